"""The allowed range of every number and word a user can type, in one table.

The CLI, the GUI's settings, the stored settings and the engine all check
values here, so a bad temperature gets the same one-line answer wherever it
was typed ("temperature must be a number from 0 to 5 (0 = greedy); got nan")
and a stored settings row with a bad field falls back for that field only.
This module imports nothing but ``specchat.errors``, so every layer may use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specchat.errors import SpecChatError

# MLX's PRNG takes an unsigned 64-bit seed; any integer a user types is
# folded into that range, so "-1" and "10**30" are seeds like any other.
SEED_MODULUS = 2 ** 64


class BadValue(SpecChatError):
    """A value a user typed (or a stored setting) is outside its range."""


@dataclass(frozen=True)
class Limit:
    """One value: its kind, its inclusive range, and what the range means."""

    name: str
    kind: type  # float or int
    low: float | None
    high: float | None
    hint: str = ""
    low_open: bool = False  # low itself is not allowed (top-p > 0)
    optional: bool = False  # None is allowed (K = auto, seed = random)

    def describe(self) -> str:
        what = "a number" if self.kind is float else "a whole number"
        if self.low is None and self.high is None:
            text = f"{self.name} must be {what}"
        else:
            low, high = _num(self.low), _num(self.high)
            text = (f"{self.name} must be {what} above {low} and at most {high}" if self.low_open
                    else f"{self.name} must be {what} from {low} to {high}")
        return text + (f" ({self.hint})" if self.hint else "")


def _num(v: float | None) -> str:
    if v is None:
        return "any"
    if float(v).is_integer():
        return f"{int(v):,}".replace(",", "")
    return f"{v:g}"


LIMITS: dict[str, Limit] = {limit.name: limit for limit in (
    Limit("temperature", float, 0.0, 5.0, "0 = greedy"),
    Limit("top-p", float, 0.0, 1.0, "1 = off", low_open=True),
    Limit("top-k", int, 0, 1_000_000, "0 = off"),
    Limit("seed", int, None, None, "any integer; none = random", optional=True),
    Limit("max tokens", int, 1, 1_048_576),
    Limit("context", int, 16, 1_048_576, "tokens"),
    Limit("K", int, 1, 32, "draft length; auto = adaptive", optional=True),
    Limit("hub timeout", float, 0.0, 3600.0, "seconds, SPECCHAT_HUB_TIMEOUT", low_open=True),
)}


def check(name: str, value: object) -> int | float | None:
    """``value`` as the limit's kind if it is in range, else ``BadValue``
    with the one line that names the range. Strings are parsed (what a user
    typed); bools are refused (a stored ``true`` is not a temperature)."""
    limit = LIMITS[name]
    blank = isinstance(value, str) and not value.strip()
    if value is None or blank or (limit.optional and isinstance(value, str)
                                  and value.strip().lower() in ("auto", "none", "random")):
        if limit.optional:
            return None
        raise BadValue(f"{limit.describe()}; got nothing")
    number = _parse(limit, value)
    if limit.kind is int and name == "seed":
        return int(number) % SEED_MODULUS
    if limit.low is not None and (number < limit.low or (limit.low_open and number == limit.low)):
        raise BadValue(f"{limit.describe()}; got {shown(value)}")
    if limit.high is not None and number > limit.high:
        raise BadValue(f"{limit.describe()}; got {shown(value)}")
    return number


def _parse(limit: Limit, value: object) -> int | float:
    # An integer too large for a float (a 400-digit "temperature" in a hand
    # edited settings row) overflows in isfinite and float(): out of range.
    try:
        return _number(limit, value)
    except OverflowError:
        raise BadValue(f"{limit.describe()}; got {shown(value)}") from None


def _number(limit: Limit, value: object) -> int | float:
    if isinstance(value, bool):
        raise BadValue(f"{limit.describe()}; got {shown(value)}")
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text) if limit.kind is int else float(text)
        except ValueError:
            raise BadValue(f"{limit.describe()}; got {shown(text)}") from None
    if limit.kind is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise BadValue(f"{limit.describe()}; got {shown(value)}")
        return value
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadValue(f"{limit.describe()}; got {shown(value)}")
    return float(value)


def text(name: str, value: object) -> str:
    """``value`` if it is text that can be written as UTF-8, else ``BadValue``
    saying where it is not. Bytes that are not UTF-8 reach Python as lone
    surrogates (argv and file names use surrogate escapes), which no
    tokenizer can encode; refusing them here keeps that from becoming an
    internal error deep in the engine. The message never repeats the text,
    so printing it cannot fail too."""
    if not isinstance(value, str):
        raise BadValue(f"{name} must be text; got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = ord(value[exc.start])
        what = (f"byte 0x{char - 0xDC00:02X}" if 0xDC80 <= char <= 0xDCFF
                else f"the lone surrogate U+{char:04X}")
        raise BadValue(f"{name} is not valid UTF-8 text: {what} at character "
                       f"{exc.start + 1}; save or type it as UTF-8") from None
    return value


def shown(value: object) -> str:
    """What was typed, short and on one line: control characters and bytes
    that are not text are escaped, so the message prints anywhere."""
    try:
        text = value if isinstance(value, str) else repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        text = "a number too long to show"
    text = text if len(text) <= 40 else text[:37] + "..."
    return "".join(c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF
                   else repr(c)[1:-1] for c in text)
