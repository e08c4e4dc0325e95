"""``specchat models recommend --target T``: the installed drafts measured
for T on this machine, fastest first, and the incompatible ones with the
reason.

The search itself is the library's (library/draft_search.py), shared with
the pair picker's "Find the best draft"; this is its terminal face: the
sample from the person's history (read-only, the app may be open), progress
lines on stderr, Ctrl-C to cancel (a second one stops at once), and the
ranking on stdout (``--json`` for scripts).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time

from specchat.library import draft_search
from specchat.library import recommendations as rec
from specchat.library.engine_link import make_client
from specchat.library.recommendations import Recommendation
from specchat.tools.history import read_history


def history_prompts(n: int) -> list[str]:
    """The person's ``n`` most recent prompts (none when there is no history yet)."""
    def newest(store) -> list[str]:
        chats = ([(m.role, m.content) for m in store.messages(c.id)] for c in store.list())
        return rec.recent_prompts(chats, n)

    return read_history(newest, "using built-in prompts") or []


class _Lines:
    """Progress on stderr, a line each; a load's messages at most once a
    second (converting a model reports every percent)."""

    def __init__(self) -> None:
        self.last = ""
        self.at = 0.0

    def __call__(self, p: draft_search.SearchProgress) -> None:
        now = time.monotonic()
        loading = p.message.startswith("Loading the ")
        if p.message == self.last or (loading and self.last.startswith("Loading the ")
                                      and now - self.at < 1.0):
            return
        self.last, self.at = p.message, now
        print(f"[{p.fraction:4.0%}] {p.message}", file=sys.stderr, flush=True)


def _cancel_on_ctrl_c(cancelled: threading.Event):
    """The first Ctrl-C asks the search to stop after the current step (what
    was measured stays remembered); the handler is then the default again,
    so a second one stops at once. Returns the handler to put back."""

    def first(_sig, _frame) -> None:
        cancelled.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("cancelling after this step (Ctrl-C again to stop at once)", file=sys.stderr,
              flush=True)

    try:
        return signal.signal(signal.SIGINT, first)
    except ValueError:  # not the main thread: Ctrl-C is not ours to catch
        return None


def format_report(r: Recommendation) -> str:
    """The ranking as a table, the refused drafts with their reasons, and
    what to run."""
    lines = [f"Drafts for {r.target} on {r.machine}, measured on {r.sample.describe()}:", ""]
    if r.ranked:
        rows = [["#", "DRAFT", "MEASURED", "PREDICTED", "ACCEPTANCE", "DRAFT COST", "TOK/S"]]
        for i, d in enumerate(r.ranked, 1):
            rows.append([
                str(i), d.name + ("" if d.name == d.draft else f" ({d.draft})"),
                f"{d.measured_speedup:.2f}×",
                f"{d.predicted_speedup:.2f}× (K={d.best_k})" if d.predicted_speedup else "-",
                f"{d.acceptance:.0%}" if d.acceptance is not None else "-",
                f"{d.draft_cost:.2f}", f"{d.tokens_per_s:.1f}"
                + (f"  remembered from {d.measured_at}" if d.remembered else "")])
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                  for row in rows]
        plain = {d.plain_tokens_per_s for d in r.ranked if not d.remembered}
        if plain:
            lines.append(f"  plain decoding: {next(iter(plain)):.1f} tok/s")
    else:
        lines.append("  No draft was measured.")
    if r.refused:
        lines += ["", "Not measured:"]
        lines += [f"  {x.name}" + ("" if x.name == x.draft else f" ({x.draft})") + f": {x.reason}"
                  for x in r.refused]
    lines.append("")
    if r.cancelled:
        left = len(r.not_measured)
        lines.append(f"Cancelled: {left} draft{'s' if left != 1 else ''} not measured.")
    if r.best is not None:
        lines.append(f"Best: {r.best.draft}, {r.best.measured_speedup:.2f}× plain decoding here."
                     f" Use it: specchat --target {r.target} --draft {r.best.draft}")
    elif r.ranked:
        lines.append("No draft beats plain decoding on this machine; prompt lookup "
                     "(--lookup) needs no draft model.")
    elif not r.cancelled:
        lines.append(f"No installed draft could be measured; `specchat models suggest "
                     f"{r.target}` lists drafts that fit it.")
    if any(d.remembered for d in r.ranked):
        lines.append("Remembered results were reused; --again measures them anew.")
    return "\n".join(lines)


def main(args) -> int:
    sample = rec.Sample.choose(history_prompts(args.prompts), args.prompts)
    cancelled = threading.Event()
    previous = _cancel_on_ctrl_c(cancelled)
    client = make_client()
    try:
        result = draft_search.search(client, args.target, sample, drafts=args.draft or None,
                                     again=args.again, max_tokens=args.max_tokens,
                                     cancelled=cancelled, progress=_Lines())
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        client.close()
    if getattr(args, "json", False):
        print(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
    else:
        print(format_report(result))
    return 130 if result.cancelled else 0
