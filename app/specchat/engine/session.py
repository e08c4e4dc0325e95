"""The engine proper: a loaded pair, its caches, and ``generate``.

An Engine is owned by exactly one thread (see worker.py); nothing here is
thread-safe, by design.
"""

from __future__ import annotations

import gc
import hashlib
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import mlx.core as mx

from specchat.engine import (
    chat,
    chat_format,
    chat_rules,
    compute,
    drafter_kinds,
    eagle3,
    eagle3_format,
    modes,
    mtp,
    mtp_format,
    reply_parts,
    request_check,
    threads,
    warmup,
)
from specchat.engine.compat import SAME_MODEL, compare_tokenizers, facts_from_tokenizer
from specchat.engine.costs import CostModel
from specchat.engine.decoding import Decoding, decode
from specchat.engine.draft_model import ModelDrafter
from specchat.engine.draft_policy import DraftPolicy
from specchat.engine.drafter_kinds import DrafterKind
from specchat.engine.drafters import Drafter, Parts
from specchat.engine.errors import EngineError
from specchat.engine.events import (
    ChatFormat,
    ComputeInfo,
    GenerateRequest,
    GenerationResult,
    LoadedPair,
    ModelInfo,
    StepEvent,
)
from specchat.engine.folders import is_cluster_folder, is_head, model_name, read_config
from specchat.engine.history import History, SyncReport
from specchat.engine.hybrid import HybridDrafter
from specchat.engine.kv import CacheSlot
from specchat.engine.loading import LoadedModel, count_params, load_folder
from specchat.engine.runner import Runner


def _head_files(path: str | None) -> eagle3_format.Head | None:
    """The checked files of the EAGLE-3 head at ``path`` (eagle3_format.read);
    None when ``path`` is none or not a head's folder."""
    if path is None or not Path(path).is_dir() or not is_head(read_config(Path(path))):
        return None
    return eagle3_format.read(Path(path))


class Engine:
    def __init__(self, compute_info: ComputeInfo | None = None):
        self.compute = compute_info or compute.detect()
        self.target: LoadedModel | None = None
        self.draft: LoadedModel | None = None
        self._slot: CacheSlot | None = None
        self._eos: set[int] = set()
        self._vocab = 0
        # The draft's drafter: a draft model's, or an EAGLE-3 head's (eagle3.py).
        self._model_drafter: ModelDrafter | eagle3.Eagle3Drafter | None = None
        # An EAGLE-3 head: the draft, or one loaded beside a draft model.
        self._head: eagle3.Eagle3Drafter | None = None
        self.head: LoadedModel | None = None  # the one beside a draft model
        self._mtp_head = None  # mtp.MTPModule: the target's own, when it ships one
        self._no_mtp = ""  # why there is none (mtp_format's words)
        # Drafters other than the draft model's, built on first use and kept
        # (with their state: a suffix index, the MTP head's cache) while the
        # target stays loaded.
        self._drafters: dict[str, Drafter] = {}
        self._cost = CostModel()
        self._pair: LoadedPair | None = None
        self._chat = ChatFormat()  # the target's tools and reasoning (chat_format.py)
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
        """Load a target and an optional draft (folders; a draft model, an
        EAGLE-3 head, or ``modes.OWN_HEAD``: the target's own MTP head), and
        optionally an EAGLE-3 head beside a draft model (``head``: the bench
        runs both in one process). Reuses an already loaded model of the
        same path. Refuses a draft whose tokenizer differs, and a head made
        for another target."""
        say = progress or (lambda _stage, _msg: None)
        target_path = str(Path(target).expanduser().resolve())
        own_head = draft == modes.OWN_HEAD
        draft_path = str(Path(draft).expanduser().resolve()) if draft and not own_head else None
        if draft_path == target_path:  # it would "speculate" at twice the cost of plain decoding
            name = Path(target_path).name
            raise EngineError(f"{name} cannot draft for {name}: {SAME_MODEL}.")
        if own_head and not is_cluster_folder(target_path) and Path(target_path).is_dir() \
                and (self.target is None or self.target.info.path != target_path):
            # Its own head's weights are checked before the target loads, as the library does.
            config = read_config(Path(target_path))
            why = mtp_format.verdict(Path(target_path), config, model_name(target_path))
            if why is not None:
                raise EngineError(why)
        # A head's files are checked before anything loads, in the library's words.
        draft_head = _head_files(draft_path)
        head_path = str(Path(head).expanduser().resolve()) if head else None
        side_head = _head_files(head_path)
        if head_path is not None and side_head is None:
            raise EngineError(f"{Path(head_path).name} is not an EAGLE-3 draft head (its "
                              "config.json names no eagle3 architecture).")
        if self.target is None or self.target.info.path != target_path:
            self._drop_target()
            if is_cluster_folder(target_path):  # the target's layers spread over a cluster
                from specchat.engine.distributed.head import load_target

                self.target, runner = load_target(target_path, self.compute,
                                                  lambda m: say("target", m))
            else:
                self.target = load_folder(target_path, self.compute, lambda m: say("target", m))
                runner = Runner(self.target.model, self.target.info.model_type, self.target.config)
                say("target", f"warming up {self.target.info.name}")
                warmup.warm(runner)
            self._slot = CacheSlot(runner)
            self._mtp_head, self._no_mtp = mtp.load_head(
                Path(target_path), self.target.model, self.compute, self.target.config,
                self.target.info.name)
            if self._mtp_head is not None:
                say("target", f"{self.target.info.name} has an MTP head: it can draft for itself")
            elif self._no_mtp != mtp_format.no_head(self.target.info.name):
                say("target", self._no_mtp)  # it ships one, which cannot draft
            self._eos = chat.end_token_ids(self.target.tokenizer)
            self._chat = chat_format.read(self.target.tokenizer)
            self.history = History()  # ids of another tokenizer mean nothing
            w = runner.head_weight()
            self._vocab = int(w.shape[0]) if w is not None else int(
                self.target.config.get("vocab_size")
                or self.target.config.get("text_config", {}).get("vocab_size"))
            threads.fit_model(self.target.config)
        if draft_path is None:
            self._drop_draft()
        elif self.draft is None or self.draft.info.path != draft_path:
            self._drop_draft()
            if draft_head is not None:
                self.draft, self._head = self._load_head(draft_head, say)
                self._model_drafter = self._head
            else:
                self._load_draft_model(draft_path, say)
        self._load_head_beside(head_path, side_head, say)
        if own_head and self._mtp_head is None:
            raise EngineError(self._no_mtp)
        head_bytes = {}
        if self._mtp_head is not None:  # a layer, and the target's output layer
            head_bytes[drafter_kinds.MTP.name] = (compute.param_bytes(self._mtp_head)
                                                  + self._slot.runner.head_bytes())
        if self._head is not None:  # its layer and its own (draft-vocabulary) output layer
            head_bytes[drafter_kinds.EAGLE3.name] = self._head.bytes_per_token()
        self._cost = CostModel.for_pair(
            self._slot.runner.bytes_per_token(),
            self._model_drafter.bytes_per_token() if self._model_drafter else None,
            self.compute.device, head_bytes)
        reason = None
        if not self.target.info.trimmable:
            reason = (f"Speculative decoding is not available for {self.target.info.name}: "
                      f"{self.target.info.untrimmable_reason}. Plain decoding still works.")
        elif self.draft is not None and not self.draft.info.trimmable:
            reason = (f"{self.draft.info.name} cannot be used as a draft: "
                      f"{self.draft.info.untrimmable_reason}.")
        self._pair = LoadedPair(
            target=self.target.info,
            draft=self.draft.info if self.draft else None,
            compute=self.compute,
            speculative_ok=reason is None,
            reason=reason,
            mtp=self._mtp_head is not None,
            own_head=own_head,
            head=self.head.info if self.head is not None else None,
            chat=self._chat,
        )
        return self._pair

    def _load_draft_model(self, path: str, say) -> None:
        loaded = load_folder(path, self.compute, lambda m: say("draft", m))
        reasons = compare_tokenizers(facts_from_tokenizer(self.target.tokenizer),
                                     facts_from_tokenizer(loaded.tokenizer))
        if reasons:
            del loaded
            gc.collect()
            raise EngineError(f"{Path(path).name} cannot draft for {self.target.info.name}: "
                              + "; ".join(reasons))
        self.draft = loaded
        special = set(self._eos) | set(self.target.tokenizer.get_added_vocab().values())
        self._model_drafter = ModelDrafter(loaded, extra_ids=sorted(special))
        say("draft", f"warming up {loaded.info.name}")
        warmup.warm(self._model_drafter.runner)

    def _load_head_beside(self, path: str | None, files: eagle3_format.Head | None,
                          say) -> None:
        draft_is_head = self.draft is not None and self.draft.info.model_type == eagle3.EAGLE3.name
        if self.head is not None and (self.head.info.path != path or draft_is_head):
            if self._head is not self._model_drafter:  # not the head just loaded as the draft
                self._head = None
            self.head = None
            gc.collect()
        if path is None:
            return
        if draft_is_head:
            raise EngineError("The draft is a head already: load the other head as the draft "
                              "instead (one head at a time).")
        if self.head is not None:
            return
        self.head, self._head = self._load_head(files, say)

    def _load_head(self, files: eagle3_format.Head,
                   say) -> tuple[LoadedModel, eagle3.Eagle3Drafter]:
        """An EAGLE-3 head (its folder checked: eagle3_format.read), checked
        against the target in words, drafting from the target's own hidden
        states (eagle3.py)."""
        folder = files.folder
        name = model_name(folder)
        say("draft", f"loading the draft head {name}")
        head = eagle3.load_head(files, self.target.model, self.compute, name,
                                self.target.info.name)
        drafter = eagle3.Eagle3Drafter(head, self._slot)
        info = ModelInfo(name=name, path=str(folder), model_type=eagle3.EAGLE3.name,
                         n_params=count_params(head),
                         weight_bytes=eagle3.head_bytes(head), dtype=compute.weight_dtype(head),
                         vocab_size=head.config.vocab_size, trimmable=True,
                         untrimmable_reason=None)
        return LoadedModel(model=head, tokenizer=self.target.tokenizer,
                           config=read_config(folder), info=info), drafter

    def _drop_target(self) -> None:
        self._drop_draft()
        self.head = self._head = None
        self.target = None
        self._slot = None
        self._mtp_head = None
        self._no_mtp = ""
        self._chat = ChatFormat()
        self._drafters.clear()
        gc.collect()
        mx.clear_cache()

    def _drop_draft(self) -> None:
        if self.draft is not None:
            if self._head is self._model_drafter:
                self._head = None
            self.draft = None
            self._model_drafter = None
            gc.collect()
            mx.clear_cache()

    @property
    def pair(self) -> LoadedPair | None:
        return self._pair

    def loaded_bytes(self) -> int:
        """Weight bytes held now (what loading another pair could free)."""
        return sum(m.info.weight_bytes for m in (self.target, self.draft, self.head) if m is not None)

    # Read-only views for measuring tools (bench, benchmarks/): they time the
    # very runner and drafter decoding uses, and print the costs its policy
    # assumes, so their numbers describe what the engine does.
    @property
    def target_runner(self) -> Runner | None:
        return self._slot.runner if self._slot is not None else None

    @property
    def model_drafter(self) -> ModelDrafter | None:
        return self._model_drafter

    @property
    def cost_model(self) -> CostModel:
        return self._cost

    @property
    def end_ids(self) -> set[int]:
        """Token ids that end a reply (EOS and the chat template's end-of-turn)."""
        return set(self._eos)

    def reset_cache(self) -> None:
        """Forget cached prompts (they are reused only on an exact prefix match
        anyway; this frees memory)."""
        if self._slot is not None:
            self._slot.reset()
        drafters = (self._model_drafter, self._head, *self._drafters.values())
        for drafter in {id(d): d for d in drafters if d}.values():  # the head may be the draft
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
        rows = self._slot.runner.rows
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

    def _drafter(self, mode: modes.Mode) -> tuple[Drafter | None, modes.Mode]:
        """The drafter for a mode, and the mode it really runs in: without a
        draft model, a mode with other drafters runs on those (hybrid runs as
        suffix matching)."""
        if not mode.speculative:
            return None, mode
        if not self._pair.speculative_ok and (
                not self.target.info.trimmable or mode.needs_draft_model):
            raise EngineError(self._pair.reason)
        have = {n for n, part in (("draft", self._model_drafter), ("mtp", self._mtp_head),
                                  ("head", self._head)) if part is not None}
        wanted = mode
        mode = mode.runs_with(have)
        if mode is None:
            if "mtp" in wanted.needs:
                raise EngineError(self._no_mtp)
            if "head" in wanted.needs:
                raise EngineError("This mode drafts with an EAGLE-3 head loaded beside the draft "
                                  "model, and none is: load one (--head), or choose the head "
                                  "as the draft.")
            raise EngineError("This mode needs a draft model, which is not loaded: choose a "
                              "draft, or draft from the conversation (suffix matching).")
        chain = [self._drafter_of(drafter_kinds.get(name)) for name in mode.drafters]
        if len(chain) == 1:
            return chain[0], mode
        return HybridDrafter(*chain), mode

    def _drafter_of(self, kind: DrafterKind) -> Drafter:
        parts = Parts(target=self._slot, draft_model=self._model_drafter,
                      mtp_head=self._mtp_head, head=self._head, history=self.history)
        if kind.made_on_load:  # made when its model loaded, and kept with it
            return kind.make(parts)
        if kind.name not in self._drafters:
            self._drafters[kind.name] = kind.make(parts)
        return self._drafters[kind.name]

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
        limit = self.target.max_context
        if limit is not None:  # the reply cannot run past the model's context
            request = replace(request, max_tokens=max(1, min(request.max_tokens, limit - len(ids))))
        drafter, mode = self._drafter(mode)
        policy = DraftPolicy(request.draft.k, self._cost)
        eos = self._eos | set(request.stop_token_ids)
        result = decode(Decoding(self._slot, self.target.tokenizer, eos, ids, request, drafter,
                                 policy, mode.name, self._vocab, cancelled, parts), on_step)
        if request.history_key and result.token_ids:
            # Finished (or stopped) replies join the history as they end.
            self.history.put(request.history_key, [*ids, *result.token_ids])
        return result
