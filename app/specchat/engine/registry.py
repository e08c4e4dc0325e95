"""Adding to and reading from a registry of named things (modes, drafter
kinds): one place for the duplicate check and the unknown-name message.
Imports no MLX."""

from __future__ import annotations

from typing import Protocol, TypeVar

from specchat.engine.errors import EngineError


class Named(Protocol):
    name: str


T = TypeVar("T", bound=Named)


def add(registry: dict[str, T], item: T) -> T:
    """Register ``item`` under its name; a name is never silently replaced."""
    if item.name in registry:
        raise ValueError(f"{item.name!r} is already registered")
    registry[item.name] = item
    return item


def lookup(registry: dict[str, T], name: str, what: str) -> T:
    """The item called ``name``, or an EngineError naming the choices."""
    try:
        return registry[name]
    except KeyError:
        raise EngineError(f"Unknown {what} {name!r}: one of {', '.join(registry)}.") from None
