"""Hybrid drafting: per step, the suffix draft, the other drafter's (the
draft model, or any drafter a mode pairs with suffix matching), or both
chained (the other drafting on from where the suffix match runs out).

Each option is priced with what the request has measured so far (the
policy's per-source acceptance and the pair's cost model), as expected
tokens per unit of cost, in target forwards:

- suffix: E_s = sum of a_s^i over its S tokens, plus the target's own
  token; costs one verify over S + 1 tokens (drafting is free).
- model: E_m(K) = (1 - a_m^(K+1)) / (1 - a_m) at the policy's K; costs K
  draft forwards and a verify over K + 1.
- chained: the suffix, then (if all S survive, with probability a_s^S)
  the model's expected tokens; costs the model's K forwards (the first one
  also reads the S suffix tokens: s * S more; a head reads them one forward
  each, c * S, and drafts on at its chained acceptance) and one verify over
  S + K + 1.

The best rate wins, with one exception: a conversation match of
TRUST_MATCH tokens or more is a copy in progress (the reply quoting code or
text from earlier in the chat), and it drafts outright while its bucket's
measured acceptance stays at TRUST_ACCEPT or above. The rates above treat
tokens as independent, which prices a copy, right to the edit point and
then wrong, too low; with the suffix priors for copies, tuning runs on the
multi-turn code follow-ups measured it 7-21% faster than the rates alone
(two runs compared; docs/bench/journal.md, "Tuning the suffix hybrid").

A weak match loses to the model; chaining pays only with a cheap draft
model (c of about 0.1 or less: at the bundled pair's 0.3 a free suffix step
followed by a model step is nearly always better) or a head (a few percent
of a target forward per token) that keeps being accepted after a suffix
draft. A head has no target features for the suffix's tokens: it reads them
from its own output, one head forward each, and its drafts after them are
priced by their own statistics key (``drafter_kinds.after_key``).
A match bucket the model keeps winning against is still tried every
EXPLORE-th time, so a bucket that lost its first blocks can show it has
recovered (its acceptance is only measured when it drafts). The drafters
themselves are unchanged: this only decides whom to ask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import mlx.core as mx

from specchat.engine import drafter_kinds
from specchat.engine.costs import expected_tokens
from specchat.engine.draft_policy import DraftPolicy
from specchat.engine.drafter_kinds import SUFFIX, DrafterKind, key_parts
from specchat.engine.drafters import DraftControl, Drafter, Part, Proposal, Reading
from specchat.engine.kv import HiddenTap
from specchat.engine.suffix import BUCKETS, SuffixDrafter
from specchat.origins import CONVERSATION

TRUST_MATCH = 4  # a conversation match at least this long drafts outright ...
TRUST_ACCEPT = 0.5  # ... while its bucket's measured acceptance is at least this
# A statistics key records the bucket, not the match: the rule reads buckets.
assert TRUST_MATCH in BUCKETS


class HybridDrafter(Drafter):
    EXPLORE = 6  # a suffix key overruled this many times in a row drafts once

    def __init__(self, suffix: SuffixDrafter, model: Drafter):
        self.suffix = suffix
        self.model = model
        self.kind: DrafterKind = drafter_kinds.get(model.name)
        self.name = f"{suffix.name}+{model.name}"
        self.choices = {"suffix": 0, "model": 0, "chained": 0}
        self._overruled: dict[str, int] = {}  # per request: HybridDrafter is built per request
        self._model_read = True  # the other drafter has read the prompt (prepare says)

    def prepare(self, prompt: Sequence[int], request=None) -> Reading:
        """Both read the prompt: the target reuses its cache as far as both
        can follow, and the other drafter says when the rest is read."""
        s, m = self.suffix.prepare(prompt, request), self.model.prepare(prompt, request)
        limits = [n for n in (s.reuse, m.reuse) if n is not None]
        self._model_read = not m.behind  # until it is, the suffix drafts alone
        return replace(m, reuse=min(limits) if limits else None, drafts_behind=True)

    @property
    def hidden_tap(self) -> HiddenTap | None:
        return self.model.hidden_tap

    def kept(self, length: int) -> None:
        self.suffix.kept(length)
        self.model.kept(length)

    def catch_up(self, context: Sequence[int]) -> None:
        self.suffix.catch_up(context)
        self.model.catch_up(context)
        self._model_read = True

    def finish(self, context: Sequence[int]) -> None:
        self.suffix.finish(context)
        self.model.finish(context)

    def reset(self) -> None:
        self.suffix.reset()
        self.model.reset()

    def stats(self) -> dict:
        return {**self.suffix.stats(), **self.model.stats(), "hybrid": dict(self.choices)}

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        if not self._model_read:  # the other drafter has not read the prompt yet
            return self.suffix.propose(context, ctl)
        s = self.suffix.propose(context, replace(ctl, fallback=True))
        policy: DraftPolicy | None = ctl.policy
        if not s.tokens:
            return self.model.propose(context, ctl)
        if policy is None or policy.fixed_k is not None:
            return s
        choice, k_model = self.choose(policy, s)
        if choice == "model":
            n = self._overruled[s.key] = self._overruled.get(s.key, 0) + 1
            if n >= self.EXPLORE:
                choice = "suffix"
        if choice != "model":
            self._overruled[s.key] = 0
        if choice == "suffix":
            self.choices["suffix"] += 1
            return s
        if choice == "model":
            self.choices["model"] += 1
            return self.model.propose(context, ctl)
        # The other drafter drafts on only while the whole block, the suffix's
        # tokens first, is worth it: its own confidences start from the
        # chance that all S survive.
        survive = policy.stats(SUFFIX.name, s.key).accept ** s.k
        m = self.model.propose_after(context, s.tokens, replace(
            ctl, cap=lambda kind, key=None: min(ctl.cap(kind, key), k_model),
            keep_going=lambda kind, confs: policy.keep_going(kind, confs, survive)))
        self.choices["chained" if m.tokens else "suffix"] += 1
        return chain(s, m, ctl.vocab, ctl.sampling.greedy)

    def choose(self, policy: DraftPolicy, s: Proposal) -> tuple[str, int]:
        """("suffix" | "model" | "chained", the other drafter's K when it drafts)."""
        cost = policy.cost
        a_s = policy.stats(SUFFIX.name, s.key).accept
        a_m = policy.stats(self.kind.name).accept
        c = cost.token(self.kind)
        k_m = max(1, cost.best_k(a_m, c, self.kind.cap))
        origin_bucket = key_parts(s.key)
        if origin_bucket is not None and origin_bucket[0] == CONVERSATION \
                and origin_bucket[1] >= TRUST_MATCH and a_s >= TRUST_ACCEPT:
            return "suffix", k_m
        # Expected accepted drafts of the suffix: expected tokens less the target's own.
        e_s = expected_tokens(a_s, s.k) - 1.0
        # Chained, the block is at most the other drafter's longest.
        room = self.kind.cap - s.k
        if self.kind.reads_target:
            # A head reads the suffix's tokens one forward each, from its own
            # output, and drafts on at the acceptance of its chained drafts.
            a_c = policy.stats(self.kind.name, drafter_kinds.after_key(self.kind.name)).accept
            k_c, read = max(1, cost.best_k(a_c, c, self.kind.cap)), c * s.k
        else:
            # A draft model reads them in its first forward, as a longer one.
            a_c, k_c, read = a_m, k_m, c * cost.slope * s.k
        k_c = min(k_c, room)
        e_c = expected_tokens(a_c, k_c) - 1.0
        rates = {
            "suffix": cost.rate(a_s, s.k, 0.0),
            "model": cost.rate(a_m, k_m, c),
            "chained": (e_s + a_s ** s.k * e_c + 1.0)
            / (k_c * c + read + cost.verify(s.k + k_c + 1)),
        }
        if c <= 0 or k_c < 1:
            rates.pop("chained")  # no draft cost known (never chain blindly), or no room
        best = max(rates, key=lambda r: rates[r])
        return best, (k_c if best == "chained" else k_m)


def chain(s: Proposal, m: Proposal, vocab: int, greedy: bool) -> Proposal:
    """The suffix proposal followed by the model's. At T > 0 the suffix rows
    of q are one-hot (a deterministic proposal), the model's its own."""
    if not m.tokens:
        return s
    q = None
    if not greedy and m.q is not None:
        onehot = (mx.arange(vocab)[None, :] == mx.array(s.tokens)[:, None]).astype(m.q.dtype)
        q = mx.concatenate([onehot, m.q], axis=0)
    parts = [*s.parts, Part(m.source, m.key, m.k, tuple(m.confidences))]
    return Proposal(tokens=[*s.tokens, *m.tokens], source=s.source, key=s.key, q=q,
                    confidences=[*s.confidences, *m.confidences],
                    draft_s=s.draft_s + m.draft_s, forwards=m.forwards,
                    origins=[*s.origins, *m.origins], parts=parts)
