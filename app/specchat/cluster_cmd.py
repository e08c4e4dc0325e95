"""``specchat cluster``: define a cluster (a hostfile) and start its ranks.

A cluster lives in ``<home>/clusters/NAME/``: the hostfile ``mlx.launch``
reads, the cluster's secret (owner-only), plus links to the target's files
so that the folder reads as the target (see engine/distributed/hostfile.py
and secret.py). ``start`` keeps ranks 1..N-1 running and hands each the
secret on its standard input; rank 0 is whatever loads the folder as its
target: the app, or ``specchat generate --target cluster:NAME``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from specchat import records
from specchat.engine.errors import EngineError
from specchat.engine.folders import HOSTFILE, clusters_dir
from specchat.library import refs
from specchat.library.sources.cluster import defined, states
from specchat.library.sources.cluster import folder as cluster_folder

# engine/distributed is optional: imported where a command needs it, never at start-up.


def add_parser(sub, model_ref, cluster_name, value) -> None:
    """The ``cluster`` commands; ``model_ref`` and ``cluster_name`` are the
    argparse types of a model reference and of a cluster's name (refused as
    a usage error unless it is one exactly as typed: values.NAMES);
    ``value(name)`` the argparse type for one of ``specchat.values``'
    entries (cli.py's), so a number is refused in the table's words."""
    c = sub.add_parser("cluster", help="run the target across several machines (MLX's ring backend)")
    csub = c.add_subparsers(dest="cluster_command", required=True)
    m = csub.add_parser("create", help="write a cluster's hostfile (rank 0 is this machine)")
    m.add_argument("name", type=cluster_name)
    m.add_argument("--hosts", required=True,
                   help="comma-separated IP addresses or host names, rank 0 (this machine) "
                        "first; repeat 127.0.0.1 for ranks on this machine")
    m.add_argument("--model", required=True, type=model_ref,
                   help="the target (the same folder must exist on every host)")
    m.add_argument("--port", type=value("cluster port"), default=39100,
                   help="first ring port; rank r uses port+r and control port port+N+r, "
                        "all at most 65535 (default 39100)")
    m.add_argument("--layers", help="layers per rank, comma-separated (default: even split)")
    m.add_argument("--remote-command", default="specchat",
                   help="how ssh runs SpecChat on the other hosts (default: specchat)")
    csub.add_parser("list", help="clusters defined here")
    s = csub.add_parser("show", help="a cluster's ranks and hostfile")
    s.add_argument("name", type=cluster_name)
    st = csub.add_parser("start", help="start ranks 1..N-1 and keep them running")
    st.add_argument("name", type=cluster_name)
    st.add_argument("--once", action="store_true", help="do not restart a rank that exits")
    r = csub.add_parser("rank", help="run one rank (what start runs on each host); reads the "
                                      "cluster's secret from standard input")
    r.add_argument("--rank", type=int, required=True)
    r.add_argument("--listen", required=True, metavar="HOST:PORT", help="the rank's control address")
    rm = csub.add_parser("rm", help="remove a cluster's definition")
    rm.add_argument("name", type=cluster_name)
    for sp in csub.choices.values():
        sp.add_argument("--json", action="store_true", help="machine-readable output")


def read(name: str):
    from specchat.engine.distributed import hostfile

    found = cluster_folder(name)
    return found, hostfile.read(found)


def main(args: argparse.Namespace) -> int:
    from specchat.engine.distributed import hostfile

    cmd = args.cluster_command
    if cmd == "create":
        folder = clusters_dir() / hostfile.check_name(args.name)
        model = refs.resolve(args.model)
        try:
            layers = [int(n) for n in args.layers.split(",")] if args.layers else None
        except ValueError:
            raise EngineError(f"--layers takes whole numbers separated by commas; got {args.layers}") from None
        ips = [h.strip() for h in args.hosts.split(",") if h.strip()]
        spec = hostfile.plan(args.name, model, ips, args.port, layers, args.remote_command)
        hostfile.write(folder, spec)
        _show(folder, spec, args.json)
        return 0
    if cmd == "list":
        names = defined()
        if args.json:
            print(json.dumps(names))
        elif not names:
            print("No clusters yet: specchat cluster create NAME ...")
        else:
            for st in states():  # dials each rank, as the app's pair picker does
                print(f"{st.name}: {st.model}, {st.ranks} ranks, "
                      + ("every rank answers" if st.waiting is None else st.waiting))
        return 0
    if cmd == "show":
        _show(*read(args.name), args.json)
        return 0
    if cmd == "rm":
        # Also a cluster whose hostfile cannot be read (a FIFO in its place):
        # removing it is how it is mended.
        folder = clusters_dir() / hostfile.check_name(args.name)
        if folder.is_symlink() or not os.path.lexists(folder / HOSTFILE):
            folder = cluster_folder(args.name)  # none of that name: says so
        with records.locked(records.lock_beside(folder)):  # not while a create writes it
            shutil.rmtree(folder)  # links, the hostfile and the secret: the model stays
        return 0
    if cmd == "start":
        from specchat.engine.distributed import secret
        from specchat.engine.distributed.launch import Supervisor

        folder, spec = read(args.name)
        return Supervisor(spec, secret.read(folder), lambda m: print(m, flush=True),
                          once=args.once).run()
    if cmd == "rank":
        from specchat.engine.distributed import secret
        from specchat.engine.distributed.rank import serve

        host, port = hostfile.parse_address(args.listen)
        return serve(args.rank, host, port, secret.from_stdin(sys.stdin.buffer, sys.stdin.isatty()))
    raise AssertionError(cmd)


def _show(folder: Path, spec, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"folder": str(folder), "hostfile": spec.to_json()}))
        return
    print(f"cluster {spec.name}: {spec.model}, {spec.size} ranks "
          f"(hostfile {folder / 'hostfile.json'})")
    for r in spec.ranks:
        role = "this machine: the app, the draft and the last layers" if r.rank == 0 else "layers"
        print(f"  rank {r.rank}: {r.ip} ring :{r.ring_port} control :{r.control_port}  ({role})")
    print(f"start ranks 1-{spec.size - 1} with `specchat cluster start {spec.name}`, then load "
          f"cluster:{spec.name} (or the folder {folder}) as the target", file=sys.stderr)
