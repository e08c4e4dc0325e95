"""Recommended pairs, from ``resources/catalog/*.json``.

Each file describes one tokenizer family: the tokenizer, the models that
use it, and the pairs worth recommending. A pair fits because both models
share that tokenizer (so a draft token id means the same text to the
target) and the draft is much smaller; the reason and the memory a pair
needs are computed here from the numbers in the file, not written by hand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import specchat
from specchat.library.errors import LibraryError
from specchat.library.memory import MemoryEstimate, estimate


def catalog_dir() -> Path:
    return Path(specchat.__file__).parent / "resources" / "catalog"


@dataclass(frozen=True)
class Tokenizer:
    id: str
    label: str
    vocab: int
    note: str = ""


@dataclass(frozen=True)
class CatalogModel:
    """A model the catalog knows, with what is needed to estimate its memory
    and to explain its pairs before anything is downloaded."""

    id: str
    name: str
    ref: str  # hf:org/repo or bundled:name
    tokenizer: Tokenizer
    params: int
    quantization: str | None
    download_bytes: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_context: int
    license: str = ""

    @property
    def repo(self) -> str | None:
        return self.ref[3:].split("@", 1)[0] if self.ref.startswith("hf:") else None

    @property
    def bundled(self) -> bool:
        return self.ref.startswith("bundled:")

    def kv_elements_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def memory(self, context_tokens: int = 4096, dtype: str | None = None) -> MemoryEstimate:
        return estimate(self, None, context_tokens, dtype=dtype, measure=False)

    def to_json(self) -> dict:
        return {
            "id": self.id, "name": self.name, "ref": self.ref, "tokenizer": self.tokenizer.id,
            "params": self.params, "quantization": self.quantization,
            "download_bytes": self.download_bytes, "max_context": self.max_context,
            "license": self.license,
        }


@dataclass(frozen=True)
class Pair:
    target: CatalogModel
    draft: CatalogModel
    note: str = ""
    bundled: bool = False

    @property
    def id(self) -> str:
        return f"{self.target.id}+{self.draft.id}"

    @property
    def download_bytes(self) -> int:
        return self.target.download_bytes + self.draft.download_bytes

    @property
    def why(self) -> str:
        """Why the pair works, in words, from the catalog's numbers."""
        tok = self.target.tokenizer
        ratio = self.target.params / self.draft.params
        text = (f"Both use the {tok.label} tokenizer ({tok.vocab:,} tokens), so every token "
                f"the draft proposes means the same text to the target; the draft has "
                f"{ratio:.0f}x fewer parameters ({_b(self.draft.params)} vs "
                f"{_b(self.target.params)}), so drafting costs little next to verifying.")
        return f"{text} {self.note}".strip()

    def memory(self, context_tokens: int = 4096, dtype: str | None = None) -> MemoryEstimate:
        """MemoryEstimate for the pair in ``dtype`` (default: this machine's
        compute dtype), without measuring what is available."""
        return estimate(self.target, self.draft, context_tokens, dtype=dtype,
                               measure=False)

    def to_json(self, context_tokens: int = 4096) -> dict:
        mem = self.memory(context_tokens)
        return {"id": self.id, "target": self.target.to_json(), "draft": self.draft.to_json(),
                "why": self.why, "bundled": self.bundled, "download_bytes": self.download_bytes,
                "memory": mem.to_json()}


@dataclass(frozen=True)
class Catalog:
    models: list[CatalogModel] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)

    def model(self, key: str) -> CatalogModel | None:
        """By id (``qwen2.5-7b``), reference (``hf:org/repo``) or repo id."""
        key_l = key.lower()
        for m in self.models:
            if key_l in (m.id.lower(), m.ref.lower()) or (m.repo and m.repo.lower() == key_l):
                return m
        if key_l.startswith("hf:"):
            repo = key_l[3:].split("@", 1)[0]
            return next((m for m in self.models if m.repo and m.repo.lower() == repo), None)
        return None

    def pair(self, key: str) -> Pair | None:
        return next((p for p in self.pairs if p.id.lower() == key.lower()), None)

    def pairs_for_target(self, model: CatalogModel) -> list[Pair]:
        return [p for p in self.pairs if p.target.id == model.id]

    def same_tokenizer(self, model: CatalogModel) -> list[CatalogModel]:
        return [m for m in self.models if m.tokenizer.id == model.tokenizer.id and m.id != model.id]


def _b(params: int) -> str:
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"


def _parse(path: Path) -> tuple[list[CatalogModel], list[tuple[str, str, str, bool]]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    tok = Tokenizer(**data["tokenizer"])
    models = []
    for m in data.get("models", []):
        if not str(m["ref"]).startswith(("hf:", "bundled:")):  # sources/catalog.py pulls only these
            raise ValueError(f"{m['id']}: {m['ref']!r} is neither an hf: nor a bundled: reference")
        models.append(CatalogModel(
            id=m["id"], name=m["name"], ref=m["ref"], tokenizer=tok, params=int(m["params"]),
            quantization=m.get("quantization"), download_bytes=int(m.get("download_bytes") or 0),
            num_layers=int(m["num_layers"]), num_kv_heads=int(m["num_kv_heads"]),
            head_dim=int(m["head_dim"]), max_context=int(m["max_context"]),
            license=m.get("license", "")))
    pairs = [(p["target"], p["draft"], p.get("note", ""), bool(p.get("bundled")))
             for p in data.get("pairs", [])]
    return models, pairs


@lru_cache(maxsize=4)
def _load(folder: str) -> Catalog:
    models: dict[str, CatalogModel] = {}
    raw_pairs = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            file_models, file_pairs = _parse(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LibraryError(f"The model catalog file {path.name} is damaged ({exc})") from exc
        for m in file_models:
            models[m.id] = m
        raw_pairs += file_pairs
    pairs = []
    for t_id, d_id, note, bundled in raw_pairs:
        if t_id not in models or d_id not in models:
            raise LibraryError(f"The model catalog pairs unknown models: {t_id} + {d_id}")
        pairs.append(Pair(models[t_id], models[d_id], note, bundled))
    return Catalog(models=list(models.values()), pairs=pairs)


def load_catalog(folder: Path | None = None) -> Catalog:
    """The catalog (read once per process)."""
    return _load(str(folder or catalog_dir()))
