"""Starting ranks 1..N-1 and keeping them running (``specchat cluster start``).

Each rank is one process, ``specchat cluster rank``: started here for ranks
on this machine, over ssh for the others (as ``mlx.launch`` does, with the
hostfile's ``ssh`` names). A rank serves one session of rank 0 (MLX joins a
process to a ring once), so when it exits (rank 0 closed the app, or the
rank failed) the supervisor starts a fresh one, and gives up on a rank that
keeps failing at once. Rank 0 is not started here: it is the app (or
``specchat generate``) loading the cluster as its target.

Each rank gets the cluster's secret as one line on its standard input (the
pipe of the local process, or the ssh session's stdin, which ssh carries
encrypted): never in its arguments or environment, which ``ps`` shows.
ssh gets ``--`` before the host, and hosts are checked when the cluster is
created (hostfile.check_host), so a host is never read as an option.
Imports no MLX.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from specchat.engine.distributed import secret
from specchat.engine.distributed.hostfile import ClusterSpec, Rank
from specchat.engine.errors import EngineError

RESTART_S = 0.5
QUICK_EXIT_S = 3.0  # a rank that exits sooner than this after starting ...
QUICK_EXITS = 3  # ... this many times in a row is given up on


def rank_command(spec: ClusterSpec, rank: Rank) -> list[str]:
    args = ["cluster", "rank", "--rank", str(rank.rank), "--listen",
            f"{rank.ip}:{rank.control_port}"]
    if rank.local:
        return [sys.executable, "-m", "specchat", *args]
    remote = " ".join([spec.remote_command, *map(shlex.quote, args)])
    return ["ssh", "-o", "BatchMode=yes", "--", rank.ssh, remote]


def rank_environment() -> dict[str, str]:
    """This process's environment without the BLAS thread count SpecChat
    set here itself (engine/blas.py): a rank that inherited it would take
    it for the user's and never lower it, and BLAS threads spinning in two
    processes on the same cores slow both by orders of magnitude."""
    from specchat.engine import blas

    env = dict(os.environ)
    if blas.status().fixed_threads is None:
        env.pop("BLIS_NUM_THREADS", None)
    return env


class Supervisor:
    def __init__(self, spec: ClusterSpec, key: bytes, say: Callable[[str], None] = print,
                 once: bool = False):
        self.spec = spec
        self.key = key
        self.say = say
        self.once = once
        self.procs: dict[int, subprocess.Popen] = {}
        self.started: dict[int, float] = {}
        self.quick: dict[int, int] = {}
        self._stop = False

    def start(self, rank: Rank) -> None:
        proc = subprocess.Popen(rank_command(self.spec, rank), env=rank_environment(),
                                stdin=subprocess.PIPE)
        # A rank that exited at once (ssh could not connect) closed the
        # pipe: the supervisor's loop reports its exit in words.
        with contextlib.suppress(OSError):
            proc.stdin.write(secret.text(self.key).encode())
        with contextlib.suppress(OSError):
            proc.stdin.close()
        self.procs[rank.rank] = proc
        self.started[rank.rank] = time.monotonic()
        where = "here" if rank.local else f"on {rank.ssh}"
        self.say(f"specchat cluster: started rank {rank.rank} {where} (pid {proc.pid})")

    def run(self) -> int:
        """Until interrupted (or, with ``once``, until every rank exits)."""
        def stop(_sig, _frame):
            self._stop = True

        signal.signal(signal.SIGTERM, stop)
        for rank in self.spec.ranks[1:]:
            self.start(rank)
        self.say(f"specchat cluster: {self.spec.name} is ready for rank 0: load it as the target "
                 f"in SpecChat (Ctrl-C stops the ranks)")
        try:
            while not self._stop and self.procs:
                time.sleep(0.2)
                for r, proc in list(self.procs.items()):
                    code = proc.poll()
                    if code is None:
                        continue
                    del self.procs[r]
                    self.say(f"specchat cluster: rank {r} exited ({code})")
                    if self.once:
                        continue
                    quick = time.monotonic() - self.started[r] < QUICK_EXIT_S and code != 0
                    self.quick[r] = self.quick.get(r, 0) + 1 if quick else 0
                    if self.quick[r] >= QUICK_EXITS:
                        raise EngineError(f"rank {r} of {self.spec.name} keeps failing as it "
                                          "starts; see its messages above")
                    time.sleep(RESTART_S)
                    self.start(self.spec.ranks[r])
        except KeyboardInterrupt:
            pass
        finally:
            self.shutdown()
        return 0

    def shutdown(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()
