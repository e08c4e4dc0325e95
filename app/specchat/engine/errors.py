"""Errors whose message is meant for a person, not a traceback."""


class EngineError(Exception):
    """Raised for anything the user can act on: bad model folder, mismatched
    pair, prompt too long. ``str(err)`` is the whole message."""
