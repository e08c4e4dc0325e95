"""Gemma 4 assistant drafters: a few layers that draft for one Gemma 4 from
that target's own final hidden state and KV cache.

An assistant is its own folder (``google/gemma-4-31B-it-assistant``);
assistant_format.py reads and checks it (config, weights' shapes, token
ordering, fit to a target) before anything here is built, with the
library's rules and words; this module builds and runs it. Its structure
follows mlx-vlm's ``gemma4_assistant`` drafter and transformers'
``Gemma4AssistantForCausalLM`` (their code is not copied here).

How it drafts. With the target's cache holding the m committed positions
0..m-1 and the context's last token t (not fed yet), one step reads
[the target's embedding of t, scaled as the target scales it; a state],
projects it to its own width (``pre_projection``), runs its layers, whose
queries sit at the constant position m and attend, without keys of their
own, over the target's keys and values: a full-attention layer's over
those of the target's last full-attention layer (all m positions), a
sliding layer's over those of its last sliding layer (the positions a
query at m would see in that layer's window: those after m minus the
window). Its output gives the logits of the token after t (through its
tied embedding, or for the small sizes the centroid-routed layer below)
and, through ``post_projection``, the state of the next step, which reads
the drafted token. The first step's state is the target's final hidden
state (after its norm) at m - 1. Every step of a block keeps the position
and the keys: transformers' ``SinglePositionMultiTokenCandidateGenerator``
places the queries at m (the position t will take), which is followed
here; mlx-vlm places them at m - 1.

So it keeps no cache: only the target's final hidden states, tapped from
the forwards the loop runs anyway (kv.CacheSlot.tapped), of which it needs
the newest. The target's cache holds committed positions only when a block
starts (the loop rewinds it after every verify: a rejected block's keys,
in the sliding window too, are gone), and the assistant reads it then;
when it holds fewer (tokens pending after a rewind to a checkpoint) the
assistant proposes nothing that step.

The centroid-routed output layer (``use_ordered_embeddings``): its
vocabulary is split into clusters of ids (``token_ordering``, one row of
ids per centroid); a step scores the centroids, takes the
``centroid_intermediate_top_k`` best and scores only their ids against
the output layer; every other id gets the lowest of those scores less 1,
as the reference does, so it is never the greedy choice and rarely drawn.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from functools import partial

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import gemma4_text
from mlx_lm.models.cache import make_prompt_cache

from specchat.engine import compute, rollback
from specchat.engine.assistant_format import (
    ORDERING,
    SLIDING,
    Assistant,
    AssistantConfig,
    fit_problem,
    rename,
    target_facts,
)
from specchat.engine.drafter_kinds import ASSISTANT, after_key
from specchat.engine.drafters import Build, DraftControl, Drafter, Proposal, Reading
from specchat.engine.drafting import DraftHead, draft_block
from specchat.engine.errors import EngineError
from specchat.engine.folders import model_name
from specchat.engine.head_drafter import HiddenLog
from specchat.engine.kv import CacheSlot, HiddenTap
from specchat.engine.loading import LoadedModel, load_renamed, loaded_head
from specchat.engine.prompt_cache import common_prefix


def rows_of(layer: nn.Module, ids: mx.array) -> mx.array:
    """Rows ``ids`` of an output layer's weight (an embedding or a linear
    layer, quantized or not), as floats."""
    if isinstance(layer, nn.Embedding | nn.QuantizedEmbedding):
        return layer(ids)
    if isinstance(layer, nn.QuantizedLinear):
        return mx.dequantize(layer.weight[ids], layer.scales[ids], layer.biases[ids],
                             layer.group_size, layer.bits)
    return layer.weight[ids]


class Centroids(nn.Module):
    """The centroid-routed output layer (``masked_embedding``)."""

    def __init__(self, c: AssistantConfig):
        super().__init__()
        self.top_k, self.groups = c.top_k, c.num_centroids
        self.centroids = nn.Linear(c.hidden_size, c.num_centroids, bias=False)
        self.token_ordering = mx.zeros((c.vocab_size,), dtype=mx.int32)

    def __call__(self, x: mx.array, output: nn.Module) -> mx.array:
        """[1, V] logits for one output row ``x`` [1, H] through the output
        layer ``output`` (its rows for the chosen clusters' ids only)."""
        scores = self.centroids(x)[0]
        best = mx.argpartition(-scores, kth=self.top_k - 1)[:self.top_k]
        ids = self.token_ordering.reshape(self.groups, -1)[best].reshape(-1)
        picked = (x @ rows_of(output, ids).T)[0]
        out = mx.full((self.token_ordering.shape[0],), mx.min(picked) - 1, dtype=picked.dtype)
        out[ids] = picked
        return out[None]


class Stack(nn.Module):
    """Its text stack (``model.``): mlx-lm's own Gemma 4 layers, every one
    KV-shared (no key or value projections), its embedding and norm."""

    def __init__(self, args: gemma4_text.ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [gemma4_text.DecoderLayer(args, i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class AssistantModel(nn.Module):
    def __init__(self, c: AssistantConfig):
        super().__init__()
        self.config = c
        self.model = Stack(gemma4_text.ModelArgs.from_dict(c.text))
        self.pre_projection = nn.Linear(2 * c.backbone_hidden_size, c.hidden_size, bias=False)
        self.post_projection = nn.Linear(c.hidden_size, c.backbone_hidden_size, bias=False)
        if not c.tie_word_embeddings:
            self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.ordered:
            self.masked_embedding = Centroids(c)

    def output(self) -> nn.Module:
        """Its output layer: its embedding (tied) or ``lm_head``."""
        return self.model.embed_tokens if self.config.tie_word_embeddings else self.lm_head

    def step(self, embeds: mx.array, state: mx.array, kv: dict, position: int
             ) -> tuple[mx.array, mx.array]:
        """One draft step: ``embeds`` [1, B] (the target's embedding of the
        token read, scaled) and ``state`` [1, B] -> (the next step's state
        [1, B], logits [1, V]). ``kv``: per layer kind, the target's keys and
        values it attends over; ``position``: where its queries sit."""
        x = self.pre_projection(mx.concatenate([embeds, state], axis=-1))[None]
        for layer in self.model.layers:
            x, _, _ = layer(x, None, None, shared_kv=kv[layer.layer_type], offset=position)
        x = self.model.norm(x)[0]
        return self.post_projection(x), self.logits(x)

    def logits(self, x: mx.array) -> mx.array:
        if self.config.ordered:
            return self.masked_embedding(x, self.output())
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(x)
        return self.lm_head(x)


def load_assistant(files: Assistant, target: LoadedModel, policy, name: str) -> AssistantModel:
    """An assistant's module from its checked folder (assistant_format.read),
    checked against a loaded target, in the policy's dtype."""
    facts = target_facts(target.info.name, target.config)
    problem = (fit_problem(files.facts(), facts, name) if facts is not None else
               f"{target.info.name}'s config.json does not state its hidden size, layers and "
               f"vocabulary, so {name} cannot be checked against it")
    if problem:
        raise EngineError(problem)
    c = files.config
    try:  # mlx-lm builds its layers from the config: a rope it cannot build fails here
        module = AssistantModel(c)
    except (ValueError, KeyError, TypeError, AssertionError, ArithmeticError) as exc:
        raise EngineError(f"{name}: mlx-lm cannot build its layers ({exc})") from exc
    tied = "lm_head.weight" if c.tie_word_embeddings else None  # its embedding's, if shipped
    weights = load_renamed(files.files, files.folder,
                           lambda k: None if (n := rename(k)) == tied else n)
    if c.ordered:
        weights[ORDERING] = weights[ORDERING].astype(mx.int32)
    want = {k: tuple(v.shape) for k, v in tree_flatten(module.parameters())}
    unlike = sorted(k for k in want.keys() | weights.keys()
                    if k not in want or k not in weights or tuple(weights[k].shape) != want[k])
    if unlike:  # assistant_format checked them against the config: mlx-lm's layer differs
        raise EngineError(f"{name}: its tensor {unlike[0]} does not fit mlx-lm's Gemma 4 "
                          "layers")
    module.load_weights(list(weights.items()), strict=True)
    compute.apply(module, policy)  # floats only: the token ordering stays ids
    return module


def assistant_bytes(module: AssistantModel) -> int:
    """What one drafted token reads: its layers and projections, and of its
    output layer the rows it scores (all of them; the centroids and their
    top clusters' ids when it routes through centroids). Its embedding is
    never read as an input: it embeds with the target's."""
    c = module.config
    total = compute.param_bytes(module)
    if not c.tie_word_embeddings:
        total -= compute.param_bytes(module.model.embed_tokens)
    if c.ordered:
        rows = c.top_k * (c.vocab_size // c.num_centroids)
        total -= compute.param_bytes(module.output()) * (c.vocab_size - rows) // c.vocab_size
        total -= module.masked_embedding.token_ordering.nbytes
    return total


def cache_entries(model, entries: int) -> dict[str, int]:
    """For each kind of layer, the index of the target's cache entry of its
    last layer of that kind: of the ``entries`` layers with a cache of their
    own (a Gemma 4 whose last layers share the keys of earlier ones has
    fewer entries than layers; they share the last of their kind's)."""
    lm = getattr(model, "language_model", model)
    kinds = list(lm.args.layer_types)[:entries]
    return {kind: max(i for i, k in enumerate(kinds) if k == kind) for kind in set(kinds)}


class AssistantDrafter(Drafter):
    """Drafts with a Gemma 4 assistant from the target's own cache."""

    name = ASSISTANT.name
    own_cap_only = True

    def __init__(self, module: AssistantModel, target: CacheSlot, entries: dict[str, int],
                 window: int):
        """``entries``: the target's cache entry of each kind of layer it
        reads; ``window``: the sliding layers' window, the shorter of its own
        and the target's."""
        if not target.runner.split:
            raise EngineError("a Gemma 4 assistant needs its target's hidden states, which "
                              "this model type does not expose")
        self.module, self.target = module, target
        self.entries, self.window = entries, window
        trunk = target.runner.trunk
        self.embed, self.scale = trunk.embed_tokens, float(getattr(trunk, "embed_scale", 1.0))
        self.reset()

    def bytes_per_token(self) -> int:
        return assistant_bytes(self.module)

    # -- what it reads of the target ---------------------------------------------------------
    @property
    def hidden_tap(self) -> HiddenTap:
        """The target's final hidden states: no layer of its own."""
        return HiddenTap((), self._collect)

    def _collect(self, start: int, tapped: dict) -> None:
        """A forward's final hidden states, by position. A block reads the
        newest forward's (its last committed position is never before the
        first position a forward fed), so older ones go, but for the row a
        reply to the same prompt starts from (a regenerated reply: the
        target goes back to where the prompt ended, not one position
        before)."""
        rows = tapped["final"]
        p = self.prompt_end
        if start <= p < start + rows.shape[0]:
            self.anchor = (p, rows[p - start:p - start + 1])
        self.log.add(start, rows)
        self.log.forget_before(start)

    def _state(self, m: int) -> mx.array | None:
        """The target's final hidden state at m - 1 [1, B], if kept."""
        if self.log.covers(m - 1, m):
            return self.log.rows(m - 1, m)
        return self.anchor[1] if self.anchor is not None and self.anchor[0] == m - 1 else None

    def _forget(self, p: int) -> None:
        """Hidden states of positions p and later go."""
        self.log.truncate(p)
        if self.anchor is not None and self.anchor[0] >= p:
            self.anchor = None

    def shared(self, cache: list, m: int) -> dict | None:
        """The keys and values of the m committed positions ``cache`` (the
        target's) holds, per kind of layer the assistant reads: all of a
        full-attention layer's, the window's of a sliding one (positions p
        with m - p < window). None when the window's cache no longer holds
        the oldest of them."""
        out = {}
        for kind, i in self.entries.items():
            c = cache[i]
            first = max(0, m - self.window + 1) if kind == SLIDING else 0
            start = getattr(c, "start", 0)  # a window cache's first stored position
            if c.keys is None or first < start or c.offset < m:
                return None
            out[kind] = (c.keys[..., first - start:m - start, :],
                         c.values[..., first - start:m - start, :])
        return out

    def _step(self, tokens, state: mx.array, kv: dict, m: int) -> tuple[mx.array, mx.array]:
        ids = tokens if isinstance(tokens, mx.array) else mx.array(list(tokens), dtype=mx.uint32)
        return self.module.step(self.embed(ids.reshape(-1)) * self.scale, state, kv, m)

    # -- the drafter -------------------------------------------------------------------------
    def reset(self) -> None:
        self.log = HiddenLog()  # the target's final hidden states, by position
        self.prompt_end = -1  # the last prompt's last committed position
        self.anchor: tuple[int, mx.array] | None = None  # its hidden state there
        # The conversation the kept hidden states belong to, as of the last
        # request it drafted in (the target's cache follows every request).
        self.ids: list[int] = []

    _STATE = ("log", "prompt_end", "anchor", "ids")

    def state_bytes(self) -> int:
        return self.log.nbytes + (self.anchor[1].nbytes if self.anchor is not None else 0)

    def prepare(self, prompt: Sequence[int], request=None) -> Reading:
        """Its first block reads the target's hidden state at the prompt's
        last committed position: kept from an earlier request where its own
        conversation agrees with this prompt that far; otherwise the target
        computes it again (it reuses its cache up to that position only)."""
        self._forget(common_prefix(self.ids, prompt))
        self.prompt_end = last = len(prompt) - 2
        kept = last < 0 or self._state(last + 1) is not None
        return Reading(reuse=None if kept else last)

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        return self._draft(context, (), ctl)

    def propose_after(self, context: Sequence[int], given: Sequence[int],
                      ctl: DraftControl) -> Proposal:
        """Past another drafter's unverified tokens (hybrid.py): it reads
        them as it reads its own drafts, a step each from the same position
        and keys, then drafts on; those drafts are priced under
        ``drafter_kinds.after_key``."""
        return self._draft(context, tuple(given), ctl)

    def _draft(self, context: Sequence[int], given: tuple[int, ...],
               ctl: DraftControl) -> Proposal:
        key = after_key(self.name) if given else None
        k = ctl.cap(self.name, key) if given else ctl.cap(self.name)
        m = len(context) - 1  # the committed positions the target's cache should hold
        none = Proposal(tokens=[], source=self.name, key=key or "")
        if k <= 0 or m < 1:
            return none
        t0 = time.perf_counter()
        slot = self.target
        kv = self.shared(slot.cache, m) if slot.length == m and not slot.pending else None
        state = self._state(m)
        if kv is None or state is None:
            return none  # tokens pending in the target's cache, or its state never computed
        lead = [context[-1], *given]
        for t in lead[:-1]:  # the other drafter's tokens, as if drafted here
            state, _ = self._step([t], state, kv, m)
        carried = {"state": state}

        def feed(x):
            carried["state"], logits = self._step(x, carried["state"], kv, m)
            return logits

        head = DraftHead(ctl.vocab)
        block = draft_block(head, feed, [lead[-1]], k, ctl.sampling,
                            key_at=lambda _i: ctl.keys.next(),
                            keep_going=partial(ctl.keep_going, self.name), lazy=ctl.lazy)
        return block.proposal(self.name, head, ctl.sampling, t0, key=key or "",
                              forwards=block.forwards + len(given))

    def kept(self, length: int) -> None:
        # Hidden states of positions past what the target kept were fed rejected tokens.
        self._forget(length)

    def finish(self, context: Sequence[int]) -> None:
        self._forget(len(context))
        self.ids = list(context)

    def step_seconds(self, runner, ids: list[int], reps: int) -> float:
        """Seconds per token it drafts (measure.forward_times): one step on
        the keys of ``ids``, from the target run once over them with its tap
        on, in a cache of the measure's own."""
        cache = rollback.prepare(make_prompt_cache(runner.model))  # windows in position order
        out, tapped = runner.tapped_forward(ids[:-1], cache, "none")
        mx.eval(out)
        kv = self.shared(cache, len(ids) - 1)
        state = tapped["final"][-1:]
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            mx.eval(self._step(ids[-1:], state, kv, len(ids) - 1))
            times.append(time.perf_counter() - t0)
        return statistics.median(times)


def build(b: Build) -> AssistantDrafter:
    """drafter_kinds.ASSISTANT's maker: the assistant whose folder
    assistant_format read and checked (``b.files``), checked against the
    loaded target in words, drafting from the target's own cache."""
    folder = b.files.folder
    name = model_name(folder)
    b.say(f"loading the Gemma 4 assistant {name}")
    module = load_assistant(b.files, b.target, b.compute, name)
    facts = target_facts(b.target.info.name, b.target.config)
    entries = cache_entries(b.target.model, len(b.cache.cache))
    drafter = AssistantDrafter(module, b.cache, {k: entries[k] for k in module.config.reads},
                               min(module.config.sliding_window, facts.window))
    drafter.loaded = loaded_head(module, folder, ASSISTANT.name, assistant_bytes(module),
                                 module.config.vocab_size, b.target.tokenizer)
    return drafter
