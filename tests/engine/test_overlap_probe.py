"""benchmarks/overlap_probe.py runs end to end on the tiny pair (its numbers
are for the bundled pair, recorded in docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_overlap_probe_writes_its_numbers(tmp_path, tiny_target, tiny_draft):
    out = tmp_path / "overlap.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overlap_probe.py"),
                        "--target", str(tiny_target), "--draft", str(tiny_draft),
                        "--reps", "2", "--context", "32", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # in particular no abort of a thread at exit
    rep = json.loads(out.read_text())
    assert set(rep["alone"]) >= {"1"}
    for side in rep["alone"].values():
        assert set(side) == {"target_1_s", "target_verify_s", "draft_s"}
        assert all(v > 0 for v in side.values())
    for label in ("threads", "processes"):
        together = rep[f"together_{label}"]
        assert together["verify_s"] > 0 and together["draft_forwards"] >= 0
    d = rep["derived"]
    assert set(d["one_core_slowdown"]) == {"target_1_s", "target_verify_s", "draft_s"}
    assert "concurrent_slowdown_threads" in d and "concurrent_slowdown_processes" in d
    if d.get("ssd_bound_vs_spec") is not None:
        assert d["ssd_bound_vs_spec"] > 0 and d["draft_forwards_per_verify"] > 0
    assert "ssd's best case vs spec" in p.stdout or "draft forwards" in p.stdout
