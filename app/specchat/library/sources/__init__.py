"""The kinds of model reference, one module each: a ``Source`` subclass
(``base.py``) that says whether a reference is its kind, which folder it
names and what is known about it. The registry that tries them in order is
``refs.SOURCES``; nothing here imports them, so a source may import its
siblings without importing the registry."""
