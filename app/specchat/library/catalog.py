"""Recommended pairs, from ``resources/catalog/*.json``.

Each file describes one tokenizer family: the tokenizer, the models that
use it, and the pairs worth recommending. A pair's draft is one of four
kinds, each fitting for its own reason, which ``Pair.why`` puts in words
computed from the numbers in the file, not written by hand:

- ``"model"``: a separate, smaller model with the same tokenizer, so a
  draft token id means the same text to the target;
- ``"mtp"`` (the pair says ``"draft": "mtp"``): the target's own
  multi-token-prediction head, a layer shipped in its checkpoint (the target
  says ``"mtp": true``), so nothing else is downloaded;
- ``"eagle3"``: an EAGLE-3 head, one layer reading the hidden states of the
  one target it was trained ``"for"``;
- ``"assistant"``: a Gemma 4 assistant drafter, trained ``"for"`` one target
  whose activations and KV cache it reads.

Heads (EAGLE-3 and assistants) draft for their target only, so they are
kept apart from the models one can chat with or draft with
(``Catalog.heads``), and a pair whose head was trained for another target is
refused when the catalog is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import specchat
from specchat.library.errors import LibraryError
from specchat.library.memory import MemoryEstimate, estimate
from specchat.library.units import params_text

MODEL = "model"
MTP = "mtp"
EAGLE3 = "eagle3"
ASSISTANT = "assistant"
KINDS = (MODEL, EAGLE3, ASSISTANT)  # what a catalog entry may be
# How an entry of each head kind is named in messages.
HEAD_WORDS = {EAGLE3: "EAGLE-3 head", ASSISTANT: "assistant drafter"}


@dataclass(frozen=True)
class Tokenizer:
    id: str
    label: str
    vocab: int
    note: str = ""


@dataclass(frozen=True)
class CatalogModel:
    """A model the catalog knows, with what is needed to estimate its memory
    and to explain its pairs before anything is downloaded. A head (EAGLE-3,
    assistant) keeps no KV cache of its own when its layer numbers are 0."""

    id: str
    name: str
    ref: str  # hf:org/repo or bundled:name
    tokenizer: Tokenizer
    params: int
    quantization: str | None
    download_bytes: int
    num_layers: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    max_context: int | None = None  # None for a head: it follows its target
    license: str = ""
    kind: str = MODEL  # "model", "eagle3" or "assistant"
    mtp: bool = False  # the checkpoint ships a multi-token-prediction head
    trained_for: str = ""  # a head's target id (the file's "for")
    hidden_size: int = 0  # an EAGLE-3 head: the target hidden states it reads
    draft_vocab: int = 0  # an EAGLE-3 head: the tokens it proposes from
    source: str = ""  # where the numbers were checked
    # Its config.json's model_type (mlx-lm's class for a model); "" where the
    # file does not say (an EAGLE-3 head is known by its kind).
    model_type: str = ""

    @property
    def repo(self) -> str | None:
        return self.ref[3:].split("@", 1)[0] if self.ref.startswith("hf:") else None

    @property
    def bundled(self) -> bool:
        return self.ref.startswith("bundled:")

    @property
    def words(self) -> str:
        """What the entry is, in words ("EAGLE-3 head", "model")."""
        return HEAD_WORDS.get(self.kind, "model")

    def kv_elements_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def to_json(self) -> dict:
        return {
            "id": self.id, "name": self.name, "ref": self.ref, "tokenizer": self.tokenizer.id,
            "params": self.params, "quantization": self.quantization,
            "download_bytes": self.download_bytes, "max_context": self.max_context,
            "license": self.license, "kind": self.kind, "mtp": self.mtp,
            "for": self.trained_for or None, "model_type": self.model_type or None,
        }


@dataclass(frozen=True)
class Pair:
    target: CatalogModel
    draft: CatalogModel | None  # None: the target's own MTP head
    note: str = ""
    bundled: bool = False

    @property
    def kind(self) -> str:
        """"mtp" for the target's own head, else the draft's kind."""
        return MTP if self.draft is None else self.draft.kind

    @property
    def id(self) -> str:
        return f"{self.target.id}+{MTP if self.draft is None else self.draft.id}"

    @property
    def draft_name(self) -> str:
        return "its own MTP head" if self.draft is None else self.draft.name

    @property
    def refs(self) -> list[str]:
        """What pulling the pair downloads: the target, then its draft (an
        own head is in the target's checkpoint)."""
        return [self.target.ref] + ([] if self.draft is None else [self.draft.ref])

    @property
    def download_bytes(self) -> int:
        return self.target.download_bytes + (0 if self.draft is None
                                             else self.draft.download_bytes)

    @property
    def why(self) -> str:
        """Why the pair works, in words, from the catalog's numbers."""
        return f"{_WHY[self.kind](self.target, self.draft)} {self.note}".strip()

    def memory(self, context_tokens: int = 4096, dtype: str | None = None) -> MemoryEstimate:
        """MemoryEstimate for the pair in ``dtype`` (default: this machine's
        compute dtype), without measuring what is available. An own head is
        part of the target's parameters."""
        return estimate(self.target, self.draft, context_tokens, dtype=dtype, measure=False)

    def to_json(self, context_tokens: int = 4096) -> dict:
        mem = self.memory(context_tokens)
        return {"id": self.id, "kind": self.kind, "target": self.target.to_json(),
                "draft": None if self.draft is None else self.draft.to_json(),
                "why": self.why, "bundled": self.bundled, "download_bytes": self.download_bytes,
                "memory": mem.to_json()}


def _fewer(target: CatalogModel, draft: CatalogModel) -> str:
    return (f"{target.params / draft.params:.0f}x fewer parameters "
            f"({params_text(draft.params)} vs {params_text(target.params)})")


def _why_model(target: CatalogModel, draft: CatalogModel) -> str:
    tok = target.tokenizer
    return (f"Both use the {tok.label} tokenizer ({tok.vocab:,} tokens), so every token "
            f"the draft proposes means the same text to the target; the draft has "
            f"{_fewer(target, draft)}, so drafting costs little next to verifying.")


def _why_mtp(_target: CatalogModel, _draft: None) -> str:
    return ("The target drafts with its own multi-token-prediction head: the mtp.* weights in "
            "its checkpoint are a layer of the target itself that proposes the next tokens "
            "from the target's last hidden state, so there is no second model to download and "
            "no second tokenizer to disagree.")


def _why_eagle3(target: CatalogModel, head: CatalogModel) -> str:
    return (f"An EAGLE-3 head: one layer that reads the target's hidden states "
            f"({head.hidden_size:,} wide) and proposes tokens from a {head.draft_vocab:,}-token "
            f"draft vocabulary. It was trained for this target ({target.id}) and fits no "
            f"other; it has {_fewer(target, head)}.")


def _why_assistant(target: CatalogModel, head: CatalogModel) -> str:
    layers = f"{head.num_layers} layers that read" if head.num_layers else "layers that read"
    return (f"A small drafter Google trained for this Gemma 4 ({target.id}): {layers} the "
            f"target's activations and KV cache instead of keeping their own, so it fits no "
            f"other target; it has {_fewer(target, head)}.")


_WHY = {MODEL: _why_model, MTP: _why_mtp, EAGLE3: _why_eagle3, ASSISTANT: _why_assistant}


@dataclass(frozen=True)
class Catalog:
    models: list[CatalogModel] = field(default_factory=list)  # to chat with or draft with
    pairs: list[Pair] = field(default_factory=list)
    heads: list[CatalogModel] = field(default_factory=list)  # EAGLE-3 heads and assistants

    def model(self, key: str) -> CatalogModel | None:
        """By id (``qwen2.5-7b``), reference (``hf:org/repo``) or repo id;
        heads too, so a head can be pulled by its id."""
        key_l = key.lower()
        entries = [*self.models, *self.heads]
        for m in entries:
            if key_l in (m.id.lower(), m.ref.lower()) or (m.repo and m.repo.lower() == key_l):
                return m
        if key_l.startswith("hf:"):
            repo = key_l[3:].split("@", 1)[0]
            return next((m for m in entries if m.repo and m.repo.lower() == repo), None)
        return None

    def pair(self, key: str) -> Pair | None:
        return next((p for p in self.pairs if p.id.lower() == key.lower()), None)

    def pairs_for_target(self, model: CatalogModel,
                         kinds: tuple[str, ...] = (MODEL,)) -> list[Pair]:
        """The target's pairs whose draft is of one of ``kinds``; by default
        those with a separate draft model, the only drafter a suggestion
        can offer."""
        return [p for p in self.pairs if p.target.id == model.id and p.kind in kinds]

    def same_tokenizer(self, model: CatalogModel) -> list[CatalogModel]:
        return [m for m in self.models if m.tokenizer.id == model.tokenizer.id and m.id != model.id]


def _entry(m: dict, tok: Tokenizer) -> CatalogModel:
    """One model or head of a file; ValueError names what is wrong."""
    mid = m.get("id", "an entry")
    kind = m.get("kind", MODEL)
    if kind not in KINDS:
        raise ValueError(f'{mid} has kind "{kind}"; a kind is "model", "eagle3" or "assistant"')
    what = mid if kind == MODEL else f"the {HEAD_WORDS[kind]} {mid}"

    def need(key: str):
        if key not in m:
            raise ValueError(f'{what} has no "{key}"')
        return m[key]

    def number(key: str) -> int:  # a head may omit its layer numbers: it keeps no cache
        return int(need(key)) if kind == MODEL or key in m else 0

    mtp = m.get("mtp", False)
    if not isinstance(mtp, bool):
        raise ValueError(f'{what} says "mtp": {json.dumps(mtp)}; it is true or false')
    if mtp and kind != MODEL:
        raise ValueError(f'{what} says "mtp": true, but only a model ships its own MTP head')
    if kind != MODEL and "for" not in m:
        raise ValueError(f'{what} does not say which model it is "for"')
    model_type = m.get("model_type", "")
    if not isinstance(model_type, str):
        raise ValueError(f'{what} says "model_type": {json.dumps(model_type)}; it is a name')
    eagle = kind == EAGLE3
    return CatalogModel(
        id=need("id"), name=need("name"), ref=need("ref"), tokenizer=tok,
        params=int(need("params")), quantization=m.get("quantization"),
        download_bytes=int(m.get("download_bytes") or 0), num_layers=number("num_layers"),
        num_kv_heads=number("num_kv_heads"), head_dim=number("head_dim"),
        max_context=int(need("max_context")) if kind == MODEL or "max_context" in m else None,
        license=m.get("license", ""), kind=kind, mtp=mtp, trained_for=m.get("for", ""),
        hidden_size=int(need("hidden_size")) if eagle else 0,
        draft_vocab=int(need("draft_vocab")) if eagle else 0, source=m.get("source", ""),
        model_type=model_type)


def _parse(path: Path) -> tuple[list[CatalogModel], list[tuple[str, str, str, bool]]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    tok = Tokenizer(**data["tokenizer"])
    entries = [_entry(m, tok) for m in data.get("models", [])]
    for e in entries:
        if not e.ref.startswith(("hf:", "bundled:")):  # sources/catalog.py pulls only these
            raise ValueError(f"{e.id}: {e.ref!r} is neither an hf: nor a bundled: reference")
    pairs = [(p["target"], p["draft"], p.get("note", ""), bool(p.get("bundled")))
             for p in data.get("pairs", [])]
    return entries, pairs


def _pair(entries: dict[str, CatalogModel], t_id: str, d_id: str, note: str,
          bundled: bool) -> Pair:
    """One pair of the files, refused in words when its draft cannot draft
    for its target."""
    target, draft = entries.get(t_id), entries.get(d_id)
    if target is not None and target.kind != MODEL:
        raise LibraryError(f"The model catalog pairs {t_id} as a target, but it is an "
                           f"{target.words}: it drafts for {target.trained_for}")
    if target is not None and d_id == MTP:
        if not target.mtp:
            raise LibraryError(f"The model catalog pairs {t_id} with its own MTP head, but "
                               f"{t_id} ({target.ref}) ships none: its entry does not say "
                               f'"mtp": true.')
        return Pair(target, None, note, bundled)
    if target is None or draft is None:
        raise LibraryError(f"The model catalog pairs unknown models: {t_id} + {d_id}")
    if draft.kind != MODEL and draft.trained_for != t_id:
        raise LibraryError(f"The model catalog pairs {t_id} with the {draft.words} {d_id}, "
                           f"which was trained for {draft.trained_for}, not {t_id}: a head "
                           f"reads one target's hidden states and fits no other.")
    return Pair(target, draft, note, bundled)


@lru_cache(maxsize=4)
def _load(folder: str) -> Catalog:
    entries: dict[str, CatalogModel] = {}
    raw_pairs = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            file_entries, file_pairs = _parse(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LibraryError(f"The model catalog file {path.name} is damaged ({exc})") from exc
        for m in file_entries:
            entries[m.id] = m
        raw_pairs += file_pairs
    for head in entries.values():
        owner = entries.get(head.trained_for)
        if head.kind != MODEL and (owner is None or owner.kind != MODEL):
            raise LibraryError(f"The model catalog's {head.words} {head.id} is for "
                               f"{head.trained_for}, which the catalog does not list")
    pairs = [_pair(entries, *raw) for raw in raw_pairs]
    return Catalog(models=[m for m in entries.values() if m.kind == MODEL], pairs=pairs,
                   heads=[m for m in entries.values() if m.kind != MODEL])


def load_catalog(folder: Path | None = None) -> Catalog:
    """The catalog (read once per process)."""
    return _load(str(folder or Path(specchat.__file__).parent / "resources" / "catalog"))
