"""EAGLE-3 draft heads in the library: a head is a model reference like any
other. One in the published layout, served by the loopback Hub, is pulled
through ``hf:``, checked against its target in words, listed as a head, and
drafts from the command line, its reply plain decoding's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlx.core as mx
import pytest
from specchat.library import compatibility, importing, index, refs
from specchat.library.errors import LibraryError
from tinymodels import build_eagle3


def _cli(*args, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "specchat", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_a_head_from_the_hub_is_checked_listed_and_drafts(hub_heads, tiny_target):
    pulled = _cli("models", "pull", "hf:test-org/tiny-eagle3")
    assert pulled.returncode == 0, pulled.stderr
    refs.pull("hf:test-org/other-eagle3")
    ok = compatibility.check(str(tiny_target), "hf:test-org/tiny-eagle3")
    assert ok.compatible, ok.reasons
    assert ok.reasons[0] == (f"an EAGLE-3 head that reads {tiny_target.name}'s hidden states "
                             "at layers [2, 3, 3] (width 64) and drafts over 256 of its 400 ids")
    bad = compatibility.check(str(tiny_target), "hf:test-org/other-eagle3")
    assert not bad.compatible
    assert bad.reasons == ["other-eagle3 is an EAGLE-3 head for another model and cannot draft "
                           "for target-llama: it reads hidden states of width 32, target-llama "
                           "has 64"]
    listed = _cli("models", "list", "--json")
    names = {m["name"]: m for m in json.loads(listed.stdout)}
    head = next(m for m in names.values() if m["source"] == "hf:test-org/tiny-eagle3")
    assert head["model_type"] == "eagle3" and head["head"]["draft_vocab"] == 256
    assert head["tokenizer_fingerprint"] is None
    plain = _cli("generate", "--target", str(tiny_target), "--plain", "--prompt", "Hello, world!",
                 "--max-tokens", "24", "--json")
    spec = _cli("generate", "--target", str(tiny_target), "--draft", "hf:test-org/tiny-eagle3",
                "--prompt", "Hello, world!", "--max-tokens", "24", "--json")
    assert spec.returncode == 0, spec.stderr
    got = json.loads(spec.stdout)
    assert got["token_ids"] == json.loads(plain.stdout)["token_ids"]
    assert got["stats"]["drafted"] > 0 and got["models"]["draft"] == "test-org/tiny-eagle3"


def test_a_head_folder_imports_and_a_pickled_one_is_refused(lib_home, tiny_dir, tiny_target,
                                                            tmp_path):
    folder = build_eagle3(tiny_dir / "import-eagle3", tiny_target)
    model = importing.import_path(folder, name="my-head")
    assert model.model_type == "eagle3" and model.head["reads_width"] == 64
    assert [m.name for m in index.list_installed()] == ["my-head"]
    pickled = tmp_path / "pickled-head"
    pickled.mkdir()
    (pickled / "config.json").write_text((folder / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"not opened")
    with pytest.raises(Exception, match="only pickled pytorch_model.bin, which SpecChat does "
                                        "not open"):
        importing.import_path(pickled, name="pickled-head")


def test_a_heads_vocabulary_map_is_checked_before_it_loads(lib_home, tiny_dir, tiny_target):
    """The check reads the head's d2t and t2d from its files: a head whose
    draft ids map past the target's vocabulary is refused in words, with
    the numbers, before anything loads (the engine says the same at load)."""
    past = build_eagle3(tiny_dir / "map-past-eagle3", tiny_target, wrap=False)
    bad = compatibility.check(str(tiny_target), str(past))
    assert not bad.compatible
    assert bad.reasons[0] == (
        "map-past-eagle3's vocabulary map does not fit target-llama: its d2t maps 56 draft ids "
        "outside target-llama's 400 ids (draft id 255 to target id 510); its t2d marks 56 "
        "target ids past target-llama's 400 (up to 510)")
    good = compatibility.check(str(tiny_target), str(build_eagle3(tiny_dir / "map-eagle3",
                                                                  tiny_target)))
    assert good.compatible, good.reasons
    # A head over the whole vocabulary ships no d2t: its t2d is checked all
    # the same, as the engine checks it; a checkpoint's file beside it is not read.
    whole = build_eagle3(tiny_dir / "map-whole-eagle3", tiny_target, draft_vocab=400,
                         wrap=False)
    weights = dict(mx.load(str(whole / "model.safetensors")))
    del weights["d2t"]
    mx.save_safetensors(str(whole / "model.safetensors"), weights)
    mx.save_safetensors(str(whole / "optimizer.safetensors"), {"d2t": mx.array([10_000])})
    bad = compatibility.check(str(tiny_target), str(whole))
    assert not bad.compatible
    assert "its t2d marks 200 target ids past target-llama's 400 (up to 798)" in bad.reasons[0]
    # A map larger than any vocabulary is refused before it is read into memory.
    huge = build_eagle3(tiny_dir / "map-huge-eagle3", tiny_target)
    weights = dict(mx.load(str(huge / "model.safetensors")))
    weights["t2d"] = mx.zeros(((1 << 22) + 1,), dtype=mx.bool_)
    mx.save_safetensors(str(huge / "model.safetensors"), weights)
    with pytest.raises(LibraryError, match=r"the head's t2d holds 4,194,305 ids, more than any "
                                           r"vocabulary \(4,194,304 at most\)"):
        compatibility.check(str(tiny_target), str(huge))


def test_a_trained_heads_checkpoint_is_not_counted_in_its_size(lib_home, tiny_dir,
                                                                tiny_target):
    """A head trained here keeps its optimizer's state beside its weights
    (for resuming): the library counts only the head, in bytes and
    parameters, as the model manager and the pair picker show it."""
    import mlx.core as mx
    from specchat.library import trained_heads

    folder = build_eagle3(tiny_dir / "checkpoint-eagle3", tiny_target)
    alone = trained_heads.list_trained(folder, str(tiny_target))
    weights = mx.load(str(folder / "model.safetensors"))
    mx.save_safetensors(str(folder / "optimizer.safetensors"),
                        {f"{k}.{m}": v for k, v in weights.items() for m in ("m", "v")})
    (folder / "specchat-training.json").write_text('{"step": 3}')
    listed = trained_heads.list_trained(folder, str(tiny_target))
    assert listed.name == alone.name
    assert (listed.size_bytes, listed.params) == (alone.size_bytes, alone.params)
    assert listed.size_bytes < (folder / "optimizer.safetensors").stat().st_size
    assert index.get(listed.name).size_bytes == alone.size_bytes


def test_a_head_chosen_as_the_target_is_refused_in_words(lib_home, tiny_dir, tiny_target):
    """A head has no tokenizer of its own: chosen as the target, it is said
    to be a head for its target, to be used as the draft, wherever the
    target is checked (the command line before loading, the pair check)."""
    folder = build_eagle3(tiny_dir / "as-target-eagle3", tiny_target, layout="speculators")
    config = json.loads((folder / "config.json").read_text())
    config["speculators_config"] = {"verifier": {"name_or_path": "target-llama"}}
    (folder / "config.json").write_text(json.dumps(config))
    said = (f"as-target-eagle3 is an EAGLE-3 draft head made for target-llama: a head drafts "
            f"for a target and cannot be one. Use it as the draft (--draft {folder} on the "
            "command line, the Draft list in the window), with target-llama as the target")
    for extra in (["--plain"], ["--draft", str(tiny_target)]):
        run = _cli("generate", "--target", str(folder), *extra, "--prompt", "Hello",
                   "--max-tokens", "4")
        assert run.returncode == 1 and "tokenizer" not in run.stderr
        assert run.stderr.strip() == f"specchat: error: {said}"
    verdict = compatibility.check(str(folder), str(tiny_target))
    assert not verdict.compatible and verdict.reasons == [said]
    unnamed = build_eagle3(tiny_dir / "as-target-unnamed", tiny_target)
    run = _cli("generate", "--target", str(unnamed), "--plain", "--prompt", "Hello")
    assert run.stderr.strip().endswith("with the target it was made for")


def test_the_texts_a_head_learns_from_are_read_only_as_far_as_they_are_used(tmp_path):
    """Each text file gives its first 12,000 characters, but the whole file
    was read: a 3 GB ``.txt`` among the texts took 46 s and 6 GB of memory.
    Now no more than those characters' bytes are read (a character cut at
    the end is left out), and what is no regular file (a FIFO named like a
    text) is passed over, never waited on. In a child process whose memory
    is measured (the file is sparse: no disk is used)."""
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "notes.md").write_text("é" * 30_000)
    with open(texts / "huge.txt", "wb") as f:
        f.write(b"word " * 10_000)
        f.truncate(3 * 2**30)
    os.mkfifo(texts / "pipe.txt")
    code = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from specchat.library import trained_heads\n"
        "got = trained_heads.file_chats([Path(sys.argv[1])], 10**8)\n"
        "print([len(c[1].content) for c in got])\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n")
    out = subprocess.run([sys.executable, "-c", code, str(texts)], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    lengths, peak_mb = out.stdout.split("\n")[:2]
    assert lengths == "[12000, 12000]"  # huge.txt, notes.md; the pipe passed over
    assert int(peak_mb) < 1024, peak_mb
