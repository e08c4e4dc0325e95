"""Do the sampling tests catch a broken engine? Run them against copies of
the package with one deliberate defect each, and list which tests fail.

    .venv/bin/python tests/engine/mutants.py            # every mutant
    .venv/bin/python tests/engine/mutants.py residual   # one

Not part of the test run (it runs the sampling tests once per mutant, a few
minutes each). The tree is never modified: each mutant is a patched copy of
app/specchat in a temporary folder, put first on PYTHONPATH.

Last run (2026-11-23), every mutant caught; failing tests per mutant:

- residual: test_one_step_with_sampled_drafts_has_the_exact_outcome_distribution
  [3] and [5], test_a_whole_block_of_three_and_its_bonus_follow_the_target,
  test_pruned_draft_head_samples_follow_the_target,
  test_a_wider_draft_samples_follow_the_target.
- bonus-row: the same five, plus
  test_one_step_with_a_fixed_proposal_has_the_exact_outcome_distribution and
  test_speculative_samples_follow_the_target[draft-None-...].
- temperature-first: 17 of the 36 test_processed_distribution_matches_the_reference
  cases (those with top-p below 1 and a temperature other than 1, but for
  T1.6-p0.9-k3, where top-k decides alone), and
  test_speculative_samples_follow_the_target[draft-None-...].
- wide-draft-ids: test_a_wider_draft_only_proposes_ids_the_target_has,
  test_a_wider_draft_samples_follow_the_target.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# name -> (file under app/specchat, exact text, replacement, what it breaks)
MUTANTS = {
    "residual": (
        "engine/acceptance.py",
        "residual = mx.maximum(p[:k] - q_probs, 0.0)",
        "residual = p[:k]",
        "after a rejection, sample from p instead of norm(max(0, p - q))",
    ),
    "bonus-row": (
        "engine/acceptance.py",
        "dist = mx.concatenate([residual, p[k:k + 1]], axis=0)[n]",
        "dist = mx.concatenate([residual, p[k - 1:k]], axis=0)[n]",
        "when every draft is accepted, draw the bonus from the last draft position's row",
    ),
    "temperature-first": (
        "engine/sampling.py",
        "    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)\n",
        "    if params.temperature > 0 and params.temperature != 1.0:\n"
        "        logits = logits * (1.0 / params.temperature)\n"
        "    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)\n"
        "    params = type(params)(1.0, params.top_p, params.top_k, params.seed)\n",
        "apply temperature before top-p and top-k instead of after",
    ),
    "wide-draft-ids": (
        "engine/draft_model.py",
        "return out[..., :self.vocab] if out.shape[-1] > self.vocab else out",
        "return out",
        "let a draft with a wider output layer propose ids the target lacks",
    ),
}

TESTS = ["tests/engine/test_engine_sampling.py"]


def run(name: str) -> list[str]:
    rel, old, new, _ = MUTANTS[name]
    with tempfile.TemporaryDirectory(prefix=f"mutant-{name}-") as tmp:
        pkg = Path(tmp) / "specchat"
        shutil.copytree(ROOT / "app" / "specchat", pkg,
                        ignore=shutil.ignore_patterns("__pycache__"))
        target = pkg / rel
        text = target.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"{name}: the text to mutate is not in {rel} exactly once; "
                             "update tests/engine/mutants.py")
        target.write_text(text.replace(old, new))
        env = dict(os.environ, PYTHONPATH=tmp + os.pathsep + os.environ.get("PYTHONPATH", ""))
        probe = subprocess.run([sys.executable, "-c", "import specchat; print(specchat.__file__)"],
                               env=env, capture_output=True, text=True, check=True)
        assert probe.stdout.strip().startswith(tmp), probe.stdout
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "-rf", *TESTS], cwd=ROOT, env=env, capture_output=True, text=True)
    return sorted(set(re.findall(r"^FAILED (\S+)", out.stdout, re.M)))


def main(names: list[str]) -> int:
    missed = []
    for name in names or list(MUTANTS):
        failed = run(name)
        print(f"{name} ({MUTANTS[name][3]}): {len(failed)} failing test(s)")
        for f in failed:
            print(f"    {f.split('::', 1)[1]}")
        if not failed:
            missed.append(name)
    if missed:
        print("NOT CAUGHT: " + ", ".join(missed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
