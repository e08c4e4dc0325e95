"""``cluster:NAME``: the target of a cluster defined with ``specchat
cluster create``, whose layers run on several machines.

It resolves to the cluster's folder, which reads as the target's own MLX
folder (its files are links) plus the hostfile the engine looks for, so the
compatibility check and the memory estimate read the target's facts
unchanged.
"""

from __future__ import annotations

from pathlib import Path

from specchat.engine.distributed.hostfile import is_cluster_folder
from specchat.home import home
from specchat.library.errors import LibraryError
from specchat.library.sources.base import Source

PREFIX = "cluster:"


def clusters_dir() -> Path:
    return home() / "clusters"


class ClusterSource(Source):
    accepted = "cluster:NAME"
    mention = 6

    def claims(self, ref: str) -> bool:
        return ref.startswith(PREFIX)

    def resolve(self, ref: str, progress=None, cancelled=None) -> Path:
        name = ref[len(PREFIX):].strip()
        folder = clusters_dir() / name
        if not name or "/" in name or not is_cluster_folder(folder):
            root = clusters_dir()
            known = sorted(p.name for p in root.iterdir() if is_cluster_folder(p)) \
                if root.is_dir() else []
            have = f" Defined: {', '.join(known)}." if known else " None is defined yet."
            raise LibraryError(f"No cluster named {name!r}: create it with `specchat cluster "
                               f"create {name or 'NAME'} --hosts ... --model ...`.{have}")
        return folder
