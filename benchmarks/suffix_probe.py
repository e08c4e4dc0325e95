"""The suffix index's bounds, measured: memory for a million tokens of
history, the cost of an update per streamed token, and of a query.

    .venv/bin/python benchmarks/suffix_probe.py TOKENIZER_JSON [--tokens 1000000] [--json OUT]

The corpus is real text tokenized with a real tokenizer (the bundled Qwen
one: ``<home>/bundled/qwen2.5-coder-1.5b/tokenizer.json``): the Python
standard library's sources and docstrings, cut into conversations of about
2,000 tokens. Only the tokenizer is loaded, no model. Numbers go in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from specchat.engine.history import History  # noqa: E402
from specchat.engine.suffix import SuffixDrafter  # noqa: E402
from specchat.engine.suffix_index import SuffixIndex  # noqa: E402


def corpus(tokenizer_json: str, tokens: int) -> list[np.ndarray]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_json)
    lib = Path(sysconfig.get_paths()["stdlib"])
    docs, total = [], 0
    for path in sorted(lib.rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = tok.encode(text).ids
        for i in range(0, len(ids), 2000):
            docs.append(np.asarray(ids[i:i + 2000], dtype=np.int32))
            total += docs[-1].size
            if total >= tokens:
                return docs
    return docs


def percentiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"mean_us": statistics.fmean(xs) * 1e6, "p50_us": xs[len(xs) // 2] * 1e6,
            "p99_us": xs[int(len(xs) * 0.99)] * 1e6, "max_us": xs[-1] * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer")
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--json")
    args = ap.parse_args()
    docs = corpus(args.tokenizer, args.tokens)
    n = sum(d.size for d in docs)
    out: dict = {"tokens": n, "conversations": len(docs)}

    # Building the history index from the store (one sort), and its memory.
    h = History()
    tracemalloc.start()
    t0 = time.perf_counter()
    h._rebuild({str(i): d for i, d in enumerate(docs)}, {})
    out["build_s"] = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out["index_bytes"] = h.index.nbytes
    out["build_peak_bytes"] = peak
    print(f"{n:,} tokens in {len(docs)} conversations: built in {out['build_s']:.2f} s, "
          f"index {h.index.nbytes / 2**20:.1f} MB, peak while building {peak / 2**20:.1f} MB")

    # A reply streaming into the conversation index, token by token.
    conv = SuffixIndex(tail=1024)
    conv.extend(docs[0][:1000])
    stream = np.concatenate(docs[1:6])[:8000]
    times = []
    for t in stream:
        t0 = time.perf_counter()
        conv.extend([int(t)])
        times.append(time.perf_counter() - t0)
    out["conversation_update"] = percentiles(times)
    # Finished replies joining the 1M-token history (a 300-token reply each).
    times = []
    for i in range(40):
        reply = docs[(i * 7) % len(docs)][:300]
        t0 = time.perf_counter()
        h.put(f"new{i}", reply)
        times.append((time.perf_counter() - t0) / reply.size)
    out["history_update_per_token"] = percentiles(times)
    print("update per streamed token (conversation):", {k: round(v, 1) for k, v in
                                                        out["conversation_update"].items()})
    print("update per token (a finished reply joining the history):",
          {k: round(v, 1) for k, v in out["history_update_per_token"].items()})

    # A drafting query: both corpora, the continuation scored.
    d = SuffixDrafter(history=h)
    rng = np.random.default_rng(0)
    times = []
    for _ in range(300):
        doc = docs[int(rng.integers(len(docs)))]
        cut = int(rng.integers(40, max(41, doc.size)))
        ctx = doc[max(0, cut - 600):cut].tolist()
        d.prepare(ctx)
        t0 = time.perf_counter()
        d.candidates(ctx, 24)
        times.append(time.perf_counter() - t0)
    out["query"] = percentiles(times)
    print("query (conversation + history):", {k: round(v, 1) for k, v in out["query"].items()})
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
