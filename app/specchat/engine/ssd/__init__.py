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
