"""A config.json read field by field: each value checked and bounded,
refused in words that name the file and the field. A format module
(eagle3_format.py) builds its checked config from it, so a head's config
is never trusted past its reader. Imports no MLX."""

from __future__ import annotations

import math
from pathlib import Path

from specchat.engine.safetensors_file import whole
from specchat.errors import SpecChatError
from specchat.records import described

REQUIRED = object()  # a field's default when the config must state it


class Fields:
    """Reads a config's fields, each checked, refusing in words that name
    the file and the field."""

    def __init__(self, where: Path | str, error: type[SpecChatError],
                 sizes: dict[str, tuple[int, int]], whose: str):
        """``sizes``: the (least, most) of each whole number a config may
        state; ``whose``: whose config, in words ("an EAGLE-3 head's")."""
        self.where, self.error, self.sizes, self.whose = where, error, sizes, whose

    def _value(self, block: dict, key: str, prefix: str, default: object):
        value = block.get(key)
        if value is None:
            if default is REQUIRED:
                raise self.error(f"{self.where} lacks {prefix}{key}, which {self.whose} "
                                 "config states")
            return None
        return value

    def size(self, block: dict, key: str, prefix: str = "", default: object = REQUIRED):
        value = self._value(block, key, prefix, default)
        if value is None:
            return default
        low, high = self.sizes[key]
        if not (whole(value) and low <= value <= high):
            raise self.error(f"{self.where}: {prefix}{key} must be a whole number from {low:,} "
                             f"to {high:,}; got {described(value)}")
        return value

    def number(self, block: dict, key: str, prefix: str, default: float) -> float:
        value = self._value(block, key, prefix, default)
        if value is None:
            return default
        if not (isinstance(value, int | float) and not isinstance(value, bool)
                and 0 < value < math.inf):
            raise self.error(f"{self.where}: {prefix}{key} must be a number above 0; got "
                             f"{described(value)}")
        return float(value)

    def flag(self, block: dict, key: str, default: bool, prefix: str = "") -> bool:
        value = self._value(block, key, prefix, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(f"{self.where}: {prefix}{key} must be true or false; got "
                             f"{described(value)}")
        return value

    def mapping(self, block: dict, key: str, prefix: str) -> dict | None:
        value = self._value(block, key, prefix, None)
        if value is not None and not isinstance(value, dict):
            raise self.error(f"{self.where}: {prefix}{key} must be an object (or null); got "
                             f"{described(value)}")
        return dict(value) if value else None
