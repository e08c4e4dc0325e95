"""The one root of every error meant for a person.

The engine, the library and the store raise subclasses of ``SpecChatError``
whose ``str()`` is the whole message. The CLI prints it as one line, the
engine thread turns it into a ``JobFailed`` and the window shows it; any
other exception is a bug and is reported as one. This module imports
nothing, so every layer may import it.
"""


class SpecChatError(Exception):
    """Something the user can act on: a bad model, a mismatched pair, a
    prompt too long, a download that failed."""
