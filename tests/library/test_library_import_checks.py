"""Nothing unverified, nothing stuck, nothing lost (issue 13): imports.

A model that mlx-lm would fail to load is refused before it is copied or
listed, in one line that names the user's own file (never a staging folder);
work folders of imports whose process was killed are removed by the next
import while a live import's are left alone; a full disk is said in words
and leaves nothing behind. Damaged files are real files on disk, the killed
import is a real subprocess killed with SIGKILL, and the full disk is a real
small tmpfs (when the tests run as root).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from held import kill, start_held
from smalldisk import fill
from specchat.library import facts, importing, index, paths
from specchat.library.errors import LibraryError
from tinygguf import write_gguf


# -- helpers -------------------------------------------------------------------
def _read_st(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_st(path: Path, header: dict, data: bytes) -> None:
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def _drop_tensors(path: Path, names: set[str]) -> None:
    """Rewrite a safetensors file without some tensors (a valid file)."""
    header, data = _read_st(path)
    meta = header.pop("__metadata__", None)
    out: dict = {"__metadata__": meta} if meta else {}
    chunks, at = [], 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if name in names:
            continue
        start, end = info["data_offsets"]
        chunks.append(data[start:end])
        out[name] = {**info, "data_offsets": [at, at + end - start]}
        at += end - start
    _write_st(path, out, b"".join(chunks))


def _copy(src: Path, dest: Path, config: dict | None = None, drop_keys: tuple = ()) -> Path:
    shutil.copytree(src, dest)
    data = json.loads((dest / "config.json").read_text())
    data.update(config or {})
    for key in drop_keys:
        data.pop(key)
    (dest / "config.json").write_text(json.dumps(data))
    return dest


def _nothing_listed_or_left() -> None:
    """After any failed import: no entry, no model folder, no work folder."""
    assert index.list_installed() == []
    assert not paths.models_dir().exists() or list(paths.models_dir().iterdir()) == []
    assert not paths.tmp_dir().exists() or list(paths.tmp_dir().iterdir()) == []


def _refused(src: Path) -> str:
    """Import ``src``; it must be refused naming ``src``, not a staging folder."""
    with pytest.raises(LibraryError) as err:
        importing.import_path(src)
    msg = str(err.value)
    assert str(src) in msg, msg
    assert str(paths.tmp_dir()) not in msg, msg
    assert "\n" not in msg
    _nothing_listed_or_left()
    return msg


def _mlx_lm_cannot_load(folder: Path) -> None:
    """What the check stands in for: mlx-lm's own loader fails on it."""
    from mlx_lm.utils import load_model

    with pytest.raises(Exception):  # noqa: B017, PT011 - mlx raises assorted types
        load_model(folder)


# -- safetensors files and the tensors config.json implies -----------------------
def _cut(folder: Path) -> None:
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])


def _bad_span(folder: Path) -> None:
    f = folder / "model.safetensors"
    header, data = _read_st(f)
    header["model.norm.weight"]["shape"] = [65]
    _write_st(f, header, data)


def _overlap(folder: Path) -> None:
    f = folder / "model.safetensors"
    header, data = _read_st(f)
    a, b = sorted(("model.layers.0.input_layernorm.weight",
                   "model.layers.0.post_attention_layernorm.weight"),
                  key=lambda n: header[n]["data_offsets"][0])
    header[b]["data_offsets"] = header[a]["data_offsets"]
    _write_st(f, header, data)


def _trailing(folder: Path) -> None:
    with open(folder / "model.safetensors", "ab") as f:
        f.write(b"\0" * 16)


def _missing_tensor(folder: Path) -> None:
    _drop_tensors(folder / "model.safetensors", {"model.layers.3.mlp.down_proj.weight"})


def _no_lm_head(folder: Path) -> None:  # the config says untied
    _drop_tensors(folder / "model.safetensors", {"lm_head.weight"})


def _config(**values):
    def edit(folder: Path) -> None:
        data = json.loads((folder / "config.json").read_text())
        data.update(values)
        (folder / "config.json").write_text(json.dumps(data))
    return edit


DAMAGE = {
    # case: (damage, words the message has, mlx-lm fails on it too)
    "truncated": (_cut, "model.safetensors is truncated", True),
    "span": (_bad_span, "shape [65] of F32, which is 260 bytes, but its data_offsets span 256",
             True),
    "overlap": (_overlap, "overlaps", False),
    "trailing": (_trailing, "16 bytes after its last tensor belong to no tensor", False),
    "missing": (_missing_tensor, "tensor model.layers.3.mlp.down_proj.weight is missing", True),
    "more-layers": (_config(num_hidden_layers=7),
                    "config.json describes 7 layers, but tensor model.layers.6.", True),
    "fewer-layers": (_config(num_hidden_layers=5),
                     "tensor model.layers.5.input_layernorm.weight (and 8 more) is not part of "
                     "the 5-layer model config.json describes", True),
    "no-lm-head": (_no_lm_head, "tensor lm_head.weight is missing", True),
    "shape": (_config(intermediate_size=256),
              "has shape [128, 64] (in model.safetensors) but config.json implies [256, 64]",
              True),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_folder_that_would_fail_at_load_is_not_imported(lib_home, tmp_path, tiny_target, case):
    damage, words, mlx_fails = DAMAGE[case]
    broken = tmp_path / f"broken-{case}"
    shutil.copytree(tiny_target, broken)
    damage(broken)
    msg = _refused(broken)
    assert words in msg, msg
    # The Hub registers snapshots through read_folder: same check, same words.
    with pytest.raises(LibraryError, match="^" + str(broken)):
        facts.read_folder(broken)
    if mlx_fails:
        _mlx_lm_cannot_load(broken)


def test_good_folders_pass_the_check(lib_home, tiny_target, tiny_qwen_target, tiny_draft):
    """No false alarms: llama (untied) and qwen2 (padded vocabulary) folders
    that mlx-lm loads import as before."""
    for folder in (tiny_target, tiny_qwen_target, tiny_draft):
        assert importing.import_path(folder).params


@pytest.fixture(scope="module")
def tiny_q4(tmp_path_factory, tiny_target) -> Path:
    """tiny_target quantized by mlx-lm (4 bits, groups of 32): packed uint32
    weights with .scales and .biases beside them."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model, quantize_model

    folder = tmp_path_factory.mktemp("q4") / "tiny-q4"
    shutil.copytree(tiny_target, folder)
    model, config = load_model(folder)
    model, config = quantize_model(model, config, group_size=32, bits=4)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_quantized_folders_are_checked_with_their_packing(lib_home, tmp_path, tiny_q4):
    from mlx_lm.utils import load_model

    load_model(tiny_q4)  # the fixture is a folder mlx-lm loads
    model = importing.import_path(tiny_q4)
    assert model.quantization == "q4"
    index.remove(model.name)

    no_biases = tmp_path / "no-biases"
    shutil.copytree(tiny_q4, no_biases)
    _drop_tensors(no_biases / "model.safetensors", {"model.layers.2.mlp.up_proj.biases"})
    assert "tensor model.layers.2.mlp.up_proj.biases is missing" in _refused(no_biases)
    _mlx_lm_cannot_load(no_biases)

    no_scales = tmp_path / "no-scales"
    shutil.copytree(tiny_q4, no_scales)
    _drop_tensors(no_scales / "model.safetensors", {"model.layers.2.mlp.up_proj.scales"})
    msg = _refused(no_scales)
    assert "model.layers.2.mlp.up_proj.weight has shape [128, 8]" in msg, msg
    _mlx_lm_cannot_load(no_scales)


def test_a_broken_hub_repo_is_not_listed(hub, tmp_path, tiny_target):
    from specchat.library import hub as lib_hub

    broken = tmp_path / "broken"
    shutil.copytree(tiny_target, broken)
    _missing_tensor(broken)
    hub.add_repo("test-org/broken", broken)
    with pytest.raises(LibraryError, match="model.layers.3.mlp.down_proj.weight is missing"):
        lib_hub.pull("hf:test-org/broken")
    assert index.list_installed() == []


# -- an absurd layer count ---------------------------------------------------------
ABSURD_IMPORT = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from specchat.library import importing
from specchat.library.errors import LibraryError

started = time.monotonic()
try:
    importing.import_path(sys.argv[1])
    print(json.dumps({"imported": True}))
except LibraryError as exc:
    print(json.dumps({"seconds": time.monotonic() - started, "message": str(exc)}))
"""


def _import_in_a_child(src: Path) -> dict:
    """Import in a child with 2 GiB of address space, so a regression (11
    expected tensors per claimed layer, 10**9 layers) fails this test
    instead of taking the machine's memory."""
    done = subprocess.run([sys.executable, "-c", ABSURD_IMPORT, str(src)], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["folder", "gguf"])
def test_an_absurd_layer_count_is_refused_at_once(lib_home, tmp_path, tiny_target,
                                                   tiny_tokenizer, kind):
    """num_hidden_layers / block_count only has to be a whole number above
    0, and checking used to count up to it (10**9: never done, Cancel
    powerless). The check takes time in the layers the weights hold. The
    bound is 10 s for what takes milliseconds, for a loaded 2-core box."""
    if kind == "folder":
        src = _copy(tiny_target, tmp_path / "billion", {"num_hidden_layers": 10**9})
        words = ("config.json describes 1000000000 layers, but tensor "
                 "model.layers.6.input_layernorm.weight is missing: the weights hold 6 layers")
    else:
        src = write_gguf(tmp_path / "billion.gguf", tiny_tokenizer,
                         metadata={"llama.block_count": 10**9}).path
        words = "llama.block_count is 1000000000 but block 2 has no tensors (blk.2.*)"
    out = _import_in_a_child(src)
    assert "message" in out, out
    assert out["message"].startswith(str(src)) and words in out["message"], out
    assert out["seconds"] < 10, out
    _nothing_listed_or_left()


# -- shards, for any architecture ------------------------------------------------------
def _shard(folder: Path, index: bool = True) -> list[str]:
    """Split model.safetensors into model-0000i-of-00002.safetensors the way
    Transformers saves big models (with model.safetensors.index.json)."""
    header, data = _read_st(folder / "model.safetensors")
    header.pop("__metadata__", None)
    names = sorted(header)
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map = {}
    for fname, part in zip(files, (names[:len(names) // 2], names[len(names) // 2:]),
                           strict=True):
        out, chunks, at = {}, [], 0
        for name in part:
            start, end = header[name]["data_offsets"]
            chunks.append(data[start:end])
            out[name] = {**header[name], "data_offsets": [at, at + end - start]}
            at += end - start
            weight_map[name] = fname
        _write_st(folder / fname, out, b"".join(chunks))
    (folder / "model.safetensors").unlink()
    if index:
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": len(data)}, "weight_map": weight_map}))
    return files


@pytest.fixture(scope="module")
def other_archs(tmp_path_factory, tiny_tokenizer) -> dict[str, Path]:
    """Real tiny phi3 and gemma folders (layouts the tensor check does not
    model), sharded in two with an index."""
    from tinymodels import build_model

    root = tmp_path_factory.mktemp("archs")
    out = {}
    for arch, extra in (("phi3", None), ("gemma", {"head_dim": 16})):
        folder = build_model(root / arch, tiny_tokenizer, model_type=arch, extra_config=extra)
        _shard(folder)
        out[arch] = folder
    return out


def _no_second_shard(folder: Path) -> None:
    (folder / "model-00002-of-00002.safetensors").unlink()


def _second_shard_short(folder: Path) -> None:
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    gone = sorted(n for n, f in weight_map.items() if f == "model-00002-of-00002.safetensors")[0]
    _drop_tensors(folder / "model-00002-of-00002.safetensors", {gone})


def _no_index_no_second_shard(folder: Path) -> None:
    (folder / "model.safetensors.index.json").unlink()
    _no_second_shard(folder)


def _unknown_arch_no_second_shard(folder: Path) -> None:
    _config(model_type="specchat_unknown_arch")(folder)
    _no_index_no_second_shard(folder)


SHARDS = {
    "index-file-missing": (_no_second_shard, "is incomplete: model.safetensors.index.json lists "
                           "model-00002-of-00002.safetensors, which is missing", True),
    "index-tensor-missing": (_second_shard_short, "model-00002-of-00002.safetensors is "
                             "incomplete: model.safetensors.index.json puts tensor ", True),
    "no-index": (_no_index_no_second_shard, "is incomplete: it has "
                 "model-00001-of-00002.safetensors but not model-00002-of-00002.safetensors",
                 True),
    "unknown-arch": (_unknown_arch_no_second_shard, "is incomplete: it has "
                     "model-00001-of-00002.safetensors but not "
                     "model-00002-of-00002.safetensors", False),
}


@pytest.mark.parametrize("arch", ["phi3", "gemma"])
@pytest.mark.parametrize("case", list(SHARDS))
def test_a_missing_shard_is_refused_for_any_architecture(lib_home, tmp_path, other_archs, arch,
                                                         case):
    damage, words, mlx_loads_arch = SHARDS[case]
    broken = tmp_path / f"{arch}-{case}"
    shutil.copytree(other_archs[arch], broken)
    damage(broken)
    msg = _refused(broken)
    assert words in msg, msg
    with pytest.raises(LibraryError, match="is incomplete"):
        facts.read_folder(broken)
    if mlx_loads_arch:
        _mlx_lm_cannot_load(broken)


def test_complete_shards_of_other_architectures_import(lib_home, other_archs):
    """No false alarm: the whole sharded folders load in mlx-lm and import."""
    from mlx_lm.utils import load_model

    for arch, folder in other_archs.items():
        load_model(folder)
        model = importing.import_path(folder)
        assert model.model_type == arch and model.params


# -- malformed metadata ------------------------------------------------------------
CONFIGS = {
    "string": ({"num_attention_heads": "sixteen"}, (),
               "num_attention_heads must be a whole number above 0; got 'sixteen'"),
    "zero": ({"num_attention_heads": 0}, (), "num_attention_heads must be a whole number above "
                                             "0; got 0"),
    "negative": ({"hidden_size": -64}, (), "hidden_size must be a whole number above 0; got -64"),
    "fraction": ({"num_key_value_heads": 1.5}, (), "num_key_value_heads must be a whole number "
                                                   "above 0; got 1.5"),
    "bool": ({"vocab_size": True}, (), "vocab_size must be a whole number above 0; got true"),
    "eps": ({"rms_norm_eps": "small"}, (), "rms_norm_eps must be a number above 0; got 'small'"),
    "missing": ({}, ("hidden_size",), "lacks 'hidden_size', which a llama model needs"),
    "no-type": ({}, ("model_type",), "lacks 'model_type'"),
    "heads": ({"num_key_value_heads": 3}, (), "num_attention_heads (4) must be a multiple of "
                                              "num_key_value_heads (3)"),
    # A rope scaling mlx-lm cannot build (rope_rules, the heads' rule too):
    # taken by the check and the import, then failed when the model was
    # built, in Python's words ("'list' object has no attribute 'get'",
    # "division by zero") or, for llama3's missing factors, transformers'
    # as it loaded the tokenizer.
    "rope-list": ({"rope_scaling": [1, 2]}, (), "its rope scaling is one mlx-lm cannot build "
                                                "(it is a list of 2, not an object)"),
    "rope-text": ({"rope_scaling": "linear"}, (), "its rope scaling is one mlx-lm cannot build"),
    "rope-factor-0": ({"rope_scaling": {"type": "linear", "factor": 0}}, (),
                      'its rope scaling of type "linear" is one mlx-lm cannot build (its factor '
                      "is 0 (int), not a number above 0)"),
    "rope-factor-nan": ({"rope_scaling": {"rope_type": "yarn", "factor": float("nan"),
                                          "original_max_position_embeddings": 1024}}, (),
                        "its factor is nan (float), not a number above 0"),
    "rope-llama3": ({"rope_scaling": {"rope_type": "llama3", "factor": 8}}, (),
                    'its rope scaling of type "llama3" is one mlx-lm cannot build (it lacks '
                    "'low_freq_factor')"),
    "rope-unknown": ({"rope_scaling": {"rope_type": "wobbly", "factor": 2}}, (),
                     "(mlx-lm knows no such type)"),
    "rope-type-list": ({"rope_scaling": {"type": ["linear"], "factor": 2}}, (),
                       "its rope scaling's type must be a name; got a list of 1"),
    # Objects and token ids of other kinds: an internal error in the engine
    # (text_config), Python's words (quantization), transformers' several
    # lines (the ids).
    "text-config-list": ({"text_config": [1]}, (), "text_config must be an object; got [1]"),
    "quantization-list": ({"quantization": [4]}, (), "quantization must be an object; got [4]"),
    "eos-text": ({"eos_token_id": ["a"]}, (), "eos_token_id must be a token id (a whole number) "
                                              'or a list of them; got ["a"]'),
    "bos-float": ({"bos_token_id": 1e30}, (), "bos_token_id must be a token id"),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_malformed_config_is_named(lib_home, tmp_path, tiny_target, case):
    values, dropped, words = CONFIGS[case]
    broken = _copy(tiny_target, tmp_path / f"cfg-{case}", values, dropped)
    msg = _refused(broken)
    assert msg.startswith(f"{broken / 'config.json'}"), msg
    assert words in msg, msg


def test_a_config_with_a_byte_order_mark_is_refused_as_mlx_lm_refuses_it(lib_home, tmp_path,
                                                                          tiny_target):
    """Python's json takes a UTF-8 byte order mark; mlx-lm's loading does
    not ("Unexpected UTF-8 BOM"): the check and the import took such a
    folder and the engine refused it. Now all say so, naming the file."""
    broken = _copy(tiny_target, tmp_path / "bom")
    (broken / "config.json").write_bytes(b"\xef\xbb\xbf" + (broken / "config.json").read_bytes())
    msg = _refused(broken)
    assert msg == (f"{broken / 'config.json'} is broken: it starts with a byte order mark "
                   "(BOM), which mlx-lm does not read; save it as UTF-8 without one"), msg


def test_a_rope_scaling_is_refused_by_the_check_and_generate_in_the_same_words(
        lib_home, tmp_path, tiny_target, tiny_draft):
    """``models check`` said the model fits and ``generate`` failed building
    it ("could not read the weights ('list' object has no attribute
    'get')"); now both say what is wrong with the scaling, in one line."""
    env = {**os.environ, "SPECCHAT_HOME": str(lib_home)}
    for case in ("rope-list", "rope-llama3"):
        broken = _copy(tiny_target, tmp_path / case, CONFIGS[case][0])
        said = [subprocess.run([sys.executable, "-m", "specchat", *argv], env=env, text=True,
                               capture_output=True, timeout=120)
                for argv in (["models", "check", str(broken), str(tiny_draft)],
                             ["generate", "--target", str(broken), "--plain", "--prompt", "hi"])]
        lines = [done.stderr.strip().splitlines()[-1] for done in said]
        assert [done.returncode for done in said] == [1, 1], lines
        assert lines[0] == lines[1] and CONFIGS[case][2] in lines[0], lines


def _tokenizer_config(folder: Path, text: str) -> None:
    (folder / "tokenizer_config.json").write_text(text)


TOKENIZER_CONFIGS = {
    "json": ('{"eos_token": "<|im_end|>",', "tokenizer_config.json is broken: it is not valid JSON"),
    "object": ('["not", "a", "config"]', "tokenizer_config.json is broken: it is not a JSON object"),
    "template-type": ('{"chat_template": 5}',
                      "tokenizer_config.json is broken: chat_template must be text or a list"),
    "token-type": ('{"eos_token": 3}', "tokenizer_config.json is broken: eos_token must be a token"),
    "decoder": ('{"added_tokens_decoder": [1, 2]}',
                "tokenizer_config.json is broken: added_tokens_decoder must be"),
    # "²".isdigit() is true, but transformers' int("²") fails on it.
    "decoder-digit": ('{"added_tokens_decoder": {"\u00b2": {"content": "x"}}}',
                      "tokenizer_config.json is broken: added_tokens_decoder must be"),
    # Python's compiler, not Jinja, refuses these (SyntaxError, RecursionError).
    "nested-fors": (json.dumps({"chat_template": "{% for m in messages %}" * 25 + "x"
                                + "{% endfor %}" * 25}),
                    "tokenizer_config.json: the chat template is broken, its blocks or "
                    "expressions are nested too deeply to compile"),
    "nested-ifs": (json.dumps({"chat_template": "{% if messages %}" * 3000 + "x"
                               + "{% endif %}" * 3000}),
                   "tokenizer_config.json: the chat template is broken, its blocks or "
                   "expressions are nested too deeply to compile"),
    "jinja": (json.dumps({"chat_template": "{% for m in messages %}{{ m.content }}"}),
              "tokenizer_config.json: the chat template is broken, it is not valid Jinja (line 1: "),
    "named-jinja": (json.dumps({"chat_template": [
        {"name": "default", "template": "{{ messages }}"},
        {"name": "tool_use", "template": "{{ messages | no_such_filter }}"}]}),
        "the chat template 'tool_use' is broken, it is not valid Jinja"),
    # JSON nested past Python's recursion limit is a RecursionError, no ValueError.
    "deep": ("[" * 100_000, "tokenizer_config.json is broken: it is nested too deeply to read"),
    # Compiling took 11 microseconds a character: 1.6 million held the
    # import (and the check, and the engine's load) for 18 s; the file may
    # hold 64 MB. Refused by its length before Jinja sees it.
    "long": (json.dumps({"chat_template": "{{ 'x' }}" * 200_000}),
             "tokenizer_config.json: the chat template is broken, it is 1,800,000 characters "
             "long, more than a chat template is (SpecChat compiles at most 131,072)"),
}


@pytest.mark.parametrize("case", list(TOKENIZER_CONFIGS))
def test_broken_tokenizer_config_or_template_is_named(lib_home, tmp_path, tiny_target, case):
    text, words = TOKENIZER_CONFIGS[case]
    broken = _copy(tiny_target, tmp_path / f"tok-{case}")
    _tokenizer_config(broken, text)
    msg = _refused(broken)
    assert msg.startswith(str(broken / "tokenizer_config.json")), msg
    assert words in msg, msg


READ_FOLDER = """
import sys
from specchat.library import facts
from specchat.library.errors import LibraryError
try:
    facts.read_folder(sys.argv[1])
except LibraryError as exc:
    print(exc)
"""


def test_a_fifo_in_place_of_a_small_file_is_refused_not_waited_on(lib_home, tmp_path,
                                                                   tiny_target):
    """A folder used where it is (``specchat models check FOLDER``) is read
    without the import's plan, which refuses what is not a regular file: a
    FIFO in place of tokenizer_config.json must be said, not block the
    reading forever (in a child, so that a hang fails the test)."""
    folder = _copy(tiny_target, tmp_path / "fifo")
    (folder / "tokenizer_config.json").unlink()
    os.mkfifo(folder / "tokenizer_config.json")
    done = subprocess.run([sys.executable, "-c", READ_FOLDER, str(folder)], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == (f"{folder / 'tokenizer_config.json'} is broken: it is a "
                                   "FIFO (named pipe), not a regular file")


def test_a_broken_chat_template_file_is_named(lib_home, tmp_path, tiny_target):
    broken = _copy(tiny_target, tmp_path / "jinja-file")
    (broken / "chat_template.jinja").write_text("{% if messages %}\n{{ messages[0] }\n{% endif %}")
    msg = _refused(broken)
    assert msg.startswith(f"{broken / 'chat_template.jinja'}: the chat template is broken, it is "
                          "not valid Jinja (line 2: "), msg


def test_templates_transformers_accepts_compile(lib_home, tmp_path, tiny_target):
    """{% generation %} (transformers' extension), loop controls and tojson
    are part of what transformers compiles; they must not be refused."""
    good = _copy(tiny_target, tmp_path / "good-template")
    config = json.loads((good / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% generation %}{{ m.content | tojson }}{% endgeneration %}{% endfor %}")
    (good / "tokenizer_config.json").write_text(json.dumps(config))
    assert importing.import_path(good).name == "good-template"




def test_checking_a_template_never_runs_its_arithmetic(lib_home, tmp_path, tiny_target):
    """Jinja folds constants while compiling: checking ``'x' * 10**10``
    in a plain sandbox would build a 10 GB string. The check runs in a child
    with 1 GiB of address space, so a fold kills it instead of the machine."""
    bomb = _copy(tiny_target, tmp_path / "bomb-template")
    config = json.loads((bomb / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ 'x' * 10**10 }}{{ [1] * 10**10 }}{{ 9 ** 9999999 }}"
    (bomb / "tokenizer_config.json").write_text(json.dumps(config))
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
            "from specchat.library import facts; facts.validate_folder(sys.argv[1]); print('ok')")
    done = subprocess.run([sys.executable, "-c", code, str(bomb)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
# -- GGUF files ------------------------------------------------------------------
GGUFS = {
    "zero-heads": (dict(metadata={"llama.attention.head_count": 0}),
                   "llama.attention.head_count must be a whole number above 0; got 0"),
    "string-heads": (dict(metadata={"llama.attention.head_count": "sixteen"}),
                     "llama.attention.head_count must be a whole number above 0; got 'sixteen'"),
    "negative": (dict(metadata={"llama.embedding_length": -64}),
                 "llama.embedding_length must be a whole number above 0; got -64"),
    "missing-key": (dict(metadata={"llama.feed_forward_length": None}),
                    "lacks 'llama.feed_forward_length', which the import needs"),
    "eps": (dict(metadata={"llama.attention.layer_norm_rms_epsilon": "tiny"}),
            "llama.attention.layer_norm_rms_epsilon must be a number above 0; got 'tiny'"),
    "block-missing": (dict(metadata={"llama.block_count": 3}),
                      "llama.block_count is 3 but block 2 has no tensors"),
    "block-beyond": (dict(metadata={"llama.block_count": 1}),
                     "llama.block_count is 1 but the file has tensors for block 1"),
    "tensor-missing": (dict(drop={"blk.1.ffn_down.weight"}),
                       "its metadata describes 2 layers, but tensor blk.1.ffn_down.weight is "
                       "missing"),
    "template": (dict(metadata={"tokenizer.chat_template": "{% for m in messages %}"}),
                 "the chat template is broken, it is not valid Jinja"),
    # "²".isdigit() is true; int("²") raised a raw ValueError in the block check.
    "unicode-digit": (dict(extra_tensor=("blk.\u00b2.attn_q.weight",
                                         np.zeros((64, 64), np.float32), None)),
                      "has a tensor SpecChat does not know: 'blk.\u00b2.attn_q.weight'"),
}


@pytest.mark.parametrize("case", list(GGUFS))
def test_malformed_gguf_is_named_and_not_listed(lib_home, tmp_path, tiny_tokenizer, case):
    kwargs, words = GGUFS[case]
    g = write_gguf(tmp_path / f"{case}.gguf", tiny_tokenizer, **kwargs)
    msg = _refused(g.path)
    assert msg.startswith(str(g.path)), msg
    assert words in msg, msg


# -- what the user gave, named in every message ---------------------------------------
def _not_json(f: Path) -> None:
    with open(f, "r+") as out:  # in place: the copy hard-linked to it changes too
        out.truncate(0)
        out.write("{ not json")


def _cut_in_place(f: Path) -> None:
    with open(f, "r+b") as out:
        out.truncate(f.stat().st_size - 1000)


CHANGED = {"config.json": (_not_json, "is not valid JSON"),
           "tokenizer.json": (_not_json, "is not valid JSON"),
           "model.safetensors": (_cut_in_place, "is truncated")}


@pytest.mark.parametrize("name", list(CHANGED))
def test_a_file_changed_while_it_is_imported_is_named_as_the_user_s(lib_home, tmp_path,
                                                                   tiny_target, name):
    """Issue 47: a file edited in place after it was checked (its copy, a
    hard link, shares its bytes) fails the check of the copy, and the
    message named the work folder (<home>/tmp/import-...) instead of the
    user's file."""
    src = shutil.copytree(tiny_target, tmp_path / "m")
    edit, words = CHANGED[name]

    def progress(message: str, _fraction=None) -> None:
        if message.startswith("Imported the files of"):  # copied, not yet checked or listed
            edit(src / name)

    with pytest.raises(LibraryError) as err:
        importing.import_path(src, progress=progress)
    msg = str(err.value)
    assert str(src / name) in msg and words in msg, msg
    assert str(paths.tmp_dir()) not in msg and "import-" not in msg, msg
    _nothing_listed_or_left()


@pytest.mark.parametrize("kind", ["folder", "gguf"])
def test_a_model_given_through_a_link_is_named_as_given(lib_home, tmp_path, tiny_target,
                                                       tiny_tokenizer, kind):
    """A model reached through a link (an Ollama blob, a folder linked into
    place) is refused naming the path the user gave, not where it leads."""
    if kind == "folder":
        real = _copy(tiny_target, tmp_path / "store" / "real-model", {"hidden_size": "wide"})
        given = tmp_path / "my-model"
    else:
        g = write_gguf(tmp_path / "x.gguf", tiny_tokenizer, **GGUFS["template"][0])
        real = tmp_path / "blobs" / "sha256-0123abcd"
        real.parent.mkdir()
        g.path.rename(real)
        given = tmp_path / "my-model.gguf"
    given.symlink_to(real)
    msg = _refused(given)
    assert str(real) not in msg, msg


# -- work folders of dead imports ---------------------------------------------------
HELD_IMPORT = """
import os, sys, time
from pathlib import Path
from specchat.library import gguf_import, importing

kind, src, dest = sys.argv[1:4]


def hold(message, fraction):
    # Stands still mid-import (files half written) until the test kills it.
    if (fraction or 0) > 0 or message.startswith("converting"):
        print("HELD", flush=True)
        time.sleep(600)


if kind == "folder":
    def no_links(*args, **kwargs):
        raise OSError("copy instead")  # so the import writes its own files
    os.link = no_links
    importing.COPY_CHUNK = 4096
    importing.import_path(src, progress=hold)
else:
    gguf_import.import_gguf(Path(src), Path(dest), hold)
"""


def _start_held_import(tmp_path: Path, kind: str, src: Path, dest: Path | None = None):
    script = tmp_path / "held_import.py"
    script.write_text(HELD_IMPORT)
    return start_held([str(script), kind, str(src), str(dest or "")])


def _work_folders() -> list[str]:
    return sorted(p.name for p in paths.tmp_dir().iterdir()) if paths.tmp_dir().exists() else []


def test_killed_import_is_cleaned_by_the_next_and_a_live_one_is_left_alone(
        lib_home, tmp_path, tiny_target, tiny_draft, tiny_qwen_draft):
    dead = _start_held_import(tmp_path, "folder", tiny_target)
    kill(dead)
    left = _work_folders()
    assert left == [f"import-{dead.pid}-{left[0].split('-')[2]}",
                    f"import-{dead.pid}-{left[0].split('-')[2]}.lock"], left
    assert list((paths.tmp_dir() / left[0] / "model").iterdir())  # files half copied

    live = _start_held_import(tmp_path, "folder", tiny_draft)
    try:
        live_folders = [n for n in _work_folders() if n.startswith(f"import-{live.pid}-")]
        assert len(live_folders) == 2
        model = importing.import_path(tiny_qwen_draft)  # sweeps first
        assert _work_folders() == live_folders  # the dead one gone, the live one kept
        assert [m.name for m in index.list_installed()] == [model.name]
    finally:
        kill(live)
    importing.import_path(tiny_qwen_draft)  # already imported: returns it, after sweeping
    assert _work_folders() == []
    assert [m.name for m in index.list_installed()] == [model.name]
    assert sorted(p.name for p in paths.models_dir().iterdir()) == [model.name]


def test_any_command_cleans_what_killed_imports_left_and_leaves_a_live_one(
        lib_home, tmp_path, tiny_target, tiny_draft):
    """Issue 47: a killed import's work folder stayed until the next import.
    Any ``specchat`` command (here ``models list``, as the app's start)
    removes a dead process's work folders, joined parts and copies set aside
    to be deleted; a live import's folder (its lock held) is left alone."""
    live = _start_held_import(tmp_path, "folder", tiny_draft)
    try:
        live_left = _work_folders()
        assert len(live_left) == 2 and live_left[0].startswith(f"import-{live.pid}-")
        dead = _start_held_import(tmp_path, "folder", tiny_target)  # after: the live one's
        kill(dead)  # sweep at its start cannot have removed it
        assert len(_work_folders()) == 4
        built = paths.bundled_dir(create=True)
        aside = built / ".tiny.old-0123abcd"  # a replaced conversion, killed while deleting it
        aside.mkdir()
        (aside / "model.safetensors").write_bytes(b"half")
        proc = subprocess.run([sys.executable, "-m", "specchat", "models", "list"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert _work_folders() == live_left  # the dead one gone, the live one kept
        assert list(built.iterdir()) == []
    finally:
        kill(live)


def test_killed_gguf_conversion_is_cleaned_even_if_its_pid_is_reused(tmp_path, tiny_tokenizer):
    g = write_gguf(tmp_path / "tiny.gguf", tiny_tokenizer)
    out = tmp_path / "out"
    dead = _start_held_import(tmp_path, "gguf", g.path, out / "m")
    kill(dead)
    left = sorted(p.name for p in out.iterdir())
    assert len(left) == 2 and left[0].startswith(f".m.partial-{dead.pid}-"), left
    # The pid is a live process now (pid reuse): the free lock still tells.
    for name in left:
        os.rename(out / name, out / name.replace(f"-{dead.pid}-", "-1-"))

    from specchat.library.gguf_import import import_gguf

    import_gguf(g.path, out / "other")
    assert sorted(p.name for p in out.iterdir()) == ["other"]


def test_work_folders_from_older_versions_are_removed_once_old(lib_home):
    from specchat.library import staging

    tmp = paths.tmp_dir(create=True)
    old, recent = tmp / "import-0123456789ab", tmp / "import-ba9876543210"
    for folder in (old, recent):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    week_ago = old.stat().st_mtime - 7 * 24 * 3600
    os.utime(old, (week_ago, week_ago))
    assert staging.sweep(tmp, staging.IMPORT_NAMES) == [old]
    assert _work_folders() == [recent.name]


# -- a full disk ---------------------------------------------------------------------
@pytest.fixture
def home_disk(small_disk, monkeypatch):
    """mount(size) -> a real small tmpfs holding SPECCHAT_HOME."""

    def mount(size: str) -> Path:
        point = small_disk(size)
        monkeypatch.setenv("SPECCHAT_HOME", str(point / "home"))
        return point

    return mount


def test_a_model_too_big_for_the_disk_is_refused_up_front(home_disk, tiny_target):
    home_disk("256k")
    with pytest.raises(LibraryError) as err:
        importing.import_path(tiny_target)
    msg = str(err.value)
    assert msg.startswith(f"Not enough disk space for importing {tiny_target.resolve()}: it "
                          f"needs 1.1 MB (plus 5% to spare) and the disk holding "
                          f"{paths.models_dir()} has "), msg
    _nothing_listed_or_left()


def test_disk_filling_up_mid_import_is_said_and_leaves_nothing(home_disk, tiny_target):
    disk = home_disk("8m")
    filled = []

    def progress(_msg, _fraction):
        if not filled:
            fill(disk)
            filled.append(True)

    with pytest.raises(LibraryError) as err:
        importing.import_path(tiny_target, progress=progress)
    assert str(err.value) == (
        f"Not enough disk space to import {tiny_target.resolve()}: the disk holding "
        f"{paths.models_dir()} filled up during the import; nothing was added. Free some "
        "space and import again.")
    _nothing_listed_or_left()


def test_disk_filling_up_mid_gguf_conversion_is_said_and_leaves_nothing(home_disk, tmp_path,
                                                                       tiny_tokenizer):
    g = write_gguf(tmp_path / "tiny.gguf", tiny_tokenizer)
    disk = home_disk("8m")

    def progress(msg, _fraction):
        if msg.startswith("converting") and not (disk / "filler").exists():
            fill(disk)

    with pytest.raises(LibraryError) as err:
        importing.import_path(g.path, progress=progress)
    assert str(err.value) == (
        f"Not enough disk space to import {g.path}: the disk holding {paths.models_dir()} "
        "filled up during the import; nothing was added. Free some space and import again.")
    _nothing_listed_or_left()


# -- nothing from outside the folder (issue 29) ----------------------------------------
def _secret(tmp_path: Path) -> Path:
    """A private file outside the folder being imported (a stand-in for ~/.ssh/id_rsa)."""
    key = tmp_path / "user-home" / ".ssh" / "id_rsa"
    key.parent.mkdir(parents=True)
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n")
    return key


def _out_of_folder(link: Path, target: Path, root: Path) -> str:
    return (f"{link} is a symbolic link to {target}, outside {root}: SpecChat never imports a "
            "file from outside the folder being imported. Put the file itself in the folder "
            "in place of the link and import again.")


@pytest.mark.parametrize("outside", ["/etc/passwd", "private key"])
def test_a_symlink_out_of_the_folder_is_refused_and_named(lib_home, tmp_path, tiny_target,
                                                          outside):
    """A folder with generation_config.json -> /etc/passwd (or a private
    key) imported "successfully", the models folder holding a hard link to
    that very file (one inode). Now it is refused before anything is read."""
    src = _copy(tiny_target, tmp_path / "model")
    target = Path(outside) if outside.startswith("/") else _secret(tmp_path)
    (src / "generation_config.json").symlink_to(target)
    assert _refused(src) == _out_of_folder(src / "generation_config.json", target, src)


def test_the_command_refuses_a_symlink_out_in_one_line(lib_home, tmp_path, tiny_target):
    src = _copy(tiny_target, tmp_path / "model")
    key = _secret(tmp_path)
    (src / "tokenizer_config.json").unlink()
    (src / "tokenizer_config.json").symlink_to(os.path.relpath(key, src))  # relative, too
    proc = subprocess.run([sys.executable, "-m", "specchat", "models", "import", str(src)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "specchat: error: " + _out_of_folder(src / "tokenizer_config.json", key, src)]
    _nothing_listed_or_left()


def test_files_are_hard_linked_only_when_the_folder_is_their_only_other_name(
        lib_home, tmp_path, tiny_target):
    """The rule: a regular file of the folder (or a link inside it to one)
    that has no other name is hard-linked (no second copy of the weights);
    one that also has a name elsewhere (a hard link to a file outside) is
    copied, so no file in the models folder shares an inode with a file
    outside the folder the user imported."""
    src = _copy(tiny_target, tmp_path / "model")
    elsewhere = tmp_path / "elsewhere" / "generation_config.json"
    elsewhere.parent.mkdir()
    elsewhere.write_text('{"private": true}')
    os.link(elsewhere, src / "generation_config.json")
    inner = src / "tokenizer" / "tokenizer.json"
    inner.parent.mkdir()
    (src / "tokenizer.json").rename(inner)
    (src / "tokenizer.json").symlink_to("tokenizer/tokenizer.json")  # inside: followed

    dest = Path(importing.import_path(src).path)
    weights, linked = os.stat(src / "model.safetensors"), os.stat(dest / "model.safetensors")
    assert (linked.st_ino, linked.st_nlink) == (weights.st_ino, 2)
    tok = os.stat(dest / "tokenizer.json")
    assert not (dest / "tokenizer.json").is_symlink()
    assert (tok.st_ino, tok.st_nlink) == (os.stat(inner).st_ino, 2)
    copied = os.stat(dest / "generation_config.json")
    assert copied.st_ino != os.stat(elsewhere).st_ino and copied.st_nlink == 1
    assert os.stat(elsewhere).st_nlink == 2  # its own name and the one in the folder
    assert (dest / "generation_config.json").read_text() == '{"private": true}'
    outside = {os.stat(elsewhere).st_ino}
    assert all(not f.is_symlink() and f.stat().st_ino not in outside for f in dest.iterdir())


def _hub_snapshot(tmp_path: Path, tiny_target: Path) -> Path:
    """A Hugging Face cache repo as huggingface_hub lays it out: the files
    in blobs/, the snapshot a folder of relative links to them."""
    import hashlib

    repo = tmp_path / "hf" / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / ("a" * 40)
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in tiny_target.iterdir():
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        blob.write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    return snap


def test_a_hugging_face_snapshot_imports_its_blobs_but_nothing_beyond_its_repo(
        lib_home, tmp_path, tiny_target):
    snap = _hub_snapshot(tmp_path, tiny_target)
    repo = snap.parent.parent
    stray = tmp_path / "hf" / "hub" / "models--other--repo" / "blobs" / "x"
    stray.parent.mkdir(parents=True)
    stray.write_text("{}")
    (snap / "generation_config.json").symlink_to(os.path.relpath(stray, snap))
    assert _refused(snap) == _out_of_folder(snap / "generation_config.json", stray, repo)

    (snap / "generation_config.json").unlink()
    model = importing.import_path(snap)
    assert model.name == "tiny"
    for f in Path(model.path).iterdir():
        blob = Path(os.path.realpath(snap / f.name))
        assert blob.parent == repo / "blobs" and not f.is_symlink()
        assert f.stat().st_ino == blob.stat().st_ino  # the repo's own blob: linked


@pytest.mark.parametrize("kind", ["fifo", "link to a fifo", "link to a device"])
def test_a_file_that_is_not_a_regular_file_is_refused_never_read(lib_home, tmp_path,
                                                                 tiny_target, kind):
    """A FIFO as config.json blocked the import forever (in a child here, so
    that a hang fails the test)."""
    src = _copy(tiny_target, tmp_path / "model")
    (src / "config.json").unlink()
    if kind == "fifo":
        os.mkfifo(src / "config.json")
        what = "a FIFO (named pipe)"
    elif kind == "link to a fifo":
        os.mkfifo(src / "pipe")
        (src / "config.json").symlink_to("pipe")
        what = "a FIFO (named pipe)"
    else:
        os.mknod(src / "zero", 0o600 | stat.S_IFCHR, os.makedev(1, 5)) if os.geteuid() == 0 \
            else pytest.skip("making a device node needs root")
        (src / "config.json").symlink_to("zero")
        what = "a character device"
    proc = subprocess.run([sys.executable, "-m", "specchat", "models", "import", str(src)],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"specchat: error: {src / 'config.json'} is {what}, not a regular file; SpecChat "
        "imports only regular files."]
    _nothing_listed_or_left()


@pytest.mark.parametrize("place,make", [(".index.lock", "folder"), ("models", "file"),
                                        ("tmp", "file")])
def test_a_library_folder_or_lock_that_is_something_else_is_named(lib_home, tiny_draft, place,
                                                                 make):
    """In the home, the index's lock file as a folder, or the models' or
    the work folder as a file, made an import say only "Is a directory" or
    "File exists"; it names what is in the way now."""
    lib_home.mkdir()
    if make == "folder":
        (lib_home / place).mkdir()
    else:
        (lib_home / place).write_text("mine\n")
    env = {**os.environ, "SPECCHAT_HOME": str(lib_home)}
    done = subprocess.run([sys.executable, "-m", "specchat", "models", "import", str(tiny_draft)],
                          env=env, capture_output=True, text=True, timeout=120)
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode == 1 and len(errors) == 1, done.stderr
    said = (f"the lock file {lib_home / place} cannot be opened (Is a directory)"
            if make == "folder" else f"{lib_home / place} is a file, not a folder; SpecChat "
                                     "keeps its files there: move it away")
    assert errors[0].endswith(said), errors
