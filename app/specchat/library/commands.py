"""``specchat models ...``: list, pull, import, rm, check, where (and
catalog, suggest), for people and, with ``--json``, for scripts.

``list`` and ``where`` import nothing heavier than json: no MLX, no
transformers, no huggingface_hub, so they answer at once. Progress goes to
stderr, results to stdout. ``check`` exits 0 when the pair is compatible and
1 when it is not; errors (LibraryError) are printed as one line by cli.main.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from specchat.library import bundled, hub, importing, index, paths, refs
from specchat.library.catalog import load_catalog
from specchat.library.compatibility import check, suggest_drafts
from specchat.library.errors import LibraryError
from specchat.library.units import params_text, size_text


def main(args) -> int:
    command = args.models_command
    as_json = bool(getattr(args, "json", False))
    handler = {
        "list": cmd_list, "pull": cmd_pull, "import": cmd_import, "rm": cmd_rm,
        "check": cmd_check, "where": cmd_where, "catalog": cmd_catalog, "suggest": cmd_suggest,
    }.get(command)
    if handler is None:
        raise LibraryError(f"Unknown models command {command!r}")
    return handler(args, as_json)


# -- output helpers --------------------------------------------------------------


def _print_json(data) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]
    return "\n".join(lines)


class _Reporter:
    """Progress on stderr: one rewritten line on a terminal, an occasional
    line otherwise (logs, CI)."""

    def __init__(self):
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.last_text = ""

    def __call__(self, message: str, fraction: float | None = None) -> None:
        pct = f"{fraction:6.1%} " if fraction is not None else ""
        text = f"{pct}{message}"
        now = time.monotonic()
        if self.tty:
            sys.stderr.write("\r" + text[:150].ljust(min(150, max(len(self.last_text), 1))))
            sys.stderr.flush()
            self.last_text = text
        elif now - self.last >= 2.0 or fraction in (None, 1.0):
            print(text, file=sys.stderr)
            self.last = now

    def download(self, p) -> None:
        self(p.describe(), p.fraction)

    def done(self) -> None:
        if self.tty and self.last_text:
            sys.stderr.write("\n")
            sys.stderr.flush()


# -- list / where ---------------------------------------------------------------------


def cmd_list(args, as_json: bool) -> int:
    """The index's models, and the built-in ones already prepared in
    ``<home>/bundled`` (not index entries, as in the Models dialog's
    Installed tab, so both tell the same story)."""
    models = index.list_installed()
    listed = {m.source for m in models}
    built = [b for b in bundled.prepared() if b.model.ref not in listed]
    if as_json:
        _print_json([*(_built_in_json(b) for b in built), *(m.to_json() for m in models)])
        return 0
    if not models and not built:
        print("No models installed yet. Pull a recommended one "
              "(`specchat models catalog`, `specchat models pull qwen2.5-0.5b`) or bring your "
              "own (`specchat models import PATH`).")
        return 0
    # A built-in model's GGUF weights are stored as float16 once converted
    # (gguf_import.py); reading the folder to say so would take seconds.
    rows = [[b.model.name, size_text(b.size_bytes), b.model.params, "float16",
             f"{b.model.ref} (built in)"] for b in built]
    rows += [[m.name, size_text(m.size_bytes), params_text(m.params), m.quantization or "?",
              m.source + ("  [own MTP head: --draft mtp]" if m.mtp else "")]
             for m in models]
    print(_table(rows, ["NAME", "SIZE", "PARAMS", "WEIGHTS", "SOURCE"]))
    count = len(rows)
    total = sum(b.size_bytes for b in built) + sum(m.size_bytes for m in models)
    print(f"\n{count} model{'s' if count != 1 else ''}, {size_text(total)}, "
          f"in {paths.home()}")
    return 0


def _built_in_json(b) -> dict:
    return {"name": b.model.name, "source": b.model.ref, "kind": "bundled", "path": str(b.path),
            "size_bytes": b.size_bytes, "params": None, "quantization": "float16",
            "built_in": True}


def cmd_where(args, as_json: bool) -> int:
    data = {"home": str(paths.home()), "hub_cache": str(paths.hub_cache()),
            "models": str(paths.models_dir()), "bundled": str(paths.bundled_dir()),
            "index": str(paths.index_file()), "disk_usage_bytes": paths.disk_usage()}
    if as_json:
        _print_json(data)
        return 0
    for label, key in (("library", "home"), ("downloads", "hub_cache"), ("imports", "models"),
                       ("bundled", "bundled"), ("index", "index")):
        print(f"{label:<12}{data[key]}")
    print(f"{'disk usage':<12}{size_text(data['disk_usage_bytes'])}")
    print("(set SPECCHAT_HOME to keep the library somewhere else)")
    return 0


# -- pull / import / rm -----------------------------------------------------------------


def _pull_one(ref: str, report: _Reporter, cancelled: threading.Event):
    """Pull one reference through the sources that can pull
    (``refs.pull``); returns the InstalledModel."""
    pulled = refs.pull(ref, report.download, cancelled)
    if pulled is not None:
        return pulled
    if ref.count("/") == 1 and not Path(ref).exists():
        return hub.pull("hf:" + ref, report.download, cancelled)
    raise LibraryError(
        f"Cannot pull {ref!r}: pass hf:org/repo[@revision], a catalog name or pair "
        "(`specchat models catalog`), or bundled:NAME. Local folders and .gguf files are "
        "brought in with `specchat models import`.")


def cmd_pull(args, as_json: bool) -> int:
    report = _Reporter()
    cancelled = threading.Event()
    pair = load_catalog().pair(args.ref)
    wanted = pair.refs if pair is not None else [args.ref]
    results = []
    try:
        for ref in wanted:
            results.append(_pull_one(ref, report, cancelled))
    finally:
        report.done()
    out = [r.to_json() for r in results]
    if as_json:
        _print_json(out if pair is not None else out[0])
        return 0
    for r in out:
        print(f"{r['name']}: ready ({size_text(r.get('size_bytes'))}) at {r['path']}")
    return 0


def cmd_import(args, as_json: bool) -> int:
    report = _Reporter()
    try:
        model = importing.import_path(args.path, name=args.name, progress=report)
    finally:
        report.done()
    if as_json:
        _print_json(model.to_json())
        return 0
    print(f"Imported {model.name} ({size_text(model.size_bytes)}, {params_text(model.params)} "
          f"parameters) from {args.path}")
    return 0


def cmd_rm(args, as_json: bool) -> int:
    before = paths.disk_usage()
    model = index.remove(args.name)
    if model is None:
        if as_json:
            _print_json({"removed": args.name, "path": None, "freed_bytes": 0})
        else:
            print(f"Removed the damaged entry {args.name} from the list; its files, if any, "
                  "were left where they are.")
        return 0
    freed = max(0, before - paths.disk_usage())
    if as_json:
        _print_json({"removed": model.name, "path": model.path, "freed_bytes": freed})
        return 0
    print(f"Removed {model.name}; freed {size_text(freed)}")
    return 0


# -- check / catalog / suggest ------------------------------------------------------------


def cmd_check(args, as_json: bool) -> int:
    context = getattr(args, "context", None) or 4096
    report = check(args.target, args.draft, context_tokens=context)
    if as_json:
        _print_json(report.to_json())
        return 0 if report.compatible else 1
    t, d = report.target.name, report.draft.name
    verdict = "compatible" if report.compatible else "NOT compatible"
    print(f"{d} as a draft for {t}: {verdict}")
    for reason in report.reasons:
        print(f"  - {reason}")
    if report.memory is not None:
        fits = "fits" if report.memory.fits else "does NOT fit"
        print(f"memory: {fits}: {report.memory.summary()}")
        print(f"  {report.memory.breakdown()}")
    for note in report.notes:
        print(f"note: {note}")
    return 0 if report.compatible else 1


def cmd_catalog(args, as_json: bool) -> int:
    cat = load_catalog()
    installed = {m.source for m in index.list_installed()}
    if as_json:
        out = []
        for p in cat.pairs:
            item = p.to_json()
            item["target"]["installed"] = p.target.ref in installed
            if p.draft is not None:  # None: the target's own MTP head
                item["draft"]["installed"] = p.draft.ref in installed
            out.append(item)
        _print_json(out)
        return 0
    for p in cat.pairs:
        mem = p.memory()
        state = ("bundled" if p.bundled else
                 "installed" if all(ref in installed for ref in p.refs) else
                 f"{size_text(p.download_bytes)} to download")
        print(f"{p.id}  [{state}; needs about {size_text(mem.total)} in {mem.dtype}]")
        print(f"  {p.target.name} + {p.draft_name}")
        print(f"  {p.why}")
    print("\nPull a pair with `specchat models pull TARGET+DRAFT` (the id before the brackets).")
    return 0


def cmd_suggest(args, as_json: bool) -> int:
    found = suggest_drafts(args.target)
    if as_json:
        _print_json([s.to_json() for s in found])
        return 0
    if not found:
        print(f"No compatible draft known for {args.target}: a draft needs the same "
              "tokenizer and fewer parameters. Without one, suffix matching (--lookup) still "
              "speculates.")
        return 0
    for s in found:
        print(f"{s.ref}  ({params_text(s.params)}; {s.why})")
    return 0
