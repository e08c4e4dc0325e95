"""Importing a GGUF file (llama.cpp's format) as an mlx-lm model folder.

The engine loads only MLX folders (config.json, safetensors, tokenizer.json),
and MLX's own GGUF loader rejects the K-quants most GGUF files use, so a GGUF
is converted once: metadata -> config.json, every tensor dequantized with the
``gguf`` package and renamed to Hugging Face names, and the tokenizer rebuilt
from the metadata (gguf_tokenizer.py). Tensors that were quantized are stored
as float16 (the engine converts to its compute dtype when loading), F32 ones
as float32. Work goes tensor by tensor, in row chunks, straight into the
output file, so memory stays near one tensor, not one model.

The folder appears at ``dest`` only when complete: everything is written to a
hidden sibling and renamed into place, so a crash or a cancel never leaves
something that looks like a model.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from specchat import outputs, records
from specchat.library import checks, disk, gguf_tokenizer, staging
from specchat.library.checks import LAYER_INDEX
from specchat.library.errors import ImportCancelled, LibraryError
from specchat.library.gguf_header import Header, TensorInfo, read_header, tensor_nbytes
from specchat.library.progress import Progress

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
MARKER = "specchat-import.json"  # written last; its presence means "complete"
FORMAT = 1  # bump when the output layout changes, so old imports are redone
MAX_SHARD_BYTES = 4 << 30
_CHUNK_BYTES = 64 << 20  # float32 bytes dequantized at a time

_MODEL_TYPES = {"llama": ("llama", "LlamaForCausalLM"), "qwen2": ("qwen2", "Qwen2ForCausalLM")}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_CONFIG_TENSORS = {"rope_freqs.weight"}  # read into config.json, not weights
_LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}



# -- summary -----------------------------------------------------------------
def gguf_summary(path: str | Path) -> dict:
    """What the library index shows for a GGUF file, from its header only
    (milliseconds, no tensor data read)."""
    header = read_header(path)
    arch = header.architecture
    meta = header.metadata
    n_params = sum(t.n_elements for t in header.tensors)
    vocab = header.array_lengths.get("tokenizer.ggml.tokens") or meta.get(f"{arch}.vocab_size")
    embd = header.tensor("token_embd.weight")
    if not vocab and embd is not None and len(embd.dims) == 2:
        vocab = embd.dims[1]
    return {
        "architecture": arch,
        "name": str(meta.get("general.name") or Path(path).stem),
        "parameters": n_params,
        "quantization": _quantization_name(header),
        "context_length": meta.get(f"{arch}.context_length"),
        "vocab_size": int(vocab) if vocab else None,
        "supported": arch in SUPPORTED_ARCHITECTURES,
        "file_size": header.file_size,
    }


def _quantization_name(header: Header) -> str:
    from gguf import GGMLQuantizationType, LlamaFileType

    ftype = header.metadata.get("general.file_type")
    try:
        return LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        pass
    counts: dict[int, int] = {}
    for t in header.tensors:
        if len(t.dims) >= 2:
            counts[t.type_id] = counts.get(t.type_id, 0) + t.n_elements
    if not counts:
        return "unknown"
    top = max(counts, key=counts.__getitem__)
    try:
        return GGMLQuantizationType(top).name
    except ValueError:
        return f"type {top}"


# -- planning ----------------------------------------------------------------
@dataclass(frozen=True)
class _Job:
    info: TensorInfo
    hf_name: str
    out_dtype: str  # "float16" or "float32"
    unpermute_heads: int | None  # llama Q/K: undo llama.cpp's rotary row order
    where: Path | None = None  # the GGUF file, for messages


def _hf_name(name: str) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    parts = name.split(".")
    if (len(parts) == 4 and parts[0] == "blk" and LAYER_INDEX.fullmatch(parts[1])
            and parts[2] in _LAYER_NAMES):
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def _num(header: Header, key: str, default=None, kind=int):
    """A metadata number the config needs: present (or defaulted), of the
    right kind and above 0; anything else is a damaged or hand-edited file,
    said in words that name it."""
    v = header.metadata.get(key, default)
    if v is None:
        if key in header.array_lengths:
            raise LibraryError(f"{header.shown}: {key} is a list (one value per layer), which "
                               "SpecChat's importer does not support")
        raise LibraryError(f"{header.shown} lacks {key!r}, which the import needs "
                           "(damaged file?)")
    number = not isinstance(v, bool) and isinstance(v, int if kind is int else int | float)
    if not number or not 0 < v < float("inf"):
        what = "a whole number" if kind is int else "a number"
        raise LibraryError(f"{header.shown}: {key} must be {what} above 0; got {v!r} "
                           "(damaged or hand-edited file?)")
    if kind is float:
        return float(f"{float(v):.7g}")  # float32 in the file: 1e-05, not 9.99999974e-06
    return kind(v)


def build_config(header: Header) -> dict:
    """config.json for mlx-lm, from the GGUF metadata and tensor table."""
    arch = header.architecture
    where = header.shown
    if arch not in SUPPORTED_ARCHITECTURES:
        raise LibraryError(f"{where}: GGUF architecture {arch!r} is not supported "
                           f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    hidden = _num(header, f"{arch}.embedding_length")
    heads = _num(header, f"{arch}.attention.head_count")
    kv_heads = _num(header, f"{arch}.attention.head_count_kv", heads)
    if heads % kv_heads:
        raise LibraryError(f"{where}: {arch}.attention.head_count ({heads}) must be a multiple "
                           f"of {arch}.attention.head_count_kv ({kv_heads}) (damaged file?)")
    head_dim = _num(header, f"{arch}.attention.key_length", hidden // heads or None)
    rope_dims = _num(header, f"{arch}.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise LibraryError(f"{where} rotates {rope_dims} of {head_dim} head dimensions "
                           "(partial rotary embedding), which SpecChat's importer does not support")
    embd = header.tensor("token_embd.weight")
    if embd is None or len(embd.dims) != 2:
        raise LibraryError(f"{where} has no token embedding (token_embd.weight); damaged file?")
    model_type, architecture = _MODEL_TYPES[arch]
    config: dict = {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": _num(header, f"{arch}.block_count"),
        "intermediate_size": _num(header, f"{arch}.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": _num(header, f"{arch}.attention.layer_norm_rms_epsilon", kind=float),
        "rope_theta": _num(header, f"{arch}.rope.freq_base",
                           1000000.0 if arch == "qwen2" else 10000.0, kind=float),
        "max_position_embeddings": _num(header, f"{arch}.context_length", 4096),
        "vocab_size": embd.dims[1],
        "tie_word_embeddings": header.tensor("output.weight") is None,
        "torch_dtype": "float16",
    }
    if head_dim != hidden // heads:
        if arch != "llama":
            raise LibraryError(f"{where}: this {arch} GGUF has head size {head_dim} (not "
                               "hidden/heads), which mlx-lm's qwen2 model does not support")
        config["head_dim"] = head_dim
    if arch == "llama":
        config["attention_bias"] = header.tensor("blk.0.attn_q.bias") is not None
        config["mlp_bias"] = header.tensor("blk.0.ffn_up.bias") is not None
    scaling = _rope_scaling(header, arch, head_dim, config["rope_theta"])
    if scaling:
        config["rope_scaling"] = scaling
    for role in ("bos", "eos"):
        tid = header.metadata.get(f"tokenizer.ggml.{role}_token_id")
        if isinstance(tid, int):
            config[f"{role}_token_id"] = tid
    return config


def _rope_scaling(header: Header, arch: str, head_dim: int, base: float) -> dict | None:
    m = header.metadata
    freqs = header.tensor("rope_freqs.weight")
    if freqs is not None:
        return _llama3_scaling(header, freqs, head_dim, base)
    kind = str(m.get(f"{arch}.rope.scaling.type", "none"))
    factor = m.get(f"{arch}.rope.scaling.factor")
    if kind == "none" or not factor or float(factor) == 1.0:
        return None
    if kind == "linear":
        return {"type": "linear", "factor": float(factor)}
    if kind == "yarn":
        out: dict = {"type": "yarn", "factor": float(factor)}
        orig = m.get(f"{arch}.rope.scaling.original_context_length")
        if orig:
            out["original_max_position_embeddings"] = int(orig)
        return out
    raise LibraryError(f"{header.shown} uses rope scaling {kind!r}, which the importer does not "
                       "support")


def _llama3_scaling(header: Header, info: TensorInfo, head_dim: int, base: float) -> dict | None:
    """Llama 3.1+ GGUFs carry precomputed per-frequency factors
    (``rope_freqs.weight``, from llama.cpp's converter) instead of the
    ``rope_scaling`` parameters mlx-lm wants. Find the parameters that
    reproduce the factors exactly, or refuse."""
    import numpy as np
    from gguf import GGMLQuantizationType

    if info.type_id != GGMLQuantizationType.F32 or info.n_elements != head_dim // 2:
        raise LibraryError(f"{header.shown}: rope_freqs.weight has an unexpected layout "
                           f"({info.n_elements} values, type {info.type_id})")
    end = info.offset + 4 * info.n_elements
    if end > header.file_size:
        raise LibraryError(f"{header.shown} is truncated (in rope_freqs.weight); "
                           "get the file again")
    with open(header.path, "rb") as f:
        f.seek(info.offset)
        factors = np.frombuffer(f.read(4 * info.n_elements), dtype="<f4").astype(np.float64)
    if np.allclose(factors, 1.0):
        return None
    factor = float(factors.max())
    wavelen = 2 * np.pi * base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    for orig in (8192, 4096, 2048, 16384, 32768, 65536, 131072):
        for low, high in ((1.0, 4.0), (1.0, 2.0), (2.0, 4.0), (1.0, 8.0), (2.0, 8.0)):
            smooth = (orig / wavelen - low) / (high - low)
            want = np.where(wavelen < orig / high, 1.0,
                            np.where(wavelen > orig / low, factor,
                                     1.0 / ((1 - smooth) / factor + smooth)))
            if np.allclose(want, factors, rtol=1e-4, atol=1e-6):
                return {"rope_type": "llama3", "factor": float(f"{factor:.7g}"),
                        "low_freq_factor": low, "high_freq_factor": high,
                        "original_max_position_embeddings": orig}
    raise LibraryError(f"{header.shown}: the rope frequency factors (rope_freqs.weight) do not "
                       "match Llama 3's rope scaling, so the importer cannot express them for "
                       "mlx-lm")


def _gguf_name(hf: str) -> str:
    """The GGUF name of an HF tensor name (for messages about missing ones)."""
    parts = hf.split(".")
    layer = {h: g for g, h in _LAYER_NAMES.items()}.get(".".join(parts[3:-1]))
    if len(parts) > 4 and parts[:2] == ["model", "layers"] and layer:
        return f"blk.{parts[2]}.{layer}.{parts[-1]}"
    return {h: g for g, h in _GLOBAL_NAMES.items()}.get(hf, hf)


def _plan(header: Header, config: dict) -> list[_Job]:
    from gguf import GGMLQuantizationType

    arch = header.architecture
    jobs: list[_Job] = []
    checked: set[int] = set()
    for info in header.tensors:
        if info.name in _CONFIG_TENSORS:
            continue
        hf = _hf_name(info.name)
        if hf is None:
            raise LibraryError(f"{header.shown}: this {arch} GGUF has a tensor SpecChat does not "
                               f"know: {info.name!r}")
        if info.type_id not in checked:
            _check_type(info, header.shown)
            checked.add(info.type_id)
        heads = None
        if arch == "llama" and (".attn_q." in info.name or ".attn_k." in info.name):
            heads = config["num_attention_heads"] if ".attn_q." in info.name \
                else config["num_key_value_heads"]
        keep32 = info.type_id in (GGMLQuantizationType.F32, GGMLQuantizationType.BF16)
        jobs.append(_Job(info, hf, "float32" if keep32 else "float16", heads, header.shown))
        try:
            end = info.offset + tensor_nbytes(info)
        except LibraryError as exc:
            raise LibraryError(f"{header.shown}: {exc}") from None
        if end > header.file_size:
            raise LibraryError(
                f"{header.shown} is truncated: tensor {info.name!r} ends at byte {end:,} "
                f"but the file has {header.file_size:,}. The download or copy was probably "
                "cut short; get the file again")
    _check_layout(header, config, jobs)
    return jobs


def _check_layout(header: Header, config: dict, jobs: list[_Job]) -> None:
    """What would fail at load, found in the tensor table before converting:
    tensors sharing bytes, blocks beyond (or missing below) block_count, and
    any tensor the config implies missing, extra or of the wrong shape (the
    same check every MLX folder gets, checks.check_tensors)."""
    where, arch = header.shown, header.architecture
    spans = sorted((j.info.offset, j.info.offset + tensor_nbytes(j.info), j.info.name)
                   for j in jobs)
    for (_s0, end0, name0), (start1, _e1, name1) in zip(spans, spans[1:], strict=False):
        if start1 < end0:
            raise LibraryError(f"{where} is damaged: tensors {name0!r} and {name1!r} share "
                               "bytes in the file")
    count = config["num_hidden_layers"]
    blocks: dict[int, str] = {}
    for j in jobs:
        parts = j.info.name.split(".")
        if parts[0] == "blk":
            blocks.setdefault(int(parts[1]), j.info.name)
    beyond = sorted(n for n in blocks if n >= count)
    if beyond:
        raise LibraryError(
            f"{where}: {arch}.block_count is {count} but the file has tensors for block "
            f"{beyond[0]} ({blocks[beyond[0]]}); damaged or mislabelled file")
    empty = checks.first_missing_layer(blocks, count)  # never counts up to block_count
    if empty is not None:
        raise LibraryError(
            f"{where}: {arch}.block_count is {count} but block {empty} has no tensors "
            f"(blk.{empty}.*); the file is damaged or incomplete")
    tensors = {j.hf_name: checks.Tensor(j.hf_name, "F32", j.info.shape, 0, 0, where.name)
               for j in jobs}
    checks.check_tensors(tensors, config, where, source="its metadata", label=_gguf_name)
    template = header.metadata.get("tokenizer.chat_template")
    if template is not None:
        if not isinstance(template, str):
            raise LibraryError(f"{where}: tokenizer.chat_template must be text; got "
                               f"{type(template).__name__}")
        checks.check_chat_template(template, where)


def _check_type(info: TensorInfo, where: Path) -> None:
    """Fail before converting anything if the gguf package cannot decode a type."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        qtype = GGMLQuantizationType(info.type_id)
    except ValueError:
        raise LibraryError(f"{where}: tensor {info.name!r} has unknown data type {info.type_id} "
                           "(a newer GGUF than the installed gguf package knows?)") from None
    if qtype.name.startswith("I") and not qtype.name.startswith("IQ") or qtype.name == "F64":
        raise LibraryError(f"{where}: tensor {info.name!r} is stored as {qtype.name}, "
                           "which is not a weight type the importer supports")
    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8), qtype)
    except NotImplementedError:
        raise LibraryError(f"{where}: tensor {info.name!r} uses quantization {qtype.name}, "
                           "which the installed gguf package cannot decode") from None


# -- conversion --------------------------------------------------------------
def _unpermute(w, n_head: int):
    """Inverse of llama.cpp's ``permute`` (convert_hf_to_gguf.py): it reorders
    each head's Q/K rows from HF's half-split rotary layout to interleaved
    pairs; mlx-lm (like HF) expects the half-split order."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def _chunks(data, job: _Job):
    """Yield the tensor as output-dtype arrays, a block of rows at a time."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    info = job.info
    qtype = GGMLQuantizationType(info.type_id)
    out = np.dtype(job.out_dtype)
    row_len = info.dims[0]
    rows = info.n_elements // row_len if row_len else 0
    raw = data[info.offset:info.offset + tensor_nbytes(info)]
    block, type_size = GGML_QUANT_SIZES[qtype]
    raw = raw.reshape(rows, row_len // block * type_size)

    def decode(part):
        if qtype == GGMLQuantizationType.F16:
            return part.view(np.float16).reshape(-1, row_len)
        return dequantize(part, qtype).reshape(-1, row_len)

    def cast(part):
        with np.errstate(over="ignore", invalid="ignore"):  # checked just below
            part = part.astype(out, copy=False)
        if out == np.float16 and part.size and not np.isfinite(part).all():
            raise LibraryError(f"{job.where}: tensor {info.name!r} has values outside the "
                               "float16 range (or NaN/inf in the file)")
        return part

    if job.unpermute_heads:  # small (hidden x hidden at most): done whole
        yield cast(_unpermute(decode(raw).reshape(info.shape), job.unpermute_heads))
        return
    step = max(1, _CHUNK_BYTES // max(1, row_len * 4))
    for start in range(0, rows, step):
        yield cast(decode(raw[start:start + step]))


def _write_weights(header: Header, jobs: list[_Job], folder: Path, progress: Progress,
                   cancelled: threading.Event | None, max_shard_bytes: int) -> None:
    import numpy as np  # numpy (st_writer's too) only when converting: listing stays light

    from specchat.library.st_writer import Entry, StreamingWriter, plan_shards

    entries = {j.hf_name: Entry(j.hf_name, np.dtype(j.out_dtype), j.info.shape) for j in jobs}
    by_name = {j.hf_name: j for j in jobs}
    shards = plan_shards([entries[j.hf_name] for j in jobs], max_shard_bytes)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    total = sum(tensor_nbytes(j.info) for j in jobs) or 1
    done = 0
    data = np.memmap(header.path, dtype=np.uint8, mode="r")
    try:
        for fname, shard in zip(names, shards, strict=True):
            writer = StreamingWriter(folder / fname, shard, {"format": "pt"})
            try:
                for entry in shard:
                    job = by_name[entry.name]
                    if cancelled is not None and cancelled.is_set():
                        raise ImportCancelled("Import cancelled")
                    # The fraction is the news; a tensor's name means nothing
                    # to the person waiting.
                    progress("converting the weights", done / total)
                    for chunk in _chunks(data, job):
                        writer.write(entry.name, chunk)
                    done += tensor_nbytes(job.info)
            except BaseException:
                writer.abort()
                raise
            writer.close()
    finally:
        del data
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(e.nbytes for e in entries.values())},
                 "weight_map": {e.name: fname for fname, shard in zip(names, shards, strict=True)
                                for e in shard}}
        records.write_json(folder / "model.safetensors.index.json", index, indent=2)


# -- the import --------------------------------------------------------------
def is_complete(folder: Path) -> bool:
    """Whether ``folder`` is a finished import of the current format (its
    marker read as a record: a FIFO or garbage in its place means no)."""
    return read_marker(folder).get("format") == FORMAT


def read_marker(folder: Path) -> dict:
    """The marker a finished import left in ``folder``; {} when there is
    none or it is not a record."""
    return records.read_record(folder / MARKER)


def import_gguf(gguf_path: Path, dest: Path, progress: Progress | None = None,
                cancelled: threading.Event | None = None, *,
                max_shard_bytes: int = MAX_SHARD_BYTES, source: dict | None = None,
                shown_dir: Path | None = None, shown: Path | None = None) -> Path:
    """Convert ``gguf_path`` into an mlx-lm folder at ``dest`` and return it.

    Returns at once if ``dest`` already holds a complete import. ``source``
    is extra provenance recorded in the marker file (e.g. the bundled name).
    The header is checked completely before anything is written (metadata
    numbers, block count against the tensors, the tensors the config
    implies, the chat template). Raises LibraryError (ImportCancelled on
    cancel) with nothing left behind; messages name ``shown`` (default
    ``gguf_path``: the file as the user gave it, where ``gguf_path`` is a
    temporary or resolved one) and, for disk trouble, ``shown_dir`` (default
    ``dest.parent``; importing.py passes the library folder, since its
    ``dest`` is a staging folder).
    Partial folders of imports whose process died are removed first.
    """
    gguf_path, dest = Path(gguf_path), Path(dest)
    shown = Path(shown) if shown is not None else gguf_path
    where = shown_dir or dest.parent
    say: Progress = progress or (lambda _m, _f: None)
    staging.sweep(dest.parent, staging.PARTIAL_NAMES)
    if is_complete(dest):
        return dest
    # Written over only where an import of SpecChat's is (an older format's).
    outputs.folder(dest, "the converted model", lambda p: (p / MARKER).is_file(),
                   "move it away or choose another destination", LibraryError,
                   home_place=dest.parent)  # a place of the library's choosing
    say("reading the model's header", 0.0)
    started = time.monotonic()
    header = read_header(gguf_path, gguf_tokenizer.TOKENIZER_ARRAYS, shown=shown)
    config = build_config(header)
    jobs = _plan(header, config)
    try:
        tok_json, tok_config = gguf_tokenizer.build(header.metadata,
                                                    config["max_position_embeddings"])
        text = json.dumps(tok_json, ensure_ascii=False)
        gguf_tokenizer.validate(text)
    except LibraryError as exc:
        raise LibraryError(f"{shown}: {exc}") from exc

    try:
        needed = sum(j.info.n_elements * (2 if j.out_dtype == "float16" else 4) for j in jobs)
        disk.check_free_space(dest.parent, needed, f"importing {shown}", shown=where)
        # Released (what is left at tmp deleted: nothing once installed) however this ends.
        with staging.claim(dest.parent, staging.partial_prefix(dest)) as work:
            tmp = work.path
            say("writing the tokenizer", 0.0)
            (tmp / "tokenizer.json").write_text(text, encoding="utf-8")
            for name, data in (("tokenizer_config.json", tok_config), ("config.json", config)):
                records.write_json(tmp / name, data, indent=2, ensure_ascii=False)
            _write_weights(header, jobs, tmp, say, cancelled, max_shard_bytes)
            st = gguf_path.stat()
            records.write_json(tmp / MARKER, {
                "format": FORMAT,
                "source": {"path": str(gguf_path.resolve()), "size": st.st_size,
                           "mtime_ns": st.st_mtime_ns, **(source or {})},
                "summary": gguf_summary(gguf_path),
                "seconds": round(time.monotonic() - started, 1),
            }, indent=2, ensure_ascii=False)
            _install(tmp, dest)
    except OSError as exc:
        raise staging.write_error(shown, where, exc) from exc
    say("converted", 1.0)
    return dest


def _install(tmp: Path, dest: Path) -> None:
    """Move the finished folder into place; an outdated import is replaced,
    and if another process finished the same import first, theirs is kept."""
    old = None
    if dest.exists() and not is_complete(dest):  # an import of an older FORMAT
        old = dest.parent / f".{dest.name}.old-{secrets.token_hex(4)}"
        os.replace(dest, old)
    try:
        os.replace(tmp, dest)
    except OSError:
        if not is_complete(dest):
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # a concurrent import won the race
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
