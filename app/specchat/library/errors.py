"""The model library's errors.

LibraryError subclasses EngineError so the CLI (and the GUI) print its
message as one line for the user instead of a traceback.
"""

from __future__ import annotations

from specchat.engine.errors import EngineError


class LibraryError(EngineError):
    """Something about models on disk or on the Hub that the user can act on:
    an unknown reference, a missing download, a pair that does not fit."""


class ImportCancelled(LibraryError):
    """The user cancelled an import; nothing was listed or left behind."""
