"""The core loop runs without its optional features: SSD (engine/ssd/) and
the cluster (engine/distributed/) live in folders of their own, reached only
through the drafter registry or where a cluster target loads, so a process
that cannot import either still loads a pair and decodes in every mode that
needs neither (plain decoding, the draft model, suffix matching, the
hybrid, a draft head, the target's own MTP head), replies plain decoding's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tinymodels import add_mtp, build_arch, build_eagle3

CORE_ALONE = r"""
import importlib.abc, json, sys

REFUSED = ("specchat.engine.ssd", "specchat.engine.distributed")


class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in REFUSED or name.startswith(tuple(r + "." for r in REFUSED)):
            raise ModuleNotFoundError(f"{name} is not for the core", name=name)
        return None


sys.meta_path.insert(0, Refuse())
from specchat import startup

startup.prepare()
from specchat.engine.events import DraftSettings, GenerateRequest
from specchat.engine.session import Engine

target, draft, head, mtp_target = sys.argv[1:5]
prompt = (275, 364, 311, 78, 161, 53, 376, 40) * 3
out = {}
for folders, modes in (((target, draft, head), ("plain", "draft", "hybrid", "suffix", "head",
                                                 "head+suffix")),
                       ((target, head, None), ("draft", "hybrid")),
                       ((mtp_target, "mtp", None), ("plain", "mtp", "mtp+suffix"))):
    engine = Engine()
    engine.load(folders[0], folders[1], head=folders[2])
    for mode in modes:
        r = engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=24,
                                            draft=DraftSettings(mode=mode)))
        out[f"{folders[1]}:{mode}"] = [list(r.token_ids), r.summary.drafted, r.summary.mode]
print(json.dumps({"runs": out, "optional": sorted(
    m for m in sys.modules if m.startswith(REFUSED))}))
"""


def test_the_core_decodes_without_ssd_and_the_cluster(tiny_dir, tiny_target, tiny_draft,
                                                      tiny_tokenizer):
    head = build_eagle3(tiny_dir / "eagle3-core", tiny_target)
    mtp_target = add_mtp(build_arch(tiny_dir / "qwen3_5-mtp-core", tiny_tokenizer, "qwen3_5",
                                    seed=8))
    done = subprocess.run([sys.executable, "-c", CORE_ALONE, str(tiny_target), str(tiny_draft),
                           str(head), str(mtp_target)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["optional"] == []
    runs = got["runs"]
    plain = runs[f"{tiny_draft}:plain"][0]
    mtp_plain = runs["mtp:plain"][0]
    for key, (ids, drafted, mode) in runs.items():
        assert ids == (mtp_plain if key.startswith("mtp:") else plain), key
        assert mode == key.split(":")[1], key  # each ran as asked, nothing fell back
        assert drafted > 0 or mode == "plain", key
