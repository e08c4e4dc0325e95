"""Ranks 1..N-1: wait for rank 0, join the ring, then run commands.

A rank holds a run of the target's layers and one KV cache per cache rank 0
uses (normally one: the engine's), and does exactly what rank 0 announces:
load a stage, or run its layers on the announced ids starting at the
announced cache length, first trimming its cache to that length (which is
how rank 0's rewinds after rejected drafts reach it). It never computes
logits. Any error, or rank 0 leaving, ends the process: the supervisor
(``specchat cluster start``) starts a fresh one, because MLX joins a
process to one ring only once.

Rank 0 is whoever first proves the cluster's secret and asks to join
(control.RankChannel); the join names the model and the layer split, and
a load command over the ring (which MLX does not authenticate) naming
another folder or split is refused.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from dataclasses import replace

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from specchat.engine import compute, threads
from specchat.engine.distributed import protocol, stages
from specchat.engine.distributed.control import RankChannel
from specchat.engine.distributed.hostfile import MAX_RANKS
from specchat.engine.distributed.ringfile import ring_file
from specchat.engine.distributed.wire import MAX_TEXT
from specchat.engine.errors import EngineError
from specchat.engine.loading import load_folder


class Stage:
    """This rank's layers and caches, driven by rank 0's commands."""

    def __init__(self, group, rank: int, channel: RankChannel, join: dict):
        self.group = group
        self.rank = rank
        self.channel = channel
        self.join = join
        self.model = None
        self.caches: dict[int, list] = {}

    def run(self) -> None:
        while True:
            head, ids = protocol.receive(self.group)
            op = head[protocol.OP]
            if op == protocol.FEED:
                self.feed(head, ids)
            elif op == protocol.LOAD:
                self.load(self.load_request(ids))
            else:
                raise EngineError(f"unknown command {op}")

    def load_request(self, ids: list[int]) -> dict:
        """The load command's JSON, checked: the model and split rank 0
        joined with, a dtype SpecChat knows, a request number."""
        try:
            request = json.loads(protocol.from_ids(ids).decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise EngineError("rank 0 sent a load command that is not JSON") from None
        if (not isinstance(request, dict)
                or request.get("model") != self.join["model"]
                or request.get("layers") != self.join["layers"]
                or request.get("dtype") not in compute.DTYPES
                or not isinstance(request.get("seq"), int) or isinstance(request["seq"], bool)
                or not 0 <= request["seq"] < 2 ** 62):
            raise EngineError("rank 0 sent a load command for another model or split than the "
                              "one it joined with")
        return request

    def load(self, request: dict) -> None:
        self.model = None
        self.caches.clear()
        gc.collect()
        mx.clear_cache()
        seq = request["seq"]
        policy = replace(compute.detect(), dtype=request["dtype"])
        try:
            loaded = load_folder(request["model"], policy, model_classes=stages.model_classes,
                                 shard=stages.pipeline_stage(self.group, self.rank,
                                                             request["layers"]))
        except EngineError as exc:
            self.channel.send({"failed": {"seq": seq, "error": str(exc)[:MAX_TEXT]}})
            return
        self.model = loaded.model
        # BLAS threads as the engine sets them: several only for large
        # matrices, and fewer while the machine is busy (with rank 0 among
        # the others when they share it), since BLAS threads spin.
        threads.fit_model(loaded.config)
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


def serve(rank: int, host: str, port: int, secret: bytes) -> int:
    """Run rank ``rank`` (1..N-1), waiting on ``host:port`` for a rank 0
    that proves ``secret``."""
    if not 1 <= rank < MAX_RANKS:
        raise EngineError(f"--rank takes 1 to {MAX_RANKS - 1}: rank 0 is the app")

    def say(message: str) -> None:
        print(f"specchat cluster: rank {rank}: {message}", file=sys.stderr, flush=True)

    try:
        channel = RankChannel(rank, host, port, secret, say)
    except OSError as exc:
        raise EngineError(f"rank {rank} cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    print(f"specchat cluster: rank {rank} (pid {os.getpid()}) waiting for rank 0 on "
          f"{host}:{port}", flush=True)
    join = channel.accept()
    print(f"specchat cluster: rank {rank}: rank 0 joined cluster {join['cluster']}", flush=True)
    code = 0
    channel.wait_ring()  # every rank has joined: rank 0 opens its ring now too
    try:
        with ring_file(join["ring"]) as path:
            os.environ.update(MLX_RANK=str(rank), MLX_HOSTFILE=path)
            group = mx.distributed.init(strict=True, backend="ring")
        if group.size() != join["size"] or group.rank() != rank:
            raise EngineError(f"MLX joined a group of {group.size()} as rank {group.rank()}, "
                              f"not {join['size']} as rank {rank}")
        Stage(group, rank, channel, join).run()
    except RuntimeError as exc:  # the ring: rank 0 (or a neighbour) is gone
        print(f"specchat cluster: rank {rank}: the ring closed ({exc}); exiting", flush=True)
    except EngineError as exc:
        channel.send({"error": {"text": str(exc)[:MAX_TEXT]}})
        print(f"specchat cluster: rank {rank}: error: {exc}", file=sys.stderr, flush=True)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # MLX's ring threads may be blocked on a dead peer
