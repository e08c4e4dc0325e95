"""Speculative speculative decoding (SSD; Kumar, Dao and May, "Speculative
Speculative Decoding", ICLR 2026, arXiv 2603.03251): the draft drafts the
next block while the target verifies the current one.

In ordinary speculation the two take turns, so every draft forward sits on
the critical path. Here, as soon as a block d1..dK is proposed, a worker
thread drafts the *next* block for the verification outcomes it expects,
while the engine thread verifies. An outcome is (n, t): n drafts accepted,
then the target's own token t (the recovery token after a rejection at
n + 1, or the bonus token when n = K). The finished blocks wait in a
speculation cache keyed by (n, t). When the verify returns the real
outcome, a hit means the next block is ready (drafting cost nothing on the
critical path); if the worker is drafting that very key, the engine waits
for it, which is never longer than drafting it would take; otherwise (a
miss) the engine drafts the ordinary way.

The guesses come from the draft's own distribution, never the target's:

- after a rejection at position j the target's token is never d_j (a draft
  token that is rejected cannot also be the recovery token), so the
  candidates are the draft's top-F tokens at j *excluding* d_j, weighted by
  q_j(t) / (1 - q_j(d_j));
- for the bonus position the worker feeds d_K (one extra forward) and takes
  the draft's top-F tokens there.

Fan-out (how many keys per n) follows the paper: with the miss probability
of a fan-out F falling as a power law F^-r and P(n) the chance that
verification ends after n accepted drafts, minimising sum_n P(n) F_n^-r for
a budget sum_n F_n = B gives F_n proportional to P(n)^(1/(1+r)). With a
constant acceptance a, P(n) = a^n (1 - a) for n < K and a^K for n = K: a
geometric series in n with ratio a^(1/(1+r)), the bonus position boosted by
(1 - a)^(-1/(1+r)), capped at F_MAX. Here P(n) uses each position's
calibrated acceptance (the policy's Calibration of the draft's confidence)
instead of one constant a, and r = 1 (``POWER``, an assumption: the paper
fits it). The budget B is what fits in the overlap: the measured time from
proposing a block to the next step's proposal (the verify, and committing
its tokens) over the measured seconds per worker forward, divided by the
block length; keys are then drafted most likely first.

Exactness. The block that is verified is an ordinary draft: tokens drawn
from the draft's processed distribution q given the context, with q kept
for rejection sampling. Draft tokens are drawn with keys derived from the
request's seed and the token's absolute position (``position_key``), not
from the step's key stream, so a speculated block is bit for bit the block
the engine would have drafted itself for that context (the same forwards,
the same keys; ``keep_going`` and the policy's cap are applied to it on the
engine thread, drafting on if the policy wants more). Hits therefore change
where the time goes, never the tokens: greedy output is the target's own,
and a seeded sampled request gives the same tokens whatever the timing.
Position keys are exact: the key of position p is independent of every
token emitted before p (which depend only on earlier positions' keys and
the verifier's own draws), so the draft at p is a fresh draw from q given
the context, as rejection sampling requires.

Threads and caches. The worker is one daemon thread per process with its
own MLX stream (MLX streams belong to the thread that made them; every
array handed between threads is evaluated first). It never touches the
draft's KV cache: each key is drafted on a branch, a new KVCache whose
arrays are slices of an evaluated snapshot of the draft's cache taken when
the job was submitted (MLX arrays are immutable, so the engine's later
writes to its own cache cannot reach a branch). On a hit the branch becomes
the draft's cache. Like the engine thread (worker.py) the worker never
exits, and it is parked before interpreter shutdown (``atexit``): a thread
that ran MLX and then exits, or that is inside MLX at shutdown, aborts the
process with MLX 0.32 on Linux.

BLAS threads. BLIS (and OpenBLAS) take one process-wide thread count
through the CBLAS interface MLX calls; BLIS's per-call ``rntm_t`` is only
reachable through its own expert API, which MLX does not call. The
fallback: while a speculation job is queued or running the count is
lowered to half the governor's (1 of 2 cores), so the verify's products and
the draft's together use at most every core, and restored when the job
ends. Draft forwards are one-row products, single-threaded in BLIS anyway.
A count the user fixed in the environment is left alone. On a GPU (Metal)
there is no BLAS count; ``Settings.device`` can put the draft's stream on
the CPU while the target runs on the GPU: the setting where SSD can win
(see docs/engine.md).

A cache type other than mlx-lm's KVCache (rotating, quantized) cannot be
branched this way: such a pair drafts the ordinary way, every step counted
as a fallback.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from weakref import WeakKeyDictionary, ref

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from specchat.engine import blas, threads
from specchat.engine.auto_off import ewma
from specchat.engine.draft_model import Drafted, DraftHead, ModelDrafter, draft_block
from specchat.engine.drafter_kinds import SSD
from specchat.engine.drafters import DraftControl, Drafter, Proposal
from specchat.engine.errors import EngineError
from specchat.engine.events import SamplingParams
from specchat.engine.sampling import processed_logprobs

F_MAX = 4  # most keys per position (and alternatives read back per drafted token)
MAX_KEYS = 8  # most keys per job
POWER = 1.0  # r: the miss rate of a fan-out F taken to fall as F^-r
EMA = 0.3  # weight of the newest timing
_MASK64 = (1 << 64) - 1

Key = tuple[int, int]  # (drafts accepted, the target's token after them)


@dataclass(frozen=True)
class Settings:
    """How the drafter speculates. The defaults are what the app uses."""

    keys: int | None = None  # keys per job; None: as many as the measured overlap allows
    # Wait for every planned key before looking the outcome up: the worker's
    # timing then never decides hits (deterministic, for tests and replays).
    settle: bool = False
    device: str | None = None  # the worker's stream: "cpu", "gpu", None: MLX's default


DEFAULTS = Settings()


def position_key(base: int, position: int) -> mx.array:
    """The PRNG key for the draft token at ``position`` (splitmix64 of the
    request's base and the position)."""
    z = (base + 0x9E3779B97F4A7C15 * (position + 1)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return mx.random.key((z ^ (z >> 31)) >> 1)


def fan_out(p_end: Sequence[float], budget: int, caps: Sequence[int]) -> list[int]:
    """Keys per position: F_n proportional to P(n)^(1/(1+r)) (the paper's
    optimum), ``budget`` in all, at most ``caps[n]`` each. Whole keys are
    handed out one at a time to the position whose share is most behind
    (the D'Hondt rule), which gives the proportional split in integers."""
    w = [max(p, 0.0) ** (1.0 / (1.0 + POWER)) for p in p_end]
    f = [0] * len(w)
    for _ in range(budget):
        best = max((i for i in range(len(w)) if f[i] < caps[i] and w[i] > 0),
                   key=lambda i: w[i] / (f[i] + 1), default=None)
        if best is None:
            break
        f[best] += 1
    return f


def ending_probs(accept: Sequence[float]) -> list[float]:
    """P(verification ends after n accepted drafts), n = 0..K, from each
    draft token's acceptance chance."""
    out, survive = [], 1.0
    for a in accept:
        out.append(survive * (1.0 - a))
        survive *= a
    out.append(survive)
    return out


@dataclass
class Spec:
    """A speculated block, ready for the outcome ``key``: its tokens, the
    branch cache holding the new context and every token but the last, and
    the worker seconds behind it."""

    key: Key
    block: Drafted
    q: mx.array | None
    cache: list


def _draft(head: DraftHead, feed: Callable, first: list[int], k: int, sampling: SamplingParams,
           base: int | None, position: int, keep_going: Callable[[list[float]], bool],
           **more) -> Drafted | None:
    """draft_block with the position keys (the first new token at absolute
    ``position``) and the alternatives the guesses need: the engine's
    blocks and the worker's are drafted alike."""
    return draft_block(head, feed, first, k, sampling,
                       key_at=lambda i: position_key(base, position + i), keep_going=keep_going,
                       alts=F_MAX, **more)


def _q(head: DraftHead, block: Drafted, greedy: bool) -> mx.array | None:
    if greedy or not block.q_rows:
        return None
    q = head.full_q(block.q_rows)
    mx.eval(q)
    return q


def branch(snapshot: list[tuple[mx.array, mx.array]], offset: int) -> list[KVCache]:
    """A new cache holding the first ``offset`` positions of ``snapshot``
    (evaluated arrays). Its first write copies them into a buffer of its
    own, so nothing written to it reaches the snapshot or the draft's cache."""
    out = []
    for keys, values in snapshot:
        c = KVCache()
        c.keys, c.values, c.offset = keys[..., :offset, :], values[..., :offset, :], offset
        out.append(c)
    return out


class _BlasShare:
    """Half the governor's BLAS threads while any speculation job is
    queued or running (see the module docstring), all of them otherwise."""

    def __init__(self):
        self._lock = threading.Lock()
        self._active = 0

    def _set(self, share: bool) -> None:
        gov = threads.governor()
        if gov.fixed is None and gov.threads > 1:
            blas.set_threads(max(1, gov.threads // 2) if share else gov.threads)

    def enter(self) -> None:
        with self._lock:
            self._active += 1
            if self._active == 1:
                self._set(True)

    def leave(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self._set(False)


_share = _BlasShare()


class Job:
    """One block's speculation: planned on the engine thread, run on the
    worker, read back (``take``) by the engine thread once the block is
    verified."""

    def __init__(self, runner, head: DraftHead, snapshot: list, start: int, block: Drafted,
                 keys: list[tuple[Key, float]], bonus: int, p_bonus: float, length: int,
                 sampling: SamplingParams, base: int | None, device: str | None):
        self.runner, self.head, self.snapshot, self.start = runner, head, snapshot, start
        self.proposed = list(block.tokens)
        self.keys, self.bonus, self.p_bonus = keys, bonus, p_bonus
        self.length, self.sampling, self.base, self.device = length, sampling, base, device
        self.cond = threading.Condition()
        self.outcome: Key | None = None
        self.asked = False  # the engine thread has asked for its outcome
        self.cancelled = False
        self.current: Key | None = None
        self.results: dict[Key, Spec] = {}
        self.finished = False
        self.error: BaseException | None = None
        self.spent_s = 0.0  # worker forward seconds, every key
        self.forwards = 0
        self.submitted = time.perf_counter()
        _share.enter()

    # -- worker side -------------------------------------------------------------------
    def _abandon(self, key: Key | None) -> bool:
        """Stop drafting ``key`` (None: the bonus forward)? Once the engine
        has asked, only the block for its outcome is still of use."""
        with self.cond:
            return self.cancelled or (self.asked and (key is None or self.outcome != key))

    def run(self) -> None:
        """Draft the planned keys, most likely first (the worker thread)."""
        plan = list(self.keys)
        k = len(self.proposed)
        if self.bonus and not self._abandon(None):
            # Feed d_K on a branch holding the context and d_1..d_{K-1}: the
            # draft's distribution after the whole block, for the bonus keys.
            t0 = time.perf_counter()
            cache = branch(self.snapshot, self.start + k - 1)
            logits = self.head.logits(self.runner(self.proposed[-1:], cache, self.head.which))
            if self.sampling.greedy:
                probs = mx.softmax(logits, axis=-1)[0]
            else:
                probs = mx.exp(processed_logprobs(logits, self.sampling))[0]
            n_top = min(self.bonus, probs.shape[-1])
            top = mx.argpartition(-probs, kth=n_top - 1)[:n_top]
            ids, p = self.head.ids(top), probs[top]
            mx.eval(ids, p, [(c.keys, c.values) for c in cache])
            self._spent(time.perf_counter() - t0, 1)
            bonus_snapshot = [(c.keys, c.values) for c in cache]
            plan += [((k, t), self.p_bonus * q) for t, q in zip(ids.tolist(), p.tolist(),
                                                                 strict=True) if q > 0]
        plan.sort(key=lambda kp: -kp[1])
        for key, _p in plan:
            n, t = key
            with self.cond:
                if self.cancelled or (self.asked and key != self.outcome):
                    return
                self.current = key
            snap = bonus_snapshot if n == k else self.snapshot  # (k, t): planned with it
            cache = branch(snap, self.start + n)
            block = _draft(self.head, lambda x, c=cache: self.runner(x, c, self.head.which), [t],
                           self.length, self.sampling, self.base, self.start + n + 1,
                           lambda _c: True, abandon=lambda key=key: self._abandon(key))
            if block is None:
                return
            q = _q(self.head, block, self.sampling.greedy)
            mx.eval([(c.keys, c.values) for c in cache])
            self._spent(block.forward_s, block.forwards)
            with self.cond:
                self.results[key] = Spec(key, block, q, cache)
                self.current = None
                self.cond.notify_all()

    def _spent(self, seconds: float, forwards: int) -> None:
        with self.cond:
            self.spent_s += seconds
            self.forwards += forwards

    def finish(self) -> None:
        with self.cond:
            if self.finished:
                return
            self.finished = True
            self.current = None
            self.cond.notify_all()
        _share.leave()

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
            self.cond.notify_all()

    # -- engine side -------------------------------------------------------------------
    def take(self, outcome: Key | None, settle: bool) -> tuple[Spec | None, float]:
        """The block speculated for ``outcome`` (None if there is none, or
        the outcome is unknown), and the seconds spent waiting for it: only
        while the worker drafts that very key (or, with ``settle``, until
        the job is done)."""
        t0 = time.perf_counter()
        with self.cond:
            if settle:
                while not self.finished:
                    self.cond.wait()
            self.outcome, self.asked = outcome, True
            self.cond.notify_all()
            while (outcome is not None and outcome not in self.results
                   and self.current == outcome and not self.finished):
                self.cond.wait()
            if self.error is not None:
                raise RuntimeError("the SSD draft worker failed") from self.error
            spec = self.results.get(outcome) if outcome is not None else None
        return spec, time.perf_counter() - t0


class _Worker:
    """The process's one speculation thread: runs the newest job, parked
    otherwise. A newer job replaces one still queued and cancels the one
    running (only the latest block's speculation is of use)."""

    def __init__(self):
        self._cv = threading.Condition()
        self._pending: Job | None = None
        self._running: Job | None = None
        self._streams: dict[str | None, mx.Stream] = {}
        threading.Thread(target=self._run, name="specchat-ssd-draft", daemon=True).start()
        atexit.register(self.park)

    def submit(self, job: Job) -> None:
        with self._cv:  # an RLock: cancel takes it again
            self.cancel()
            self._pending = job
            self._cv.notify_all()

    def cancel(self) -> None:
        with self._cv:
            if self._pending is not None:
                self._pending.cancel()
                self._pending.finish()
                self._pending = None
            if self._running is not None:
                self._running.cancel()

    def park(self, timeout: float = 60.0) -> None:
        """Cancel everything and wait until the thread is out of MLX."""
        self.cancel()
        with self._cv:
            self._cv.wait_for(lambda: self._running is None, timeout)

    def _stream(self, device: str | None) -> mx.Stream:
        if device not in self._streams:
            dev = {"cpu": mx.cpu, "gpu": mx.gpu}.get(device or "", mx.default_device())
            self._streams[device] = mx.new_stream(dev)
        return self._streams[device]

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._pending is not None)
                job, self._pending = self._pending, None
                self._running = job
            try:
                with mx.stream(self._stream(job.device)):
                    job.run()
            except BaseException as exc:  # noqa: BLE001 - handed to the engine thread
                with job.cond:
                    job.error = exc
            finally:
                job.finish()
                with self._cv:
                    self._running = None
                    self._cv.notify_all()


_worker_lock = threading.Lock()
_the_worker: _Worker | None = None


def worker() -> _Worker:
    global _the_worker
    with _worker_lock:
        if _the_worker is None:
            _the_worker = _Worker()
        return _the_worker


@dataclass
class Stats:
    """One request's speculation, for the Summary."""

    hits: int = 0  # blocks that were speculated (or being speculated) for the outcome
    misses: int = 0  # outcome not speculated: drafted the ordinary way
    fallbacks: int = 0  # nothing speculated at all (first step, unsupported cache, ...)
    hidden_s: float = 0.0  # draft forward seconds verification hid
    draft_s: float = 0.0  # draft forward seconds behind every block verified
    spec_s: float = 0.0  # worker forward seconds, used or not

    @property
    def overlap(self) -> float:
        return self.hidden_s / self.draft_s if self.draft_s > 0 else 0.0

    def fields(self) -> dict:
        return {**asdict(self), "overlap": self.overlap}


class SpeculativeDrafter(Drafter):
    """The `ssd` mode's drafter, built around the engine's draft model."""

    name = SSD.name

    def __init__(self, model: ModelDrafter):
        # Weakly: the engine owns its draft model, and for_model keeps one
        # drafter per model in a weak dictionary that must not keep it alive.
        self._model = ref(model)
        self.counts = Stats()
        self._job: Job | None = None
        self._last: tuple[int, int] | None = None  # (context length, its last id) at the last block
        self._base: int | None = None  # the request's base for position keys
        self._window_s: float | None = None  # proposal to next proposal, measured
        self._forward_s: float | None = None  # one worker forward, measured
        self.branchable = all(type(c) is KVCache for c in model.slot.cache)

    @property
    def model(self) -> ModelDrafter:
        model = self._model()
        if model is None:
            raise EngineError("The draft model was unloaded: load a draft for the ssd mode.")
        return model

    def prepare(self, prompt: Sequence[int], request=None) -> None:
        """A request starts: its counts from zero, the draft synced to ``prompt``."""
        self._drop_job()
        self.counts = Stats()
        self._base = None
        self.model.prepare(prompt, request)

    def reset(self) -> None:
        self._drop_job()
        self.model.reset()

    def stats(self) -> dict:
        """This request's counts, for Summary.drafter_stats."""
        return {self.name: self.counts.fields()}

    # The first block is drafted at once (the prompt read first, as prompt
    # processing), as the overlap measurements in docs/benchmarks.md ran.
    waits_for_first_token = False

    def ready(self, context: Sequence[int]) -> bool:
        return self.model.ready(context)

    def kept(self, length: int) -> None:
        self.model.kept(length)

    def catch_up(self, context: Sequence[int]) -> None:
        self._drop_job()
        self.model.catch_up(context)

    def finish(self, context: Sequence[int]) -> None:
        self.model.finish(context)

    def _drop_job(self) -> None:
        """Cancel any speculation; the next step drafts the ordinary way."""
        self._last = None
        if self._job is not None:
            self._job.cancel()
            self._job = None
        worker().cancel()

    # -- one step ------------------------------------------------------------------------
    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        t0 = time.perf_counter()
        spec, status, waited = self._collect(context)
        k = ctl.cap(self.name)
        if k <= 0:
            self._last = None
            return Proposal(tokens=[], source=self.name)
        if self._base is None and not ctl.sampling.greedy:
            a, b = ctl.keys.next().tolist()
            self._base = (int(a) << 32) | int(b)
        md = self.model
        greedy = ctl.sampling.greedy
        if spec is not None:
            self.counts.hits += 1
            head = md.view(ctl.vocab)
            block, more = self._use(spec, context, k, partial(ctl.keep_going, self.name))
            # Draft seconds on the critical path: waiting for the worker to
            # finish this key, and drafting on past what it speculated.
            exposed = waited
            hidden = max(0.0, spec.block.forward_s - waited)
            forwards = 0
            if more:  # the policy wants a longer block than was speculated: draft on
                before = block.forward_s, block.forwards
                _draft(head, lambda t: md.feed(t, head), [block.tokens[-1]], k, ctl.sampling,
                       self._base, len(context), partial(ctl.keep_going, self.name), out=block)
                exposed += block.forward_s - before[0]
                forwards = block.forwards - before[1]
                q = _q(head, block, greedy)
            else:
                q = spec.q[:len(block.tokens)] if spec.q is not None else None
            self.counts.hidden_s += hidden
            self.counts.draft_s += hidden + exposed
        else:
            if status == "miss":
                self.counts.misses += 1
            else:
                self.counts.fallbacks += 1
            first = md._pending(context[md.slot.length:])
            md.slot.checkpoint()
            head = md.view(ctl.vocab)  # after catching up: it may have added rows
            block = _draft(head, lambda t: md.feed(t, head), first, k, ctl.sampling, self._base,
                           len(context), partial(ctl.keep_going, self.name))
            forwards = block.forwards
            self.counts.draft_s += block.forward_s
            q = _q(head, block, greedy)
        self._launch(context, block, head, ctl)
        return Proposal(tokens=list(block.tokens), source=self.name, q=q,
                        confidences=list(block.confs), draft_s=time.perf_counter() - t0,
                        forwards=forwards)

    def _outcome(self, job: Job, context: Sequence[int]) -> Key | None:
        """(accepted, the target's token) of the last block, read off the
        context the loop committed since; None if the context did not
        follow that block (a new request, a paused step)."""
        if self._last is None:
            return None
        length, last = self._last
        n = len(context) - length - 1
        if not (0 <= n <= len(job.proposed)) or context[length - 1] != last:
            return None
        if list(context[length:length + n]) != job.proposed[:n]:
            return None
        return n, int(context[-1])

    def _collect(self, context: Sequence[int]) -> tuple[Spec | None, str, float]:
        """The last job's block for what was verified: (spec or None,
        "hit" | "miss" | "fallback", seconds waited for it)."""
        job, self._job = self._job, None
        if job is None:
            return None, "fallback", 0.0
        outcome = self._outcome(job, context)
        self._window_s = ewma(self._window_s, time.perf_counter() - job.submitted, EMA)
        spec, waited = job.take(outcome, DEFAULTS.settle)
        job.cancel()
        with job.cond:
            self.counts.spec_s += job.spent_s
            if job.forwards:
                self._forward_s = ewma(self._forward_s, job.spent_s / job.forwards, EMA)
        if outcome is None:
            return None, "fallback", waited
        return spec, ("hit" if spec is not None else "miss"), waited

    def _use(self, spec: Spec, context: Sequence[int], k: int,
             keep_going: Callable[[list[float]], bool]) -> tuple[Drafted, bool]:
        """Make the branch the draft's cache and cut the block where the
        engine's own drafting would have stopped (k tokens, or
        ``keep_going``); True if it would have drafted further."""
        md = self.model
        # Past the context the branch holds t, then every token of the block but the last.
        md.slot.adopt(spec.cache, len(context) + len(spec.block.tokens) - 1)
        md.slot.checkpoint()
        b = spec.block
        keep, more = len(b.tokens), True
        for i in range(1, len(b.tokens) + 1):
            if i >= k or not keep_going(b.confs[:i]):
                keep, more = i, False
                break
        return Drafted(tokens=b.tokens[:keep], confs=b.confs[:keep], alts=b.alts[:keep],
                       q_rows=b.q_rows[:keep], forward_s=b.forward_s,
                       forwards=b.forwards), more

    # -- speculation -------------------------------------------------------------------
    def _budget(self, length: int, ctl: DraftControl) -> int:
        """Keys that fit in the overlap: measured seconds from one proposal
        to the next over seconds per worker forward (before measurements:
        the cost model's verify over its draft forward)."""
        if DEFAULTS.keys is not None:
            return DEFAULTS.keys
        if self._window_s is not None and self._forward_s:
            forwards = self._window_s / self._forward_s
        else:
            cost = getattr(ctl.policy, "cost", None)
            forwards = (cost.verify(length + 1) / cost.draft) if cost and cost.draft > 0 else 3.0
        return max(1, min(MAX_KEYS, int((forwards - 1) // max(length, 1))))

    def _launch(self, context: Sequence[int], block: Drafted, head: DraftHead,
                ctl: DraftControl) -> None:
        self._last = (len(context), int(context[-1])) if block.tokens else None
        if not block.tokens or not self.branchable:
            return
        budget = self._budget(len(block.tokens), ctl)
        if budget <= 0:
            return
        md = self.model
        start = len(context)
        base_len = start + len(block.tokens) - 1
        if md.slot.length < base_len:
            return
        snapshot = [(c.keys[..., :base_len, :], c.values[..., :base_len, :])
                    for c in md.slot.cache]
        mx.eval(snapshot)
        calib = getattr(ctl.policy, "calibration", None)
        accept = [calib(c) if calib is not None else c for c in block.confs]
        p_end = ending_probs(accept)
        k = len(block.tokens)
        caps = [len(a) for a in block.alts] + [F_MAX]
        counts = fan_out(p_end, budget, caps)
        keys: list[tuple[Key, float]] = []
        for n in range(k):
            rest = max(1e-9, 1.0 - block.confs[n])
            keys += [((n, t), p_end[n] * min(1.0, q / rest)) for t, q in block.alts[n][:counts[n]]]
        job = Job(md.runner, head, snapshot, start, block, keys, counts[k], p_end[k], k, ctl.sampling,
                  self._base, DEFAULTS.device)
        self._job = job
        worker().submit(job)


_by_model: WeakKeyDictionary = WeakKeyDictionary()


def for_model(model: ModelDrafter) -> SpeculativeDrafter:
    """The engine's `ssd` drafter around its draft model: one per draft
    model, so its timings carry over between requests."""
    drafter = _by_model.get(model)
    if drafter is None:
        drafter = _by_model[model] = SpeculativeDrafter(model)
    return drafter


def build(parts) -> SpeculativeDrafter:
    """drafter_kinds.SSD's maker."""
    if not isinstance(parts.draft_model, ModelDrafter):
        raise EngineError("The ssd mode drafts ahead with a draft model; the loaded draft is a "
                          "draft head: use the draft or hybrid mode.")
    return for_model(parts.draft_model)
