"""Stopping, cancellation, prompt-prefix reuse, refusals and streaming text."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
from specchat.engine.client import EngineClient
from specchat.engine.errors import EngineError
from specchat.engine.events import DraftSettings, GenerateRequest, LoadProgress, Message, StepEvent
from specchat.engine.session import Engine
from specchat.engine.worker import EngineThread, JobDone, JobFailed
from tinymodels import build_model

PROMPT = tuple(range(40, 80))


def gen(engine, mode="plain", k=None, **kw):
    kw.setdefault("prompt_ids", PROMPT)
    kw.setdefault("max_tokens", 40)
    return engine.generate(GenerateRequest(draft=DraftSettings(mode=mode, k=k), **kw))


# -- cancellation ------------------------------------------------------------------------

@pytest.mark.parametrize("mode,k", [("plain", None), ("draft", 3), ("hybrid", None)])
def test_cancel_between_steps_returns_what_was_produced(engine, mode, k):
    full = gen(engine, mode, k)
    cancel = threading.Event()
    seen = []

    def on_step(ev):
        seen.append(ev)
        if len(seen) == 3:
            cancel.set()

    r = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=40,
                                        draft=DraftSettings(mode=mode, k=k)),
                        cancelled=cancel, on_step=on_step)
    assert r.summary.finish_reason == "cancelled"
    produced = sum(len(e.token_ids) for e in seen)
    assert r.token_ids == full.token_ids[:produced]
    assert 0 < len(r.token_ids) < 40
    # The caches stay consistent: the next request is still exact.
    assert gen(engine, mode, k).token_ids == full.token_ids


def test_cancel_through_the_engine_thread(tiny_target, tiny_draft):
    client = EngineClient()
    try:
        client.load(str(tiny_target), str(tiny_draft)).wait(60)
        job = client.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=2000,
                                              draft=DraftSettings(mode="hybrid")))
        steps = 0
        result = None
        for ev in job:
            if isinstance(ev, StepEvent):
                steps += 1
                if steps == 5:
                    job.cancel()
            elif isinstance(ev, JobDone):
                result = ev.result
        assert result.summary.finish_reason == "cancelled"
        assert 0 < result.summary.new_tokens < 2000
    finally:
        client.close()


def test_asyncio_consumer_gets_events_and_result(tiny_target, tiny_draft):
    client = EngineClient()

    async def main():
        loop = asyncio.get_running_loop()
        load = client.load(str(tiny_target), str(tiny_draft), loop=loop)
        kinds = set()
        async for ev in load:
            kinds.add(type(ev).__name__)
        assert "LoadProgress" in kinds and "JobDone" in kinds
        job = client.generate(GenerateRequest(messages=(Message("user", "hi there"),),
                                              max_tokens=12), loop=loop)
        events = []
        async for ev in job:
            events.append(ev)
        return events

    try:
        events = asyncio.run(main())
        assert isinstance(events[-1], JobDone)
        steps = [e for e in events if isinstance(e, StepEvent)]
        assert sum(len(e.token_ids) for e in steps) == events[-1].result.summary.new_tokens
    finally:
        client.close()


def test_engine_thread_owns_mlx(tiny_target):
    """Every MLX call happens on the engine thread: loading and generation
    report the thread they ran on."""
    client = EngineClient()
    try:
        client.load(str(tiny_target)).wait(60)
        name = client.call(lambda eng: threading.current_thread().name).wait(10)
        assert name == "specchat-engine" == client.thread.name
        assert client.thread is not threading.main_thread()
    finally:
        client.close()


def test_errors_arrive_as_messages(tmp_path):
    client = EngineClient()
    try:
        events = list(client.load(str(tmp_path / "missing")))
        assert isinstance(events[-1], JobFailed)
        assert "not found" in events[-1].message
        with pytest.raises(EngineError):
            client.generate(GenerateRequest(prompt_ids=(1, 2), max_tokens=3)).wait(10)
    finally:
        client.close()


# -- stopping ---------------------------------------------------------------------------

def test_stop_string_ends_the_reply_and_is_never_streamed(engine, tiny_tokenizer):
    full = gen(engine, max_tokens=60)
    text = full.text
    # A stop string from the middle of the output that is not at its start.
    start = len(text) // 2
    stop = text[start:start + 3]
    assert stop and text.index(stop) > 0
    for mode, k in [("plain", None), ("draft", 4), ("hybrid", None), ("suffix", None)]:
        pieces = []
        r = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=60, stop_strings=(stop,),
                                            draft=DraftSettings(mode=mode, k=k)),
                            on_step=lambda e, acc=pieces: acc.append(e.text))
        assert r.text == text[:text.index(stop)]
        assert "".join(pieces) == r.text
        assert r.summary.finish_reason == "stop_string"
        assert len(r.token_ids) < len(full.token_ids)


def test_max_tokens_one(engine):
    for mode in ("plain", "draft", "hybrid", "suffix"):
        r = gen(engine, mode, max_tokens=1)
        assert len(r.token_ids) == 1 and r.summary.finish_reason == "length"


# -- prompt-prefix reuse ----------------------------------------------------------------

def test_conversation_prefix_is_reused_and_ids_are_unchanged(tiny_target, tiny_draft,
                                                            tiny_engine):
    cached = tiny_engine
    turn1 = (Message("system", "Be brief."), Message("user", "Write a stack class in Python."))
    r1 = cached.generate(GenerateRequest(messages=turn1, max_tokens=30))
    turn2 = (*turn1, Message("assistant", r1.text), Message("user", "Now add a peek method."))
    r2 = cached.generate(GenerateRequest(messages=turn2, max_tokens=30))
    prompt2 = cached.prompt_ids(GenerateRequest(messages=turn2))
    assert r2.summary.prompt_tokens == len(prompt2)
    # Everything up to the first reply is reused (bar retokenisation at its end).
    prompt1 = cached.prompt_ids(GenerateRequest(messages=turn1))
    assert r2.summary.reused_prompt_tokens >= len(prompt1)

    fresh = Engine()
    fresh.load(tiny_target, tiny_draft)
    r2_fresh = fresh.generate(GenerateRequest(messages=turn2, max_tokens=30))
    assert r2_fresh.summary.reused_prompt_tokens == 0
    assert r2.token_ids == r2_fresh.token_ids
    # And once more, with an edited earlier turn: only the shared prefix is reused.
    edited = (turn1[0], Message("user", "Write a queue class in Python."))
    r3 = cached.generate(GenerateRequest(messages=edited, max_tokens=20))
    r3_fresh = fresh.generate(GenerateRequest(messages=edited, max_tokens=20))
    assert r3.token_ids == r3_fresh.token_ids
    assert r3.summary.reused_prompt_tokens < len(prompt1)


def test_identical_request_twice_reuses_all_but_the_last_token(engine):
    a = gen(engine, max_tokens=5)
    b = gen(engine, max_tokens=5)
    assert a.token_ids == b.token_ids
    assert b.summary.reused_prompt_tokens == len(PROMPT) - 1


@pytest.mark.parametrize("mode", ["draft", "ssd"])
def test_the_draft_reads_the_prompt_once_as_prompt_processing(engine, mode, monkeypatch):
    """The draft model reads the prompt once, before its first proposal:
    after the reply's first token (ssd: before the first step, which it
    drafts). The read is prompt processing (``prefill_s``), not a draft step
    the policy would take for a slow draft."""
    engine.reset_cache()
    drafter = engine.model_drafter
    reads = []
    catch_up = drafter.catch_up

    def timed(context):
        t0 = time.perf_counter()
        catch_up(context)
        reads.append((len(context), time.perf_counter() - t0))

    monkeypatch.setattr(drafter, "catch_up", timed)
    events = []
    r = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=20,
                                        draft=DraftSettings(mode=mode, k=3)),
                        on_step=events.append)
    steps = [e for e in events if e.token_ids or e.drafted]
    after_first_token = mode == "draft"
    assert [n for n, _ in reads] == [len(PROMPT) + after_first_token]
    assert (steps[0].drafted == 0) is after_first_token and steps[1].drafted > 0
    assert r.summary.prefill_s >= reads[0][1]
    assert r.token_ids == gen(engine, max_tokens=20).token_ids


# -- refusals ---------------------------------------------------------------------------

def test_mismatched_tokenizers_are_refused_with_reasons(tiny_target, mismatched_draft):
    e = Engine()
    with pytest.raises(EngineError) as err:
        e.load(tiny_target, mismatched_draft)
    msg = str(err.value)
    assert "cannot draft for" in msg
    assert "vocabulary size differs" in msg
    assert "different ids" in msg


def test_special_token_mismatch_is_named(tiny_dir, tiny_tokenizer, tiny_target):
    from tinymodels import build_tokenizer

    tok = build_tokenizer(tiny_dir / "tokenizer-eos", eos="<|endoftext|>")
    draft = build_model(tiny_dir / "draft-other-eos", tok, seed=9)
    e = Engine()
    with pytest.raises(EngineError, match="different EOS token"):
        e.load(tiny_target, draft)


@pytest.fixture(scope="module")
def sliding_target(tiny_dir, tiny_tokenizer):
    return build_model(tiny_dir / "target-sliding", tiny_tokenizer, seed=21,
                       extra_config={"layer_types": ["sliding_attention", "full_attention"],
                                     "sliding_window": 16})


def test_a_sliding_window_target_speculates_exactly_past_its_window(sliding_target, tiny_draft):
    """Once refused (its cache cannot be trimmed after the window wraps), a
    sliding-window target now speculates, rolled back by window_kv.py."""
    e = Engine()
    pair = e.load(sliding_target, tiny_draft)
    assert pair.speculative_ok and pair.reason is None
    plain = gen(e, "plain", max_tokens=60).token_ids  # longer than the 16-token window
    assert len(plain) == 60
    for mode in ("draft", "hybrid", "suffix"):
        r = gen(e, mode, max_tokens=60)
        assert r.token_ids == plain, mode


def test_empty_and_oversized_prompts(engine):
    with pytest.raises(EngineError, match="empty"):
        engine.generate(GenerateRequest(messages=(Message("user", "   "),)))
    with pytest.raises(EngineError, match="empty"):
        engine.generate(GenerateRequest(prompt_ids=()))
    with pytest.raises(EngineError, match="more than"):
        engine.generate(GenerateRequest(prompt_ids=tuple([50] * 2048)))
    with pytest.raises(EngineError, match="Token id 100000 is not in .*vocabulary"):
        engine.generate(GenerateRequest(prompt_ids=(5, 100_000)))
    # Near the limit, max_tokens is cut to what fits instead of failing late.
    r = engine.generate(GenerateRequest(prompt_ids=tuple([50] * 2040), max_tokens=100))
    assert len(r.token_ids) <= 8


@pytest.mark.parametrize("damage", ["truncate", "no-config", "bad-json", "no-weights", "pickle-only"])
def test_damaged_model_folders_give_clear_errors(tmp_path, tiny_target, damage):
    bad = tmp_path / "model"
    shutil.copytree(tiny_target, bad)
    weights = bad / "model.safetensors"
    if damage == "truncate":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
        expect = "corrupt or incomplete|could not read the weights"
    elif damage == "no-config":
        (bad / "config.json").unlink()
        expect = "config.json is missing"
    elif damage == "bad-json":
        (bad / "config.json").write_text("{not json")
        expect = "not valid JSON"
    elif damage == "no-weights":
        weights.unlink()
        expect = "no weights"
    else:
        weights.rename(bad / "pytorch_model.bin")
        expect = "pickled PyTorch weights"
    with pytest.raises(EngineError, match=expect):
        Engine().load(bad)


def test_a_failed_jobs_frames_are_freed_before_its_caller_hears():
    """What a failed job's traceback holds (a failed load's model, its
    tokenizer's objects) is freed on the engine thread before the caller is
    told: a caller that then exits must not find the thread still freeing."""
    freed = threading.Event()

    class SlowToFree:
        def __del__(self):
            time.sleep(0.3)
            freed.set()

    def work(job):
        held = SlowToFree()  # noqa: F841 - a local of the failing frame
        raise EngineError("the tokenizer could not be loaded")

    job = EngineThread().submit(work)
    with pytest.raises(EngineError, match="^the tokenizer could not be loaded$"):
        job.wait(10)
    assert freed.is_set()


def test_a_large_tokenizer_the_library_rejects_ends_the_cli_with_its_error(tmp_path,
                                                                           tiny_target):
    """A 26 MB tokenizer.json that the tokenizers library refuses: the CLI
    printed the error and then aborted (exit 134, "terminate called without
    an active exception"), because the engine thread was still freeing the
    failed load when the interpreter finalized and, on taking the GIL back,
    exited inside MLX's thread-exit handler. Now the one line and exit 1."""
    bad = tmp_path / "big-tokenizer"
    shutil.copytree(tiny_target, bad)
    data = json.loads((bad / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab.update((f"tok{i:08d}zzzzzzzzzz", len(vocab) + i) for i in range(800_000))
    data["model"]["merges"].append("nothere alsonot")
    (bad / "tokenizer.json").write_text(json.dumps(data))
    size = (bad / "tokenizer.json").stat().st_size
    assert size > 25 * 2**20
    proc = subprocess.run([sys.executable, "-m", "specchat", "generate", "--target", str(bad),
                           "--prompt", "hi"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SPECCHAT_HOME": str(tmp_path / "home")})
    assert proc.returncode == 1, proc.stderr
    assert "terminate called" not in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "specchat: error: big-tokenizer: could not load the tokenizer (data did not match any "
        f"variant of untagged enum MergeType at line 1 column {size})")


# -- streaming text ---------------------------------------------------------------------

def test_stream_never_splits_a_multibyte_character(engine):
    from specchat.engine.textstream import TextStream

    tok = engine.target.tokenizer
    text = "日本語のテキスト café 🙂🚀 naïve"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # characters really are split across tokens
    stream = TextStream(tok)
    pieces = [stream.add(t) for t in ids] + [stream.finish()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text


def test_stream_holds_back_partial_stop_strings(engine):
    from specchat.engine.textstream import TextStream

    tok = engine.target.tokenizer
    ids = tok.encode("abc END def", add_special_tokens=False)
    stream = TextStream(tok, stop_strings=("END",))
    assert len(ids) >= 4  # the stop string arrives over several tokens
    out = ""
    for t in ids:
        out += stream.add(t)
        # Never a character of the stop string or past it, at any point.
        assert "abc ".startswith(out), out
        if stream.stopped:
            break
    out += stream.finish()
    assert out == "abc "
    assert stream.stopped


# -- the CLI ----------------------------------------------------------------------------

def _cli(*args, timeout=120):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "specchat", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_generate_json_shape(tiny_target, tiny_draft):
    p = _cli("generate", "--target", str(tiny_target), "--draft", str(tiny_draft), "--prompt",
             "Write a stack class.", "--max-tokens", "16", "--k", "3", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out) >= {"text", "token_ids", "mode", "stats"}
    assert out["mode"] == "hybrid"
    assert set(out["stats"]) == {"new_tokens", "steps", "drafted", "accepted", "acceptance_rate",
                                 "tokens_per_step", "tokens_per_s", "ttft_s", "wall_s"}
    assert out["stats"]["new_tokens"] == len(out["token_ids"]) == 16
    assert out["compute"]["device"] == "cpu" and out["compute"]["dtype"] == "float32"
    plain = json.loads(_cli("generate", "--target", str(tiny_target), "--prompt",
                            "Write a stack class.", "--max-tokens", "16", "--json").stdout)
    assert plain["mode"] == "plain"
    assert plain["token_ids"] == out["token_ids"]
    lk = json.loads(_cli("generate", "--target", str(tiny_target), "--lookup", "--prompt",
                         "Write a stack class.", "--max-tokens", "16", "--json").stdout)
    assert lk["mode"] == "suffix" and lk["token_ids"] == out["token_ids"]


def test_generate_streams_text_to_stdout(tiny_target):
    p = _cli("generate", "--target", str(tiny_target), "--prompt", "hello", "--max-tokens", "10")
    assert p.returncode == 0
    js = json.loads(_cli("generate", "--target", str(tiny_target), "--prompt", "hello",
                         "--max-tokens", "10", "--json").stdout)
    assert p.stdout.rstrip("\n") == js["text"]


@pytest.mark.parametrize("args,words", [
    (["--target", "/nonexistent/model", "--prompt", "x"], "not"),
    (["--prompt", "   "], "empty"),
    (["--prompt", "x", "--k", "0"], "K must be"),
])
def test_generate_errors_are_one_line(tiny_target, args, words):
    if "--target" not in args:
        args = ["--target", str(tiny_target), *args]
    p = _cli("generate", *args)
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    assert words in p.stderr
    assert len([line for line in p.stderr.splitlines() if line.strip()]) <= 3


def test_mismatched_pair_cli_error(tiny_target, mismatched_draft):
    p = _cli("generate", "--target", str(tiny_target), "--draft", str(mismatched_draft),
             "--prompt", "x")
    assert p.returncode == 1
    lines = [line for line in p.stderr.splitlines() if line.startswith("specchat: error")]
    assert len(lines) == 1 and "vocabulary size differs" in lines[0]


def test_load_progress_is_reported(tiny_target):
    client = EngineClient()
    try:
        events = list(client.load(str(tiny_target)))
        assert any(isinstance(e, LoadProgress) for e in events)
        pair = events[-1].result
        assert pair.target.dtype == "float32" and pair.draft is None
    finally:
        client.close()


def test_load_warms_each_model_it_loads_and_only_those(tiny_target, tiny_draft):
    """A model's first forwards run at load (engine/warmup.py), so the
    first reply does not pay them; a pair loaded again warms nothing."""
    client = EngineClient()
    try:
        said = [e.message for e in client.load(str(tiny_target), str(tiny_draft))
                if isinstance(e, LoadProgress)]
        warmed = [m for m in said if m.startswith("warming up")]
        assert warmed == [f"warming up {tiny_target.name}", f"warming up {tiny_draft.name}"]
        assert said.index(warmed[0]) > next(i for i, m in enumerate(said) if "converting" in m)
        again = [e.message for e in client.load(str(tiny_target), str(tiny_draft))
                 if isinstance(e, LoadProgress)]
        assert not any(m.startswith("warming up") for m in again)
        reply = client.generate(GenerateRequest(messages=(Message("user", "hello"),),
                                                max_tokens=8)).wait()
        assert reply.summary.new_tokens == 8 or reply.summary.finish_reason == "stop"
    finally:
        client.close()
