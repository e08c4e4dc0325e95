"""A cluster on disk: a folder that reads as the target's MLX folder (its
files are links to the real ones) plus ``hostfile.json``.

The hostfile is the JSON ``mlx.launch`` reads (``backend``, ``envs``,
``hosts`` with ``ssh`` and ``ips``), so the same file starts an MLX job by
hand; SpecChat's own fields sit under a ``specchat`` key that mlx.launch
ignores: the model folder (the same path on every host), each rank's ring
and control ports, and the pipeline split. Because the folder holds the
target's config, tokenizer and weights (as links), everything that reads a
model folder (the compatibility check, the memory estimate, the tokenizer
on rank 0) works on a cluster unchanged; only the engine looks for the
hostfile. Imports no MLX: the library and the CLI read clusters too.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from specchat.engine.errors import EngineError

HOSTFILE = "hostfile.json"
LOCAL_IPS = {"127.0.0.1", "::1", "localhost"}


@dataclass(frozen=True)
class Rank:
    rank: int
    ssh: str  # how to reach the host (mlx.launch's "ssh")
    ip: str  # the address the ring and the control channel use
    ring_port: int
    control_port: int

    @property
    def ring_address(self) -> str:
        return f"{self.ip}:{self.ring_port}"

    @property
    def control_address(self) -> tuple[str, int]:
        return self.ip, self.control_port

    @property
    def local(self) -> bool:
        """Whether this rank runs on this machine (started without ssh)."""
        return self.ip in LOCAL_IPS or self.ssh in LOCAL_IPS


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    model: str  # the target's MLX folder, at this path on every host
    ranks: tuple[Rank, ...]
    layers: tuple[int, ...] | None = None  # layers per rank; None: mlx-lm's even split
    remote_command: str = "specchat"  # how ssh runs SpecChat on another host

    @property
    def size(self) -> int:
        return len(self.ranks)

    def ring_hostfile(self) -> list[list[str]]:
        """What the ring backend reads from MLX_HOSTFILE: addresses by rank."""
        return [[r.ring_address] for r in self.ranks]

    def to_json(self) -> dict:
        return {
            "backend": "ring",
            "envs": [],
            "hosts": [{"ssh": r.ssh, "ips": [r.ip], "rdma": []} for r in self.ranks],
            "specchat": {
                "name": self.name,
                "model": self.model,
                "ring_ports": [r.ring_port for r in self.ranks],
                "control_ports": [r.control_port for r in self.ranks],
                "layers": list(self.layers) if self.layers else None,
                "remote_command": self.remote_command,
            },
        }

    @classmethod
    def from_json(cls, data: dict, where: str) -> ClusterSpec:
        try:
            own = data["specchat"]
            hosts = data["hosts"]
            ring, control = own["ring_ports"], own["control_ports"]
            if not (len(hosts) == len(ring) == len(control)) or len(hosts) < 2:
                raise ValueError("hosts, ring_ports and control_ports must list the same "
                                 "2 or more ranks")
            ranks = tuple(Rank(i, str(h["ssh"]), str(h["ips"][0]), int(ring[i]), int(control[i]))
                          for i, h in enumerate(hosts))
            layers = own.get("layers")
            return cls(name=str(own["name"]), model=str(own["model"]), ranks=ranks,
                       layers=tuple(int(n) for n in layers) if layers else None,
                       remote_command=str(own.get("remote_command") or "specchat"))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EngineError(f"{where} is not a SpecChat cluster hostfile ({exc}).") from None


def is_cluster_folder(path: str | os.PathLike) -> bool:
    return (Path(path) / HOSTFILE).is_file()


def read(folder: str | os.PathLike) -> ClusterSpec:
    path = Path(folder) / HOSTFILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EngineError(f"Cannot read the cluster file {path} ({exc}).") from None
    return ClusterSpec.from_json(data, str(path))


def plan(name: str, model: str | os.PathLike, ips: list[str], port: int,
         layers: list[int] | None = None, remote_command: str = "specchat") -> ClusterSpec:
    """A cluster of ``ips`` (rank 0 first: the machine running the app).
    Ranks take ring ports ``port + rank`` and control ports
    ``port + size + rank``, so several ranks can share one host."""
    n = len(ips)
    if n < 2:
        raise EngineError("A cluster needs 2 or more hosts (rank 0 is this machine).")
    if layers is not None and len(layers) != n:
        raise EngineError(f"--layers lists {len(layers)} counts for {n} ranks.")
    ranks = tuple(Rank(i, ip, ip, port + i, port + n + i) for i, ip in enumerate(ips))
    return ClusterSpec(name, str(Path(model).expanduser().resolve()), ranks,
                       tuple(layers) if layers else None, remote_command)


def write(folder: str | os.PathLike, spec: ClusterSpec) -> Path:
    """Write the cluster folder: the hostfile and a link to each file of
    the model folder (replacing links from an earlier version)."""
    folder = Path(folder)
    model = Path(spec.model)
    if not (model / "config.json").is_file():
        raise EngineError(f"{model} is not an MLX model folder (no config.json).")
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        if old.is_symlink():
            old.unlink()
    for f in sorted(model.iterdir()):
        if f.is_file() and f.name != HOSTFILE:
            (folder / f.name).symlink_to(f.resolve())
    tmp = folder / (HOSTFILE + ".tmp")
    tmp.write_text(json.dumps(spec.to_json(), indent=2) + "\n", encoding="utf-8")
    tmp.replace(folder / HOSTFILE)
    return folder
