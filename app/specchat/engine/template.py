"""Rendering a model's chat template as the untrusted code it is.

A chat template comes with the model (a folder, a GGUF file, the Hub), and
Jinja is a language with loops: ``{% for i in range(100000) %}{% for j in
range(100000) %}{% endfor %}{% endfor %}`` runs for hours, ``{{ 'x' *
10**10 }}`` asks for 10 GB in one go. Jinja's sandbox stops templates from
reaching Python's internals, not from spending time or memory. So:

- **Identical output.** The template is compiled by transformers' own
  ``_compile_jinja_template`` (the sandboxed environment, filters and
  globals ``apply_chat_template`` uses) and given the same variables, so a
  normal template renders exactly the text, hence the ids, it did before.
  The only change is on an *overlay* of that environment (transformers'
  cached one is never touched, see ``template_env.py``): every step that
  can build a huge value in one C call (arithmetic, ``~``, printing, str
  methods, filters, captured blocks) sizes its result first and refuses
  past the budget before Python allocates it.
- **A time budget, Stop and Ctrl-C.** ``template.generate()`` yields the
  text piece by piece; a short-lived helper thread runs it and counts the
  characters, refusing past the size budget. The engine thread (the
  caller) waits on it in 50 ms slices, checking the job's cancelled flag
  and the deadline, so Stop (``job.cancel()``, which the CLI's Ctrl-C
  calls) and the budget give control back within about 0.1 s. A runaway
  render is then stopped by raising an exception in its thread
  (``PyThreadState_SetAsyncExc``): a compiled Jinja template is Python
  bytecode, so the exception lands at its next loop iteration or call. A
  subprocess would be cleaner to kill, but a packaged app's
  ``sys.executable`` is not a Python one can start with a script, and
  rendering must stay in-process to stay identical. Many small steps that
  each stay within the budget are bounded by the time budget.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from collections.abc import Mapping
from typing import Any

from specchat.engine import template_env
from specchat.engine.errors import EngineError

RENDER_SECONDS = 2.0
# The longest template compiled. Published ones are a few thousand to some
# tens of thousands of characters (a tool-calling template with its
# examples); compiling costs about 3 to 11 microseconds a character (a
# template of 1.6 million held an import and a model check for 18 s, and
# tokenizer_config.json may hold 64 MB), so this is at most about 1.4 s.
MAX_TEMPLATE_CHARS = 128 * 1024
# The rendered text may be template_env.BASE_CHARS long plus a few times the
# conversation's own text (a template may repeat the system prompt); far
# beyond any context.
PER_CONTENT_CHAR = 4
_POLL = 0.05
RENDER_THREAD = "specchat-template"  # the helper thread's name, while a render runs
_FIX = "Use another model, or fix its chat_template."
_HELP = f"the template is broken or hostile. {_FIX}"


class TemplateError(EngineError):
    """The model's chat template failed, refused, or ran out of budget."""


class TemplateStopped(EngineError):
    """Rendering was stopped because the job was cancelled."""


class _Stop(BaseException):
    """Raised inside the render thread to end a runaway render."""


def budget_chars(content_chars: int) -> int:
    """The most characters a conversation's rendered prompt may have."""
    return template_env.BASE_CHARS + PER_CONTENT_CHAR * content_chars


def render(source: str, variables: Mapping[str, Any], *, max_chars: int,
           cancelled: threading.Event | None = None, seconds: float = RENDER_SECONDS) -> str:
    """The template's text for ``variables``, or a TemplateError /
    TemplateStopped; returns within about 0.1 s of the deadline or a
    cancel, whatever the template does."""
    template = compile_template(source)
    box: list = []
    done = threading.Event()
    lock = threading.Lock()
    live = [True]  # the render may still be interrupted (guarded by lock)

    def run() -> None:
        template_env.set_budget(max_chars)
        try:
            parts, n = [], 0
            for chunk in template.generate(**variables):
                n += len(chunk)
                if n > max_chars:
                    raise template_env.Refused(f"its text grew past {template_env.size_text(max_chars)}")
                parts.append(chunk)
            text = "".join(parts)
            with lock:
                live[0] = False
            box.append(text)
        except BaseException as exc:  # noqa: BLE001 - reported on the engine thread
            with lock:
                live[0] = False
            box.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=run, name=RENDER_THREAD, daemon=True)
    deadline = time.monotonic() + seconds
    worker.start()
    while not done.wait(_POLL):
        if cancelled is not None and cancelled.is_set():
            _interrupt(worker, lock, live, done)
            raise TemplateStopped("Stopped while the chat template was being rendered; "
                                  "nothing was generated.")
        if time.monotonic() > deadline:
            _interrupt(worker, lock, live, done)
            raise TemplateError(f"The model's chat template took longer than {seconds:g} s to "
                                f"render and was stopped; {_HELP}")
    outcome = box[0]
    if isinstance(outcome, str):
        return outcome
    raise _explain(outcome) from None


def _interrupt(worker: threading.Thread, lock: threading.Lock, live: list, done: threading.Event) -> None:
    """End a render in progress: one asynchronous exception, at most, and
    only while the thread is still inside the template (``live``), so it can
    never land in the thread's own bookkeeping."""
    with lock:
        if live[0]:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident),
                                                       ctypes.py_object(_Stop))
    # Let it go quietly if it can; a single long C operation cannot be
    # interrupted, and the caller must not wait for it.
    done.wait(0.5)


def _explain(exc: BaseException) -> EngineError:
    import jinja2

    if isinstance(exc, template_env.Refused):
        return TemplateError(f"The model's chat template was stopped: {exc}; {_HELP}")
    if isinstance(exc, MemoryError):
        return TemplateError(f"The model's chat template ran out of memory; {_HELP}")
    if isinstance(exc, jinja2.TemplateError) and type(exc) is jinja2.TemplateError:
        # raise_exception('...') in the template: its own words for the user.
        return TemplateError(f"The model's chat template refused this conversation: {_line(exc)}")
    return TemplateError(f"The model's chat template failed ({type(exc).__name__}: {_line(exc)}); "
                         f"{_HELP}")


def _line(what: BaseException | str) -> str:
    """An error's text on one line of at most 200 characters."""
    text = " ".join(str(what).split())
    return text if len(text) <= 200 else text[:197] + "..."


@functools.lru_cache(maxsize=8)
def compile_template(source: str, *, syntax_only: bool = False):
    """The model's template compiled on the bounded environment, or a
    one-line TemplateError saying it is broken, whatever went wrong: Jinja
    reports bad syntax, but deep nesting surfaces as Python's own
    SyntaxError ("too many statically nested blocks") or RecursionError,
    and a huge source as MemoryError. The message names no file: a caller
    that knows where the template came from adds that. ``syntax_only``
    compiles without transformers (see template_env.syntax_environment),
    for checking a model; the result is not for rendering. A source past
    ``MAX_TEMPLATE_CHARS`` is refused before Jinja sees it."""
    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"The model's chat template is broken: it is {len(source):,} "
                            f"characters long, more than a chat template is (SpecChat compiles "
                            f"at most {MAX_TEMPLATE_CHARS:,}). {_FIX}")
    import jinja2

    env = template_env.syntax_environment() if syntax_only else template_env.environment()
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        line = f"line {exc.lineno}: " if exc.lineno else ""
        why = f"it is not valid Jinja ({line}{_line(exc.message or str(exc))})"
    except jinja2.TemplateError as exc:
        why = f"it is not valid Jinja ({_line(exc)})"
    except (SyntaxError, RecursionError):
        why = "its blocks or expressions are nested too deeply to compile"
    except MemoryError:
        why = "compiling it ran out of memory"
    except Exception as exc:  # noqa: BLE001 - any other failure is the template's too
        why = f"it could not be compiled ({type(exc).__name__}: {_line(exc)})"
    raise TemplateError(f"The model's chat template is broken: {why}. {_FIX}") from None
