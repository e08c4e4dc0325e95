"""``specchat heads train``: train an EAGLE-3 draft head for a target here.

What it learns from (engine/head_training.py labels it with the target):
the person's conversations from the history, and text found on this
machine (the documentation and source files of the installed Python
packages, or the folders given with ``--texts``), each placed in the
target's chat template as a request and its answer.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

from specchat.engine.events import TrainPlan, TrainProgress
from specchat.library import trained_heads
from specchat.tools.history import read_history


def add_parser(sub, model_ref, value, existing) -> None:
    """cli.py's argparse types: ``value(name)`` for one of
    ``specchat.values``' entries, so each number is refused in the table's
    words; ``existing`` for a file or folder that must be there."""
    h = sub.add_parser("heads", help="draft heads: train an EAGLE-3 head for a target here")
    hsub = h.add_subparsers(dest="heads_command", required=True)
    t = hsub.add_parser("train", help="train (or go on training) a head for TARGET")
    t.add_argument("--target", required=True, type=model_ref, help="the target model")
    t.add_argument("--minutes", type=value("minutes"), default=60.0,
                   help="this run's time budget; a resumed run trains this much more (default 60)")
    t.add_argument("--out", help="the head's folder (default: in the model library): a new or "
                                 "empty one, or that of a head trained here, which a run that "
                                 "was stopped or killed goes on from; nothing else is written into")
    t.add_argument("--restart", action="store_true",
                   help="start over in --out instead of going on from its checkpoint (one that "
                        "is damaged, or for another target); it is replaced at the first save")
    t.add_argument("--texts", action="append", type=existing, metavar="PATH",
                   help="folders or files of text to learn from (default: the installed "
                        "packages' documentation and sources); repeatable")
    t.add_argument("--max-chars", type=value("text characters"), default=4_000_000,
                   help="at most this much text from files")
    t.add_argument("--replies", type=value("replies"), default=0, metavar="N",
                   help="also N requests made from excerpts of the texts, which the target "
                        "answers itself (each reply costs its decoding time, but is what "
                        "the head drafts through)")
    t.add_argument("--reply-tokens", type=value("reply tokens"), default=192,
                   help="the longest reply the target writes to one request (default 192)")
    t.add_argument("--no-history", action="store_true", help="leave your conversations out")
    t.add_argument("--draft-vocab", type=value("draft vocabulary"), default=8192,
                   help="the ids the head proposes from: the text's most frequent (default 8192)")
    t.add_argument("--steps", type=value("updates"),
                   help="stop after this many updates in all (a resumed run's included), too")
    t.add_argument("--checkpoint-s", type=value("checkpoint seconds"), default=120.0,
                   help="seconds between checkpoints (each measures held-out acceptance)")
    t.add_argument("--held-out", type=value("held-out pieces"), default=16, metavar="PIECES",
                   help="held-out pieces the acceptance is measured on (default 16)")
    t.add_argument("--seed", type=value("seed"), default=0,
                   help="any integer (folded into 64 bits; default 0)")
    t.add_argument("--json", action="store_true", help="machine-readable output")


# The command line's words for TrainPlan.restart_how, and for where to train instead.
RESTART = "run the same command with --restart"
ELSEWHERE = "give --out a new or empty folder, or that of a head trained here"


def main(args) -> int:
    from specchat.engine.errors import EngineError
    from specchat.library.engine_link import make_client
    from specchat.library.errors import LibraryError

    # First, before anything is read: a folder that is not the head's own is refused.
    out = trained_heads.head_folder(
        args.out if args.out is not None else trained_heads.default_out(args.target), ELSEWHERE)
    chats = [] if args.no_history else trained_heads.corpus_chats(  # the person's chats
        read_history(lambda store: store.corpus(), "training on files only") or [], 10_000)
    texts = [Path(t) for t in args.texts] if args.texts else trained_heads.default_texts()
    chats += trained_heads.file_chats(texts, args.max_chars)
    plan = TrainPlan(samples=tuple(chats), out=str(out), minutes=args.minutes,
                     draft_vocab=args.draft_vocab, seed=args.seed,
                     checkpoint_s=args.checkpoint_s, max_steps=args.steps,
                     held_pieces=args.held_out, reply_tokens=args.reply_tokens,
                     requests=tuple(trained_heads.request_chats(texts, args.replies)),
                     restart=args.restart, restart_how=RESTART)

    def report(p) -> None:
        acc = " ".join(f"{a:.0%}" for a in p.accept)
        line = {"stage": p.stage, "step": p.step, "tokens": p.tokens,
                "elapsed_s": round(p.elapsed_s, 1), "loss": p.loss, "accept": list(p.accept),
                "resumed": p.resumed, "message": p.message}
        if args.json:
            print(json.dumps(line), flush=True)
        elif p.stage not in ("training", "labelling") or p.accept or (
                p.stage == "training" and p.step % 20 == 0):
            extra = f", held-out acceptance by position {acc}" if acc else ""
            loss = f", loss {p.loss:.3f}" if p.loss is not None else ""
            note = f" ({p.message})" if p.message else ""
            print(f"[{p.stage}] step {p.step}, {p.tokens:,} tokens, {p.elapsed_s / 60:.1f} of "
                  f"{p.budget_s / 60:g} min{loss}{extra}{note}", file=sys.stderr, flush=True)

    client = make_client()
    stopped, job = threading.Event(), None

    def stop(*_args) -> None:  # Ctrl-C: the load, or the run at its next step (checkpoint kept)
        stopped.set()
        if job is not None:
            job.cancel()

    old = signal.signal(signal.SIGINT, stop)
    try:
        job = client.load(args.target)
        job.wait()
        if stopped.is_set():
            raise EngineError("Stopped before training began; nothing was saved.")
        job = client.train_head(plan)
        if stopped.is_set():
            job.cancel()
        record = job.wait(on_event=lambda ev: report(ev) if isinstance(ev, TrainProgress)
                          else None)
        if not trained_heads.can_resume(out):
            if stopped.is_set():
                print("specchat: training stopped before the first update; nothing was saved",
                      file=sys.stderr)
                return 130
            print(f"specchat: error: the {args.minutes:g}-minute budget ended before the first "
                  "update; nothing was saved. Run again with more --minutes.", file=sys.stderr)
            return 1
        trained_heads.list_trained(out, args.target)
    except (EngineError, LibraryError) as exc:
        print(f"specchat: error: {exc}", file=sys.stderr)
        return 130 if stopped.is_set() else 1
    finally:
        signal.signal(signal.SIGINT, old)
        client.close()
    last = record["curve"][-1] if record.get("curve") else {}
    print(f"The head is in {out} ({record['tokens']:,} tokens labelled by the target); draft with it: "
          f"--draft {out}" + (". Held-out acceptance by position: "
                              + ", ".join(f"{a:.0%}" for a in last.get("accept", [])) if last
                              else ""), file=sys.stderr)
    if stopped.is_set():
        print("specchat: training stopped (Ctrl-C); run the same command to go on from the "
              "checkpoint", file=sys.stderr)
        return 130
    return 0
