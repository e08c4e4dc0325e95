"""The engine proper: a loaded target, what its drafters need, and ``generate``.

What drafters need besides the target (drafter_kinds.DrafterKind.needs) is
held in one map, ``Engine._slots``, from need to a ``Slot``: the drafter
that holds it (the draft model, a head, the MTP head: made by its kind as
it loads) and those other kinds make on it when first used (ssd around the
draft model; suffix matching on need "", the target alone), dropped with
it. A head chosen as the draft holds its own need too: one slot, two keys.
A head's folder is recognised and checked by its kind's format module
(drafter_kinds.of_folder): nothing here names a kind of head.

An Engine is owned by exactly one thread (see worker.py); nothing here is
thread-safe, by design.
"""

from __future__ import annotations

import copy
import gc
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import mlx.core as mx

from specchat.engine import (
    chat,
    chat_format,
    chat_rules,
    compute,
    drafter_kinds,
    modes,
    mtp_format,
    reply_parts,
    request_check,
    threads,
    warmup,
)
from specchat.engine.compat import SAME_MODEL, facts_from_tokenizer
from specchat.engine.costs import CostModel
from specchat.engine.decoding import Decoding, decode
from specchat.engine.draft_policy import EXPECTED_REPLY, DraftPolicy
from specchat.engine.drafter_kinds import DRAFT_MODEL, MTP, DrafterKind
from specchat.engine.drafters import Absent, Build, Drafter
from specchat.engine.errors import EngineError
from specchat.engine.events import (
    ChatFormat,
    ComputeInfo,
    GenerateRequest,
    GenerationResult,
    LoadedPair,
    StepEvent,
)
from specchat.engine.folders import is_cluster_folder, model_name, read_config
from specchat.engine.history import History, SyncReport
from specchat.engine.hybrid import HybridDrafter
from specchat.engine.kv import CacheSlot
from specchat.engine.loading import LoadedModel, load_folder
from specchat.engine.prompt_cache import CacheUse, Conversation, PromptCache, common_prefix
from specchat.engine.runner import Runner

# A conversation a request would cut short by this many tokens or more is put
# aside first; when the request shares at least FORK_MIN tokens with it, a copy
# is (the request reuses that prefix in place).
KEEP_MIN = 32
FORK_MIN = 256
REPLY_ALPHA = 0.3  # the weight of the latest reply in the average reply length


@dataclass
class Slot:
    """What the engine holds for one need: the drafter that holds it (None:
    the target alone, or empty for ``why``), and those made on it by kind."""

    drafter: Drafter | None = None
    made: dict[str, Drafter] = field(default_factory=dict)
    why: str = ""  # in words (the target ships no MTP head that drafts)

    @property
    def folder(self) -> str | None:
        loaded = self.drafter.loaded if self.drafter is not None else None
        return loaded.info.path if loaded is not None else None


@dataclass(frozen=True)
class Choice:
    """A folder chosen for a need, its kind, and what the kind's format
    module read and checked of it (a head's)."""

    folder: Path
    kind: DrafterKind
    files: object = None


def _choice(path: str | Path | None, head: bool = False) -> Choice | None:
    """What ``path`` is for the draft's need or, with ``head``, the head's:
    a head's folder is read and checked by its format before anything
    loads, in the library's words; any other folder is a draft model's."""
    if path is None:
        return None
    folder = Path(path).expanduser().resolve()
    kind = drafter_kinds.of_folder(read_config(folder)) if folder.is_dir() else None
    if kind is not None:
        return Choice(folder, kind, kind.folder.read(folder))
    if head:
        known = ", ".join(k.folder.LABEL for k in drafter_kinds.KINDS.values() if k.folder)
        raise EngineError(f"{folder.name} is not a draft head: its config.json is not one of "
                          f"the head formats SpecChat reads ({known}).")
    return Choice(folder, DRAFT_MODEL)


class Engine:
    def __init__(self, compute_info: ComputeInfo | None = None):
        self.compute = compute_info or compute.detect()
        self.target: LoadedModel | None = None
        self._cache: CacheSlot | None = None  # the target's
        self._slots: dict[str, Slot] = {}
        self._eos: set[int] = set()
        self._vocab = 0
        self._cost = CostModel()
        self._pair: LoadedPair | None = None
        self._chat = ChatFormat()  # the target's tools and reasoning (chat_format.py)
        # Conversations put aside with their caches (prompt_cache.py).
        self._conversations = PromptCache()
        # How long replies run, lately (an average): what reading a long
        # prompt into a draft model is weighed against (DraftPolicy.worth_reading).
        self._expected_reply = EXPECTED_REPLY
        # The user's earlier conversations, for suffix drafting (history.py):
        # tied to the target's tokenizer, filled by sync_history.
        self.history = History()

    # -- loading ---------------------------------------------------------
    def load(
        self,
        target: str | Path,
        draft: str | Path | None = None,
        progress: Callable[[str, str], None] | None = None,
        head: str | Path | None = None,
    ) -> LoadedPair:
        """Load a target and an optional draft (folders; a draft model, a
        draft head, or ``modes.OWN_HEAD``: the target's own MTP head), and
        optionally a head beside a draft model (``head``: the bench runs
        both in one process). Reuses an already loaded model of the same
        path. Refuses a draft whose tokenizer differs, and a head made for
        another target, checking what it can before anything loads."""
        say = progress or (lambda _stage, _msg: None)
        target_path = str(Path(target).expanduser().resolve())
        own_head = draft == modes.OWN_HEAD
        new_target = self.target is None or self.target.info.path != target_path
        chosen = _choice(None if own_head else draft)
        if chosen is not None and str(chosen.folder) == target_path:
            # it would "speculate" at twice the cost of plain decoding
            name = Path(target_path).name
            raise EngineError(f"{name} cannot draft for {name}: {SAME_MODEL}.")
        if own_head and new_target:
            _check_own_head(target_path)
        beside = _choice(head, head=True)
        if new_target:
            self._load_target(target_path, say)
        self._hold("draft", chosen, lambda m: say("draft", m))
        self._hold("head", beside, lambda m: say("draft", m))
        if own_head and self._slots[MTP.needs].drafter is None:
            raise EngineError(self._slots[MTP.needs].why)
        self._cost = self._price()
        self._pair = self._describe(own_head)
        return self._pair

    def _load_target(self, path: str, say) -> None:
        """The target, warmed up, its cache and what it holds itself: its
        own MTP head if it drafts (need "mtp"), the need ""."""
        self._drop_target()
        if is_cluster_folder(path):  # the target's layers spread over a cluster
            from specchat.engine.distributed.head import load_target

            self.target, runner = load_target(path, self.compute, lambda m: say("target", m))
        else:
            self.target = load_folder(path, self.compute, lambda m: say("target", m))
            runner = Runner(self.target.model, self.target.info.model_type, self.target.config)
            say("target", f"warming up {self.target.info.name}")
            warmup.warm(runner)
        self._cache = CacheSlot(runner)
        self._eos = chat.end_token_ids(self.target.tokenizer)
        self._chat = chat_format.read(self.target.tokenizer)
        self.history = History()  # ids of another tokenizer mean nothing
        w = runner.head_weight()
        self._vocab = int(w.shape[0]) if w is not None else int(
            self.target.config.get("vocab_size")
            or self.target.config.get("text_config", {}).get("vocab_size"))
        threads.fit_model(self.target.config)
        self._slots = {"": Slot()}
        try:
            mtp = Slot(MTP.make(self._build(folder=Path(path),
                                            say=lambda m: say("target", m))))
        except Absent as absent:
            mtp = Slot(why=str(absent))
        except BaseException:
            self._drop_target()  # its own head unreadable: nothing stays half loaded
            raise
        self._slots[MTP.needs] = mtp

    def _hold(self, need: str, chosen: Choice | None, say: Callable[[str], None]) -> None:
        """What was chosen for ``need`` (the pair's draft, a head beside the
        draft model), kept if it holds it already, else made by its kind. A
        head chosen as the draft holds its own need too: one head at a time."""
        draft = self._slots.get("draft")
        if need != "draft" and draft is not None and self._slots.get(need) is draft:
            if chosen is not None:
                raise EngineError("The draft is a head already: load the other head as the "
                                  "draft instead (one head at a time).")
            return
        held = self._slots.get(need)
        if held is not None and chosen is not None and held.folder == str(chosen.folder):
            return
        self._drop(need)
        if chosen is None:
            return
        self._drop(chosen.kind.needs)  # a head beside the draft model, for a head as the draft
        slot = Slot(chosen.kind.make(self._build(folder=chosen.folder, files=chosen.files,
                                                 say=say)))
        for n in {need, chosen.kind.needs}:
            self._slots[n] = slot

    def _build(self, **what) -> Build:
        return Build(target=self.target, cache=self._cache, compute=self.compute,
                     history=self.history, end_ids=set(self._eos), **what)

    def _price(self) -> CostModel:
        """Drafting costs: the bytes a drafted token of each drafter that
        holds a need reads, against a target forward's."""
        draft = self._slots.get("draft")
        kinds = {d.name: d.bytes_per_token() for d in self._held()
                 if not drafter_kinds.get(d.name).uses_draft_model}
        return CostModel.for_pair(self._cache.runner.bytes_per_token(),
                                  draft.drafter.bytes_per_token() if draft else None,
                                  self.compute.device, kinds)

    def _describe(self, own_head: bool) -> LoadedPair:
        draft = self.draft
        reason = None
        if not self.target.info.trimmable:
            reason = (f"Speculative decoding is not available for {self.target.info.name}: "
                      f"{self.target.info.untrimmable_reason}. Plain decoding still works.")
        elif draft is not None and not draft.info.trimmable:
            reason = (f"{draft.info.name} cannot be used as a draft: "
                      f"{draft.info.untrimmable_reason}.")
        slot = self._slots.get("draft")
        return LoadedPair(
            target=self.target.info,
            draft=draft.info if draft else None,
            compute=self.compute,
            speculative_ok=reason is None,
            reason=reason,
            mtp=self._slots[MTP.needs].drafter is not None,
            own_head=own_head,
            head=self.head.info if self.head is not None else None,
            draft_is_head=slot is not None and self._slots.get("head") is slot,
            chat=self._chat,
        )

    def _held(self) -> list[Drafter]:
        """Every drafter that holds a need (a head chosen as the draft once)."""
        return list({id(s.drafter): s.drafter for s in self._slots.values() if s.drafter}.values())

    def _drop(self, need: str) -> None:
        """Unload what holds ``need`` (under every key) and what was made on it."""
        slot = self._slots.get(need)
        if slot is None:
            return
        self._conversations.clear()  # what was put aside holds its drafter's state
        self._slots = {n: s for n, s in self._slots.items() if s is not slot}
        _unload(slot)
        del slot
        gc.collect()
        mx.clear_cache()

    def _drop_target(self) -> None:
        self._conversations.clear()
        for slot in {id(s): s for s in self._slots.values()}.values():
            _unload(slot)
        self._slots = {}
        if self.target is not None:
            self.target.unload()
        self.target = None
        self._cache = None
        self._chat = ChatFormat()
        gc.collect()
        mx.clear_cache()

    @property
    def pair(self) -> LoadedPair | None:
        return self._pair

    @property
    def draft(self) -> LoadedModel | None:
        """The pair's draft as loaded (a draft model, or a head chosen as the draft)."""
        return self.model_drafter.loaded if self.model_drafter is not None else None

    @property
    def head(self) -> LoadedModel | None:
        """A head loaded beside the draft model, as loaded."""
        slot, draft = self._slots.get("head"), self._slots.get("draft")
        return slot.drafter.loaded if slot is not None and slot is not draft else None

    def loaded_bytes(self) -> int:
        """Weight bytes held now (what loading another pair could free)."""
        models = [self.target, *(d.loaded for d in self._held())]
        return sum(m.info.weight_bytes for m in models if m is not None)

    # Read-only views for measuring tools (bench, benchmarks/): they time the
    # very runner and drafter decoding uses, and print the costs its policy
    # assumes, so their numbers describe what the engine does.
    @property
    def target_runner(self) -> Runner | None:
        return self._cache.runner if self._cache is not None else None

    @property
    def target_cache(self) -> CacheSlot | None:
        return self._cache

    @property
    def model_drafter(self) -> Drafter | None:
        """The pair's draft's drafter (a draft model's, or a head's)."""
        slot = self._slots.get("draft")
        return slot.drafter if slot is not None else None

    @property
    def cost_model(self) -> CostModel:
        return self._cost

    @property
    def vocab(self) -> int:
        """Ids the target's output layer scores: what drafts, the verifier's
        columns and the ids of a saved history stay below."""
        return self._vocab

    @property
    def end_ids(self) -> set[int]:
        """Token ids that end a reply (EOS and the chat template's end-of-turn)."""
        return set(self._eos)

    def reset_cache(self) -> None:
        """Forget cached prompts, those put aside too (this frees memory)."""
        self._conversations.clear()
        if self._cache is not None:
            self._cache.reset()
        slots = {id(s): s for s in self._slots.values()}.values()  # a head may hold two needs
        for drafter in (d for s in slots for d in (s.drafter, *s.made.values()) if d):
            drafter.reset()

    # -- generation ------------------------------------------------------
    def prompt_ids(self, request: GenerateRequest,
                   cancelled: threading.Event | None = None) -> list[int]:
        return self._prompt(request, cancelled)[0]

    def _prompt(self, request: GenerateRequest, cancelled: threading.Event | None = None
                ) -> tuple[list[int], reply_parts.ReplySplitter | None]:
        """The prompt's ids, and for a chat the splitter of its reply (which
        has read what SpecChat wrote of the reply at the prompt's end to
        honour tool_choice: reply_parts.prefill)."""
        if self.target is None:
            raise EngineError("No model is loaded.")
        if request.prompt_ids is None:
            tok, fmt = self.target.tokenizer, self._chat
            switches = chat_rules.template_variables(fmt, request.template_switches,
                                                     request.reasoning_effort)
            chat_rules.offered(fmt, bool(request.tools), request.tool_choice)
            tools = chat_rules.tool_list(request.tools)
            ids = chat.render(tok, request.messages, cancelled,
                              tools=tools if request.tool_choice != "none" else None,
                              switches=switches, reasoning_key=fmt.reasoning_key)
            started = reply_parts.prefill(tok, fmt, ids, request)
            if started:
                ids += tok.encode(started, add_special_tokens=False)
            self._fits(ids)
            return ids, reply_parts.splitter(tok, fmt, ids, request, tools, started)
        ids = list(request.prompt_ids)
        if not ids:
            raise EngineError("The prompt is empty: write a message first.")
        self._fits(ids)  # before reading every id
        rows = self._cache.runner.rows
        bad = next((t for t in ids if rows is not None and not 0 <= t < rows), None)
        if bad is not None:
            raise EngineError(f"Token id {bad} is not in {self.target.info.name}'s "
                              f"vocabulary (ids 0 to {rows - 1}).")
        return ids, None

    def _fits(self, ids: list[int]) -> None:
        """The prompt's tokens against the target's context (its bytes, a
        bound on its tokens, were checked before it was tokenized)."""
        limit = self.target.max_context
        if limit is not None and len(ids) + 1 > limit:
            raise EngineError(
                f"The prompt is {len(ids):,} tokens, more than {self.target.info.name} can "
                f"read ({limit:,}). Start a new conversation or shorten the message.")

    def drafter(self, kind: str) -> Drafter:
        """The drafter the engine runs for the kind ``kind``: the one that
        holds its need, or one its kind makes on it when first asked for."""
        k = drafter_kinds.get(kind)
        slot = self._slots.get(k.needs)
        if slot is None or (k.needs and slot.drafter is None):
            raise EngineError(f"Nothing is loaded that the {kind} drafter needs.")
        if k.fills:
            return slot.drafter
        if k.name not in slot.made:
            slot.made[k.name] = k.make(self._build(base=slot.drafter))
        return slot.made[k.name]

    def drafter_for(self, mode: modes.Mode) -> tuple[Drafter | None, modes.Mode]:
        """The drafter for a mode, and the mode it really runs in: without a
        draft model, a mode with other drafters runs on those (hybrid runs as
        suffix matching). Public: what runs decoding's loop with a policy of
        its own (tests of auto-off with a clock of their own) drafts with what
        a request would."""
        if not mode.speculative:
            return None, mode
        if not self._pair.speculative_ok and (
                not self.target.info.trimmable or mode.needs_draft_model):
            raise EngineError(self._pair.reason)
        have = {n for n, slot in self._slots.items() if n and slot.drafter is not None}
        runs = mode.runs_with(have)
        if runs is None:
            raise EngineError(self._missing(mode))
        chain = [self.drafter(name) for name in runs.drafters]
        return (chain[0] if len(chain) == 1 else HybridDrafter(*chain)), runs

    def _missing(self, mode: modes.Mode) -> str:
        """Why ``mode`` cannot run with what is loaded, in words."""
        kind = next(drafter_kinds.get(d) for d in mode.drafters
                    if drafter_kinds.get(d).needs)
        if self._slots.get(kind.needs, Slot()).why:
            return self._slots[kind.needs].why
        if kind.needs == "head":
            return (f"This mode drafts with an {kind.folder.LABEL} head loaded beside the draft "
                    "model, and none is: load one (--head), or choose the head as the draft.")
        return ("This mode needs a draft model, which is not loaded: choose a draft, or draft "
                "from the conversation (suffix matching).")

    # -- several conversations (prompt_cache.py) ---------------------------------
    def _nearest_conversation(self, ids: list[int]) -> None:
        """Before a request: the caches hold the conversation that shares
        the most of ``ids`` (one put aside is taken back); one the request
        would cut short is put aside first (a copy of it, when the request
        shares a long prefix with it and will reuse that in place)."""
        if self._cache is None:
            return
        held = self._cache.ids
        current = common_prefix(held, ids)
        found = self._conversations.nearest(ids, current)
        if found is not None:
            self._set_aside(self._move_out())
            self._move_in(found)
        elif len(held) - current >= KEEP_MIN and self._conversations.budget > 0:
            if current >= FORK_MIN:  # keep the conversation aside, reuse the prefix here
                conv = self._move_out()
                self._move_in(conv)
                self._set_aside(copy.deepcopy(conv))
            else:
                self._set_aside(self._move_out())

    def _stateful(self) -> list[tuple[str, Drafter]]:
        """Every drafter that may hold a conversation's state, by a key
        that stays its own while the pair stays loaded."""
        out, seen = [], set()
        for need, slot in self._slots.items():
            for key, d in ((need, slot.drafter), *((f"{need}:{k}", m)
                                                    for k, m in slot.made.items())):
                if d is not None and id(d) not in seen:
                    seen.add(id(d))
                    out.append((key, d))
        return out

    def _move_out(self) -> Conversation:
        ids, target = list(self._cache.ids), self._cache.take()
        drafters = {key: d.save() for key, d in self._stateful()}
        return Conversation(ids, target, drafters,
                            target.nbytes + sum(s.nbytes for s in drafters.values() if s))

    def _move_in(self, conv: Conversation) -> None:
        self._cache.put(conv.target)
        for key, d in self._stateful():
            d.restore(conv.drafters.get(key))

    def _set_aside(self, conv: Conversation) -> None:
        if self._conversations.put_aside(conv):  # some dropped: give their memory back
            mx.clear_cache()

    def set_prompt_cache(self, budget: int) -> CacheUse:
        """The bytes conversations put aside may hold (0: one at a time)."""
        if self._conversations.resize(budget):
            mx.clear_cache()
        return self._conversations.use()

    def prompt_cache_use(self) -> CacheUse:
        return self._conversations.use()

    # -- the user's history (suffix drafting) ----------------------------------
    def tokenizer_fingerprint(self) -> str:
        if self.target is None:
            raise EngineError("No model is loaded.")
        return facts_from_tokenizer(self.target.tokenizer).fingerprint()

    def sync_history(self, conversations, folder: str | Path | None = None,
                     cancelled: threading.Event | None = None) -> SyncReport:
        """Rebuild the history index from the store's conversations, given
        as (key, stamp, messages) with messages a sequence of events.Message.
        Token ids saved in ``folder`` (one file per tokenizer) are reused for
        unchanged stamps."""
        if self.target is None:
            raise EngineError("No model is loaded.")
        tok = self.target.tokenizer
        # Ids depend on the tokenizer and on the chat template that rendered them.
        hf = getattr(tok, "_tokenizer", tok)
        template = hashlib.sha256(str(getattr(hf, "chat_template", "")).encode()).hexdigest()[:8]
        fp = f"{self.tokenizer_fingerprint()}-{template}"
        path = Path(folder) / f"history-{fp}.npz" if folder is not None else None
        return self.history.sync(fp, conversations,
                                 lambda msgs: chat.render(tok, msgs, cancelled),
                                 path, vocab=self._vocab)

    def forget_conversation(self, key: str) -> None:
        """A conversation the user deleted leaves the history index."""
        self.history.remove(key)

    def generate(
        self,
        request: GenerateRequest,
        cancelled: threading.Event | None = None,
        on_step: Callable[[StepEvent], None] | None = None,
    ) -> GenerationResult:
        request = request_check.checked(request)  # every value in range, before MLX sees one
        mode = modes.get(request.draft.mode)
        ids, parts = self._prompt(request, cancelled)
        self._nearest_conversation(ids)
        limit = self.target.max_context
        if limit is not None:  # the reply cannot run past the model's context
            request = replace(request, max_tokens=max(1, min(request.max_tokens, limit - len(ids))))
        drafter, mode = self.drafter_for(mode)
        policy = DraftPolicy(request.draft.k, self._cost, expected_reply=self._expected_reply)
        eos = self._eos | set(request.stop_token_ids)
        result = decode(Decoding(self._cache, self.target.tokenizer, eos, ids, request, drafter,
                                 policy, mode.name, self._vocab, cancelled, parts), on_step)
        if result.summary.finish_reason != "cancelled":  # how long replies run, lately
            self._expected_reply += REPLY_ALPHA * (result.summary.new_tokens
                                                   - self._expected_reply)
        if request.history_key and result.token_ids:
            # Finished (or stopped) replies join the history as they end.
            self.history.put(request.history_key, [*ids, *result.token_ids])
        return result


def _check_own_head(target: str) -> None:
    """The target's own MTP head chosen as the draft: its weights checked
    before the target loads, as the library checks them."""
    if is_cluster_folder(target) or not Path(target).is_dir():
        return
    why = mtp_format.verdict(Path(target), read_config(Path(target)), model_name(target))
    if why is not None:
        raise EngineError(why)


def _unload(slot: Slot) -> None:
    """What loading a need's model changed of it is given back (attention.py)."""
    if slot.drafter is not None and slot.drafter.loaded is not None:
        slot.drafter.loaded.unload()
