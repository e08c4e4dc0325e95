"""The event loop stays responsive while a reply streams: the lag monitor's
numbers, measured on the real qasync loop in a separate process."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_event_loop_lag_while_generating(tmp_path, tiny_target, tiny_draft):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", SPECCHAT_HOME=str(tmp_path / "home"))
    shot = tmp_path / "mid-reply.png"
    out = subprocess.run(
        [sys.executable, "-m", "specchat.tools.ui_probe", "--target", str(tiny_target), "--draft",
         str(tiny_draft), "--max-tokens", "1200", "--screenshot", str(shot)],
        capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    lag, summary = report["lag_ms"], report["summary"]
    print(f"\nlag while generating {summary['new_tokens']} tokens in {summary['steps']} steps "
          f"at {summary['tokens_per_s']:.0f} tok/s: {lag}")
    assert summary["new_tokens"] > 100 and lag["samples"] >= 20
    # The brief: under 50 ms. The median sample is far below; allow the
    # occasional scheduling hiccup of a shared CI machine in the maximum.
    assert lag["p95_ms"] < 50
    assert lag["max_ms"] < 250
    assert shot.exists() and shot.stat().st_size > 10_000
