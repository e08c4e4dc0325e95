"""``specchat heads train`` on the tiny target, as a person runs it: a real
process that labels text with the target, trains an EAGLE-3 head, writes it
in the published layout (loadable as a draft), resumes after SIGKILL, and
whose held-out acceptance beats the untrained head's."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from specchat.engine.events import DraftSettings, GenerateRequest, TrainPlan
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
    # The split hashes each prompt's ids (a resumed run splits the same
    # way), and the prompts are excerpts of whatever the texts are: hold out
    # just the request whose hash is lowest, whichever it is.
    share = min(hashlib.sha256(json.dumps(chat.render(engine.target.tokenizer, r)).encode())
                .digest()[0] for r in requests) / 256 + 1 / 512
    plan = TrainPlan(samples=history, requests=tuple(requests), out=str(tmp_path / "head"),
                     minutes=5, draft_vocab=256, reply_tokens=24, max_steps=3, held_pieces=1,
                     held_out=share, checkpoint_s=999, seq_len=4096)
    trainer = head_training.Trainer(engine, plan)
    assert isinstance(trainer.held[0], head_training.Request)  # the measure reads replies
    assert sum(isinstance(p, head_training.Request) for p in trainer.train + trainer.held) == 12
    request = next(p for p in trainer.train if isinstance(p, head_training.Request))
    prompt = list(request.prompt)
    assert tuple(chat.render(engine.target.tokenizer, requests[0])) in {
        p.prompt for p in trainer.train + trainer.held if isinstance(p, head_training.Request)}
    reply = engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=24,
                                            draft=DraftSettings(mode="plain"))).token_ids
    # Counted from the row that drafts the reply's second token.
    assert trainer.piece(request) == ([*prompt, *reply], len(prompt) - 1) and len(reply) > 1
    trainer.release()  # the folder is one run's at a time
    record = head_training.train(engine, plan, lambda _p: None)
    # Three updates label at least one whole request (which one depends on
    # the shuffle and on the texts): its prompt and its whole reply, which
    # is the full reply_tokens here (the tiny target has no end token).
    assert len(reply) == plan.reply_tokens
    shortest = min(len(p.prompt) for p in trainer.train if isinstance(p, head_training.Request))
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
    label_held = head_training.Trainer.label_held

    def slow(self):  # as if each held-out piece took a large target's forward
        if not hasattr(self, "_held"):
            label_held(self)
            time.sleep(6)

    monkeypatch.setattr(head_training.Trainer, "label_held", slow)

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

    # A budget of 0 is refused (values.py); one far shorter than a forward
    # ends before the first update.
    record, events = run(tmp_path / "none", 1e-9)
    assert record["step"] == 0 and not trained_heads.can_resume(tmp_path / "none")
    assert not (tmp_path / "none").exists()
    assert events[-1].stage == "done" and events[-1].message == (
        "the 1e-09-minute budget ended before the first update; give it more minutes; "
        "nothing was saved")


# -- the head's folder, and the checkpoint read back (issue 47) -------------------------

RESTART = "run it again with restart"


def _plan(texts: Path, out: Path, steps: int, restart: bool = False) -> TrainPlan:
    from specchat.library import trained_heads

    return TrainPlan(samples=tuple(trained_heads.file_chats([texts], 60_000)), out=str(out),
                     minutes=1, draft_vocab=64, max_steps=steps, held_pieces=1,
                     checkpoint_s=999, restart=restart, restart_how=RESTART)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_target, texts) -> tuple[Engine, Path]:
    """The tiny target loaded, and a head's checkpoint after 2 updates."""
    from specchat.engine import head_training

    engine = Engine()
    engine.load(tiny_target)
    out = tmp_path_factory.mktemp("checkpoint") / "head"
    head_training.train(engine, _plan(texts, out, 2), lambda _p: None)
    return engine, out


def _snapshot(folder: Path) -> dict[str, object]:
    """Each file's bytes; what is not a regular file, by what it is (a
    named pipe is never opened)."""
    return {p.name: p.read_bytes() if p.is_file() and not p.is_symlink()
            else ("link", os.readlink(p)) if p.is_symlink() else stat.S_IFMT(p.lstat().st_mode)
            for p in sorted(folder.iterdir())}


def test_the_engine_trains_into_no_folder_but_the_head_s_own(tmp_path, trained, texts,
                                                              tiny_draft):
    """Whoever calls it (the window, the command line): a model folder is
    refused before anything is read, and a folder swapped for a link to one
    while the run goes is refused at its checkpoint, nothing written into
    it."""
    from specchat.engine import head_training
    from specchat.engine.errors import EngineError

    engine, _ = trained
    model = shutil.copytree(tiny_draft, tmp_path / "model")
    before = _snapshot(model)
    with pytest.raises(EngineError, match="Will not write the head at .*holds files this "
                                          "command did not write"):
        head_training.train(engine, _plan(texts, model, 2), lambda _p: None)
    assert _snapshot(model) == before

    # Once the run has taken its folder, something else in its place: a
    # link to the model, a new empty folder, a file. Nothing is written
    # through it, and the run says so at its checkpoint.
    swaps = {"a link to a model": (lambda out: out.symlink_to(model),
                                   "Will not write the head at .*is a symbolic link"),
             "another folder": (lambda out: out.mkdir(), "was removed or replaced while"),
             "a file": (lambda out: out.write_text("mine"), "Will not write the head at .*is "
                                                              "a file, not a folder")}
    for name, (put, said) in swaps.items():
        out = tmp_path / name.replace(" ", "-")

        def swap(progress, out=out, put=put) -> None:
            if progress.stage == "measuring" and out.is_dir() and not out.is_symlink():
                out.rmdir()
                put(out)

        with pytest.raises(EngineError, match=said):
            head_training.train(engine, _plan(texts, out, 2), swap)
        assert _snapshot(model) == before
        assert not out.is_dir() or out.is_symlink() or not any(out.iterdir()), name


def _state_edit(change):
    def damage(folder: Path, vocab: int) -> None:
        path = folder / "specchat-training.json"
        state = json.loads(path.read_text())
        change(state, vocab)
        path.write_text(json.dumps(state))
    return damage


def _text(name: str, text: str):
    def damage(folder: Path, _vocab: int) -> None:
        (folder / name).write_text(text)
    return damage


def _cut(name: str):
    def damage(folder: Path, _vocab: int) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[:len(data) // 2])
    return damage


def _tensors(name: str, change):
    def damage(folder: Path, _vocab: int) -> None:
        import mlx.core as mx

        tensors = dict(mx.load(str(folder / name)))
        change(tensors)
        mx.save_safetensors(str(folder / name), tensors)
    return damage


def _replace(name: str, put):
    def damage(folder: Path, _vocab: int) -> None:
        (folder / name).unlink()
        put(folder / name)
    return damage


def _setitem(key, value):
    return lambda d, _vocab: d.__setitem__(key, value)


DAMAGE = {  # what is wrong -> (how it is made, the file the message names)
    "a draft id equal to the vocabulary size": (_state_edit(
        lambda s, vocab: s["draft_ids"].__setitem__(-1, vocab)), "specchat-training.json"),
    "a draft id below 0": (_state_edit(lambda s, _v: s["draft_ids"].__setitem__(0, -1)),
                           "specchat-training.json"),
    "a draft id twice": (_state_edit(lambda s, _v: s["draft_ids"].__setitem__(
        1, s["draft_ids"][0])), "specchat-training.json"),
    "draft ids out of order": (_state_edit(lambda s, _v: s["draft_ids"].reverse()),
                               "specchat-training.json"),
    "no draft ids": (_state_edit(_setitem("draft_ids", [])), "specchat-training.json"),
    "more draft ids than the vocabulary": (_state_edit(
        lambda s, vocab: s.__setitem__("draft_ids", list(range(vocab + 1)))),
        "specchat-training.json"),
    "a draft id that is text": (_state_edit(lambda s, _v: s["draft_ids"].__setitem__(0, "1")),
                                "specchat-training.json"),
    "a step below 0": (_state_edit(_setitem("step", -1)), "specchat-training.json"),
    "a step that is not whole": (_state_edit(_setitem("step", 2.5)), "specchat-training.json"),
    "a cursor that is text": (_state_edit(_setitem("cursor", "3")), "specchat-training.json"),
    "a time that is not a number": (_state_edit(_setitem("elapsed_s", float("nan"))),
                                    "specchat-training.json"),
    "an acceptance past 1": (_state_edit(_setitem("curve", [{"tokens": 1, "accept": [2.0]}])),
                             "specchat-training.json"),
    "a curve point that is text": (_state_edit(_setitem("curve", ["x"])),
                                   "specchat-training.json"),
    "nesting too deep to read": (_text("specchat-training.json", "[" * 100_000 + "]" * 100_000),
                                 "specchat-training.json"),
    "no JSON": (_text("specchat-training.json", "{"), "specchat-training.json"),
    "a list, not a record": (_text("specchat-training.json", "[]"), "specchat-training.json"),
    "a cut-short head": (_cut("model.safetensors"), "model.safetensors"),
    "a head without one of its tensors": (_tensors("model.safetensors", lambda t: t.pop(
        "fc.weight")), "model.safetensors"),
    "a head of another width": (_tensors("model.safetensors", lambda t: t.__setitem__(
        "fc.weight", t["fc.weight"][:, :8])), "model.safetensors"),
    "a head of another run": (_tensors("model.safetensors", lambda t: t.__setitem__(
        "d2t", t["d2t"] + 1)), "model.safetensors"),
    # Not a regular file, or not there though the state says a head was
    # saved: the run started over silently (writing over the training the
    # state stood for), ignored the optimizer, or failed on an internal
    # error writing over a folder.
    "a head that is a named pipe": (_replace("model.safetensors", os.mkfifo),
                                    "model.safetensors"),
    "no head, though updates were made": (_replace("model.safetensors", lambda _p: None),
                                          "model.safetensors"),
    "a head that is a link to nothing": (_replace("model.safetensors", lambda p: p.symlink_to(
        p.parent / "gone")), "model.safetensors"),
    "an optimizer that is a folder": (_replace("optimizer.safetensors", Path.mkdir),
                                      "optimizer.safetensors"),
    "an optimizer that is a named pipe": (_replace("optimizer.safetensors", os.mkfifo),
                                          "optimizer.safetensors"),
    "a cut-short optimizer": (_cut("optimizer.safetensors"), "optimizer.safetensors"),
    "an optimizer without a moment": (_tensors("optimizer.safetensors", lambda t: t.pop(
        "fc.weight.m")), "optimizer.safetensors"),
    "an optimizer of another shape": (_tensors("optimizer.safetensors", lambda t: t.__setitem__(
        "fc.weight.v", t["fc.weight.v"][:3])), "optimizer.safetensors"),
    "an MLP width that is text": (_text("config.json", json.dumps(
        {"transformer_layer_config": {"intermediate_size": "128"}})), "config.json"),
    "an MLP width past any head's": (_text("config.json", json.dumps(
        {"transformer_layer_config": {"intermediate_size": 10 ** 9}})), "config.json"),
}


@pytest.mark.parametrize("what", DAMAGE)
def test_a_damaged_checkpoint_is_said_to_be_and_nothing_is_changed(tmp_path, trained, texts,
                                                                   what):
    """Issue 47: a checkpoint is outside input. Each field is checked before
    use; any damage names the file and how to start over, and leaves the
    folder as it was (a draft id equal to the vocabulary size trained a head
    that learnt nothing, "loss 0.000"; others ended on internal errors)."""
    from specchat.engine import head_training
    from specchat.engine.checkpoint import DamagedCheckpoint

    engine, good = trained
    folder = shutil.copytree(good, tmp_path / "head")
    damage, file = DAMAGE[what]
    damage(folder, int(engine.target_runner.trunk.embed_tokens.weight.shape[0]))
    before = _snapshot(folder)
    with pytest.raises(DamagedCheckpoint) as refused:
        head_training.train(engine, _plan(texts, folder, 4), lambda _p: None)
    assert str(refused.value).startswith(f"The training checkpoint in {folder} is damaged: "
                                         f"{file} ")
    assert str(refused.value).endswith(f"Nothing was changed; to start over, {RESTART}.")
    assert _snapshot(folder) == before


def test_a_damaged_checkpoint_is_started_over_when_asked(tmp_path, trained, texts):
    """Starting over (``--restart``, Start over in the window) trains a new
    head in its place, and the run after goes on from that one."""
    from specchat.engine import head_training

    engine, good = trained
    folder = shutil.copytree(good, tmp_path / "head")
    DAMAGE["a draft id equal to the vocabulary size"][0](folder, 10 ** 9)
    record = head_training.train(engine, _plan(texts, folder, 1, restart=True), lambda _p: None)
    assert record["step"] == 1 and max(record["draft_ids"]) < 10 ** 9
    events = []
    record = head_training.train(engine, _plan(texts, folder, 2), events.append)
    assert events[0].resumed and record["step"] == 2


def test_a_draft_id_past_the_vocabulary_is_refused_by_the_command(tmp_path, trained, texts,
                                                                  tiny_target):
    """The reported case, as a person meets it: ``draft_ids`` of 10^9 in the
    checkpoint ended ``specchat heads train`` on a segmentation fault (exit
    139); it is one line now, and ``--restart`` starts over."""
    _, good = trained
    folder = shutil.copytree(good, tmp_path / "head")
    path = folder / "specchat-training.json"
    state = json.loads(path.read_text())
    state["draft_ids"] = [10 ** 9]
    path.write_text(json.dumps(state))
    args = ["heads", "train", "--target", str(tiny_target), "--texts", str(texts), "--out",
            str(folder), "--minutes", "1", "--draft-vocab", "64", "--steps", "3", "--held-out",
            "1", "--no-history"]
    env = {**os.environ, "SPECCHAT_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "specchat", *args], env=env, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"specchat: error: The training checkpoint in {folder} is damaged: "
        "specchat-training.json lists the draft id 1,000,000,000, past the target's "
        f"{_vocab(tiny_target):,} ids (0 to {_vocab(tiny_target) - 1:,}). Nothing "
        "was changed; to start over, run the same command with --restart.")
    proc = subprocess.run([sys.executable, "-m", "specchat", *args, "--restart"], env=env,
                          text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(path.read_text())["step"] == 3


def _vocab(model: Path) -> int:
    return json.loads((model / "config.json").read_text())["vocab_size"]


def test_one_run_at_a_time_trains_in_a_folder(tmp_path, tiny_target, texts, trained):
    """Two ``heads train --out X`` at once both ran to the end and both said
    "The head is in X", each writing its checkpoints over the other's (the
    weights of one beside the state of the other). A run now takes its
    folder for itself: a second one, while the first trains, is refused in
    words and writes nothing. A link left under a checkpoint file's
    temporary name (``.part-model.safetensors``) was written through, into
    whatever it named; the names are new each time, and what a killed run
    left is removed unread."""
    out, home = tmp_path / "head", tmp_path / "home"
    first = _train(tiny_target, texts, out, home, 1, steps=10 ** 6)
    try:
        for line in first.stdout:  # the first run has taken the folder and is training
            if json.loads(line)["stage"] in ("labelling", "training"):
                break
        second = _train(tiny_target, texts, out, home, 0.1)
        _, err = second.communicate(timeout=300)
        assert second.returncode == 1, err
        assert err.splitlines()[-1] == (f"specchat: error: Another run is training a head in "
                                        f"{out} now; nothing was changed. Wait for it to end "
                                        "(or stop it), or train into another folder.")
        assert first.poll() is None
    finally:
        first.kill()
        first.wait(60)
        first.stdout.close()
        first.stderr.close()

    from specchat.engine import head_training

    engine, good = trained
    folder = shutil.copytree(good, tmp_path / "resumed")
    kept = tmp_path / "kept.txt"
    kept.write_text("mine\n")
    (folder / ".part-model.safetensors").symlink_to(kept)
    head_training.train(engine, _plan(texts, folder, 3), lambda _p: None)
    assert kept.read_text() == "mine\n"
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_a_head_is_trained_for_a_target_of_few_layers(tmp_path, tiny_tokenizer, texts, layers):
    """EAGLE-3 reads the hidden states of layers 2, n/2 and n - 3: a target
    of one layer has no layer 2, and training a head for it ended on an
    internal error (IndexError). The ids stop at the last layer's output;
    the head trains, loads and drafts."""
    from specchat.engine import eagle3_format, head_training
    from tinymodels import build_model

    target = build_model(tmp_path / "target", tiny_tokenizer, layers=layers, seed=3)
    engine = Engine()
    engine.load(target)
    out = tmp_path / "head"
    head_training.train(engine, _plan(texts, out, 1), lambda _p: None)
    ids = eagle3_format.read(out).config.layer_ids
    assert ids == eagle3_format.default_layer_ids(layers) and max(ids) <= layers
    engine.load(target, out)
    result = engine.generate(GenerateRequest(prompt_ids=(5, 6, 7) * 4, max_tokens=8,
                                             draft=DraftSettings(mode="draft", k=2)))
    assert result.summary.drafted > 0
