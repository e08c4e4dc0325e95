"""The target's own multi-token-prediction (MTP) head as a drafter.

Qwen3.5, Qwen3.6 and Qwen3-Next checkpoints carry an ``mtp.*`` module that
mlx-lm's ``sanitize`` throws away: a projection ``fc`` of [embedding of the
next token; the target's last hidden state], then one decoder layer (full
attention, its own KV cache) and a norm, read out through the target's own
output layer. It drafts at the cost of a layer, not of a second model, and
needs no second download: it is read from the same folder.

How it drafts (the layout mlx-vlm's ``qwen3_5_mtp`` drafter uses): row p
of the head's cache pairs the target's hidden state after token p with the
token at p + 1, and predicts the token at p + 2. The target's hidden states
come from the forwards the loop runs anyway (the runner's tap, collected by
the target's CacheSlot: no extra forward); a step feeds the rows for the
tokens committed since the last one, whose last row predicts the first
draft token, then chains, feeding the head's own output with each drafted
token. Chained rows are dropped after the verify (``kept``): the next step
feeds the committed tokens' rows again with the target's real hidden
states, so the head's cache only ever holds those.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from specchat.engine import compute
from specchat.engine.draft_model import DraftHead, draft_block
from specchat.engine.drafter_kinds import MTP
from specchat.engine.drafters import DraftControl, Drafter, Proposal
from specchat.engine.errors import EngineError
from specchat.engine.folders import MTP_PREFIX, mtp_keys, weight_files
from specchat.engine.kv import CacheSlot, common_prefix

PREFIX = MTP_PREFIX
# Qwen's checkpoints store RMSNorm weights zero-centred (weight + 1 at use);
# mlx-lm adds the 1 when it converts them (a checkpoint whose conv1d weights
# are still in the Hub's layout), and so does this, for the head's norms.
_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight",
          "k_norm.weight", "norm.weight", "pre_fc_norm_embedding.weight",
          "pre_fc_norm_hidden.weight")


class MTPModule(nn.Module):
    def __init__(self, layer_cls: type, args, layers: int):
        super().__init__()
        hidden = args.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(hidden, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(hidden, eps=args.rms_norm_eps)
        full = replace(args, full_attention_interval=1)  # every layer of it: full attention
        self.layers = [layer_cls(full, layer_idx=0) for _ in range(layers)]
        self.norm = nn.RMSNorm(hidden, eps=args.rms_norm_eps)

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list) -> mx.array:
        """[1, L, H] embeddings of the next tokens and hidden states -> [1, L, H]."""
        h = self.fc(mx.concatenate([self.pre_fc_norm_embedding(embeddings),
                                    self.pre_fc_norm_hidden(hidden)], axis=-1))
        for layer, c in zip(self.layers, cache, strict=True):
            h = layer(h, mask=create_attention_mask(h, c), cache=c)
        return self.norm(h)


def load_head(folder: Path, target, policy) -> MTPModule | None:
    """The MTP module of a loaded target from its folder's ``mtp.*`` weights,
    in the policy's dtype; None if the folder has none."""
    keys = mtp_keys(folder)
    if not keys:
        return None
    inner = getattr(target, "language_model", target)
    args = getattr(inner, "args", None)
    layers = getattr(getattr(inner, "model", None), "layers", None)
    if args is None or not layers:
        raise EngineError(f"{folder.name} has MTP weights, but SpecChat cannot run them for "
                          f"its model type")
    n = len({k.split(".")[2] for k in keys if k.startswith(PREFIX + "layers.")}) or 1
    head = MTPModule(type(layers[0]), args, n)
    weights: dict[str, mx.array] = {}
    hub_layout = False
    for f in weight_files(folder):
        tensors = mx.load(str(f))
        weights.update((k[len(PREFIX):], v) for k, v in tensors.items() if k.startswith(PREFIX))
        hub_layout |= any("conv1d.weight" in k and v.shape[-1] != 1 for k, v in tensors.items())
        del tensors
    if hub_layout:
        weights = {k: v + 1.0 if k.endswith(_NORMS) and v.ndim == 1 else v
                   for k, v in weights.items()}
    try:
        head.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise EngineError(f"{folder.name}: its MTP weights do not fit the model ({exc})") from exc
    compute.apply(head, policy)
    return head


def head_bytes(head: MTPModule) -> int:
    return sum(v.nbytes for _, v in tree_flatten(head.parameters()))


class HiddenLog:
    """The target's hidden states by position, as its forwards produce them
    (a later forward's rows replace an earlier one's: those of a rejected
    draft are overwritten once the position is committed)."""

    def __init__(self):
        self.parts: list[tuple[int, mx.array]] = []  # (first position, [L, H])

    def add(self, start: int, rows: mx.array) -> None:
        self.parts.append((start, rows))

    def rows(self, a: int, b: int) -> mx.array:
        """[b - a, H] (b > a): positions a..b-1, each from the newest part holding it."""
        out: list[mx.array] = []
        p = a
        while p < b:
            for start, rows in reversed(self.parts):
                if start <= p < start + rows.shape[0]:
                    end = min(b, start + rows.shape[0])
                    out.append(rows[p - start:end - start])
                    p = end
                    break
            else:
                raise EngineError(f"the target's hidden state at position {p} was not kept")
        return mx.concatenate(out, axis=0)

    def covers(self, a: int, b: int) -> bool:
        try:
            if a < b:
                self.rows(a, b)
        except EngineError:
            return False
        return True

    def forget_before(self, p: int) -> None:
        self.parts = [(s, r) for s, r in self.parts if s + r.shape[0] > p]

    def truncate(self, p: int) -> None:
        """Forget positions p and later."""
        self.parts = [(s, r[:p - s]) for s, r in self.parts if s < p]


class MTPDrafter(Drafter):
    """Drafts with the target's MTP head (see the module docstring)."""

    name = MTP.name

    def __init__(self, head: MTPModule, target_slot: CacheSlot):
        self.head = head
        self.target = target_slot
        runner = target_slot.runner
        if not runner.split:
            raise EngineError("the MTP head needs the target's hidden states, which this "
                              "model type does not expose")
        self.embed = runner.trunk.embed_tokens
        self.readout = runner.head  # the target's own output layer
        self.reset()

    def reset(self) -> None:
        self.cache = [KVCache() for _ in self.head.layers]
        self.rows = 0  # committed rows in the head's cache: pairs (hidden p, token p + 1)
        self.hidden = HiddenLog()  # the target's hidden states, by position
        # The head's output for each committed row, by row: after going back
        # to any row, its output drafts without feeding it again.
        self.outs = HiddenLog()

    def reuse_limit(self, prompt: Sequence[int]) -> int | None:
        """The target's hidden states are kept from now on. It may reuse its
        cache as far as the kept ones cover the positions past the head's
        rows (none are kept between requests that did not use the head);
        else only as far as the head's rows go, computing the rest again."""
        self.target.on_hidden = self.hidden.add
        n = min(common_prefix(self.target.ids, prompt), len(prompt) - 1)
        keep = min(self.rows, n)
        return None if self.hidden.covers(keep, n) else keep

    def prepare(self, prompt: Sequence[int], request=None) -> None:
        # The target's cache was reused up to ``reused`` positions: the head's
        # rows for that shared prefix stay, the rest go.
        self._trim(min(self.rows, self.target.reused))
        self.hidden.forget_before(self.rows)

    def _trim(self, rows: int) -> None:
        for c in self.cache:
            c.trim(c.offset - rows)
        self.rows = rows
        self.outs.truncate(rows)

    def _forward(self, tokens: Sequence[int] | mx.array, hidden: mx.array) -> mx.array:
        ids = tokens if isinstance(tokens, mx.array) else mx.array(list(tokens), dtype=mx.uint32)
        return self.head(self.embed(ids.reshape(1, -1)), hidden[None], self.cache)[0]

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        k = ctl.cap(self.name)
        n = len(context)
        if k <= 0 or n < 2:
            return Proposal(tokens=[], source=self.name)
        t0 = time.perf_counter()
        # Rows for the tokens committed since the last step (pairs of the
        # target's hidden state and the next token); the last row's output
        # predicts the first draft token, each drafted token the next.
        start = self.rows
        try:
            hidden = self.hidden.rows(start, n - 1) if start < n - 1 else None
        except EngineError:  # not computed by the target (a paused request's backlog)
            return Proposal(tokens=[], source=self.name)
        state: dict = {"first": start < n - 1}

        def feed(x):
            if state.pop("first", False):
                out = self._forward(context[start + 1:n], hidden)
                self.outs.add(start, out)
                self.rows = n - 1
            elif "h" in state:
                out = self._forward(x, state["h"])
            else:  # no new row: the last committed row's output drafts
                out = self.outs.rows(n - 2, n - 1)
            state["h"] = out[-1:]
            return self.readout(out[-1:])

        head = DraftHead(None, None, ctl.vocab)
        block = draft_block(head, feed, [], k, ctl.sampling, key_at=lambda _i: ctl.keys.next(),
                            keep_going=ctl.keep_going, lazy=ctl.lazy)
        self.hidden.forget_before(self.rows)
        q = None if ctl.sampling.greedy else head.full_q(block.q_rows)
        return Proposal(tokens=block.tokens, source=self.name, q=q, confidences=block.confs,
                        draft_s=time.perf_counter() - t0, forwards=block.forwards)

    def kept(self, length: int) -> None:
        # Chained rows were fed the head's own outputs: they go, whatever was kept.
        self._trim(min(self.rows, max(0, length - 1)))

    def finish(self, context: Sequence[int]) -> None:
        self._trim(min(self.rows, max(0, len(context) - 1)))
        self.target.on_hidden = None  # no hidden states kept while the head is not in use


def build(parts) -> MTPDrafter:
    """drafter_kinds.MTP's maker."""
    if parts.mtp_head is None:
        raise EngineError("This target has no MTP head.")
    return MTPDrafter(parts.mtp_head, parts.target)
