"""``specchat heads train`` on the tiny target, as a person runs it: a real
process that labels text with the target, trains an EAGLE-3 head, writes it
in the published layout (loadable as a draft), resumes after SIGKILL, and
whose held-out acceptance beats the untrained head's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from specchat.engine.events import DraftSettings, GenerateRequest
from specchat.engine.session import Engine

ENGINE = Path(__file__).resolve().parents[2] / "app" / "specchat" / "engine"


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    """Text found on the machine: here, the engine's own sources."""
    folder = tmp_path_factory.mktemp("texts")
    for f in sorted(ENGINE.glob("*.py"))[:30]:
        shutil.copy(f, folder / f.name)
    return folder


def _train(target: Path, texts: Path, out: Path, home: Path, minutes: float, steps: int = 999):
    env = {**os.environ, "SPECCHAT_HOME": str(home)}
    return subprocess.Popen(
        [sys.executable, "-m", "specchat", "heads", "train", "--target", str(target),
         "--texts", str(texts), "--out", str(out), "--minutes", str(minutes), "--draft-vocab",
         "256", "--checkpoint-s", "4", "--steps", str(steps), "--json", "--no-history"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _lines(proc) -> list[dict]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.slow  # a long chi-square or training run: CI's slow step
def test_a_trained_head_drafts_resumes_after_sigkill_and_beats_the_untrained(
        tmp_path, tiny_target, texts):
    out, home = tmp_path / "head", tmp_path / "home"
    first = _train(tiny_target, texts, out, home, 5)
    for line in first.stdout:  # killed hard after its second checkpoint
        event = json.loads(line)
        if event["stage"] == "checkpoint" and event["step"] >= 2:
            killed_at = event["step"]
            first.send_signal(signal.SIGKILL)
            break
    first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    saved = json.loads((out / "specchat-training.json").read_text())
    assert saved["step"] >= killed_at - 1  # the checkpoint it wrote (atomically) is there

    until = saved["step"] + 100
    events = _lines(_train(tiny_target, texts, out, home, 10, steps=until))
    assert events[0]["resumed"] and events[-1]["stage"] == "done"
    assert events[-1]["step"] == until
    record = json.loads((out / "specchat-training.json").read_text())
    untrained, trained = record["curve"][0]["accept"], record["curve"][-1]["accept"]
    assert record["curve"][0]["tokens"] == 0 and trained[0] > untrained[0] + 0.05

    text = (out / "config.json").read_text()
    assert text.endswith("}\n")  # a text file, as the Hub's are
    config = json.loads(text)
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] <= 256
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporary left
    engine = Engine()
    assert engine.load(tiny_target, out).draft.model_type == "eagle3"
    prompt = (275, 364, 311, 78, 161, 53, 376, 40) * 3
    plain = engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=32,
                                            draft=DraftSettings(mode="plain")))
    spec = engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=32,
                                           draft=DraftSettings(mode="draft", k=3)))
    assert spec.token_ids == plain.token_ids and spec.summary.drafted > 0


@pytest.mark.slow  # a long run: CI's slow step keeps the default run under 15 minutes
def test_training_another_target_into_the_same_folder_is_refused(tmp_path, tiny_target,
                                                                tiny_qwen_target, texts):
    out, home = tmp_path / "head", tmp_path / "home"
    _lines(_train(tiny_target, texts, out, home, 0.1))
    proc = _train(tiny_qwen_target, texts, out, home, 0.1)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert "holds a head trained for another target" in err


def test_a_request_is_learnt_from_with_the_targets_own_reply(tmp_path, tiny_target, texts):
    """A sample that ends in a user turn is a request: its piece is the
    prompt and exactly the target's greedy reply (what the head will draft
    through), and a run on requests alone writes a head."""
    from specchat.engine import chat, eagle3_format, head_training
    from specchat.engine.events import Message, TrainPlan
    from specchat.library import trained_heads

    requests = trained_heads.request_chats([texts], 12)
    assert len(requests) == 12 and all(len(r) == 1 and r[0].role == "user" for r in requests)
    assert requests[0][0].content.startswith("Explain what this code does.\n\n```python\n")
    engine = Engine()
    engine.load(tiny_target)
    history = ((Message("user", "a chat whose reply never came"),),)  # text, not a request
    plan = TrainPlan(samples=history, requests=tuple(requests), out=str(tmp_path / "head"),
                     minutes=5, draft_vocab=256, reply_tokens=24, max_steps=3, held_pieces=1,
                     held_out=0.2, checkpoint_s=999, seq_len=4096)
    trainer = head_training._Trainer(engine, plan)
    assert isinstance(trainer.held[0], head_training._Request)  # the measure reads replies
    assert sum(isinstance(p, head_training._Request) for p in trainer.train + trainer.held) == 12
    request = next(p for p in trainer.train if isinstance(p, head_training._Request))
    prompt = list(request.prompt)
    assert tuple(chat.render(engine.target.tokenizer, requests[0])) in {
        p.prompt for p in trainer.train + trainer.held if isinstance(p, head_training._Request)}
    reply = engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=24,
                                            draft=DraftSettings(mode="plain"))).token_ids
    # Counted from the row that drafts the reply's second token.
    assert trainer.piece(request) == ([*prompt, *reply], len(prompt) - 1) and len(reply) > 1
    record = head_training.train(engine, plan, lambda _p: None)
    # Three updates label at least one whole request (which one depends on
    # the shuffle and on the texts): its prompt and its whole reply, which
    # is the full reply_tokens here (the tiny target has no end token).
    assert len(reply) == plan.reply_tokens
    shortest = min(len(p.prompt) for p in trainer.train if isinstance(p, head_training._Request))
    assert record["step"] == 3 and record["tokens"] >= shortest + plan.reply_tokens - 1
    # What it writes passes the one check of a head's files (the engine's and the library's).
    written = eagle3_format.read(tmp_path / "head")
    assert written.config.layer_ids == eagle3_format.default_layer_ids(6)


def test_the_budget_starts_after_the_held_out_pieces_are_labelled(tmp_path, tiny_target, texts,
                                                                  monkeypatch):
    """Labelling the held-out pieces takes minutes on a large target; it
    comes first and outside the budget, so a short budget still trains. A
    budget that ends before the first update saves nothing and says so,
    and a run that goes on from a checkpoint says so before it starts."""
    import time

    from specchat.engine import head_training
    from specchat.engine.events import TrainPlan
    from specchat.library import trained_heads

    engine = Engine()
    engine.load(tiny_target)
    samples = tuple(trained_heads.file_chats([texts], 200_000))
    label_held = head_training._Trainer.label_held

    def slow(self):  # as if each held-out piece took a large target's forward
        if not hasattr(self, "_held"):
            label_held(self)
            time.sleep(6)

    monkeypatch.setattr(head_training._Trainer, "label_held", slow)

    def run(out, minutes, steps=None):
        events = []
        plan = TrainPlan(samples=samples, out=str(out), minutes=minutes, draft_vocab=256,
                         max_steps=steps, held_pieces=1, checkpoint_s=999)
        return head_training.train(engine, plan, events.append), events

    record, events = run(tmp_path / "head", 0.1, steps=2)
    assert [e.stage for e in events][:2] == ["preparing", "measuring"]
    assert "before the 0.1-minute budget starts" in events[1].message
    assert record["step"] == 2 and trained_heads.can_resume(tmp_path / "head")

    record, events = run(tmp_path / "head", 1.0, steps=3)
    assert events[0].resumed and events[0].message.startswith(
        f"going on from the checkpoint in {tmp_path / 'head'}: step 2, ")
    assert record["step"] == 3

    record, events = run(tmp_path / "none", 0.0)
    assert record["step"] == 0 and not trained_heads.can_resume(tmp_path / "none")
    assert not (tmp_path / "none" / "model.safetensors").exists()
    assert events[-1].stage == "done" and events[-1].message == (
        "the 0-minute budget ended before the first update; give it more minutes; "
        "nothing was saved")
