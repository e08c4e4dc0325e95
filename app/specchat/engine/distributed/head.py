"""Rank 0: the target as the engine sees it when its layers are spread
over a cluster.

``load_target`` returns what ``load_folder`` and ``Runner`` would for a
local target: a LoadedModel (rank 0's stage: the last layers, the final
norm and the head, the tokenizer) and a Runner. Two things differ, and
nothing above the Runner notices:

* rank 0's inner model announces every forward to the other ranks before
  running it (the class of ``model.model`` is swapped for a subclass whose
  ``__call__`` does that first), so every path that runs the target (the
  Runner, the bench's timing, mlx-lm's generators) keeps the ranks in
  lockstep; the announcement names the cache and its length, so a rewind
  on rank 0 needs no message of its own: the next forward carries it;
* the Runner evaluates each forward where it is built, so a collective
  that fails because a rank died surfaces here and becomes an EngineError
  naming the rank, and the reply stops with what it has streamed.

MLX joins a process to one ring, once (``mx.distributed.init`` caches its
group), so a process serves one cluster for its lifetime: after a rank is
lost, local models work as before, and the cluster needs a restart of its
ranks and of SpecChat.
"""

from __future__ import annotations

import collections
import json
import os
import weakref
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from specchat.engine.distributed import control, hostfile, protocol, secret, stages
from specchat.engine.distributed.hostfile import ClusterSpec
from specchat.engine.distributed.ringfile import ring_file
from specchat.engine.errors import EngineError
from specchat.engine.events import ComputeInfo
from specchat.engine.loading import LoadedModel, load_folder
from specchat.engine.runner import Runner

_LINK: Link | None = None  # this process's cluster (one per process, see above)
NAME_WAIT_S = 2.0  # how long a failed collective waits for the watchdog to name the rank


class Link:
    """Rank 0's end of one cluster: the MLX group, the control channel,
    and the caches the other ranks mirror."""

    def __init__(self, spec: ClusterSpec, peers: control.Peers, group):
        self.spec = spec
        self.peers = peers
        self.group = group
        self.broken: str | None = None
        self.last: mx.array | None = None  # the previous forward's output
        self._ids = 0
        self._loads = 0
        self._forgotten: collections.deque[int] = collections.deque()
        self._ring = control.ring_sockets(spec, 0)
        for sock in self._ring:
            control.keepalive(sock)
        peers.on_lost(self._unblock)

    # -- failure ----------------------------------------------------------
    def _unblock(self) -> None:
        """Watchdog thread: make a collective blocked on a lost rank fail."""
        control.shut(self._ring + control.ring_sockets(self.spec, 0))

    def check(self) -> None:
        """Refuse, in words, to use a cluster that lost a rank: MLX's ring
        does not recover, and a collective on it could wait forever."""
        if self.broken is None and self.peers.lost is not None:
            self.fail()
        if self.broken is not None:
            raise EngineError(self.broken)

    def fail(self, exc: BaseException | None = None,
             stopped: str = "the reply stops here") -> EngineError:
        """The error for a lost cluster, naming the rank when the watchdog
        can (a dead process's connections close at once)."""
        if self.broken is None:
            self.peers.wait_lost(NAME_WAIT_S)
            what = self.peers.describe_loss()
            if self.peers.lost is None and exc is not None:
                what += f" ({exc})"
            self._unblock()
            self.broken = (f"{what}. Local models still work; to use the cluster again, "
                           f"restart its ranks (specchat cluster start {self.spec.name}) "
                           "and SpecChat.")
            return EngineError(self.broken.replace(". Local", f"; {stopped}. Local", 1))
        return EngineError(self.broken)

    def settle(self, out: mx.array) -> None:
        """Evaluate a forward now, turning a lost rank into an EngineError."""
        self.check()
        try:
            mx.eval(out)
        except RuntimeError as exc:
            raise self.fail(exc) from None

    # -- commands ---------------------------------------------------------
    def _cache_id(self, cache) -> int:
        if not cache or cache[0] is None:
            return 0
        first = cache[0]
        cid = getattr(first, "_specchat_cluster_cache", None)
        if cid is None:
            self._ids += 1
            cid = self._ids
            first._specchat_cluster_cache = cid
            # The other ranks drop their copy with the next command.
            weakref.finalize(first, self._forgotten.append, cid)
        return cid

    def announce(self, inputs: mx.array, cache) -> mx.array:
        """Tell the other ranks to run their layers on ``inputs``; the ids
        rank 0 must feed its own layers (the broadcast ones)."""
        self.check()
        cid = self._cache_id(cache)
        offset = cache[0].offset if cid else 0
        forget = self._forgotten.popleft() if self._forgotten else 0
        ids = protocol.announce(self.group, protocol.FEED, inputs, cache=cid, offset=offset,
                                forget=forget, after=self.last)
        # Evaluated before the forward is built: a pipeline stage's receive
        # depends on no input, so nothing else would keep MLX from running
        # it before the announcement (and waiting on a rank that waits for us).
        self.settle(ids)
        return ids.astype(inputs.dtype).reshape(inputs.shape)

    def load(self, folder: Path, policy: ComputeInfo, say) -> tuple[LoadedModel, Runner]:
        """Every rank loads its stage of the cluster's model (concurrently)."""
        self.check()
        spec = self.spec
        self._loads += 1  # replies to an earlier, abandoned load are told apart
        request = {"model": spec.model, "dtype": policy.dtype, "seq": self._loads,
                   "layers": list(spec.layers) if spec.layers else None}
        try:
            mx.eval(protocol.announce(self.group, protocol.LOAD,
                                      protocol.to_ids(json.dumps(request).encode()),
                                      after=self.last))
        except RuntimeError as exc:
            raise self.fail(exc, "loading stopped") from None
        self.last = None
        say(f"loading the last layers of {Path(spec.model).name} here; "
            f"ranks 1-{spec.size - 1} load the others")
        local = load_folder(spec.model, policy, say, model_classes=stages.model_classes,
                            shard=stages.pipeline_stage(self.group, 0, spec.layers))
        say(f"waiting for ranks 1-{spec.size - 1} of {spec.name}")
        try:
            replies = self.peers.collect("loaded", self._loads)
        except EngineError:
            if self.peers.lost is not None:
                raise self.fail(stopped="loading stopped") from None
            raise
        _announcing(local.model.model, self)
        runner = DistributedRunner(self, local.model, local.info.model_type, local.config)
        runner.total_bytes = runner.bytes_per_token() + sum(r["layer_bytes"] for r in replies.values())
        info = replace(local.info, name=f"{Path(spec.model).name} on {spec.name}", path=str(folder),
                       n_params=local.info.n_params + sum(r["layer_params"] for r in replies.values()),
                       weight_bytes=local.info.weight_bytes + sum(r["layer_bytes"] for r in replies.values()))
        return replace(local, info=info), runner


class DistributedRunner(Runner):
    """A Runner whose forwards run across the cluster and are evaluated
    where they are built (see the module docstring)."""

    def __init__(self, link: Link, model: nn.Module, model_type: str, config: dict | None = None):
        super().__init__(model, model_type, config)
        self.link = link
        self.total_bytes: int | None = None

    def __call__(self, tokens, cache, which="all"):
        out = super().__call__(tokens, cache, which)
        self.link.settle(out)
        return out

    def hidden(self, tokens, cache):
        out = super().hidden(tokens, cache)
        self.link.settle(out)
        return out

    def bytes_per_token(self) -> int:
        """Weight bytes a step reads on all ranks together: the cost the
        draft policy weighs a draft forward against."""
        if self.total_bytes is not None:
            return self.total_bytes
        return super().bytes_per_token()


_ANNOUNCING: dict[type, type] = {}


def _announcing(trunk: nn.Module, link: Link) -> None:
    """Make ``trunk`` announce each forward before running it."""
    base = type(trunk)
    cls = _ANNOUNCING.get(base)
    if cls is None:
        def __call__(self, inputs, cache=None, input_embeddings=None):
            if input_embeddings is not None:
                raise EngineError("A target on a cluster takes token ids, not embeddings.")
            lk = self._specchat_link
            out = base.__call__(self, lk.announce(inputs, cache), cache)
            lk.last = out
            return out

        cls = type(f"Announcing{base.__name__}", (base,), {"__call__": __call__})
        _ANNOUNCING[base] = cls
    trunk.__class__ = cls
    trunk._specchat_link = link


def load_target(folder: str | os.PathLike, policy: ComputeInfo,
                say=lambda _m: None) -> tuple[LoadedModel, Runner]:
    """The target of the cluster folder ``folder``, loaded across its ranks."""
    folder = Path(folder)
    spec = hostfile.read(folder)
    link = _join(spec, secret.read(folder), say)
    return link.load(folder, policy, say)


def _join(spec: ClusterSpec, key: bytes, say) -> Link:
    global _LINK
    if _LINK is not None:
        if _LINK.spec.ring_hostfile() != spec.ring_hostfile():
            raise EngineError(f"SpecChat has joined cluster {_LINK.spec.name} already, and MLX "
                              f"joins a process to one cluster: restart SpecChat to use "
                              f"{spec.name}.")
        _LINK.check()
        return _LINK
    say(f"connecting to ranks 1-{spec.size - 1} of {spec.name}")
    peers = control.Peers(spec, key)
    peers.connect()
    peers.on_lost(lambda: control.shut(control.ring_sockets(spec, 0)))  # during init
    peers.watch()
    peers.open_ring()
    say(f"joining the ring of {spec.name}")
    group = _init_ring(spec)
    if group.size() != spec.size or group.rank() != 0:
        peers.close()
        raise EngineError(f"MLX joined a group of {group.size()} as rank {group.rank()}, "
                          f"not {spec.size} as rank 0: is another MLX job set up here?")
    _LINK = Link(spec, peers, group)
    return _LINK


def _init_ring(spec: ClusterSpec):
    """``mx.distributed.init`` with the ring backend as rank 0, configured
    the way the ring reads it (MLX_RANK, MLX_HOSTFILE: a pipe, see
    ringfile.py), which is undone afterwards so that processes the app
    starts do not inherit it."""
    saved = {k: os.environ.get(k) for k in ("MLX_RANK", "MLX_HOSTFILE")}
    try:
        with ring_file(spec.ring_hostfile()) as path:
            os.environ.update(MLX_RANK="0", MLX_HOSTFILE=path)
            return mx.distributed.init(strict=True, backend="ring")
    except RuntimeError as exc:
        raise EngineError(f"Could not join the ring of cluster {spec.name}: {exc}") from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
