"""Speculative speculative decoding (SSD; Kumar, Dao and May, "Speculative
Speculative Decoding", ICLR 2026, arXiv 2603.03251): the draft drafts the
next block while the target verifies the current one. docs/engine.md
("Speculative speculative decoding") derives and measures what is said here
in short.

As soon as a block d1..dK is proposed, a worker thread drafts the next block
for the outcomes (n, t) it expects (n drafts accepted, then the target's
token t), most likely first, while the engine thread verifies: a hit costs
no draft forward on the critical path, a miss drafts the ordinary way. The
guesses come from the draft's own distribution (after a rejection at j, its
top tokens there but d_j; after the whole block, its top tokens after d_K),
spread over positions as the paper's fan-out says (plan.py).

Exactness: every draft token is drawn with the key of its absolute
position (``plan.position_key``), not from the step's key stream, so a
speculated block is bit for bit the block the engine would have drafted
(the policy's cap and early stop are applied to it on the engine thread):
hits change where the time goes, never the tokens.

Threads: one daemon worker per process with its own MLX stream, parked at
exit (a thread inside MLX at shutdown aborts the process with MLX 0.32 on
Linux). It never touches the draft's cache: each key is drafted on a branch
over an evaluated snapshot of it, and a hit's branch becomes the cache.
While a job runs the BLAS threads are halved, so the verify's products and
the draft's together use every core at most (worker.py). A cache other than
mlx-lm's KVCache cannot be branched: such a pair drafts the ordinary way.

The package stands apart from the core loop, which reaches it only through
the drafter registry (drafter_kinds.SSD): ``plan.py`` the outcomes to guess
and the keys, ``worker.py`` the thread and its jobs, ``drafter.py`` the
mode's drafter around the draft model (its public ``begin``, ``feed`` and
``adopt``) and the one draft step (drafting.py).
"""
