"""GGUF import on tiny GGUF files written in the test (no downloads).

What is checked: the folder loads with mlx-lm and the engine; every weight
equals the dequantized source in HF row order (llama Q/K permutation undone,
checked independently through attention scores); the tokenizer matches a
reference built from the same vocabulary; atomicity on cancel and failure;
clear errors for truncated files, unknown architectures and quant types.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from specchat.library.errors import LibraryError
from specchat.library.gguf_header import read_header
from specchat.library.gguf_import import ImportCancelled, gguf_summary, import_gguf
from tinygguf import CHATML, write_gguf

SAMPLES = ["Hello, world! How are you today?", "def fibonacci(n):\n    a, b = 0, 1\n",
           "x = np.arange(10)  # 12345 67", "日本語 café 🙂 naïve", "  two  spaces\n\n\ttab",
           "<|im_start|>user\nhi<|im_end|>"]


def _load_safetensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for f in sorted(folder.glob("model*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory, tiny_tokenizer):
    d = tmp_path_factory.mktemp("gguf-llama")
    return write_gguf(d / "tiny-llama.gguf", tiny_tokenizer, arch="llama",
                      quant={"attn_q": "Q8_0", "attn_k": "Q4_0", "ffn_gate": "Q4_1",
                             "ffn_up": "F16", "token_embd": "Q8_0", "attn_output": "Q5_0"})


@pytest.fixture(scope="module")
def llama_folder(llama_gguf, tmp_path_factory):
    return import_gguf(llama_gguf.path, tmp_path_factory.mktemp("imp-llama") / "tiny-llama")


@pytest.fixture(scope="module")
def qwen_gguf(tmp_path_factory, tiny_tokenizer):
    d = tmp_path_factory.mktemp("gguf-qwen")
    return write_gguf(d / "tiny-qwen.gguf", tiny_tokenizer, arch="qwen2", hidden=256, heads=4,
                      kv_heads=2, ffn=256, layers=1, tied=False, pre="qwen2", seed=3,
                      kquant={"token_embd": "Q4_K", "ffn_down": "Q6_K", "attn_q": "Q4_K",
                              "output": "Q6_K"},
                      quant={"attn_v": "Q8_0"})


@pytest.fixture(scope="module")
def qwen_folder(qwen_gguf, tmp_path_factory):
    return import_gguf(qwen_gguf.path, tmp_path_factory.mktemp("imp-qwen") / "tiny-qwen")


# -- weights and config --------------------------------------------------------
def test_llama_weights_equal_dequantized_source(llama_gguf, llama_folder):
    weights = _load_safetensors(llama_folder)
    assert set(weights) == set(llama_gguf.expected)
    for name, expected in llama_gguf.expected.items():
        got = weights[name]
        assert got.shape == expected.shape, name
        if llama_gguf.types[name] == "F32":
            assert got.dtype == np.float32, name
            np.testing.assert_array_equal(got, expected, err_msg=name)
        else:  # quantized or F16 in the file -> float16
            assert got.dtype == np.float16, name
            np.testing.assert_array_equal(got, expected.astype(np.float16), err_msg=name)


def test_llama_rotary_permutation_undone_gives_llamacpp_attention(llama_gguf, llama_folder):
    """llama.cpp applies RoPE to adjacent pairs of its (permuted) Q/K rows;
    mlx-lm applies it to half-split pairs of HF rows. The attention scores
    must agree, which pins the permutation independently of how it is coded."""
    import mlx.core as mx

    cfg = llama_gguf.config
    heads, kv, hd = cfg["heads"], cfg["kv_heads"], cfg["hidden"] // cfg["heads"]
    weights = _load_safetensors(llama_folder)
    x = mx.array(np.random.default_rng(0).standard_normal((1, 7, cfg["hidden"])).astype(np.float32))

    def scores(wq, wk, traditional):
        q = (x @ mx.array(wq).T).reshape(1, 7, heads, hd).transpose(0, 2, 1, 3)
        k = (x @ mx.array(wk).T).reshape(1, 7, kv, hd).transpose(0, 2, 1, 3)
        q = mx.fast.rope(q, hd, traditional=traditional, base=10000.0, scale=1.0, offset=0)
        k = mx.fast.rope(k, hd, traditional=traditional, base=10000.0, scale=1.0, offset=0)
        k = mx.repeat(k, heads // kv, axis=1)
        return np.array(q @ k.transpose(0, 1, 3, 2))

    def as16(w):  # the import stores quantized tensors as float16
        return w.astype(np.float16).astype(np.float32)

    for layer in range(cfg["layers"]):
        p = f"model.layers.{layer}.self_attn."
        wq, wk = as16(llama_gguf.stored[p + "q_proj.weight"]), as16(
            llama_gguf.stored[p + "k_proj.weight"])
        gguf_rows = scores(wq, wk, traditional=True)
        imported = scores(weights[p + "q_proj.weight"].astype(np.float32),
                          weights[p + "k_proj.weight"].astype(np.float32), traditional=False)
        np.testing.assert_allclose(imported, gguf_rows, rtol=1e-4, atol=1e-4)
        wrong = scores(wq, wk, traditional=False)
        assert not np.allclose(wrong, gguf_rows, atol=1e-2)  # the check can fail


def test_llama_config(llama_gguf, llama_folder):
    text = (llama_folder / "config.json").read_text()
    assert text.endswith("}\n")  # a text file, as the Hub's are
    cfg = json.loads(text)
    c = llama_gguf.config
    assert cfg["model_type"] == "llama"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["vocab_size"]) == (
        c["hidden"], c["layers"], c["heads"], c["kv_heads"], c["ffn"], c["vocab"])
    assert cfg["rms_norm_eps"] == 1e-5 and cfg["rope_theta"] == 10000.0
    assert cfg["max_position_embeddings"] == 512
    assert cfg["tie_word_embeddings"] is True and cfg["attention_bias"] is False
    assert cfg["eos_token_id"] == 2 and cfg["bos_token_id"] == 0


def test_qwen2_k_quants_and_untied_head(qwen_gguf, qwen_folder):
    weights = _load_safetensors(qwen_folder)
    assert set(weights) == set(qwen_gguf.expected)
    assert "lm_head.weight" in weights and qwen_gguf.types["lm_head.weight"] == "Q6_K"
    assert qwen_gguf.types["model.embed_tokens.weight"] == "Q4_K"
    for name, expected in qwen_gguf.expected.items():
        want = expected if qwen_gguf.types[name] == "F32" else expected.astype(np.float16)
        np.testing.assert_array_equal(weights[name], want, err_msg=name)
    cfg = json.loads((qwen_folder / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["tie_word_embeddings"] is False


@pytest.mark.parametrize("which", ["llama", "qwen"])
def test_imported_folder_runs_in_the_engine(which, llama_folder, qwen_folder):
    import mlx.core as mx
    from specchat.engine import compute
    from specchat.engine.loading import load_folder

    folder = llama_folder if which == "llama" else qwen_folder
    loaded = load_folder(folder, compute.detect())
    ids = loaded.tokenizer.encode("def fibonacci(n):")
    logits = loaded.model(mx.array([ids]))
    assert logits.shape[-1] == json.loads((folder / "config.json").read_text())["vocab_size"]
    assert bool(mx.all(mx.isfinite(logits)))


# -- tokenizer -----------------------------------------------------------------
def _reference(tokenizer_dir: Path, pre_tokenizer, normalizer=None):
    """The tiny vocabulary with a given pre-tokenizer, built with the
    tokenizers API (not from the importer's JSON)."""
    from tokenizers import Tokenizer, decoders

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    if normalizer is not None:
        tok.normalizer = normalizer
    return tok


def _imported_tokenizer(folder: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def test_tokenizer_gpt2_split_matches_original(llama_folder, tiny_tokenizer):
    from tokenizers import Tokenizer

    original = Tokenizer.from_file(str(tiny_tokenizer / "tokenizer.json"))
    ours = _imported_tokenizer(llama_folder)
    for s in SAMPLES:
        assert ours.encode(s).ids == original.encode(s).ids, s
        assert ours.decode(ours.encode(s).ids, skip_special_tokens=False) == s


def test_tokenizer_qwen2_split_matches_reference(qwen_folder, tiny_tokenizer):
    from tokenizers import Regex, normalizers, pre_tokenizers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    ref = _reference(tiny_tokenizer, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), normalizers.NFC())
    ours = _imported_tokenizer(qwen_folder)
    for s in SAMPLES:
        assert ours.encode(s).ids == ref.encode(s).ids, s
        assert ours.decode(ours.encode(s).ids, skip_special_tokens=False) == s
    # Qwen's split keeps digits apart; GPT-2's would not.
    digits = ours.encode("x = 12345").tokens
    assert [t for t in digits if t.strip("Ġ").isdigit()] == ["1", "2", "3", "4", "5"]


@pytest.mark.parametrize("pre", ["smollm", "llama-bpe"])
def test_tokenizer_other_splits(pre, tiny_tokenizer):
    from specchat.library import gguf_tokenizer
    from tinygguf import vocab_from_tokenizer
    from tokenizers import Regex, Tokenizer, pre_tokenizers

    tokens, types, merges = vocab_from_tokenizer(tiny_tokenizer)
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 0,
            "tokenizer.ggml.eos_token_id": 2}
    tok_json, config = gguf_tokenizer.build(meta)
    ours = Tokenizer.from_str(json.dumps(tok_json))
    if pre == "smollm":  # SmolLM2's tokenizer.json: single digits, then GPT-2's split
        ref_pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                           pre_tokenizers.ByteLevel(add_prefix_space=False)])
        assert config["add_bos_token"] is False
    else:  # Llama 3's tokenizer.json
        llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
        ref_pre = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(llama3), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        assert config["add_bos_token"] is True  # llama.cpp's default for llama-bpe
    ref = _reference(tiny_tokenizer, ref_pre)
    for s in SAMPLES:
        want = ref.encode(s, add_special_tokens=False).ids
        if pre == "llama-bpe":
            want = [0] + want  # BOS prepended
        assert ours.encode(s).ids == want, s


def test_tokenizer_config_and_chat_template(llama_folder):
    from mlx_lm.utils import load_tokenizer

    cfg = json.loads((llama_folder / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<|im_end|>" and cfg["bos_token"] == "<|endoftext|>"
    assert cfg["chat_template"] == CHATML and cfg["add_bos_token"] is False
    tok = load_tokenizer(llama_folder)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode("<|im_start|>user", add_special_tokens=False)
    assert ids[0] == 1  # control tokens stay whole, with their GGUF ids
    assert tok.eos_token_ids == {2}


def test_unsupported_tokenizer_model(tmp_path):
    from specchat.library import gguf_tokenizer

    with pytest.raises(LibraryError, match="SentencePiece"):
        gguf_tokenizer.build({"tokenizer.ggml.model": "llama"})
    with pytest.raises(LibraryError, match="pre-tokenizer 'mystery'"):
        gguf_tokenizer.build({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "mystery"})


# -- files, atomicity, errors --------------------------------------------------
def test_header_reader_agrees_with_gguf_reader(qwen_gguf):
    import gguf

    ours = read_header(qwen_gguf.path, ["tokenizer.ggml.tokens"])
    ref = gguf.GGUFReader(qwen_gguf.path)
    assert [(t.name, t.dims, t.type_id, t.offset) for t in ours.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset))
        for t in ref.tensors]
    assert ours.metadata["tokenizer.ggml.tokens"] == ref.fields["tokenizer.ggml.tokens"].contents()
    assert ours.metadata["qwen2.embedding_length"] == 256


def test_summary(qwen_gguf):
    s = gguf_summary(qwen_gguf.path)
    assert s["architecture"] == "qwen2" and s["name"] == "Tiny qwen2"
    assert s["vocab_size"] == qwen_gguf.config["vocab"] and s["context_length"] == 512
    assert s["quantization"] == "Q8_0"  # general.file_type as written
    assert s["parameters"] == sum(v.size for v in qwen_gguf.expected.values())
    assert s["supported"] is True


def test_existing_import_is_reused_and_foreign_folder_refused(llama_gguf, llama_folder, tmp_path):
    before = (llama_folder / "model.safetensors").stat().st_mtime_ns
    assert import_gguf(llama_gguf.path, llama_folder) == llama_folder
    assert (llama_folder / "model.safetensors").stat().st_mtime_ns == before
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(LibraryError, match="holds files this command did not write"):
        import_gguf(llama_gguf.path, foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def test_cancel_leaves_nothing(llama_gguf, tmp_path):
    cancel = threading.Event()
    seen = []

    def progress(msg, frac):
        seen.append(msg)
        if len(seen) == 6:
            cancel.set()

    with pytest.raises(ImportCancelled):
        import_gguf(llama_gguf.path, tmp_path / "m", progress, cancel)
    assert _leftovers(tmp_path) == []


def test_failure_mid_import_leaves_nothing(llama_gguf, small_disk):
    """A real disk that another program fills while the weights are being
    written (after the space was checked): the import fails in words and
    leaves nothing behind."""
    from smalldisk import fill

    disk = small_disk("8m")
    converting = []

    def progress(msg, _frac):
        if msg == "converting the weights":
            converting.append(msg)
            if len(converting) == 2:
                fill(disk)

    with pytest.raises(LibraryError) as err:
        import_gguf(llama_gguf.path, disk / "m", progress)
    assert len(converting) >= 2
    assert str(err.value) == (
        f"Not enough disk space to import {llama_gguf.path}: the disk holding {disk} filled "
        "up during the import; nothing was added. Free some space and import again.")
    assert _leftovers(disk) == ["filler"]


def test_not_enough_disk_space_is_refused_up_front(llama_gguf, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(LibraryError, match=r"Not enough disk space .* needs \d+\.\d KB .* has "
                                           r"1\.0 KB free"):
        import_gguf(llama_gguf.path, tmp_path / "m")
    assert _leftovers(tmp_path) == []


def test_stale_partial_folders_are_removed(llama_gguf, tmp_path):
    stale = tmp_path / ".m.partial-999999999-dead"  # no such pid
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    import_gguf(llama_gguf.path, tmp_path / "m")
    assert _leftovers(tmp_path) == ["m"]


def test_sharded_output_loads(llama_gguf, tmp_path):
    from specchat.engine import compute
    from specchat.engine.loading import load_folder

    folder = import_gguf(llama_gguf.path, tmp_path / "m", max_shard_bytes=60_000)
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    assert len(shards) > 1 and shards[0].endswith(f"-of-{len(shards):05d}.safetensors")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    weights = _load_safetensors(folder)
    assert set(weights) == set(llama_gguf.expected)
    load_folder(folder, compute.detect())


@pytest.mark.parametrize("keep", [0.6, 0.001])
def test_truncated_file_is_explained(llama_gguf, tmp_path, keep):
    data = llama_gguf.path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:max(30, int(len(data) * keep))])
    with pytest.raises(LibraryError, match="truncated") as err:
        import_gguf(cut, tmp_path / "m")
    assert "get the file again" in str(err.value)
    assert _leftovers(tmp_path) == ["cut.gguf"]


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(LibraryError, match="not a GGUF file"):
        import_gguf(bad, tmp_path / "m")


@pytest.mark.parametrize(("version", "said"), [
    (b"\0\0\0\0", "is not a valid GGUF file (its version is 0: the file is damaged)"),
    (b"\0\0\0\x03", "is a big-endian GGUF file; only little-endian is supported"),
    (b"\x07\0\0\0", "GGUF version 7 is not supported (only 2 and 3)"),
])
def test_a_gguf_files_version_is_read_for_what_it_says(tmp_path, version, said):
    """The magic then zeros (a damaged file) was said to be big-endian;
    only a version that reads as 1-3 the other way round is one."""
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + version + b"\0" * 100)
    with pytest.raises(LibraryError) as err:
        import_gguf(bad, tmp_path / "m")
    assert str(err.value) == f"{bad} {said}" or str(err.value) == f"{bad}: {said}"


def test_unknown_architecture(tmp_path, tiny_tokenizer):
    g = write_gguf(tmp_path / "xyz.gguf", tiny_tokenizer, arch="xyz", layers=1)
    with pytest.raises(LibraryError) as err:
        import_gguf(g.path, tmp_path / "m")
    assert str(err.value) == (f"{g.path}: GGUF architecture 'xyz' is not supported "
                              "(supported: llama, qwen2)")
    assert gguf_summary(g.path)["supported"] is False
    assert _leftovers(tmp_path) == ["xyz.gguf"]


def test_unsupported_quant_type(tmp_path, tiny_tokenizer):
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_1]
    raw = np.zeros((4, 64 // block * size), dtype=np.uint8)
    g = write_gguf(tmp_path / "q81.gguf", tiny_tokenizer, layers=1,
                   extra_tensor=("blk.0.attn_v.bias", raw, GGMLQuantizationType.Q8_1))
    with pytest.raises(LibraryError, match="Q8_1"):
        import_gguf(g.path, tmp_path / "m")


def test_unknown_tensor_is_refused(tmp_path, tiny_tokenizer):
    g = write_gguf(tmp_path / "odd.gguf", tiny_tokenizer, layers=1,
                   extra_tensor=("blk.0.attn_q_norm.weight", np.ones(16, np.float32), None))
    with pytest.raises(LibraryError, match="attn_q_norm"):
        import_gguf(g.path, tmp_path / "m")


def _llamacpp_rope_factors(dim: int, base: float, factor: float, low: float, high: float,
                           old_context_len: int) -> np.ndarray:
    """The factors llama.cpp's convert_hf_to_gguf.py writes as rope_freqs for
    Llama 3.1+ (its loop, transcribed)."""
    import math

    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_context_len / high:
            out.append(1)
        elif wavelen > old_context_len / low:
            out.append(factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_llama3_rope_factors_become_rope_scaling(tmp_path, tiny_tokenizer):
    import mlx.core as mx
    from mlx_lm.utils import load_model

    factors = _llamacpp_rope_factors(16, 10000.0, 32.0, 1.0, 4.0, 8192)
    assert 1.0 < factors[-2] < 32.0 and factors[-1] == 32.0  # all three regimes present
    g = write_gguf(tmp_path / "l3.gguf", tiny_tokenizer, layers=1,
                   extra_tensor=("rope_freqs.weight", factors, None))
    folder = import_gguf(g.path, tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["rope_scaling"] == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192}
    model, _ = load_model(folder)
    rope = model.model.layers[0].self_attn.rope
    got = np.array(rope._freqs / 10000.0 ** (mx.arange(0, 16, 2) / 16))
    np.testing.assert_allclose(got, factors, rtol=1e-5)


def test_unknown_rope_factors_are_refused(tmp_path, tiny_tokenizer):
    factors = np.linspace(1, 3, 8, dtype=np.float32)
    g = write_gguf(tmp_path / "odd.gguf", tiny_tokenizer, layers=1,
                   extra_tensor=("rope_freqs.weight", factors, None))
    with pytest.raises(LibraryError, match="do not match Llama 3's rope scaling"):
        import_gguf(g.path, tmp_path / "m")


def test_values_beyond_float16_are_refused(tmp_path, tiny_tokenizer):
    from gguf import GGMLQuantizationType

    # qwen2's V bias: 2 KV heads x 16 = 32 values, one Q8_0 block. (A tensor
    # the model does not have would be refused before conversion.)
    raw = np.zeros(34, dtype=np.uint8)
    raw[:2] = np.array([60000.0], dtype=np.float16).view(np.uint8)  # block scale
    raw[2:] = 127  # 60000 * 127 does not fit in float16
    g = write_gguf(tmp_path / "big.gguf", tiny_tokenizer, arch="qwen2", layers=1,
                   drop={"blk.0.attn_v.bias"},
                   extra_tensor=("blk.0.attn_v.bias", raw, GGMLQuantizationType.Q8_0))
    with pytest.raises(LibraryError, match="outside the float16 range"):
        import_gguf(g.path, tmp_path / "m")
    assert _leftovers(tmp_path) == ["big.gguf"]


def _point_tensor_at(path: Path, name: str, other: str) -> None:
    """Rewrite ``name``'s data offset in the tensor table to ``other``'s."""
    import struct

    header = read_header(path)
    target = header.tensor(other).offset - header.data_offset
    raw = bytearray(path.read_bytes())
    key = struct.pack("<Q", len(name)) + name.encode()
    at = raw.index(key) + len(key)
    (n_dims,) = struct.unpack_from("<I", raw, at)
    struct.pack_into("<Q", raw, at + 4 + 8 * n_dims + 4, target)
    path.write_bytes(bytes(raw))


def test_tensors_sharing_bytes_are_refused(tmp_path, tiny_tokenizer):
    g = write_gguf(tmp_path / "shared.gguf", tiny_tokenizer, layers=1)
    _point_tensor_at(g.path, "blk.0.ffn_norm.weight", "blk.0.attn_norm.weight")
    with pytest.raises(LibraryError) as err:
        import_gguf(g.path, tmp_path / "m")
    assert str(err.value).startswith(f"{g.path} is damaged: tensors ")
    assert "'blk.0.attn_norm.weight'" in str(err.value) and "share bytes" in str(err.value)
    assert _leftovers(tmp_path) == ["shared.gguf"]


@pytest.mark.parametrize("alignment", [12, -8])
def test_bad_alignment_is_refused(tmp_path, tiny_tokenizer, alignment):
    g = write_gguf(tmp_path / "aligned.gguf", tiny_tokenizer, layers=1,
                   metadata={"general.alignment": alignment})
    with pytest.raises(LibraryError, match=f"^{g.path} is not a valid GGUF file "
                                           r"\(general.alignment is"):
        read_header(g.path)
