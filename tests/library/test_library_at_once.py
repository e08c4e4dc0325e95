"""Processes writing one file of the library at once (issue 47): each
keeps what the others wrote."""

from __future__ import annotations

import json
import sys

from atonce import run_at_once
from libtools import specchat_env

REMEMBER = """
import sys
from pathlib import Path
from specchat.library import hub_files
for blob in sys.argv[1:]:
    hub_files.remember(Path(blob))
"""


def test_blobs_checked_by_processes_at_once_are_all_remembered(tmp_path, lib_home):
    """The records of checked files are read, changed and written back by
    every pull: four pulls at once keep each other's records."""
    blobs = lib_home / "hub" / "models--o--r" / "blobs"
    blobs.mkdir(parents=True)
    for i in range(100):
        (blobs / f"{i:040x}").write_bytes(b"x%d" % i)
    groups = [sorted(blobs.iterdir())[k::4] for k in range(4)]
    env = specchat_env(tmp_path, lib_home)
    runs = run_at_once([[sys.executable, "-c", REMEMBER, *map(str, g)] for g in groups], env)
    assert [r.returncode for r in runs] == [0] * 4, [r.stderr for r in runs]
    kept = json.loads((lib_home / "hub-verified.json").read_text())
    assert len(kept) == 100
