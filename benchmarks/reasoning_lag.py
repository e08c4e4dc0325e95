"""The Thinking section's cost to the GUI: the window's event-loop lag while
a long reasoning streams, against a plain reply of the same length.

    QT_QPA_PLATFORM=offscreen python benchmarks/reasoning_lag.py --runs 3 \\
        --json docs/bench/reasoning-lag.json

The bundled pair cannot think, so the replies come from the scripted tiny
reasoner the UI tests use (tests/tinymodels.py: Qwen3's template, <think>
and </think> as tokens, one added token per word): with thinking on it
writes ``--thoughts`` words of reasoning, then ``--answer`` words of
answer; the plain reply is the same model with the conversation's thinking
switch off, answering ``--thoughts + --answer`` words. Each run is
``python -m specchat.tools.ui_probe`` (the real window on the real qasync
loop) in a process of its own, the two kinds alternating. A tiny model
streams far faster than a real one, so the window is busier than it ever
is with the bundled pair: the lag here is an upper bound.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "app"))


def build(folder: Path, thoughts: int, answer: int) -> Path:
    from tinymodels import build_reasoner_model, build_reasoner_tokenizer

    tok = build_reasoner_tokenizer(folder / "tok", thoughts=thoughts, answer=answer)
    return build_reasoner_model(folder / "model", tok, thoughts=thoughts, answer=answer)


def probe(model: Path, home: Path, thinking: bool, max_tokens: int) -> dict:
    cmd = [sys.executable, "-m", "specchat.tools.ui_probe", "--target", str(model),
           "--max-tokens", str(max_tokens), "--prompt", "Think it over, then answer."]
    if not thinking:
        cmd.append("--no-thinking")
    env = {**os.environ, "SPECCHAT_HOME": str(home), "PYTHONPATH": str(ROOT / "app"),
           "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen")}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise SystemExit(f"ui_probe failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--thoughts", type=int, default=1500)
    p.add_argument("--answer", type=int, default=300)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", dest="json_out")
    args = p.parse_args()
    from specchat import outputs

    if args.json_out:  # refused now, not after the run: never over a file already there
        try:
            outputs.file(args.json_out, "the report", None, "choose another --json file")
        except outputs.Refused as exc:
            sys.exit(f"{Path(__file__).name}: {exc}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="reasoning-lag-") as tmp:
        tmp = Path(tmp)
        thinker = build(tmp / "thinking", args.thoughts, args.answer)
        plain = build(tmp / "plain", 1, args.thoughts + args.answer)  # 0 thoughts: the short texts
        total = args.thoughts + args.answer + 8
        for run in range(args.runs):
            for kind, model, thinking in (("reasoning", thinker, True), ("plain", plain, False)):
                got = probe(model, tmp / f"home-{kind}-{run}", thinking, total)
                lag = got["lag_ms"]
                rows.append({"run": run, "reply": kind, "chars": got["chars"],
                             "generation_s": got["generation_s"], "lag_ms": lag,
                             "tokens": got["summary"] and got["summary"].get("tokens")})
                print(f"{kind:9} run {run}: {got['chars']} in {got['generation_s']} s, "
                      f"lag mean {lag['mean_ms']:.2f} ms p95 {lag['p95_ms']:.2f} ms "
                      f"max {lag['max_ms']:.2f} ms ({lag['samples']} samples)", flush=True)
    summary = {kind: {"p95_median_ms": statistics.median(r["lag_ms"]["p95_ms"] for r in rows
                                                         if r["reply"] == kind),
                      "max_ms": max(r["lag_ms"]["max_ms"] for r in rows if r["reply"] == kind)}
               for kind in ("reasoning", "plain")}
    print(json.dumps(summary))
    if args.json_out:
        outputs.write_json(args.json_out, {"command": " ".join(sys.argv),
                                           "machine": platform.platform(),
                                           "load_average": os.getloadavg(),
                                           "settings": vars(args), "runs": rows,
                                           "summary": summary},
                           "the report", None, "choose another --json file", indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
