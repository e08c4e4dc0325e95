"""The target sharded across machines with MLX's own distributed backend.

A cluster is N processes ("ranks") joined by ``mx.distributed`` (the ring
backend, TCP). mlx-lm's pipeline support gives each rank a contiguous run of
the target's layers; rank 0 is the app's engine thread, which also holds the
draft and does all drafting, acceptance and streaming. Every forward rank 0
runs over the target is announced to the other ranks first (one collective
carrying the token ids), so they run their layers in lockstep; see
docs/engine.md "Past one machine".

Modules: ``hostfile`` (the cluster folder and its mlx.launch hostfile; no
MLX), ``secret`` (the cluster's shared secret), ``stages`` (which layers a
rank holds; llama's pipeline support), ``protocol`` (the command a
collective carries), ``control`` (the side channel: rendezvous,
heartbeats, the watchdog), ``wire`` and ``handshake`` (its checked
messages, and the proof of the secret before a rank acts on any),
``ringfile`` (the ring layout handed to MLX without a file), ``head``
(rank 0: the target object the engine uses), ``rank`` (ranks 1..N-1) and
``launch`` (starting them). Importing this package imports no MLX.
Security: docs/engine.md, "Past one machine".
"""
