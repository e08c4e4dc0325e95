"""Tiny GGUF files for tests, written with ``gguf.GGUFWriter`` the way
llama.cpp's converter writes real ones: HF weights renamed, llama Q/K rows
permuted into llama.cpp's rotary order, some tensors quantized, and a
byte-level BPE vocabulary (trained by tinymodels.build_tokenizer) stored as
tokenizer.ggml.* metadata.

``write_gguf`` returns what each tensor must be after import, in HF names and
HF row order, computed *without* the importer's code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def llamacpp_permute(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """``permute`` from llama.cpp's convert_hf_to_gguf.py (HF -> GGUF rows)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def random_kquant(rows: int, cols: int, qtype, rng: np.random.Generator) -> np.ndarray:
    """Random, valid K-quant bytes (gguf cannot quantize to K-quants): random
    nibbles and scales, with the float16 super-block scales set to small
    finite values."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)

    def f16(n):
        return (rng.uniform(0.001, 0.02, n).astype(np.float16)).view(np.uint8).reshape(n, 2)

    if qtype == GGMLQuantizationType.Q4_K or qtype == GGMLQuantizationType.Q5_K:
        raw[:, 0:2] = f16(n_blocks)  # d
        raw[:, 2:4] = f16(n_blocks)  # dmin
    elif qtype == GGMLQuantizationType.Q6_K:
        raw[:, size - 2:size] = f16(n_blocks)  # d is last
    else:
        raise ValueError(qtype)
    return raw.reshape(rows, cols // block * size)


@dataclass
class TinyGGUF:
    path: Path
    arch: str
    config: dict
    expected: dict[str, np.ndarray]  # HF name -> float32 values after import (HF row order)
    stored: dict[str, np.ndarray] = field(default_factory=dict)  # HF name -> GGUF-order float32
    types: dict[str, str] = field(default_factory=dict)  # HF name -> GGML type name


def vocab_from_tokenizer(tokenizer_dir: Path) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) in llama.cpp's form from a tokenizer.json."""
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = dict(data["model"]["vocab"])
    special = {t["content"]: t["id"] for t in data["added_tokens"]}
    vocab.update(special)
    tokens = [""] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    types = [3 if t in special else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return tokens, types, merges


def write_gguf(path: Path, tokenizer_dir: Path, *, arch: str = "llama", hidden: int = 64,
               layers: int = 2, heads: int = 4, kv_heads: int = 2, ffn: int | None = None,
               seed: int = 0, quant: dict[str, str] | None = None, tied: bool = True,
               pre: str = "gpt-2", eos: str = "<|im_end|>", bos: str | None = "<|endoftext|>",
               extra_tensor: tuple[str, np.ndarray, object] | None = None,
               kquant: dict[str, str] | None = None, drop: set[str] | None = None,
               metadata: dict[str, object] | None = None) -> TinyGGUF:
    """A random llama- or qwen2-shaped model as a GGUF file.

    ``quant`` maps a GGUF tensor-name part (``attn_q``, ``token_embd``...) to
    a type gguf can quantize to (Q8_0, Q4_0, Q4_1, Q5_0, F16); ``kquant`` to
    Q4_K/Q5_K/Q6_K (random valid bytes). Everything else is F32.
    Damaged files for the import checks: ``drop`` leaves out GGUF tensors by
    name, ``metadata`` replaces keys as written (None removes a key; an int
    is written as INT32, so 0 and negatives are possible; str as STRING).
    """
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(seed)
    quant = quant or {}
    kquant = kquant or {}
    ffn = ffn or hidden * 2
    head_dim = hidden // heads
    tokens, types, merges = vocab_from_tokenizer(tokenizer_dir)
    vocab = len(tokens)

    hf: dict[str, np.ndarray] = {}

    def rnd(*shape, scale=0.05):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    hf["model.embed_tokens.weight"] = rnd(vocab, hidden, scale=0.5)
    if not tied:
        hf["lm_head.weight"] = rnd(vocab, hidden, scale=0.5)
    hf["model.norm.weight"] = (1 + rnd(hidden, scale=0.1))
    for i in range(layers):
        p = f"model.layers.{i}."
        hf[p + "input_layernorm.weight"] = 1 + rnd(hidden, scale=0.1)
        hf[p + "post_attention_layernorm.weight"] = 1 + rnd(hidden, scale=0.1)
        hf[p + "self_attn.q_proj.weight"] = rnd(heads * head_dim, hidden, scale=0.2)
        hf[p + "self_attn.k_proj.weight"] = rnd(kv_heads * head_dim, hidden, scale=0.2)
        hf[p + "self_attn.v_proj.weight"] = rnd(kv_heads * head_dim, hidden)
        hf[p + "self_attn.o_proj.weight"] = rnd(hidden, heads * head_dim)
        if arch == "qwen2":
            hf[p + "self_attn.q_proj.bias"] = rnd(heads * head_dim, scale=0.1)
            hf[p + "self_attn.k_proj.bias"] = rnd(kv_heads * head_dim, scale=0.1)
            hf[p + "self_attn.v_proj.bias"] = rnd(kv_heads * head_dim, scale=0.1)
        hf[p + "mlp.gate_proj.weight"] = rnd(ffn, hidden)
        hf[p + "mlp.up_proj.weight"] = rnd(ffn, hidden)
        hf[p + "mlp.down_proj.weight"] = rnd(hidden, ffn)

    names = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
             "model.norm.weight": "output_norm.weight"}
    parts = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}

    def gguf_name(n: str) -> str:
        if n in names:
            return names[n]
        _, _, i, *rest = n.split(".")
        return f"blk.{i}.{parts['.'.join(rest[:-1])]}.{rest[-1]}"

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"Tiny {arch}")
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(tokens.index(bos))
    w.add_eos_token_id(tokens.index(eos))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    for key, value in (metadata or {}).items():
        if value is None:
            w.kv_data[0].pop(key, None)
            continue
        vtype = (gguf.GGUFValueType.STRING if isinstance(value, str) else
                 gguf.GGUFValueType.FLOAT32 if isinstance(value, float) else
                 gguf.GGUFValueType.INT32)
        w.kv_data[0][key] = gguf.GGUFValue(value=value, type=vtype)

    out = TinyGGUF(path=path, arch=arch, config={"hidden": hidden, "heads": heads,
                                                  "kv_heads": kv_heads, "layers": layers,
                                                  "vocab": vocab, "ffn": ffn},
                   expected={})
    for name, value in hf.items():
        g = gguf_name(name)
        if g in (drop or ()):
            continue
        kind = g.split(".")[-2] if g.startswith("blk.") else g.split(".")[0]
        is_weight_2d = value.ndim == 2
        rows = value
        if arch == "llama" and kind in ("attn_q", "attn_k"):
            rows = llamacpp_permute(value, heads, heads if kind == "attn_q" else kv_heads)
        if is_weight_2d and kind in kquant:
            qtype = Q[kquant[kind]]
            raw = random_kquant(*rows.shape, qtype, rng)
            w.add_tensor(g, raw, raw_dtype=qtype)
            stored = dequantize(raw, qtype).reshape(rows.shape)
            # Undo the permutation with llama.cpp's own forward permutation:
            # the stored rows are P(expected), so expected = P^-1(stored).
            expected = _inverse_rows(stored, heads, kv_heads, kind) if rows is not value \
                else stored
            out.types[name] = qtype.name
        elif is_weight_2d and kind in quant and quant[kind] != "F16":
            qtype = Q[quant[kind]]
            raw = quantize(rows, qtype)
            w.add_tensor(g, raw, raw_dtype=qtype)
            stored = dequantize(raw, qtype).reshape(rows.shape)
            # Blocks run along rows and the permutation moves whole rows, so
            # quantizing HF rows directly gives the same values in HF order.
            expected = dequantize(quantize(value, qtype), qtype).reshape(value.shape)
            out.types[name] = qtype.name
        elif is_weight_2d and quant.get(kind) == "F16":
            w.add_tensor(g, rows.astype(np.float16))
            stored = rows.astype(np.float16).astype(np.float32)
            expected = value.astype(np.float16).astype(np.float32)
            out.types[name] = "F16"
        else:
            w.add_tensor(g, rows)
            stored, expected = rows, value
            out.types[name] = "F32"
        out.expected[name] = expected
        out.stored[name] = stored
    if extra_tensor is not None:
        ename, evalue, etype = extra_tensor
        if etype is None:
            w.add_tensor(ename, evalue)
        else:
            w.add_tensor(ename, evalue, raw_dtype=etype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _inverse_rows(stored: np.ndarray, heads: int, kv_heads: int, kind: str) -> np.ndarray:
    """P^-1 by brute force: permute an index vector forward and invert it."""
    n = heads if kind == "attn_q" else kv_heads
    idx = np.arange(stored.shape[0], dtype=np.float64)[:, None]
    fwd = llamacpp_permute(idx, heads, n).ravel().astype(int)  # stored row r holds source fwd[r]
    out = np.empty_like(stored)
    out[fwd] = stored
    return out
