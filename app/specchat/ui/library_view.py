"""What the windows need from the model library, as plain values.

The library's errors are caught here: the picker must still open, with what
can be listed, if a file on disk is damaged. Its results are typed
dataclasses, read field by field. Nothing here touches MLX.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from specchat.engine.drafter_kinds import head_words
from specchat.library import bundled, compatibility, index
from specchat.library import catalog as cat
from specchat.library.bundled import PreparedModel
from specchat.library.catalog import CatalogModel
from specchat.library.compatibility import CompatReport
from specchat.library.errors import LibraryError
from specchat.library.index import InstalledModel
from specchat.library.sources import cluster
from specchat.library.sources.cluster import ClusterState
from specchat.library.units import params_text, size_text

T = TypeVar("T")
BUNDLED_REFS = ("bundled:qwen2.5-coder-1.5b", "bundled:qwen2.5-coder-0.5b",
                "bundled:smollm2-135m")


@dataclass(frozen=True)
class ModelChoice:
    ref: str
    label: str
    group: str  # "bundled", "installed", "head", "catalog"
    detail: str = ""
    # A draft head (EAGLE-3): never a target. The model its files say it was
    # made for ("" when they do not say); None for a model.
    head_for: str | None = None


@dataclass(frozen=True)
class Verdict:
    compatible: bool | None  # None: could not be checked before loading
    reasons: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        if self.compatible is None:
            return "; ".join(self.reasons) or "Checked when the pair loads."
        if self.compatible:
            return "; ".join(self.reasons) or "Compatible: the draft shares the target's tokenizer."
        return "; ".join(self.reasons) or "Incompatible."


def default_pair() -> tuple[str, str | None]:
    return bundled.DEFAULT_TARGET, bundled.DEFAULT_DRAFT


def _or_empty(read: Callable[[], list[T]]) -> list[T]:
    """``read()``, or nothing if it fails: an unreadable index, folder or
    catalog, a damaged cluster folder, a model not on disk must not break
    the window, which lists what it can."""
    try:
        return read()
    except Exception:  # noqa: BLE001
        return []


def installed_models() -> list[InstalledModel]:
    return _or_empty(lambda: list(index.list_installed()))


def _install_names(m: InstalledModel) -> set[str]:
    """Every name a head's record may give an installed model by: its name,
    where it came from (with and without the revision) and its folder."""
    source = m.source.removeprefix("hf:")
    return {m.name, source, source.split("@", 1)[0], m.path or ""} - {""}


def _made_for(head: InstalledModel, model: InstalledModel) -> bool:
    """Whether a draft head names ``model`` as the one it drafts for."""
    made_for = (head.head or {}).get("for") or ""
    return bool(made_for) and made_for in _install_names(model)


def heads_under_targets(models: list[InstalledModel]) -> list[InstalledModel]:
    """Models in their order, each followed by the draft heads made for it;
    heads whose target is not installed come last."""
    heads = [m for m in models if m.head]
    out: list[InstalledModel] = []
    for m in models:
        if m.head:
            continue
        out.append(m)
        out += [h for h in heads if _made_for(h, m) and h not in out]
    return out + [h for h in heads if h not in out]


def nested_heads(models: list[InstalledModel], others: list[str] = ()) -> list[InstalledModel]:
    """The draft heads whose target is listed with them (one of ``models``,
    or named in ``others``: the built-in models shown beside them), which
    heads_under_targets puts under it; the rest have no target row."""
    return [h for h in models if h.head and (
        any(not m.head and _made_for(h, m) for m in models)
        or (h.head.get("for") or None) in others)]


def source_text(m: InstalledModel, listed: bool = True) -> str:
    """Where a model came from, and for a draft head which model it drafts
    for; ``listed=False``: that model is not in the library (a head trained
    for a target loaded from a folder), said so, since no row is its."""
    if not m.head:
        return m.source
    made_for = m.head.get("for") or "its target"
    return (f"{m.source} ({head_words(m.model_type or '')} for {made_for}"
            + ("" if listed else ", which is not in the library") + ")")


def built_in_models() -> list[PreparedModel]:
    """The built-in models converted so far (``<home>/bundled``): not index
    entries, but on disk all the same, so the Models dialog lists them."""
    return _or_empty(bundled.prepared)


def catalog_models() -> list[CatalogModel]:
    """The catalog's models, or none when the catalog cannot be read."""
    return _or_empty(lambda: list(cat.load_catalog().models))


def _shipped(ref: str) -> bool:
    """Whether this installation carries the built-in model (a packaged app
    carries only the default pair)."""
    try:
        return bundled.shipped(ref)
    except LibraryError:  # not a built-in name: offer it, loading it says what is wrong
        return True


def model_choices() -> list[ModelChoice]:
    """Bundled first, then installed, then what the catalog can download."""
    seen: set[str] = set()
    out: list[ModelChoice] = []

    def add(choice: ModelChoice) -> None:
        if choice.ref not in seen:
            seen.add(choice.ref)
            out.append(choice)

    cat_models = catalog_models()
    bundled_names = {m.ref: m.name for m in cat_models if m.bundled}
    for ref in BUNDLED_REFS:
        if not _shipped(ref):
            continue
        name = bundled_names.get(ref, ref.split(":", 1)[1]).removesuffix(" (bundled)")
        add(ModelChoice(ref, f"{name}  (built in)", "bundled"))
    for m in installed_models():
        if m.kind == "bundled" or m.source.startswith("bundled:"):
            continue
        detail = " · ".join(x for x in (params_text(m.params) if m.params else "",
                                         size_text(m.size_bytes) if m.size_bytes else "") if x)
        if m.head:  # a draft head: the picker offers it as a draft, labelled by whether
            # it fits the chosen target (pair_choices.head_label)
            add(ModelChoice(m.ref, m.name, "head", source_text(m),
                            head_for=m.head.get("for") or ""))
            continue
        add(ModelChoice(m.ref, f"{m.name}  (installed{', ' + detail if detail else ''})",
                        "installed", m.source))
    for m in cat_models:
        if m.bundled:
            continue
        add(ModelChoice(m.ref, f"{m.name}  (download {size_text(m.download_bytes)})", "catalog",
                        m.ref))
    return out


@dataclass(frozen=True)
class HeadFits:
    """Which of the installed draft heads can draft for one target: the
    target's name as the labels say it, and a Verdict for each head."""

    target: str
    name: str
    verdicts: dict[str, Verdict]


def _names(side: compatibility.ModelSide) -> set[str]:
    """Every name a head's record may give its target by."""
    names = {side.ref, side.name, side.path or ""}
    if side.catalog is not None:
        names |= {side.catalog.id, side.catalog.name, side.catalog.ref,
                  side.catalog.repo or ""}
    for m in installed_models():  # an installed target: by where it came from too
        if m.name == side.ref:
            names |= _install_names(m)
    return names - {""}


def head_verdict(target: str, head: str, made_for: str = "",
                 names: set[str] | None = None) -> Verdict:
    """Whether the draft head ``head`` drafts for ``target``: the
    compatibility check (the hidden states it reads, the ids it maps into),
    as the engine checks at load. While the target's files are not here to
    check against, a head that records this target as its own fits, and
    any other is unknown (None) until they are."""
    try:
        report = compatibility.check(target, head, allow_work=False)
    except Exception as exc:  # noqa: BLE001 - e.g. not downloaded yet
        return Verdict(None, (f"Checked when the pair loads ({exc}).",))
    if not report.compatible or report.target.on_disk:
        return _verdict(report)
    draft = report.draft
    words = head_words(draft.facts.model_type if draft.facts is not None
                       else draft.catalog.kind if draft.catalog is not None else "")
    if made_for and made_for in (names if names is not None else _names(report.target)):
        return Verdict(True, (f"{draft.name} is an {words} made for {made_for}", *report.notes))
    # Another name may still be this model (a conversion, a quantized copy):
    # unknown, not refused, until the target's files are here to check.
    said = (f"{draft.name} is an {words} made for {made_for}",) if made_for else ()
    return Verdict(None, (*said, *report.notes) or ("Checked when the pair loads.",))


def head_fits(target: str, heads: tuple[tuple[str, str], ...]) -> HeadFits:
    """``head_verdict`` for each (head, what it records it was made for),
    for the picker's draft list. Reads config files: off the GUI thread."""
    try:
        side = compatibility.describe(target, allow_work=False)
        name, names = side.name, _names(side)  # the index is read once, not once a head
    except Exception:  # noqa: BLE001 - named as typed
        name, names = target, None
    return HeadFits(target, name, {ref: head_verdict(target, ref, made_for, names)
                                   for ref, made_for in heads})


def cluster_states() -> list[ClusterState]:
    """The clusters defined here and whether their ranks answer (dials
    them: call it off the GUI thread); none when they cannot be read."""
    return _or_empty(cluster.states)


NO_DRAFT = "No draft model: suffix matching drafts from the conversation and your history."


def check_pair(target: str, draft: str | None) -> Verdict:
    """Can ``draft`` speculate for ``target`` (``modes.OWN_HEAD``: its own MTP
    head)? Reads tokenizer files (and may be slow for models not yet on
    disk): call it off the GUI thread."""
    if not draft:
        return Verdict(True, (NO_DRAFT,))
    try:
        # allow_work=False: a verdict must never start a minutes-long
        # conversion of a bundled model or a GGUF file.
        report = compatibility.check(target, draft, allow_work=False)
    except Exception as exc:  # noqa: BLE001 - e.g. not downloaded yet
        return Verdict(None, (f"Checked when the pair loads ({exc}).",))
    return _verdict(report)


def _verdict(report: CompatReport) -> Verdict:
    """The library's report in the picker's terms: unknown (None) rather
    than a tick when the tokenizers could not be compared yet."""
    reasons, notes = tuple(report.reasons), tuple(report.notes)
    if report.compatible and not report.tokenizers_known:
        # Nothing wrong was found, but the tokenizers could not be compared
        # yet: do not show a tick the files might contradict.
        return Verdict(None, (*notes, *reasons) or ("Checked when the pair loads.",))
    return Verdict(report.compatible, reasons + tuple(n for n in notes if report.compatible))


def suggest_drafts(target: str) -> list[str]:
    return _or_empty(lambda: [s.ref for s in compatibility.suggest_drafts(target)])

