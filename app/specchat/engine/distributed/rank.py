"""Ranks 1..N-1: wait for rank 0, join the ring, then run commands.

A rank holds a run of the target's layers and one KV cache per cache rank 0
uses (normally one: the engine's), and does exactly what rank 0 announces:
load a stage, or run its layers on the announced ids starting at the
announced cache length, first trimming its cache to that length (which is
how rank 0's rewinds after rejected drafts reach it). It never computes
logits. Any error, or rank 0 leaving, ends the process: the supervisor
(``specchat cluster start``) starts a fresh one, because MLX joins a
process to one ring only once.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
from dataclasses import replace

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from specchat.engine import compute, threads
from specchat.engine.distributed import protocol, stages
from specchat.engine.distributed.control import RankChannel
from specchat.engine.errors import EngineError
from specchat.engine.loading import load_folder


class Stage:
    """This rank's layers and caches, driven by rank 0's commands."""

    def __init__(self, group, rank: int, channel: RankChannel):
        self.group = group
        self.rank = rank
        self.channel = channel
        self.model = None
        self.caches: dict[int, list] = {}

    def run(self) -> None:
        while True:
            head, ids = protocol.receive(self.group)
            op = head[protocol.OP]
            if op == protocol.FEED:
                self.feed(head, ids)
            elif op == protocol.LOAD:
                self.load(json.loads(protocol.from_ids(ids)))
            else:
                raise EngineError(f"unknown command {op}")

    def load(self, request: dict) -> None:
        self.model = None
        self.caches.clear()
        gc.collect()
        mx.clear_cache()
        seq = request.get("seq")
        policy = replace(compute.detect(), dtype=request["dtype"])
        try:
            loaded = load_folder(request["model"], policy, model_classes=stages.model_classes,
                                 shard=stages.pipeline_stage(self.group, self.rank,
                                                             request.get("layers")))
        except EngineError as exc:
            self.channel.send({"failed": {"seq": seq, "error": str(exc)}})
            return
        self.model = loaded.model
        # BLAS threads as the engine sets them: several only for large
        # matrices, and fewer while the machine is busy (with rank 0 among
        # the others when they share it), since BLAS threads spin.
        cfg = loaded.config.get("text_config", loaded.config)
        largest = int(cfg.get("hidden_size") or 0) * int(cfg.get("intermediate_size") or 0)
        threads.governor().set_ceiling(
            threads.parallel_ceiling(largest or threads.PARALLEL_MIN_WEIGHTS))
        inner = self.model.model
        params, nbytes = stages.layer_sizes(self.model)
        self.channel.send({"loaded": {"seq": seq, "layer_params": params, "layer_bytes": nbytes,
                                      "layers": [inner.start_idx, inner.end_idx]}})

    def feed(self, head: list[int], ids: list[int]) -> None:
        if self.model is None:
            raise EngineError("rank 0 ran the target before this rank loaded it")
        threads.governor().tick()
        forget = head[protocol.FORGET]
        if forget:
            self.caches.pop(forget, None)
        cid, offset = head[protocol.CACHE], head[protocol.OFFSET]
        cache = None
        if cid:
            cache = self.caches.get(cid)
            if cache is None:
                if offset:
                    raise EngineError(f"cache {cid} is unknown here, but rank 0's holds "
                                      f"{offset} tokens")
                cache = self.caches[cid] = make_prompt_cache(self.model)
            have = cache[0].offset
            if offset < have:
                if can_trim_prompt_cache(cache):
                    trim_prompt_cache(cache, have - offset)
                elif offset == 0:
                    cache = self.caches[cid] = make_prompt_cache(self.model)
                else:
                    raise EngineError("this rank's cache cannot be rewound")
            elif offset > have:
                raise EngineError(f"out of step: rank 0's cache holds {offset} tokens, ours {have}")
        h = self.model.model(mx.array(ids, dtype=mx.int32)[None], cache)
        mx.eval(h, [c.state for c in cache] if cache else [])


def serve(rank: int, host: str, port: int) -> int:
    """Run rank ``rank`` (1..N-1), waiting for rank 0 on ``host:port``."""
    if rank < 1:
        raise EngineError("rank 0 is the app; start ranks 1 and up")
    try:
        channel = RankChannel(rank, host, port)
    except OSError as exc:
        raise EngineError(f"rank {rank} cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    print(f"specchat cluster: rank {rank} (pid {os.getpid()}) waiting for rank 0 on "
          f"{host}:{port}", flush=True)
    join = channel.accept()
    print(f"specchat cluster: rank {rank}: rank 0 joined cluster {join.get('cluster')}", flush=True)
    fd, path = tempfile.mkstemp(prefix="specchat-ring-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(join["ring"], f)
    os.environ.update(MLX_RANK=str(rank), MLX_HOSTFILE=path)
    code = 0
    try:
        group = mx.distributed.init(strict=True, backend="ring")
        os.unlink(path)
        Stage(group, rank, channel).run()
    except RuntimeError as exc:  # the ring: rank 0 (or a neighbour) is gone
        print(f"specchat cluster: rank {rank}: the ring closed ({exc}); exiting", flush=True)
    except EngineError as exc:
        channel.send({"error": str(exc)})
        print(f"specchat cluster: rank {rank}: error: {exc}", file=sys.stderr, flush=True)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # MLX's ring threads may be blocked on a dead peer
