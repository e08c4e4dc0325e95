"""The Jinja environment a model's chat template runs in: transformers' own,
with every step that can build a big value in one go sized *before* it runs.

The render thread can be interrupted between Python steps, never inside one
C call, and one C call can allocate gigabytes: ``big_list|join``,
``s.replace('a', s)``, ``ns.s ~ ns.s`` in a loop, ``str(list)`` behind
``{{ value }}``. So each such step first works out (cheaply, from lengths
and counts, never by building the value) how many characters its result can
have, and refuses past the render's budget. The estimates are upper bounds
for strings and close to exact for containers (their ``repr`` may escape a
few characters more); the render also checks every result's real length.
Only operations are changed, never their results: a template within budget
renders exactly the text transformers renders.
"""

from __future__ import annotations

import functools
import inspect
import re
import string
import threading
from collections.abc import Iterable, Mapping
from typing import Any

BASE_CHARS = 4 * 1024 * 1024
# Integers a template computes stay below this many bits (a 20,000-digit
# number): ``10 ** 10 ** 9`` would hold the GIL for minutes in one operation.
INT_BITS = 1 << 16
_DEEPEST = 200  # nesting of lists/dicts a template's value may have when printed


class Refused(Exception):
    """A template operation that would exceed the budget."""


_limit = threading.local()  # .chars: this render thread's size budget


def set_budget(chars: int) -> None:
    """The size budget for templates rendered on this thread."""
    _limit.chars = chars


def _cap() -> int:
    return getattr(_limit, "chars", BASE_CHARS)


def size_text(chars: int) -> str:
    return f"{chars:,} characters"


def _check_size(n: int) -> None:
    if n > _cap():
        raise Refused(f"it tried to build a value of {size_text(n)} (the limit is "
                      f"{size_text(_cap())})")


def _over() -> Refused:
    return Refused(f"it tried to build a value of more than its limit of {size_text(_cap())}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(v: int) -> None:
    if abs(v) > _cap():
        raise Refused(f"it passed the number {v if v.bit_length() < 64 else 'a huge number'} "
                      f"as a size (the limit is {size_text(_cap())})")


def _check_args(args: Iterable, kwargs: Mapping) -> None:
    for v in (*args, *kwargs.values()):
        if _is_int(v):
            _check_int(v)


# -- how long a value's text is, without building it ------------------------------

def _parts(v: Any) -> Iterable | None:
    """What a container prints, or None for a value that is not one."""
    from jinja2.utils import Namespace

    if isinstance(v, (list, tuple, set, frozenset)):
        return v
    if isinstance(v, Namespace):  # prints as <Namespace {...}>
        v = object.__getattribute__(v, "_Namespace__attrs")
    if isinstance(v, Mapping):
        return (x for item in v.items() for x in item)
    return None


def text_len(value: Any, room: int | None = None) -> int:
    """About ``len(str(value))``, refusing as soon as it passes ``room``
    (the budget by default), so measuring costs at most about that many
    steps whatever the value: a list holding one big list twice per level
    prints exponentially long, and is refused after a few items."""
    room = _cap() if room is None else room
    known: dict[int, int] = {}  # a container shared in several places prints each time
    open_: set[int] = set()  # a container inside itself prints as [...]

    def measure(v: Any, nested: bool, depth: int) -> int:
        if isinstance(v, str):
            n = len(v) + (2 if nested else 0)
        elif isinstance(v, (bytes, bytearray)):
            n = 4 * len(v) + 3
        elif v is None or isinstance(v, bool):
            n = 5
        elif isinstance(v, int):
            n = v.bit_length() * 3 // 10 + 2
        elif isinstance(v, float):
            n = 24
        else:
            parts = _parts(v)
            if parts is None:
                n = 64
            elif id(v) in known:
                n = known[id(v)]
            elif id(v) in open_:
                n = 5
            elif depth > _DEEPEST:
                raise Refused("it built a value nested too deeply to print")
            else:
                open_.add(id(v))
                n = 13  # brackets, or <Namespace {}>
                for part in parts:
                    n += measure(part, True, depth + 1) + 2
                    if n > room:
                        raise _over()
                open_.discard(id(v))
                known[id(v)] = n
        if n > room:
            raise _over()
        return n

    return measure(value, False, 0)


def _texts(items: Iterable, sep: int = 0) -> tuple[list, int]:
    """The items (read once, as a join reads them) and the length of their
    texts joined by a ``sep``-long separator; refused past the budget."""
    room, total, out = _cap(), 0, []
    for item in items:
        total += text_len(item, max(room - total, 0)) + (sep if out else 0)
        if total > room:
            raise _over()
        out.append(item)
    return out, total


# -- the checks, by operation ---------------------------------------------------

# %-format widths and precisions, and digits in a str.format spec.
_PERCENT = re.compile(r"%(?:\([^)]*\))?[#0\- +*]*(\d+)?(?:\.(\d+))?")
_DIGITS = re.compile(r"\d+")


def _width(digits: str) -> int:
    width = int(digits) if len(digits) < 20 else 10 ** 20
    _check_int(width)
    return width


def _widest(values: Iterable) -> int:
    return max((text_len(v) for v in values), default=0)


def _check_percent(fmt: str, args: Any) -> None:
    """``fmt % args``: every conversion can be as wide as its width and
    precision (``'%999999999d'``) and as long as the longest argument's text
    (``'%s%s%s' % (big, big, big)``)."""
    values = list(args.values()) if isinstance(args, Mapping) else (
        list(args) if isinstance(args, tuple) else [args])
    convs = list(_PERCENT.finditer(fmt))
    fixed = sum(_width(g) for m in convs for g in m.groups() if g)
    if "*" in fmt:  # '%*d' takes its width from the arguments
        for v in values:
            if _is_int(v):
                _check_int(v)
                fixed += abs(v)
    _check_size(len(fmt) + fixed + len(convs) * _widest(values))


def _check_str_format(fmt: str, args: Iterable, kwargs: Mapping) -> None:
    """``fmt.format(...)``, as ``_check_percent``; a width given by a nested
    field (``'{:{}}'``) can be the largest number passed."""
    values = [*args, *kwargs.values()]
    try:
        fields = [spec or "" for _, name, spec, _ in string.Formatter().parse(fmt)
                  if name is not None]
    except ValueError:
        return  # format raises the same error before it builds anything
    fixed = sum(_width(d) for spec in fields for d in _DIGITS.findall(spec))
    nested = max((abs(v) for v in values if _is_int(v)), default=0)
    fixed += nested * sum(spec.count("{") for spec in fields)
    _check_size(len(fmt) + fixed + len(fields) * _widest(values))


def _check_replace(s: str, old: Any, new: Any, count: Any = -1) -> None:
    """``s.replace(old, new)`` grows by ``len(new) - len(old)`` per match;
    an empty ``old`` matches between every two characters."""
    if not (isinstance(old, str) and isinstance(new, str)):
        return
    hits = s.count(old) if old else len(s) + 1
    if _is_int(count) and count >= 0:
        hits = min(hits, count)
    _check_size(len(s) + hits * max(0, len(new) - len(old)))


def _lines(s: str) -> int:
    return s.count("\n") + 1


def _check_str_method(owner: str, name: str, args: tuple, kwargs: dict) -> tuple:
    """Sizes a str method's result before the call; returns the arguments
    to call it with (an iterable to join is read here, once)."""
    if name == "join" and len(args) == 1 and not kwargs:
        return (_texts(args[0], len(owner))[0],)
    if name == "format":
        _check_str_format(owner, args, kwargs)
    elif name == "format_map" and args and isinstance(args[0], Mapping):
        _check_str_format(owner, (), args[0])
    elif name == "replace":
        _check_replace(owner, *args[:3], **{k: v for k, v in kwargs.items() if k == "count"})
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if _is_int(tab):
            _check_size(len(owner) + owner.count("\t") * max(tab, 0))
    elif name == "translate" and args and isinstance(args[0], Mapping):
        _check_size(len(owner) * max(1, _widest(args[0].values())))
    return args


def _check_lipsum(args: tuple, kwargs: dict) -> None:
    from jinja2.utils import generate_lorem_ipsum

    bound = inspect.signature(generate_lorem_ipsum).bind_partial(*args, **kwargs)
    bound.apply_defaults()
    n, longest = bound.arguments["n"], bound.arguments["max"]
    if _is_int(n) and _is_int(longest):
        _check_size(max(n, 0) * max(longest, 0) * 16)  # words are at most 12 letters


def _checked_result(value: Any) -> Any:
    if isinstance(value, (str, bytes, list, tuple)):
        _check_size(len(value))
    return value


def _binop(env, context, op: str, a: Any, b: Any, /) -> Any:
    if op == "*":
        if _is_int(a) and _is_int(b):
            if a.bit_length() + b.bit_length() > INT_BITS:
                raise Refused("it computed a number too large to use")
        elif _is_int(b) and isinstance(a, (str, bytes, list, tuple)):
            _check_size(_repeated(a) * max(b, 0))
        elif _is_int(a) and isinstance(b, (str, bytes, list, tuple)):
            _check_size(_repeated(b) * max(a, 0))
    elif op == "**" and _is_int(a) and _is_int(b) and b > 0 and abs(a) > 1:
        if b > INT_BITS or b * abs(a).bit_length() > INT_BITS:
            raise Refused("it computed a number too large to use")
    elif op == "+" and isinstance(a, (str, bytes, list, tuple)) and isinstance(
            b, (str, bytes, list, tuple)):
        _check_size(len(a) + len(b))
    elif op == "%" and isinstance(a, str):
        _check_percent(a, b)
    return type(env).call_binop(env, context, op, a, b)


def _repeated(seq: str | bytes | list | tuple) -> int:
    """What one copy of ``seq`` weighs when repeated: a list counts the
    characters of its items (at least one each), as a later join or print
    of the repeated list would build them."""
    if isinstance(seq, (str, bytes)):
        return len(seq)
    room, total = _cap(), 0
    for item in seq:
        total += max(1, text_len(item, max(room - total, 0)))
        if total > room:
            raise _over()
    return total


def _call(env, context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
    _check_args(args, kwargs)
    method = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
    owner = getattr(method, "__self__", None)
    name = getattr(method, "__name__", "")
    if isinstance(owner, str):
        args = _check_str_method(owner, name, args, kwargs)
    elif name == "generate_lorem_ipsum":
        _check_lipsum(args, kwargs)
    return _checked_result(type(env).call(env, context, obj, *args, **kwargs))


# Filters that print their input (a list as its repr) before working on it.
_PRINTING = frozenset({
    "capitalize", "center", "e", "escape", "forceescape", "format", "indent", "lower",
    "pprint", "replace", "safe", "string", "striptags", "title", "tojson", "trim",
    "truncate", "upper", "urlencode", "urlize", "wordcount", "wordwrap"})


def _check_filter(env, name: str, a: dict, value_name: str) -> None:
    """Sizes a filter's result before the call; ``a`` holds its arguments
    by name, ``value_name`` names the one the filter is applied to."""
    value = a.get(value_name)
    if name in _PRINTING and not isinstance(value, str):
        text_len(value)
        value = str(value)
    if name == "join":
        a[value_name], _ = _texts(value if value is not None else (), text_len(a.get("d", "")))
    elif name == "replace":
        _check_replace(value, str(a.get("old")), str(a.get("new")), a.get("count") or -1)
    elif name == "format":
        _check_percent(value, a.get("kwargs") or a.get("args", ()))
    elif name == "indent":
        width = a.get("width", 4)
        per_line = len(width) if isinstance(width, str) else width if _is_int(width) else 0
        _check_size(len(value) + _lines(value) * max(per_line, 0))
    elif name == "wordwrap":
        wrap = a.get("wrapstring") or env.newline_sequence
        width = a.get("width", 79)
        per = max(width, 1) if _is_int(width) else 1
        # Greedy wrapping: two neighbouring lines together are longer than
        # the width, so at most about 2 * len / width lines per paragraph.
        lines = 2 * (len(value) // per + 1) + _lines(value)
        _check_size(len(value) + lines * len(str(wrap)))
    elif name == "urlize":
        extra = sum(len(v) for v in a.values() if isinstance(v, str) and v is not value)
        words = value.count(" ") + _lines(value)
        _check_size(3 * len(value) + words * (extra + 64))


def _bounded_filter(env, name: str, fn):
    try:
        signature = inspect.signature(fn)
        # The value comes first, after the context Jinja passes to some.
        value_name = list(signature.parameters)[1 if getattr(fn, "jinja_pass_arg", None) else 0]
    except (TypeError, ValueError, IndexError):
        signature = None

    @functools.wraps(fn)  # keeps jinja's pass_context/pass_environment marks
    def bounded(*args, **kwargs):
        _check_args(args, kwargs)
        try:
            bound = signature.bind(*args, **kwargs) if signature is not None else None
        except TypeError:
            bound = None  # the filter itself reports the bad call
        if bound is not None:
            bound.apply_defaults()
            a = dict(bound.arguments)
            _check_filter(env, name, a, value_name)
            if name == "join":  # the iterable was read while sizing it
                bound.arguments[value_name] = a[value_name]
            args, kwargs = bound.args, bound.kwargs
        return _checked_result(fn(*args, **kwargs))
    return bounded


def _checked_output(value: Any) -> Any:
    """Every ``{{ value }}``: its text is built by one ``str()``."""
    if not isinstance(value, str):
        text_len(value)
    return value


def _checked_concat(parts: Iterable) -> list:
    """A captured block (``{% set x %}``, ``{% filter %}``, a macro's
    body): its pieces are joined in one go."""
    items, _ = _texts(parts)
    return items


def _checked_operands(parts: tuple) -> tuple:
    """The operands of ``~``, which are printed and joined in one go."""
    _texts(parts)
    return parts


@functools.lru_cache(maxsize=1)
def _generator_class():
    from jinja2.compiler import CodeGenerator, optimizeconst

    class Generator(CodeGenerator):
        """Compiles ``a ~ b`` to a join whose operands are sized first."""

        @optimizeconst
        def visit_Concat(self, node, frame) -> None:
            if frame.eval_ctx.volatile:
                func_name = "(markup_join if context.eval_ctx.volatile else str_join)"
            elif frame.eval_ctx.autoescape:
                func_name = "markup_join"
            else:
                func_name = "str_join"
            self.write(f"{func_name}(environment.specchat_operands((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write(")))")

    return Generator


@functools.lru_cache(maxsize=1)
def environment():
    """An overlay of transformers' own template environment (its sandbox,
    filters and globals) whose arithmetic, calls, filters, ``~``, printing
    and captured blocks size their results first; transformers' cached
    environment is never touched."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    # The environment of an empty template: compiling the model's source
    # there would already run it in part (Jinja folds constants, and
    # ``'x' * 10**10`` is one).
    base = _compile_jinja_template("").environment
    env = base.overlay(finalize=_checked_output)
    env.filters = {name: _bounded_filter(env, name, fn) for name, fn in base.filters.items()}
    env.intercepted_binops = frozenset({"*", "**", "+", "%"})
    env.call_binop = functools.partial(_binop, env)
    env.call = functools.partial(_call, env)
    env.concat = lambda parts: "".join(_checked_concat(parts))
    env.specchat_operands = _checked_operands
    env.code_generator_class = _generator_class()
    return env


@functools.lru_cache(maxsize=1)
def syntax_environment():
    """An environment that compiles exactly the templates ``environment()``
    compiles (transformers' extensions, filter and test names, and the same
    sized ``~``), for checking a template without rendering it and without
    importing transformers. Why: the library checks models on the window's
    worker threads; importing transformers there, while the engine thread
    imports mlx-lm (which imports it too), left one of them with a
    half-initialised module ("cannot import name 'AutoTokenizer'"), and it
    costs seconds. Whether a template compiles depends only on its syntax,
    the extensions' tags and the names of filters and tests, which are these
    (tests/engine/test_engine_template.py compares them with transformers')."""
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}``, which transformers
        uses to mark assistant text; compiling needs only its body."""

        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = env.filters.get("tojson")  # transformers replaces it (same name)
    env.intercepted_binops = frozenset({"*", "**", "+", "%"})  # never folded while compiling
    env.code_generator_class = _generator_class()
    return env
