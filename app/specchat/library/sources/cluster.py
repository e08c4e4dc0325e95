"""``cluster:NAME``: the target of a cluster defined with ``specchat
cluster create``, whose layers run on several machines.

It resolves to the cluster's folder, which reads as the target's own MLX
folder (its files are links) plus the hostfile the engine looks for, so the
compatibility check and the memory estimate read the target's facts
unchanged. Only the folders of ``<home>/clusters`` are clusters
(engine/folders.is_cluster_folder): a model folder holding a hostfile is not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specchat.engine.errors import EngineError
from specchat.engine.folders import HOSTFILE, clusters_dir, is_cluster_folder, model_name
from specchat.library.errors import LibraryError
from specchat.library.sources.base import Source

PREFIX = "cluster:"


def defined() -> list[str]:
    """The names of the clusters defined here, sorted."""
    return sorted(p.name for p in clusters_dir().glob("*") if is_cluster_folder(p))


@dataclass(frozen=True)
class ClusterState:
    """A cluster as the pair picker offers it: its target can be picked
    once ``waiting`` is None, i.e. every other rank answers."""

    name: str
    model: str  # the target's folder name
    ranks: int
    waiting: str | None  # why it cannot be picked yet, in words

    @property
    def ref(self) -> str:
        return PREFIX + self.name


def states(timeout: float = 0.5) -> list[ClusterState]:
    """Every defined cluster, with whether its ranks answer now. Dials each
    rank (control.probe: about ``timeout`` per rank at worst): call it
    off the GUI thread. One unreadable cluster is listed with its error."""
    from specchat.engine.distributed import control, hostfile, secret  # optional: not at start-up

    out = []
    for name in defined():
        try:
            folder = clusters_dir() / name
            spec = hostfile.read(folder)
            missing = control.probe(spec, secret.read(folder), timeout)
        except (EngineError, OSError) as exc:
            out.append(ClusterState(name, "?", 0, str(exc)))
            continue
        out.append(ClusterState(name, model_name(spec.model), spec.size,
                                missing[1] if missing else None))
    return out


class ClusterSource(Source):
    accepted = "cluster:NAME"
    mention = 6

    def claims(self, ref: str) -> bool:
        return ref.startswith(PREFIX)

    def resolve(self, ref: str, progress=None, cancelled=None) -> Path:
        return folder(ref[len(PREFIX):].strip())


def folder(name: str) -> Path:
    """The folder of the cluster named ``name`` (``cluster:NAME``, ``specchat
    cluster show NAME``); else a LibraryError in words: a name that cannot
    be one (a path: never suggested to ``cluster create``), a cluster whose
    hostfile cannot be read (why), or none of that name."""
    from specchat.engine.distributed import hostfile  # optional: not at start-up

    known = defined()
    have = f" Defined: {', '.join(known)}." if known else " None is defined yet."
    if not name:
        raise LibraryError(f"cluster: names no cluster: give cluster:NAME.{have}")
    try:
        found = clusters_dir() / hostfile.check_name(name)
        if not is_cluster_folder(found) and os.path.lexists(found / HOSTFILE):
            hostfile.read(found)  # a hostfile that is there but no file: says why
    except EngineError as exc:
        raise LibraryError(f"{exc}{have}") from None
    if not is_cluster_folder(found):
        raise LibraryError(f"No cluster named {name!r}: create it with `specchat cluster "
                           f"create {name} --hosts ... --model ...`.{have}")
    return found
