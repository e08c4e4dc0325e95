"""The model library's errors.

LibraryError is a ``SpecChatError`` (specchat/errors.py), so the CLI and the
GUI print its message as one line for the user instead of a traceback. It is
not an ``EngineError``: the library does not depend on the engine.
"""

from __future__ import annotations

from specchat.errors import SpecChatError


class LibraryError(SpecChatError):
    """Something about models on disk or on the Hub that the user can act on:
    an unknown reference, a missing download, a pair that does not fit."""


class ImportCancelled(LibraryError):
    """The user cancelled an import; nothing was listed or left behind."""
