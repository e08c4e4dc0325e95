"""What a cluster costs per decoding step (docs/engine.md, "Past one machine").

``--raw`` starts two local processes joined by MLX's ring backend on the
loopback interface and times what one sharded forward puts on the link:
the command (an all_sum of 40 int32), the pipeline hop (send/recv of the
hidden states of a block of L tokens) and mlx-lm's closing all_gather, for
hidden sizes H, plus the bandwidth of large transfers.

``--cluster FOLDER`` runs as rank 0 of a running cluster (``specchat
cluster start NAME`` first) and times the target's forwards over m tokens
as the bench's cost table does, with the target loaded here alone and then
on the cluster.

    python benchmarks/cluster_link.py --raw --hidden 64 1536
    specchat cluster start lab &
    python benchmarks/cluster_link.py --cluster "$(specchat cluster show lab --json | jq -r .folder)"
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from specchat import startup  # noqa: E402

startup.prepare()


from forward_costs import median_time as timed  # noqa: E402 - same folder


def raw_rank(hidden: list[int], reps: int) -> None:
    """One side of --raw (both ranks run this; rank 0 prints). Every timed
    round waits for the other rank, so these are latencies, not the
    throughput of one side queueing sends."""
    import mlx.core as mx

    group = mx.distributed.init(strict=True, backend="ring")
    rank = group.rank()
    say = print if rank == 0 else (lambda *_a, **_k: None)
    cmd = mx.zeros((40,), mx.int32)

    def command():
        mx.eval(mx.distributed.all_sum(cmd, stream=mx.cpu))

    for _ in range(50):
        command()
    say(f"command (all_sum of 40 int32): {timed(command, reps) * 1e6:.0f} us per round")
    for h in hidden:
        for n in (1, 5, 9, 17):
            x = mx.ones((1, n, h), mx.float32)
            mx.eval(x)

            def step(x=x):
                # What one sharded forward puts on the link with 2 ranks:
                # the command, rank 1's hidden states to rank 0, the gather.
                command()
                y = mx.distributed.send(x, 0) if rank == 1 else mx.distributed.recv_like(x, 1)
                mx.eval(y)
                mx.eval(mx.distributed.all_gather(x)[:1])

            for _ in range(20):
                step()
            t = timed(step, reps)
            say(f"step H={h:5d} L={n:2d} (hidden states {x.nbytes / 1024:6.1f} KiB): "
                f"{t * 1e6:6.0f} us")
    big = mx.ones((4 << 20,), mx.float32)  # 16 MiB
    mx.eval(big)

    def ping_pong():
        if rank == 1:
            mx.eval(mx.distributed.send(big, 0))
            mx.eval(mx.distributed.recv_like(big, 0))
        else:
            mx.eval(mx.distributed.recv_like(big, 1))
            mx.eval(mx.distributed.send(big, 1))

    t = timed(ping_pong, 7) / 2
    say(f"16 MiB one way: {t * 1000:.1f} ms = {big.nbytes / t / 1e9:.2f} GB/s")


def raw(hidden: list[int], reps: int) -> None:
    ports = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        ports.append(s.getsockname()[1])
        s.close()
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump([[f"127.0.0.1:{p}"] for p in ports], f)
    args = [sys.executable, __file__, "--raw-rank", "--reps", str(reps), "--hidden", *map(str, hidden)]
    procs = [subprocess.Popen(args, env={**os.environ, "MLX_RANK": str(r), "MLX_HOSTFILE": path})
             for r in (1, 0)]
    for p in procs:
        p.wait()
    os.unlink(path)


def cluster(folder: str, reps: int) -> None:
    from specchat.engine.distributed import hostfile
    from specchat.engine.session import Engine
    from specchat.tools.forward_timing import measure_costs

    spec = hostfile.read(folder)
    ids = list(range(100, 300))
    engine = Engine()
    rows = {}
    for where, path in (("one process", spec.model), (f"cluster {spec.name}", folder)):
        engine.load(path)
        rows[where] = measure_costs(engine, [i % engine.target_runner.rows for i in ids], reps)["target"]
    print("target forward over m tokens (median):")
    local, remote = rows.values()
    for m in local:
        print(f"  m={m}: one process {local[m] * 1000:7.2f} ms, cluster {remote[m] * 1000:7.2f} ms, "
              f"difference {(remote[m] - local[m]) * 1000:+7.2f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--raw", action="store_true")
    p.add_argument("--raw-rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cluster", metavar="FOLDER")
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 1536])
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args()
    if args.raw_rank:
        raw_rank(args.hidden, args.reps)
    elif args.raw:
        raw(args.hidden, args.reps)
    elif args.cluster:
        cluster(args.cluster, max(3, args.reps // 20))
    else:
        p.error("pass --raw or --cluster FOLDER")


if __name__ == "__main__":
    main()
