"""Can this draft speculate for that target? A verdict with the reasons in
words, for installed models, folders, files and catalog entries, before any
weights are loaded.

A pair works when (1) both tokenizers are identical, so a token id the draft
proposes means the same text to the target (same vocabulary, same ids, same
special tokens; the words come from ``engine.compat.compare_tokenizers``,
which the engine uses at load time too), or the draft is a draft head
made for the target (the hidden width and layers it reads, the ids it maps
into: its format module, ``engine.eagle3_format`` for an EAGLE-3 head,
``engine.assistant_format`` for a Gemma 4 assistant, the engine's own rules
and words), or the
draft is the target's own MTP head (``modes.OWN_HEAD``, "mtp": its weights
checked by ``engine.mtp_format``, as the engine checks them); (2) both
caches can go back after rejected draft tokens (every kind mlx-lm makes
can: engine/rollback.py); and (3) the draft is smaller than the target, or
drafting costs as much as verifying.

Models not downloaded yet are judged from the catalog (tokenizer family and
parameter counts) and the report says so (``verified=False``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from specchat.engine import drafter_kinds, folders, modes, mtp_format
from specchat.engine.compat import SAME_MODEL, compare_tokenizers
from specchat.library import index, memory, refs
from specchat.library.catalog import load_catalog
from specchat.library.errors import LibraryError
from specchat.library.facts import tokenizer_facts
from specchat.library.memory import MemoryEstimate
from specchat.library.model_side import ModelSide, catalog_for_source
from specchat.library.units import params_text

__all__ = ["CompatReport", "ModelSide", "Suggestion", "check", "describe", "suggest_drafts"]


@dataclass(frozen=True)
class CompatReport:
    """``compatible`` and, in ``reasons``, why: the problems when it is not,
    what makes the pair work when it is. ``notes`` hold caveats (e.g. a
    verdict from the catalog only). ``memory`` is the estimate for the pair."""

    compatible: bool
    reasons: list[str]
    target: ModelSide
    draft: ModelSide
    memory: MemoryEstimate | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        """True when judged from the files themselves."""
        return self.target.on_disk and self.draft.on_disk

    @property
    def tokenizers_known(self) -> bool:
        """Whether both tokenizers were known (from files or the catalog); if
        not, "compatible" only means nothing else was found wrong."""
        return self.target.tokenizer_known and self.draft.tokenizer_known

    def to_json(self) -> dict:
        return {"compatible": self.compatible, "reasons": list(self.reasons),
                "notes": list(self.notes), "verified": self.verified,
                "target": self.target.to_json(), "draft": self.draft.to_json(),
                "memory": self.memory.to_json() if self.memory is not None else None}


# -- describing a reference without loading it ------------------------------------


def describe(ref: str, allow_work: bool = True) -> ModelSide:
    """What is known about ``ref`` without downloading anything. Installed and
    local models are read from disk; Hub and catalog models not downloaded
    yet come from the catalog. With ``allow_work``, bundled models and GGUF
    files not converted yet are converted (once) so they can be read. The
    source that claims ``ref`` (see ``sources/``) answers."""
    ref, source = refs.source_for(ref)
    return source.describe(ref, allow_work)


# -- the verdict ----------------------------------------------------------------------


def _tokenizer_verdict(t: ModelSide, d: ModelSide) -> tuple[list[str], list[str], list[str]]:
    """(problems, good reasons, notes) about the two tokenizers."""
    tf = t.facts.tokenizer_fingerprint if t.facts else None
    df = d.facts.tokenizer_fingerprint if d.facts else None
    if tf and df:
        if tf == df:
            return [], [f"same tokenizer ({t.facts.vocab_size:,} tokens, identical ids and "
                        "special tokens), so every draft token means the same to the target"], []
        problems = compare_tokenizers(tokenizer_facts(Path(t.path)), tokenizer_facts(Path(d.path)))
        if problems:
            return problems, [], []
        return [], ["the tokenizers agree on every token id and special token"], []
    if t.on_disk and d.on_disk:
        missing = t.name if not tf else d.name
        return [], [], [f"{missing} has no tokenizer.json, so the tokenizers are compared "
                        "when the pair is loaded"]
    tfam, dfam = t.tokenizer_family, d.tokenizer_family
    if tfam and dfam:
        note = ["judged from the catalog; checked again from the files once downloaded"]
        if tfam == dfam:
            label = (t.catalog or d.catalog).tokenizer
            return [], [f"both use the {label.label} tokenizer ({label.vocab:,} tokens)"], note
        return ([f"different tokenizers: the target uses {t.catalog.tokenizer.label}, the "
                 f"draft {d.catalog.tokenizer.label}"], [], note)
    return [], [], ["the tokenizers cannot be compared until both models are downloaded"]


def _head_verdict(t: ModelSide, d: ModelSide) -> tuple[list[str], list[str], list[str]]:
    """(problems, good reasons, notes) for a draft head drafting for a
    target, by the engine's own rules and words (its format's fit_problem
    and map_problem: the engine refuses the same at load)."""
    head = d.facts.head
    fmt = drafter_kinds.get(d.facts.model_type).folder
    if not t.on_disk or not t.path:
        return [], [], ["the head is checked against the target once the target is downloaded"]
    target = fmt.target_facts(t.name, folders.read_config(Path(t.path), LibraryError))
    if target is None:
        return [], [], [f"{t.name}'s config.json does not state its hidden size, layers and "
                        "vocabulary, so the head is checked against it when the pair is loaded"]
    problem = fmt.fit_problem(head, target, d.name)
    if problem is None and d.on_disk and d.path:
        problem = fmt.map_problem(fmt.read(Path(d.path), LibraryError), target, d.name)
    if problem is not None:
        return [problem], [], []
    return [], [fmt.fits(head, target)], []


def _own_head(t: ModelSide, context_tokens: int) -> CompatReport:
    """The verdict for the target drafting with its own MTP head
    (``specchat models check T mtp``, the pair picker's own head): from its
    files when it is on disk, in the engine's words (mtp_format.verdict, as
    the engine checks it before it loads), else from the catalog. The head
    is part of the target: its side is the target's."""
    draft = ModelSide(modes.OWN_HEAD, f"{t.name}'s own MTP head", t.path, t.facts, t.catalog)
    notes = []
    if t.facts is not None and t.facts.head is not None:
        problem = _not_a_target(t)
    elif t.on_disk and t.path:
        path = Path(t.path)
        problem = mtp_format.verdict(path, folders.read_config(path, LibraryError), t.name,
                                     LibraryError)
    elif t.catalog is not None:
        problem = None if t.catalog.mtp else mtp_format.no_head(t.name)
        notes.append("judged from the catalog; checked again from the files once downloaded")
    else:
        problem = f"{t.name} is not on disk, so whether it ships an MTP head is not known yet"
    good = [f"{t.name} drafts for itself with its own MTP head: one layer, no second model to "
            "download or hold"]
    est = memory.estimate(t, None, context_tokens) if t.params else None
    return CompatReport(compatible=problem is None, reasons=[problem] if problem else good,
                        target=t, draft=draft, memory=est, notes=notes)


def _not_a_target(t: ModelSide) -> str:
    """A head chosen as the target, in the engine's words."""
    return drafter_kinds.not_a_target(t.path or t.ref, drafter_kinds.get(t.facts.model_type),
                                      t.facts.head.get("for") or "")


def check(target_ref: str, draft_ref: str, context_tokens: int = 4096,
          allow_work: bool = True) -> CompatReport:
    """The verdict for ``draft_ref`` speculating for ``target_ref``
    (``modes.OWN_HEAD``: the target's own MTP head)."""
    t = describe(target_ref, allow_work)
    if draft_ref == modes.OWN_HEAD:
        return _own_head(t, context_tokens)
    d = describe(draft_ref, allow_work)
    is_head = d.facts is not None and d.facts.head is not None
    problems, good, notes = (_head_verdict if is_head else _tokenizer_verdict)(t, d)
    if t.path and d.path and Path(t.path).resolve() == Path(d.path).resolve():
        problems.insert(0, SAME_MODEL)
    if t.params and d.params:
        if d.params >= t.params and SAME_MODEL not in problems:
            problems.append(
                f"the draft is not smaller than the target ({params_text(d.params)} vs "
                f"{params_text(t.params)} parameters), so drafting would cost as much as "
                "verifying")
        elif d.params < t.params:
            good.append(f"the draft is {t.params / d.params:.1f}x smaller "
                        f"({params_text(d.params)} vs {params_text(t.params)} parameters)")
    if t.facts is not None and d.facts is not None and not problems:
        good.append("both caches can be rewound after rejected draft tokens")
    if t.facts is not None and t.facts.head is not None:  # a head chosen as the target:
        # that is the one thing to say (the engine refuses to load it the same way)
        problems = [_not_a_target(t)]
    est = memory.estimate(t, d, context_tokens) if t.params else None
    return CompatReport(compatible=not problems, reasons=problems or good, target=t, draft=d,
                        memory=est, notes=notes)


# -- suggestions -----------------------------------------------------------------------


@dataclass(frozen=True)
class Suggestion:
    """A draft for a chosen target: installed (ready to use) or from the
    catalog (to download), with why it fits."""

    ref: str
    name: str
    installed: bool
    params: int | None
    download_bytes: int | None
    why: str
    recommended: bool = False  # a catalog pair

    def to_json(self) -> dict:
        return asdict(self)


def suggest_drafts(target_ref: str) -> list[Suggestion]:
    """Compatible drafts for a target: installed models with the same
    tokenizer that are smaller and rewindable first (smallest first), then
    catalog drafts not installed yet (recommended pairs first)."""
    t = describe(target_ref, allow_work=False)
    t_params = t.params or 0
    out: list[Suggestion] = []
    seen_sources: set[str] = set()
    t_fp = t.facts.tokenizer_fingerprint if t.facts else None
    for m in sorted(index.list_installed(), key=lambda m: m.params or 0):
        if t.path and Path(m.path).resolve() == Path(t.path).resolve():
            continue
        if not m.params or (t_params and m.params >= t_params):
            continue
        same = (t_fp and m.tokenizer_fingerprint == t_fp) or (
            not t_fp and t.tokenizer_family is not None
            and (c := catalog_for_source(m.source)) is not None
            and c.tokenizer.id == t.tokenizer_family)
        if not same:
            continue
        ratio = f", {t_params / m.params:.0f}x smaller" if t_params else ""
        out.append(Suggestion(m.name, m.name, True, m.params, 0,
                              f"installed; same tokenizer{ratio}"))
        seen_sources.add(m.source)
    cat_target = t.catalog
    if cat_target is not None:
        cat = load_catalog()
        recommended = [p.draft for p in cat.pairs_for_target(cat_target)]
        others = sorted((m for m in cat.same_tokenizer(cat_target)
                         if m.params < cat_target.params and m not in recommended),
                        key=lambda m: m.params)
        for m in recommended + others:
            if m.ref in seen_sources or index.find_source(m.ref) is not None:
                continue
            is_pair = m in recommended
            why = (f"{'recommended pair' if is_pair else 'same tokenizer'}: "
                   f"{m.tokenizer.label} tokenizer, {cat_target.params / m.params:.0f}x smaller"
                   + ("" if m.bundled else f", {m.download_bytes / 1e9:.1f} GB to download"))
            out.append(Suggestion(m.id, m.name, False, m.params,
                                  0 if m.bundled else m.download_bytes, why, is_pair))
    return out
