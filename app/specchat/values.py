"""The allowed range of every number and word a user can type, in one table.

The CLI, the API, the GUI's settings, the stored settings and the engine all
check values here, so a bad temperature gets the same one-line answer
wherever it was typed ("temperature must be a number from 0 to 5 (0 =
greedy); got nan") and a stored settings row with a bad field falls back for
that field only. Environment variables that choose among a few words
(``CHOICES``) are checked here too, once at start-up (``specchat.startup``),
and so are the names a user gives what SpecChat keeps (``NAMES``: a model,
a cluster), taken exactly as typed or refused. A host a user types is read
here as the system's resolver reads it (``address``, ``is_loopback``): the
server's ``--host`` and a cluster's hosts alike.
This module imports nothing of SpecChat's but ``specchat.errors``, so every
layer may use it.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specchat.errors import SpecChatError

# MLX's PRNG takes an unsigned 64-bit seed; any integer a user types is
# folded into that range, so "-1" and "10**30" are seeds like any other.
SEED_MODULUS = 2 ** 64
# The default of the "prompt cache" limit, in GB: a few dozen agents'
# prompts of a 1.5B model in float32. A GB of it is GB bytes.
PROMPT_CACHE_GB = 2.0
GB = 2 ** 30


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
    Limit("cluster port", int, 1, 65535, "a cluster's first port"),
    # The memory conversations put aside may hold with their caches
    # (engine/prompt_cache.py: serve --prompt-cache-gb, Settings); 0 keeps
    # one conversation at a time.
    Limit("prompt cache", float, 0.0, 1024.0, "GB for conversations put aside; 0 = one at a time"),
    # The local API's port; 0 lets the system pick a free one (the window shows which).
    Limit("port", int, 0, 65535, "0 = any free port"),
    # What one request may carry (``size``), counted before any of it is
    # used: every item costs the one engine thread time that every other
    # request waits for, so each list and its total length is bounded, not
    # only the body's bytes. The API refuses past a bound with a 400 naming
    # the field, the CLI as a usage error, the engine's request check for
    # every caller alike.
    #
    # The prompt, in UTF-8 bytes, counted before the chat template and the
    # tokenizer see it: a token of a byte-level BPE (or byte-fallback)
    # tokenizer covers at least one byte, so this bounds the tokens too,
    # whatever the script (characters did not: an emoji is 4 bytes and up
    # to 4 tokens). Tokenizing takes about 2 s a megabyte. A million bytes
    # is some 250,000 tokens of English prose or code; a prompt sent as
    # token ids is bounded by the same number of ids.
    Limit("prompt", int, 0, 1_000_000, "in one request"),
    # OpenAI takes 4 stop strings; 64 leaves room for clients that list
    # many. Matching costs the same per token however many there are
    # (engine/stops.py); their characters are what its automaton is built
    # from, once per request, and bound the text held back.
    Limit("stop strings", int, 0, 64, "in one request"),
    Limit("characters of stop strings", int, 0, 4096, "in one request"),
    # Each message is a turn of the chat template's loop; a long chat has
    # hundreds. A message's text parts are joined into one text.
    Limit("messages", int, 0, 10_000, "in one request"),
    # The Responses API's input: its items make the turns (a reply's reasoning,
    # message and calls one turn), so they are bounded as the messages are.
    Limit("input items", int, 0, 10_000, "in one request"),
    Limit("content parts", int, 0, 1_000, "in one message"),
    # Rendered into the prompt by the chat template: OpenAI's own bound on
    # their count, the prompt's on their JSON. The calls an assistant turn
    # made are turns of the template's loop too, bounded as OpenAI's tools.
    Limit("tools", int, 0, 128, "in one request"),
    Limit("bytes of tools", int, 0, 1_000_000, "in one request, as UTF-8 JSON"),
    # specchat models recommend: the recent prompts each draft is measured on.
    Limit("prompts", int, 1, 20, "recent prompts each draft runs"),
    # specchat bench: processes spinning beside it, to measure on a busy machine.
    Limit("background load", int, 0, 256, "spinning processes"),
    # Training a draft head (specchat heads train, the model manager's Train
    # row; TrainPlan checks them for every caller). A budget of 0 or less
    # would end before the first update; a week is past any sensible run.
    Limit("minutes", float, 0.0, 7 * 24 * 60.0, "this run's training budget", low_open=True),
    Limit("updates", int, 1, 1_000_000_000, "in all, a resumed run's included; none = "
                                            "until the budget ends", optional=True),
    Limit("checkpoint seconds", float, 1.0, 24 * 3600.0, "between checkpoints"),
    # Acceptance is measured on these; none would report 0% as measured.
    Limit("held-out pieces", int, 1, 10_000),
    # The ids a head drafts from; the largest vocabularies are 262,144 ids.
    Limit("draft vocabulary", int, 1, 262_144, "ids"),
    Limit("text characters", int, 0, 100_000_000, "read from files; 0 = none"),
    Limit("replies", int, 0, 100_000, "requests the target answers itself"),
    Limit("reply tokens", int, 1, 32_768, "the longest reply to one request"),
    Limit("tool calls", int, 0, 128, "in one message"),
    # ... and in the whole conversation: each is a turn of the template's
    # loop too, and each is read, checked and rendered, so they are bounded
    # as the messages are (76,800 calls, 128 in each of 600 messages, held
    # the engine thread for 8 s).
    Limit("tool calls in all", int, 0, 10_000, "in one request"),
    # The chat template's switches a request sets (chat_template_kwargs):
    # a template reads a handful; a text value may be written into the prompt.
    Limit("template switches", int, 0, 32, "in one request"),
    Limit("characters of template switches", int, 0, 4096, "in one request"),
)}


@dataclass(frozen=True)
class Choice:
    """An environment variable that takes one of a few words (any case),
    or with ``paths`` also the path of a file: text with a ``/`` in it, or
    the name of a file that exists."""

    name: str
    words: tuple[str, ...]
    paths: str = ""  # what a path names ("the path of a CBLAS library"); "" = no paths

    def describe(self) -> str:
        options = [*self.words, self.paths] if self.paths else list(self.words)
        return f"{self.name} must be {', '.join(options[:-1])} or {options[-1]}"


CHOICES: dict[str, Choice] = {c.name: c for c in (
    Choice("SPECCHAT_DTYPE", ("float32", "float16", "bfloat16", "q4")),
    Choice("SPECCHAT_BLAS", ("blis", "openblas", "bundled"), "the path of a CBLAS library"),
    Choice("SPECCHAT_ATTENTION", ("blocks", "mlx")),
)}


def choice(name: str, value: str | None) -> str | None:
    """``value`` as one of ``CHOICES[name]``'s words (lower case) or, where
    it takes one, a path (as typed, stripped); None when nothing is set;
    else ``BadValue`` naming the variable and what it takes."""
    entry = CHOICES[name]
    text = (value or "").strip()
    if not text:
        return None
    if text.lower() in entry.words:
        return text.lower()
    if entry.paths and ("/" in text or os.sep in text or os.path.isfile(text)):
        return text
    raise BadValue(f"{entry.describe()}; got {shown(text)}")


def environment(name: str) -> str | None:
    """The environment variable ``name`` checked by ``choice``: a typo such
    as ``SPECCHAT_BLAS=blsi`` is refused in one line, not quietly ignored."""
    return choice(name, os.environ.get(name))


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
    # An integer too large for a float (a 400-digit "temperature" in a hand
    # edited settings row) overflows in isfinite and float(): out of range.
    try:
        number = _number(limit, value)
    except OverflowError:
        raise BadValue(f"{limit.describe()}; got {shown(value)}") from None
    if limit.kind is int and name == "seed":
        return int(number) % SEED_MODULUS
    if limit.low is not None and (number < limit.low or (limit.low_open and number == limit.low)):
        raise BadValue(f"{limit.describe()}; got {shown(value)}")
    if limit.high is not None and number > limit.high:
        raise BadValue(f"{limit.describe()}; got {shown(value)}")
    return number


def _number(limit: Limit, value: object) -> int | float:
    typed = value  # what the message shows: the text as typed, not its parse
    if isinstance(value, bool):
        raise BadValue(f"{limit.describe()}; got {shown(value)}")
    if isinstance(value, str):
        typed = value.strip()
        try:
            value = _whole(typed) if limit.kind is int else float(typed)
        except ValueError:
            raise BadValue(f"{limit.describe()}; got {shown(typed)}") from None
    if limit.kind is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise BadValue(f"{limit.describe()}; got {shown(typed)}")
        return value
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadValue(f"{limit.describe()}; got {shown(typed)}")
    return float(value)


def _whole(text: str) -> int | float:
    """Typed text for a whole number: an integer exactly (a seed of 40
    digits stays itself), else the number it writes ("2.0", "1e3"), which
    ``_number`` takes when it is whole, as it takes the JSON number 2.0."""
    try:
        return int(text)
    except ValueError:
        return float(text)


# Text that cannot be empty: an empty stop string would end every reply
# before its first character, an empty prompt asks nothing.
NOT_EMPTY = frozenset({"a stop string", "the prompt"})


def text(name: str, value: object) -> str:
    """``value`` if it is text that can be written as UTF-8, else ``BadValue``
    saying where it is not. Bytes that are not UTF-8 reach Python as lone
    surrogates (argv and file names use surrogate escapes), which no
    tokenizer can encode; refusing them here keeps that from becoming an
    internal error deep in the engine. The message never repeats the text,
    so printing it cannot fail too. Text in ``NOT_EMPTY`` must not be empty."""
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
    if not value and name in NOT_EMPTY:
        raise BadValue(f"{name} must not be empty")
    return value


def size(name: str, n: int) -> None:
    """``BadValue`` if a request carries more than the table's bound for
    ``name`` (a count, or a length such as ``characters of stop strings``):
    checked before the items are used, in one line that names the bound."""
    limit = LIMITS[name]
    if n > limit.high:
        raise BadValue(f"too many {name}: {n:,}; at most {int(limit.high):,} {limit.hint}")


def utf8_size(texts: Iterable[str]) -> int:
    """The bytes ``texts`` take as UTF-8 (each already checked by ``text``)."""
    return sum(len(t.encode("utf-8")) for t in texts)


def prompt_size(size_bytes: int, what: str = "the prompt") -> None:
    """``BadValue`` if a prompt of ``size_bytes`` UTF-8 bytes (every message
    together) is past the table's bound, checked before it is tokenized: no
    token is shorter than a byte, so the bound is one on its tokens too.
    Checked on what a request carries, before anything is rendered, and on
    the text the chat template makes of it (``what``), which the tokenizer
    reads: each turn and call adds the template's own text around it."""
    bound = int(LIMITS["prompt"].high)
    if size_bytes > bound:
        raise BadValue(f"{what} is {size_bytes:,} bytes of UTF-8 text, more than SpecChat "
                       f"reads at once ({bound:,} bytes, at most as many tokens); shorten it")


def prompt_tokens(n: int) -> None:
    """``BadValue`` if a prompt given as ``n`` token ids is past the bound
    a text prompt's bytes are held to."""
    bound = int(LIMITS["prompt"].high)
    if n > bound:
        raise BadValue(f"the prompt is {n:,} tokens, more than SpecChat reads at once "
                       f"({bound:,}); shorten it")


def stop_strings(stops: Sequence[object]) -> tuple[str, ...]:
    """``stops`` checked as the engine, the CLI and the API take them: each
    one text by ``text``'s rule (not empty), their count and their total
    length within the table's bounds (the count first, before any is read)."""
    size("stop strings", len(stops))
    checked = tuple(text("a stop string", s) for s in stops)
    size("characters of stop strings", sum(map(len, checked)))
    return checked


@dataclass(frozen=True)
class Name:
    """A name a user gives something SpecChat keeps under it (a model in the
    library, a cluster): one folder of the home, so only characters that are
    safe in a file name on every system. A typed name is taken exactly as
    typed or refused (``name``), never quietly changed: the name a command
    prints and lists is the one the user typed."""

    what: str
    chars: str  # a regular-expression class of the characters allowed
    first: str  # ... of the first character
    last: str  # ... of the last character
    longest: int
    rule: str  # the same, in words

    @property
    def pattern(self) -> re.Pattern:
        """Matches (``fullmatch``) exactly the names this rule allows."""
        return re.compile(f"[{self.first}](?:[{self.chars}]{{0,{self.longest - 2}}}"
                          f"[{self.last}])?")


NAMES: dict[str, Name] = {n.what: n for n in (
    Name("a model name", "A-Za-z0-9._+-", "A-Za-z0-9_+", "A-Za-z0-9_+", 120,
         "letters, digits, '.', '_', '+' and '-', at most 120 characters, not starting or "
         "ending with '.' or '-'"),
    Name("a cluster name", "A-Za-z0-9._-", "A-Za-z0-9", "A-Za-z0-9._-", 64,
         "letters, digits, '.', '_' and '-', at most 64 characters, starting with a letter "
         "or a digit"),
)}


def name(what: str, value: object) -> str:
    """``value`` if it is a name ``NAMES[what]`` allows exactly as typed;
    else ``BadValue`` with the rule in words and what was typed, quoted (a
    space shows) and on one line (a newline shows as ``\\n``)."""
    entry = NAMES[what]
    if isinstance(value, str) and entry.pattern.fullmatch(value):
        return value
    raise BadValue(f"{entry.what} must be {entry.rule}; got "
                   + (f"'{shown(value)}'" if value else "nothing"))


_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_ORIGIN_HOST = re.compile(r"[a-z0-9._~-]+|\[[0-9a-f:.]+\]")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(value: object) -> str:
    """A web origin a user allows to call the local API (CORS), as a browser
    sends it in its ``Origin`` header: ``scheme://host[:port]``, lower case,
    without the scheme's default port; else ``BadValue``. No wildcard and no
    ``null``: each allowed page is named."""
    typed = value.strip() if isinstance(value, str) else value
    bad = BadValue("an allowed origin must be scheme://host[:port] with no path, as a browser "
                   f"sends it (http://localhost:5173); got {shown(typed)}")
    if not isinstance(typed, str):
        raise bad
    scheme, sep, rest = typed.lower().partition("://")
    rest = rest[:-1] if rest.endswith("/") else rest
    host, port = rest, None
    if ":" in rest and not rest.endswith("]"):
        host, _, digits = rest.rpartition(":")
        if not digits.isdigit() or not 0 < int(digits) <= 65535:
            raise bad
        port = int(digits)
    if not (sep and _SCHEME.fullmatch(scheme) and _ORIGIN_HOST.fullmatch(host)):
        raise bad
    if port is None or port == _DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address a socket reaches for ``host`` when the system's resolver
    reads ``host`` as a number (``[...]`` around IPv6 allowed); None for a
    name, which only DNS or the hosts file can say. The resolver takes more
    than the dotted quads Python's ``ipaddress`` reads: inet_aton's forms,
    where ``0`` and ``0x0`` are 0.0.0.0, and ``127.1``, ``0x7f.0.0.1``,
    ``0177.0.0.1`` and ``2130706433`` are all 127.0.0.1; and an IPv4 address
    inside IPv6 (``::ffff:0.0.0.0``) reaches that IPv4 address, which is the
    one returned. What ``ipaddress`` does not read is asked of the resolver
    itself (getaddrinfo with AI_NUMERICHOST, which never looks anything
    up), so the answer is what this system's sockets do."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if not text or len(text) > 253 or not text.isascii() or not text.isprintable():
        return None
    try:
        ip = ipaddress.ip_address(text)  # as written (an IPv6 zone kept: fe80::1%en0)
    except ValueError:
        try:
            found = socket.getaddrinfo(text, None, flags=socket.AI_NUMERICHOST)
            ip = ipaddress.ip_address(found[0][4][0])
        except (OSError, UnicodeError, ValueError, IndexError):  # a name, or nothing
            return None
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return mapped if mapped is not None else ip


def is_loopback(host: str) -> bool:
    """Only this computer can reach ``host``: ``localhost``, or an address of
    127.0.0.0/8 or ::1 however it is written (``address``). Any other name
    may resolve to anything."""
    if host.strip().lower() == "localhost":
        return True
    ip = address(host)
    return ip is not None and ip.is_loopback


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
