"""Whether a draft can speculate for a target, and in words why not.

Pure Python over tokenizer facts, so the model library can answer the same
question for installed models without loading any weights.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from specchat import records
from specchat.records import MAX_JSON_BYTES, BadRecord

# Why a model cannot draft for itself, in the words both the engine (at load
# time) and ``specchat models check`` use.
SAME_MODEL = ("the draft is the target itself; a draft must be a smaller model with the same "
              "tokenizer")


@dataclass(frozen=True)
class TokenizerFacts:
    """What must match between a draft's and a target's tokenizers."""

    vocab: dict[str, int]
    special: dict[str, str | None]  # role (bos, eos, pad, unk) -> token text
    added: dict[str, int] = field(default_factory=dict)  # added/special tokens -> id

    @property
    def size(self) -> int:
        ids = list(self.vocab.values()) + list(self.added.values())
        return (max(ids) + 1) if ids else 0

    def fingerprint(self) -> str:
        """Memoised: hashing a 150K-entry vocabulary holds the GIL for ~100 ms."""
        cached = self.__dict__.get("_fingerprint")
        if cached is None:
            cached = self._hash()
            object.__setattr__(self, "_fingerprint", cached)  # frozen, not a field
        return cached

    def _hash(self) -> str:
        blob = json.dumps(
            {"vocab": sorted(self.vocab.items()), "added": sorted(self.added.items()),
             "special": sorted((k, v or "") for k, v in self.special.items())},
            separators=(",", ":"),
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def facts_from_tokenizer(tokenizer) -> TokenizerFacts:
    """Facts from a transformers tokenizer (or mlx-lm's TokenizerWrapper)."""
    tok = getattr(tokenizer, "_tokenizer", tokenizer)
    vocab = dict(tok.get_vocab())
    added = dict(tok.get_added_vocab()) if hasattr(tok, "get_added_vocab") else {}
    special = {
        role: getattr(tok, f"{role}_token", None) for role in ("bos", "eos", "pad", "unk")
    }
    special = {k: (str(v) if v is not None else None) for k, v in special.items()}
    return TokenizerFacts(vocab=vocab, special=special, added=added)


def tokenizer_vocab(data: object) -> tuple[dict[str, int], dict[str, int]]:
    """(the vocabulary with its added tokens, the added tokens) of a parsed
    tokenizer.json; ``records.BadRecord`` says in words what makes it none
    (the engine's file check and the library's facts read it alike)."""
    if not isinstance(data, dict):
        raise BadRecord("it is not a JSON object")
    model = data.get("model") or {}
    if not isinstance(model, dict):
        raise BadRecord("its model is not a JSON object")
    vocab = model.get("vocab") or {}
    if isinstance(vocab, list):  # unigram: [[piece, score], ...]
        if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in vocab):
            raise BadRecord("its model's vocab is not a list of [piece, score] pairs")
        vocab = {piece: i for i, (piece, _score) in enumerate(vocab)}
    elif not isinstance(vocab, dict) or not all(_token_id(i) for i in vocab.values()):
        raise BadRecord("its model's vocab is not an object of tokens and their ids (whole "
                        "numbers from 0)")
    added_tokens = data.get("added_tokens") or []
    if not isinstance(added_tokens, list) or not all(
            isinstance(t, dict) and isinstance(t.get("content"), str) and _token_id(t.get("id"))
            for t in added_tokens):
        raise BadRecord("its added_tokens is not a list of tokens with their content and id")
    added = {t["content"]: t["id"] for t in added_tokens}
    return {**vocab, **added}, added


def _token_id(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def facts_from_tokenizer_json(folder) -> TokenizerFacts:
    """Facts straight from tokenizer.json + tokenizer_config.json, without
    importing transformers (used for the installed-model index). Each file
    is read only if it is a regular file, bounded; ``records.BadRecord``
    (a ValueError) says what is wrong with one."""
    folder = Path(folder)
    vocab, added = tokenizer_vocab(records.read_json(folder / "tokenizer.json", MAX_JSON_BYTES))
    special: dict[str, str | None] = {r: None for r in ("bos", "eos", "pad", "unk")}
    cfg_path = folder / "tokenizer_config.json"
    if cfg_path.exists():
        cfg = records.read_json(cfg_path, MAX_JSON_BYTES)
        if not isinstance(cfg, dict):
            raise BadRecord("its tokenizer_config.json is not a JSON object")
        for role in special:
            v = cfg.get(f"{role}_token")
            if isinstance(v, dict):
                v = v.get("content")
            special[role] = v if isinstance(v, str) else None
    return TokenizerFacts(vocab=vocab, special=special, added=added)


@dataclass(frozen=True)
class Verdict:
    compatible: bool
    reasons: tuple[str, ...]


def compare_tokenizers(target: TokenizerFacts, draft: TokenizerFacts, limit: int = 3) -> list[str]:
    """Every way the two tokenizers differ that breaks speculation, in words."""
    reasons: list[str] = []
    t_all = {**target.vocab, **target.added}
    d_all = {**draft.vocab, **draft.added}
    if len(t_all) != len(d_all):
        reasons.append(
            f"vocabulary size differs: target has {len(t_all):,} tokens, draft has {len(d_all):,}"
        )
    moved = [(t, i, d_all[t]) for t, i in t_all.items() if t in d_all and d_all[t] != i]
    if moved:
        moved.sort(key=lambda x: x[1])
        ex = ", ".join(f"{t!r} is {i} in the target but {j} in the draft" for t, i, j in moved[:limit])
        reasons.append(f"{len(moved):,} tokens have different ids ({ex})")
    only_t = [t for t in t_all if t not in d_all]
    if only_t and not reasons:
        reasons.append(f"{len(only_t):,} target tokens are missing from the draft (e.g. {only_t[0]!r})")
    for role in ("bos", "eos", "pad", "unk"):
        a, b = target.special.get(role), draft.special.get(role)
        if a != b:
            reasons.append(f"different {role.upper()} token: target {a!r}, draft {b!r}")
    diff = sorted(set(target.added.items()) ^ set(draft.added.items()), key=lambda x: x[1])
    if diff and not any("different ids" in r for r in reasons):
        names = ", ".join(repr(t) for t, _ in diff[:limit])
        reasons.append(f"different special tokens ({names})")
    return reasons
