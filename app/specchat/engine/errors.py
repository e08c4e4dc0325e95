"""Errors whose message is meant for a person, not a traceback."""

from specchat.errors import SpecChatError


class EngineError(SpecChatError):
    """Raised for anything the user can act on while loading or generating:
    bad model folder, mismatched pair, prompt too long. ``str(err)`` is the
    whole message."""
