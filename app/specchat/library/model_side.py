"""What is known about one named model before it is loaded: its files when
they are on disk, else its catalog entry.

Every reference source (``sources/``) describes its references as a
``ModelSide``, and the compatibility verdict, the memory estimate and the
draft suggestions read only this, so they never care which kind of
reference the user typed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specchat.library.catalog import CatalogModel, load_catalog
from specchat.library.facts import ModelFacts, read_folder
from specchat.library.index import InstalledModel


@dataclass(frozen=True)
class ModelSide:
    """What is known about one side of a pair: files (``facts``) when the
    model is on disk, otherwise its catalog entry."""

    ref: str
    name: str
    path: str | None = None
    facts: ModelFacts | None = None
    catalog: CatalogModel | None = None

    @property
    def on_disk(self) -> bool:
        return self.facts is not None

    @property
    def params(self) -> int | None:
        if self.facts is not None and self.facts.params:
            return self.facts.params
        return self.catalog.params if self.catalog is not None else None

    @property
    def tokenizer_family(self) -> str | None:
        return self.catalog.tokenizer.id if self.catalog is not None else None

    @property
    def tokenizer_known(self) -> bool:
        """Whether the tokenizer can be compared at all: read from the files,
        or named by the catalog."""
        return self.facts is not None or bool(self.tokenizer_family)

    def kv_elements_per_token(self) -> int | None:
        if self.facts is not None:
            return self.facts.kv_elements_per_token()
        return self.catalog.kv_elements_per_token() if self.catalog is not None else None

    def to_json(self) -> dict:
        out = {"ref": self.ref, "name": self.name, "path": self.path, "on_disk": self.on_disk,
               "params": self.params}
        if self.facts is not None:
            out.update({"model_type": self.facts.model_type,
                        "tokenizer_fingerprint": self.facts.tokenizer_fingerprint,
                        "vocab_size": self.facts.vocab_size,
                        "attention": self.facts.attention,
                        "quantization": self.facts.quantization})
        if self.catalog is not None:
            out["catalog_id"] = self.catalog.id
            out["tokenizer_family"] = self.catalog.tokenizer.id
        return out


def catalog_for_source(source: str) -> CatalogModel | None:
    """The catalog entry an index source (``hf:org/repo@rev``, ``bundled:NAME``)
    came from, if any: it names the tokenizer family of an installed model."""
    if source.startswith(("hf:", "bundled:")):
        return load_catalog().model(source.split("@", 1)[0])  # a revision is not in the catalog
    return None


def installed_side(ref: str, model: InstalledModel) -> ModelSide:
    """An installed model: facts from the index, no file read."""
    return ModelSide(ref, model.name, model.path, model.facts, catalog_for_source(model.source))


def folder_side(ref: str, folder: Path, known: CatalogModel | None = None) -> ModelSide:
    """An MLX folder on disk, read now (small files only)."""
    folder = Path(folder)
    return ModelSide(ref, folder.name, str(folder), read_folder(folder), known)


def catalog_side(ref: str, known: CatalogModel) -> ModelSide:
    """A model not on disk: only what the catalog says."""
    return ModelSide(ref, known.id, catalog=known)
