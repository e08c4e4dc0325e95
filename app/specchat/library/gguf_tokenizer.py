"""A Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) rebuilt
from a GGUF file's metadata.

Why not transformers' GGUF converter: in transformers 5 its reader imports
torch, and its byte-level builder has no split rule for ``smollm`` (so digit
runs would merge differently from llama.cpp) and drops Qwen's NFC
normalizer. The tokenizer.json format is stable and small, so it is written
here directly, mirroring the upstream tokenizer.json of each model family,
and validated by loading it with ``tokenizers``.

Only byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``) are
supported; that covers Qwen2/2.5, Llama 3 and SmolLM GGUFs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from specchat.library.errors import LibraryError

# llama.cpp token types (tokenizer.ggml.token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level(add_prefix_space: bool, trim_offsets: bool, use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space,
            "trim_offsets": trim_offsets, "use_regex": use_regex}


def _split(regex: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


# GPT-2's own split, as in llama.cpp's "default".
_GPT2 = {"normalizer": None, "pre_tokenizer": _byte_level(False, True, True),
         "decoder": _byte_level(True, True, True), "ignore_merges": False}
_LLAMA3 = {**_GPT2, "ignore_merges": True,
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
               _split(_LLAMA3_SPLIT), _byte_level(False, True, False)]}}

# tokenizer.ggml.pre -> how the upstream tokenizer.json of that family splits
# text (llama.cpp's llama-vocab.cpp has the same table as regex lists).
_PRESETS: dict[str, dict] = {
    "gpt2": _GPT2,
    # StarCoder family (SmolLM, Refact): every digit alone, then GPT-2's split.
    "starcoder": {**_GPT2, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, _byte_level(False, True, True)]}},
    "llama3": _LLAMA3,
    "smaug": {**_LLAMA3, "ignore_merges": False},  # Llama 3's split, merges applied
    "qwen2": {"normalizer": {"type": "NFC"},
              "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                  _split(_QWEN2_SPLIT), _byte_level(False, False, False)]},
              "decoder": _byte_level(False, False, False),
              "ignore_merges": False},
}

PRE_TOKENIZERS = {
    "default": "gpt2", "gpt-2": "gpt2",
    "smollm": "starcoder", "starcoder": "starcoder", "refact": "starcoder",
    "llama-bpe": "llama3", "llama3": "llama3", "llama-v3": "llama3",
    "smaug-bpe": "smaug",
    "qwen2": "qwen2", "deepseek-r1-qwen": "qwen2",
}

# Families whose llama.cpp default is to prepend BOS when the file does not say.
_ADD_BOS_DEFAULT = {"llama3"}


def build(meta: dict, context_length: int | None = None) -> tuple[dict, dict]:
    """(tokenizer.json, tokenizer_config.json) contents for the GGUF metadata
    ``meta`` (which must include the arrays in TOKENIZER_ARRAYS)."""
    family = _family(meta)
    tokens, vocab, added = _vocabulary(meta)
    merges = [_merge(m) for m in meta.get("tokenizer.ggml.merges") or []]
    roles = _Roles.read(meta, tokens, family)
    preset = _PRESETS[family]
    tokenizer_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": preset["normalizer"],
        "pre_tokenizer": preset["pre_tokenizer"],
        "post_processor": _post_processor(roles.bos if roles.add_bos else None,
                                          roles.eos if roles.add_eos else None, tokens),
        "decoder": preset["decoder"],
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": preset["ignore_merges"],
                  "vocab": vocab, "merges": merges},
    }
    return tokenizer_json, _config(meta, roles, context_length)


def _family(meta: dict) -> str:
    """The split-rule family (a _PRESETS key) of a byte-level BPE GGUF;
    LibraryError names what else it is."""
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        kind = {"llama": "SentencePiece ('llama')", "bert": "WordPiece ('bert')",
                "t5": "Unigram ('t5')"}.get(str(model), repr(model))
        raise LibraryError(
            f"This GGUF's tokenizer is {kind}; SpecChat imports only byte-level BPE "
            "tokenizers ('gpt2', as in Qwen, Llama 3 and SmolLM models)")
    pre_name = str(meta.get("tokenizer.ggml.pre", "default"))
    family = PRE_TOKENIZERS.get(pre_name)
    if family is None:
        raise LibraryError(
            f"This GGUF's pre-tokenizer {pre_name!r} is not supported "
            f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    return family


def _vocabulary(meta: dict) -> tuple[list[str], dict[str, int], list[dict]]:
    """(every token by id, the BPE vocabulary, the added tokens). UNUSED
    tokens (llama.cpp's [PAD...] fillers) are dropped; CONTROL tokens become
    special added tokens, USER_DEFINED ones plain added tokens."""
    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens") or [])
    if not tokens:
        raise LibraryError("This GGUF has no vocabulary (tokenizer.ggml.tokens is missing)")
    types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise LibraryError("This GGUF's token types do not match its vocabulary (damaged file?)")
    vocab: dict[str, int] = {}
    added: list[dict] = []
    for i, (tok, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind == UNUSED or tok in vocab:
            continue
        # Added tokens stay in the model vocabulary too: ``tokenizers`` keeps
        # an added token's id only if the vocabulary has it, else renumbers.
        vocab[tok] = i
        if kind in (CONTROL, USER_DEFINED):
            added.append({"id": i, "content": tok, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": kind == CONTROL})
    return tokens, vocab, added


@dataclass(frozen=True)
class _Roles:
    """The special tokens by role, and whether BOS / EOS are added."""

    bos: str | None
    eos: str | None
    pad: str | None
    unk: str | None
    add_bos: bool
    add_eos: bool

    @classmethod
    def read(cls, meta: dict, tokens: list[str], family: str) -> _Roles:
        def role(key: str) -> str | None:
            i = meta.get(f"tokenizer.ggml.{key}_token_id")
            return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

        bos = role("bos")
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", family in _ADD_BOS_DEFAULT))
        return cls(bos=bos, eos=role("eos"), pad=role("padding"), unk=role("unknown"),
                   add_bos=add_bos and bos is not None,
                   add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)))


def _config(meta: dict, roles: _Roles, context_length: int | None) -> dict:
    """tokenizer_config.json: the roles, the length limit and the chat template."""
    config: dict = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": roles.bos, "eos_token": roles.eos, "pad_token": roles.pad,
        "unk_token": roles.unk,
        "add_bos_token": roles.add_bos, "add_eos_token": roles.add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(context_length) if context_length else 131072,
    }
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str) and template.strip():
        config["chat_template"] = template
    return config


def _merge(m: str) -> list[str]:
    parts = m.split(" ")
    if len(parts) != 2:
        raise LibraryError(f"This GGUF has a malformed BPE merge {m!r} (damaged file?)")
    return parts


def _post_processor(bos: str | None, eos: str | None, tokens: list[str]) -> dict | None:
    """Prepend BOS / append EOS as the file asks (llama.cpp does this in tokenize)."""
    if bos is None and eos is None:
        return None

    def around(sequence: str, type_id: int) -> list[dict]:
        """[BOS] the sequence [EOS], each special token only if there is one."""
        ends = [[{"SpecialToken": {"id": tok, "type_id": type_id}}] if tok is not None else []
                for tok in (bos, eos)]
        return [*ends[0], {"Sequence": {"id": sequence, "type_id": type_id}}, *ends[1]]

    special = {tok: {"id": tok, "ids": [tokens.index(tok)], "tokens": [tok]}
               for tok in (bos, eos) if tok is not None}
    return {"type": "TemplateProcessing", "single": around("A", 0),
            "pair": around("A", 0) + around("B", 1), "special_tokens": special}


def validate(tokenizer_json: str) -> None:
    """Load the JSON with ``tokenizers``, check every added token kept its id
    and round-trip a sample, so a broken tokenizer fails the import rather
    than the first chat."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception
        raise LibraryError(f"The tokenizer rebuilt from this GGUF is invalid ({exc})") from exc
    for t in json.loads(tokenizer_json)["added_tokens"]:
        if tok.token_to_id(t["content"]) != t["id"]:
            raise LibraryError(f"The rebuilt tokenizer numbers {t['content']!r} wrongly")
    sample = "Hello, world! def f(x): return x * 2  # 12345\n日本語 café 🙂"
    ids = tok.encode(sample, add_special_tokens=False).ids
    if tok.decode(ids, skip_special_tokens=False) != sample:
        raise LibraryError("The tokenizer rebuilt from this GGUF does not round-trip text")
