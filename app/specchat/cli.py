"""The ``specchat`` command: the GUI by default; ``generate``, ``serve``,
``bench``, ``models`` and ``cluster`` subcommands for the terminal.

Every command builds the whole parser, so what is imported at the top is
paid by ``specchat --help`` too: SpecChat's pure-Python modules are; MLX
(the bench), Qt (the window) and uvicorn with Starlette (``serve``) are
imported only by the command that needs them."""

from __future__ import annotations

import argparse
import functools
import json
import os
import stat
import sys
from pathlib import Path

from specchat import applog, cluster_cmd, records, startup, values
from specchat.engine import chat_rules, modes
from specchat.engine.errors import EngineError
from specchat.engine.events import (
    DraftSettings,
    GenerateRequest,
    LoadProgress,
    Message,
    SamplingParams,
    StepEvent,
)
from specchat.errors import SpecChatError
from specchat.library import bundled, commands, refs, staging
from specchat.library import recommendations as rec
from specchat.library.engine_link import make_client
from specchat.server import DEFAULT_HOST, DEFAULT_PORT, KEY_VARIABLE
from specchat.server.protocol import MAX_TOKENS_CAP
from specchat.server.service import ApiService, Served
from specchat.store.summary import ReplySummary, shares_text
from specchat.tools import bench_output, heads, recommend
from specchat.tools.prompts import KINDS
from specchat.tools.variants import VARIANTS

# The exit status of a command Ctrl-C stopped (128 + SIGINT), as shells report it.
INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (plus where to look), like every other error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _refusing(check, name: str):
    """``check(name, text)`` as an argparse ``type``: its BadValue becomes
    the usage error's one line. ``parse.value`` names the table entry, so
    the tests can walk the options against the API's parameters."""
    def parse(text: str):
        try:
            return check(name, text)
        except values.BadValue as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.value = name
    return parse


# ``_value(name)``: an argparse ``type`` for one of ``specchat.values``' names:
# the same range, and the same one line, as the engine and the settings dialog.
_value = functools.partial(_refusing, values.check)
# ``_text(name)``: for free text: bytes that are not UTF-8 arrive from argv as
# surrogate escapes, which no tokenizer can encode.
_text = functools.partial(_refusing, values.text)
# An argparse ``type`` for a CORS origin, as the Settings field takes it.
_origin = _refusing(lambda _name, t: values.origin(t), "origin")


def _model_ref(text: str) -> str:
    """An argparse ``type`` for a model reference: an empty one (``--draft ""``)
    is refused as a usage error, in the library's words for "no model", rather
    than quietly meaning "no draft"."""
    if text.strip():
        return text
    try:
        refs.source_for(text)  # refuses it with the library's "No model given: pass ..."
    except SpecChatError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _existing(folders: bool):
    """An argparse ``type`` for an input path: a regular file, or with
    ``folders`` a folder too. One that is not there, is something else (a
    FIFO would block the command for good) or is empty (which would name
    the current folder) is a usage error in words saying which, not an
    OSError from deep in the command."""
    wanted = "a regular file or folder" if folders else "a regular file"

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError("no path given")
        path = Path(text)
        try:
            path = path.expanduser()
        except RuntimeError:  # ~someone who has no home folder here: not found either
            pass
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) and path.is_symlink():  # was "no such file"
                raise argparse.ArgumentTypeError(
                    f"{text} is a link to {os.readlink(path)}, which is not there") from None
            missing = "no such file or folder" if folders else "no such file"
            why = missing if isinstance(exc, FileNotFoundError) else exc.strerror or exc
            raise argparse.ArgumentTypeError(f"{why}: {text}") from None
        if not (stat.S_ISREG(mode) or (folders and stat.S_ISDIR(mode))):
            raise argparse.ArgumentTypeError(f"{text} is {records.file_kind(mode)}, not {wanted}")
        return str(path)

    return parse


_readable_file = _existing(folders=False)


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=_value("max tokens"), default=256,
                   help="new tokens at most (default 256)")
    p.add_argument("--temperature", type=_value("temperature"), default=0.0,
                   help="0 = greedy (default)")
    p.add_argument("--top-p", type=_value("top-p"), default=1.0)
    p.add_argument("--top-k", type=_value("top-k"), default=0)
    p.add_argument("--seed", type=_value("seed"), default=None,
                   help="any integer (folded into 64 bits); default random")


def _add_pair(p: argparse.ArgumentParser, target_help: str, lookup_help: str,
              required: bool = False):
    """``--target``, and ``--draft`` or ``--lookup``: the pair that generate
    and serve run; the group, for a command's further choices that exclude
    these two."""
    p.add_argument("--target", required=required, type=_model_ref, help=target_help)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--draft", type=_model_ref, help="draft model sharing the target's "
                      "tokenizer, or mtp: the target's own MTP head")
    mode.add_argument("--lookup", action="store_true", help=lookup_help)
    p.set_defaults(subparser=p)  # for the usage errors of the checks after parsing
    return mode


def _add_k(p: argparse.ArgumentParser) -> None:
    p.add_argument("--k", type=_value("K"), default=None, metavar="auto|N",
                   help="draft length: auto (adaptive, default) or a fixed N")


def _add_bench(sub) -> None:
    names = list(VARIANTS)
    b = sub.add_parser("bench", help="compare SpecChat and mlx-lm decoding on the same weights")
    b.add_argument("--target", required=True, type=_model_ref,
                   help="target model (folder, bundled:..., .gguf, hf:...)")
    b.add_argument("--draft", required=True, type=_model_ref,
                   help="draft model sharing the target's tokenizer (or a draft head)")
    b.add_argument("--head", type=_model_ref, metavar="HEAD",
                   help="a draft head for the target, loaded beside the draft model, so "
                        "the head modes run in the same process as the draft model's")
    b.add_argument("--prompts", required=True, type=_readable_file,
                   help='JSONL file, one {"id", "kind", "messages"} a line (benchmarks/prompts.jsonl)')
    b.add_argument("--kinds", nargs="+", choices=KINDS, metavar="KIND",
                   help="only the prompts of these kinds (" + ", ".join(KINDS) + "), in file order")
    b.add_argument("--ids", nargs="+", metavar="ID",
                   help="only the prompts with these ids, in file order")
    b.add_argument("--max-tokens", type=_value("max tokens"), default=128,
                   help="new tokens per prompt (default 128)")
    b.add_argument("--temperature", type=_value("temperature"), default=0.0,
                   help="0 = greedy (default)")
    b.add_argument("--seed", type=_value("seed"), default=0, help="sampling seed (default 0)")
    b.add_argument("--modes", nargs="+", choices=names, metavar="MODE",
                   help="modes to run, interleaved per prompt (default: those of " + ", ".join(names)
                   + " that the models loaded can run)")
    b.add_argument("--background-load", type=_value("background load"), default=0, metavar="N",
                   help="keep N processes spinning on the CPU beside the bench, to measure "
                        "speed on a busy machine (default 0)")
    b.add_argument("--auto-off", choices=("on", "off"), default="on",
                   help="break-even auto-off: on (default, as in the app) decodes plainly while "
                        "speculating is measured slower than plain; off speculates throughout")
    b.add_argument("--history", choices=("session", "none"), default="none",
                   help="session: prompts run in file order and each one's conversation joins "
                        "the history index for the next ones (as over a user's day), with every "
                        "suffix-drafting mode also run cold (empty history); none: no history "
                        "(default)")
    b.add_argument("--json", dest="json_out", metavar="OUT", help="write the report as JSON")


def _add_models(sub) -> None:
    m = sub.add_parser("models", help="list, pull, import, remove and check models")
    m.add_argument("--json", action="store_true", help="machine-readable output")
    msub = m.add_subparsers(dest="models_command", required=True)
    msub.add_parser("list", help="installed models")
    p = msub.add_parser("pull", help="download a model (hf:org/repo[@rev], catalog name, bundled:...)")
    p.add_argument("ref")
    i = msub.add_parser("import", help="import an MLX folder or a .gguf file")
    i.add_argument("path")
    i.add_argument("--name", type=_refusing(values.name, "a model name"),
                   help="the name to list it under (default: the folder's or file's name)")
    r = msub.add_parser("rm", help="remove an installed model")
    r.add_argument("name")
    c = msub.add_parser("check", help="can DRAFT speculate for TARGET? (exit 1 if not)")
    c.add_argument("target", type=_model_ref)
    c.add_argument("draft", type=_model_ref)
    c.add_argument("--context", type=_value("context"), default=4096,
                   help="context length for the memory estimate (default 4096)")
    msub.add_parser("where", help="where models are stored")
    msub.add_parser("catalog", help="recommended pairs, with memory and download sizes")
    s = msub.add_parser("suggest", help="compatible drafts for TARGET")
    s.add_argument("target")
    _add_recommend(msub)
    for sp in msub.choices.values():
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS)


def _add_recommend(msub) -> None:
    r = msub.add_parser("recommend", help="measure the installed drafts for TARGET on this "
                                          "machine and rank them (Ctrl-C cancels)")
    r.add_argument("--target", required=True, type=_model_ref,
                   help="target model (folder, bundled:..., installed name, .gguf, hf:...)")
    r.add_argument("--draft", action="append", type=_model_ref, metavar="DRAFT",
                   help="measure only this draft (repeatable; default: every installed one)")
    r.add_argument("--prompts", type=_value("prompts"), default=rec.DEFAULT_PROMPTS,
                   metavar="N",
                   help=f"recent prompts from your history to run (default {rec.DEFAULT_PROMPTS}; "
                        "built-in ones when the history is empty)")
    r.add_argument("--max-tokens", type=_value("max tokens"), default=rec.DEFAULT_MAX_TOKENS,
                   help=f"new tokens per prompt (default {rec.DEFAULT_MAX_TOKENS})")
    r.add_argument("--again", action="store_true",
                   help="measure every draft anew instead of reusing remembered results")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specchat",
        description="Local LLM chat with speculative decoding. Without a subcommand, opens the app.",
    )
    _add_pair(parser, "target model reference (opens the app with it selected)",
              "no draft model: draftless suffix matching")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    g = sub.add_parser("generate", help="generate one reply and stream it to stdout")
    mode = _add_pair(g, "target model (folder, bundled:..., .gguf, hf:...)",
                     "draftless speculation: suffix matches in the conversation", required=True)
    mode.add_argument("--plain", action="store_true", help="plain decoding with the target only")
    g.add_argument("--no-lookup", action="store_true",
                   help="with --draft: draft model only (default also uses suffix matches)")
    g.add_argument("--prompt", required=True, type=_text("the prompt"), help="the user message")
    g.add_argument("--system", type=_text("the system prompt"), help="system prompt")
    _add_sampling(g)
    _add_k(g)
    g.add_argument("--stop", action="append", default=[], type=_text("a stop string"),
                   help="stop string (repeatable)")
    g.add_argument("--tools", type=_readable_file, metavar="FILE",
                   help="a JSON file of tools the model may call (OpenAI's shape: a list of "
                        '{"type": "function", "function": {...}}), rendered by its chat template')
    g.add_argument("--no-thinking", action="store_true",
                   help="turn the model's reasoning off with its chat template's own switch "
                        "(the API's reasoning_effort none)")
    g.add_argument("--acceptance", choices=["rejection", "equality"], default="rejection",
                   help=argparse.SUPPRESS)
    g.add_argument("--json", action="store_true", help="print one JSON object at the end")

    _add_bench(sub)
    _add_models(sub)
    cluster_cmd.add_parser(sub, _model_ref, _refusing(values.name, "a cluster name"), _value)
    heads.add_parser(sub, _model_ref, _value, _existing(folders=True))
    _add_serve(sub)
    return parser


def _add_serve(sub) -> None:
    s = sub.add_parser("serve", help="serve a pair as an OpenAI-compatible API on this computer")
    _add_pair(s, "target model (default: the built-in default pair)",
              "no draft model: draftless suffix matching")
    s.add_argument("--plain", action="store_true",
                   help="plain decoding with the target only (not with --lookup)")
    _add_k(s)
    s.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}: this computer only)")
    s.add_argument("--port", type=_value("port"), default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0 = any free port)")
    s.add_argument("--allow-remote", action="store_true",
                   help="allow a --host other machines can reach (needs an API key)")
    s.add_argument("--api-key-file", type=_readable_file, metavar="FILE",
                   help=f"a file holding the bearer token every request must send (or set "
                        f"{KEY_VARIABLE}; never on the command line, where ps shows it)")
    s.add_argument("--api-key", type=_key_refused, help=argparse.SUPPRESS)
    s.add_argument("--cors-origin", action="append", default=[], type=_origin, metavar="ORIGIN",
                   help="a web page origin (scheme://host[:port]) allowed to call the API from "
                        "a browser (repeatable; none by default)")
    s.add_argument("--max-tokens-cap", type=_value("max tokens"), default=None, metavar="N",
                   help="most new tokens a request may ask for (default: the context's room)")
    s.add_argument("--prompt-cache-gb", type=_value("prompt cache"),
                   default=values.PROMPT_CACHE_GB, metavar="GB",
                   help="memory for the caches of conversations put aside, so clients that "
                        f"alternate do not read each other's prompts again (default "
                        f"{values.PROMPT_CACHE_GB:g}; 0 = one conversation at a time)")


def _key_refused(_text: str) -> str:
    """``--api-key KEY`` is refused: every user of the machine sees a
    process's arguments (``ps``)."""
    raise argparse.ArgumentTypeError(f"a key on the command line shows in ps: set {KEY_VARIABLE} "
                                     "or pass --api-key-file FILE")


def _refuse_contradictions(args) -> None:
    """Options argparse's groups cannot express: each a usage error in the
    words argparse uses for its own groups, never one option quietly
    winning (``serve --plain --draft D`` stays: it serves a loaded pair
    plainly, for comparison)."""
    if args.command == "generate" and args.no_lookup and not args.draft:
        args.subparser.error("argument --no-lookup: only with --draft")
    if args.command == "serve" and args.plain and args.lookup:
        args.subparser.error("argument --lookup: not allowed with argument --plain")


def _refuse_past_bounds(args) -> None:
    """What one request may carry, bounded as the engine and the API bound
    it (``values.stop_strings``: their count and total length), refused as
    a usage error before any model loads. Each stop string on its own is
    checked by its option's type."""
    if args.command == "generate":
        try:
            values.stop_strings(args.stop)
        except values.BadValue as exc:
            args.subparser.error(f"argument --stop: {exc}")
        args.tools_json = _tools_file(args) if args.tools else ""


def _tools_file(args) -> str:
    """``--tools FILE`` read (a regular file, at most four times the bound
    on a request's tools, room for indentation) and checked by the rules the
    API checks ``tools`` by, as JSON text."""
    limit = 4 * int(values.LIMITS["bytes of tools"].high)
    try:
        data = records.read_file(args.tools, limit)
        return chat_rules.tools(records.parse_json(data, max_depth=chat_rules.JSON_DEPTH))
    except (OSError, records.BadRecord) as exc:
        args.subparser.error(f"argument --tools: {args.tools}: {exc}")
    except values.BadValue as exc:
        args.subparser.error(f"argument --tools: {exc}")


def _failed(exc: BaseException) -> int:
    """The one line for an error, exit status 1: a SpecChatError's own
    words, anything else named as what it is."""
    what = str(exc) if isinstance(exc, SpecChatError) else f"{type(exc).__name__}: {exc}"
    print(f"specchat: error: {what}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    """The command: exit 0, 1 with one line for an error, 2 for a usage
    error, 130 when Ctrl-C stopped it (at any point, start-up included)."""
    try:
        return _run(argv)
    except KeyboardInterrupt:
        print("specchat: interrupted", file=sys.stderr)
        return INTERRUPTED


def _run(argv: list[str] | None) -> int:
    try:
        startup.prepare()  # first: before MLX, and a bad environment value before anything
    except SpecChatError as exc:
        return _failed(exc)
    startup.temporary_files_at_home()
    applog.setup()  # once per process, here: not in library code, not in tests
    parser = build_parser()
    args = parser.parse_args(argv)
    _refuse_contradictions(args)
    _refuse_past_bounds(args)
    staging.sweep_library()  # what killed imports left: at every start, the app's too
    try:
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "cluster":
            return cluster_cmd.main(args)
        if args.command == "bench":
            if args.json_out is not None:  # refused before MLX is even imported
                bench_output.check(args.json_out)
            from specchat.tools import bench

            return bench.main(args)
        if args.command == "heads":
            return heads.main(args)
        if args.command == "models" and args.models_command == "recommend":
            return recommend.main(args)
        if args.command == "models":
            return commands.main(args)
        from specchat.ui import app

        return app.run(target=args.target, draft=args.draft, lookup=args.lookup)
    except Exception as exc:  # noqa: BLE001 - one clear line, never a traceback
        return _failed(exc)


def _request_from(args) -> tuple:
    own_head = args.draft == modes.OWN_HEAD
    mode = modes.for_pair(speculative=bool(args.lookup or args.draft),
                          has_draft=bool(args.draft) and not own_head, lookup=not args.no_lookup,
                          mtp=own_head)
    if not args.prompt.strip():
        raise EngineError("The prompt is empty: pass --prompt with some text.")
    messages = []
    if args.system:
        messages.append(Message("system", args.system))
    messages.append(Message("user", args.prompt))
    request = GenerateRequest(
        messages=tuple(messages),
        max_tokens=args.max_tokens,
        sampling=SamplingParams(args.temperature, args.top_p, args.top_k, args.seed),
        draft=DraftSettings(mode=mode.name, k=args.k, acceptance=args.acceptance),
        stop_strings=tuple(args.stop),
        tools=args.tools_json,
        reasoning_effort="none" if args.no_thinking else "",
    )
    return request, mode


def mode_text(mode: modes.Mode, pair) -> str:
    """The mode in words, naming the pair's draft (``pair``: the
    LoadedPair): a head chosen as the draft runs the draft model's modes,
    and is named as what it is."""
    if pair.draft is None or "draft model" not in mode.label:
        return mode.label
    kind = "draft head" if pair.draft_is_head else "draft model"
    return mode.label.replace("draft model", f"{kind} {pair.draft.name}")


def cmd_generate(args) -> int:
    request, mode = _request_from(args)

    def stream(ev) -> None:
        if isinstance(ev, StepEvent) and not args.json:
            sys.stdout.write(ev.text)
            sys.stdout.flush()

    client = make_client()
    # The target's own MTP head is named as the draft (modes.OWN_HEAD), so the
    # engine refuses a target without one rather than draft on without it.
    draft = args.draft if mode.needs_draft_model or "mtp" in mode.needs else None
    loading = client.load(args.target, draft)
    try:
        pair = loading.wait(on_event=None if args.json else _print_load)
    except KeyboardInterrupt:  # Ctrl-C while loading: stop it, then exit as interrupted
        _let_end(loading)
        client.close()
        raise
    job = client.generate(request)
    try:
        result = job.wait(on_event=stream)
    except KeyboardInterrupt:  # Ctrl-C: the reply ends at the next step
        job.cancel()
        result = job.wait(on_event=stream)  # the steps already made, and held-back text
    cancelled = result.summary.finish_reason == "cancelled"
    s = result.summary
    if args.json:
        out = result.to_json()
        out["compute"] = {"device": pair.compute.device, "dtype": pair.compute.dtype,
                          "blas": pair.compute.blas, "attention": pair.compute.attention,
                          # steps (and prefill chunks) at each BLAS thread count
                          "blas_threads": {str(n): c for n, c in s.blas_threads.items()}}
        out["models"] = {"target": pair.target.name,
                         "draft": pair.draft.name if pair.draft else None}
        print(json.dumps(out, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        rate = f", acceptance {s.acceptance_rate:.0%}" if s.drafted else ""
        shares = shares_text(s.tokens_by_origin)
        drafts = (f" ({mode_text(modes.get(s.mode), pair)}"
                  f"{': ' + shares if shares else ''})") if s.mode != modes.PLAIN.name else ""
        print(f"[{s.mode}] {s.new_tokens} tokens, {s.tokens_per_s:.2f} tok/s, "
              f"{s.tokens_per_step:.2f} tokens/step{rate}{drafts}, first token {s.ttft_s:.2f}s, "
              f"{pair.compute.device}/{pair.compute.dtype}/{pair.compute.blas}", file=sys.stderr)
        parts = ReplySummary.of(s).parts_line()  # a reply that reasoned: each part apart
        if parts:
            print(f"[parts] {parts}", file=sys.stderr)
        if cancelled:
            print("specchat: reply cancelled (Ctrl-C): the text above is incomplete",
                  file=sys.stderr)
    client.close()
    return INTERRUPTED if cancelled else 0


def _print_load(ev) -> None:
    """A load's progress, a line each on stderr (stdout is the reply's)."""
    if isinstance(ev, LoadProgress):
        print(f"[{ev.stage}] {ev.message}", file=sys.stderr)


def _let_end(job) -> None:
    """Cancel ``job`` and wait until the engine thread has left it, however
    it ends: a process that exits while that thread is inside MLX is
    aborted at shutdown ("terminate called without an active exception",
    SIGABRT instead of exit status 130)."""
    job.cancel()
    try:
        job.wait()
    except SpecChatError:  # "Loading cancelled.", or whatever else ended it
        pass


def serve_pair(args) -> tuple[str, str | None]:
    """The pair ``specchat serve`` loads: the one given (a target alone
    speculates without a draft model), else the built-in default pair, as
    the app."""
    if args.target or args.draft:
        return args.target or bundled.DEFAULT_TARGET, args.draft
    # --plain and --lookup never draft with a model: none is loaded (its
    # gigabytes would sit unused).
    return bundled.DEFAULT_TARGET, None if args.lookup or args.plain else bundled.DEFAULT_DRAFT


def cmd_serve(args) -> int:
    from specchat.server.listener import LocalServer, api_key_from, check_bind  # uvicorn

    key = api_key_from(args.api_key_file)
    check_bind(args.host, args.allow_remote, key)  # before minutes of loading
    target, draft = serve_pair(args)

    def activity(a) -> None:
        if a.finished is not None and a.summary is not None:
            s = a.summary
            rate = f", acceptance {s.acceptance_rate:.0%}" if s.drafted else ""
            print(f"[api] {a.request_id}: {s.new_tokens} tokens ({s.finish_reason}), "
                  f"{s.tokens_per_s:.2f} tok/s, {s.tokens_per_step:.2f} tokens/step{rate}",
                  file=sys.stderr)
        elif a.finished is not None:
            print(f"[api] {a.request_id}: {a.finished}", file=sys.stderr)

    client = make_client()
    try:
        # No draft model for the target's own MTP head (``--draft mtp``).
        pair = client.load(target, None if draft == modes.OWN_HEAD else draft).wait(
            on_event=_print_load)
        client.prompt_cache(int(args.prompt_cache_gb * values.GB)).wait()
        mode = modes.for_pair(not args.plain, pair.draft is not None, pair.speculative_ok,
                              mtp=draft == modes.OWN_HEAD)
        service = ApiService(client, Served.of(pair, mode.name, args.k, target),
                             args.max_tokens_cap or MAX_TOKENS_CAP, on_activity=activity)
        server = LocalServer(service, args.host, args.port, key, args.allow_remote,
                             cors_origins=args.cors_origin)
        print(f"SpecChat API on {server.url}: model {service.served.model!r}, "
              f"{mode_text(mode, pair)}"
              f"{', API key required' if key else ''}. Ctrl+C stops it.", file=sys.stderr)
        server.serve_forever()
        print("SpecChat API stopped.", file=sys.stderr)
    finally:
        client.close()
    return 0

