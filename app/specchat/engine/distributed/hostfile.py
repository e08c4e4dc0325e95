"""A cluster on disk: a folder that reads as the target's MLX folder (its
files are links to the real ones) plus ``hostfile.json`` and the cluster's
``secret`` (secret.py).

The hostfile is the JSON ``mlx.launch`` reads (``backend``, ``envs``,
``hosts`` with ``ssh`` and ``ips``), so the same file starts an MLX job by
hand; SpecChat's own fields sit under a ``specchat`` key that mlx.launch
ignores: the model folder (the same path on every host), each rank's ring
and control ports, and the pipeline split. Because the folder holds the
target's config, tokenizer and weights (as links), everything that reads a
model folder (the compatibility check, the memory estimate, the tokenizer
on rank 0) works on a cluster unchanged; only the engine asks whether a
folder is a cluster, and the answer is yes only for a folder ``specchat
cluster create`` made in ``<home>/clusters``: a model folder or a Hub
download that happens to hold a hostfile is a model like any other, so
loading it never connects anywhere.

Hosts, ports and layer splits are checked when a cluster is created and
again when its hostfile is read (it may have been edited): an address
that is not one machine's, a port past 65535, a host ssh would take for
an option. Imports no MLX.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from specchat import outputs, records, values
from specchat.engine.distributed import secret
from specchat.engine.errors import EngineError
from specchat.engine.folders import HOSTFILE, clusters_dir, is_cluster_folder, read_config

MAX_RANKS = 64
MAX_HOSTFILE_BYTES = 2**20  # a hostfile of MAX_RANKS long host names is some 30 KB
HIGHEST_PORT = 65535
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_SSH_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,31}")
_NUMBER = re.compile(r"[0-9]+|0[xX][0-9a-fA-F]*")  # a last label no name has (RFC 3696)
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")  # "this network": no machine's address
_RESERVED = ipaddress.ip_network("240.0.0.0/4")  # 255.255.255.255 among them


def check_host(host: str) -> str:
    """``host`` if it names one machine: an IP address as the system reads
    it (values.address: not one meaning every address of whichever machine
    reads it, 0.0.0.0, 0.x.x.x or ::, nor broadcast, reserved or multicast)
    written as it is read (never ``127.1``, ``0x7f.0.0.1`` or ``0177.0.0.1``,
    which a person reads otherwise than the resolver), or a host name
    (letters, digits, '-' and '.', never all digits at the end, so never an
    option to ssh, nor a number the resolver would read after all). The one
    check of every host a cluster takes: ``cluster create``'s, the
    hostfile's, a rank's ``--listen`` and the ring addresses of a join."""
    ip = values.address(host)
    if ip is None:
        if (len(host) > 253 or not _HOSTNAME.fullmatch(host)
                or _NUMBER.fullmatch(host.rpartition(".")[2])):
            raise EngineError(f"{host!r} is not an IP address or a host name.")
        return host
    try:
        written = ipaddress.ip_address(host)
    except ValueError:
        written = None
    name = host if written == ip else f"{host} (which the system reads as {ip})"
    if ip.is_unspecified:
        raise EngineError(f"{name} is not a host: it means any address of a machine; give each "
                          "machine's own address.")
    if ip in _THIS_NETWORK:
        raise EngineError(f"{name} is not a host: 0.0.0.0/8 means this network, not one machine.")
    if ip.is_multicast:
        raise EngineError(f"{name} is a multicast address, not a host.")
    if ip in _RESERVED:
        raise EngineError(f"{name} is a broadcast or reserved address, not a host.")
    if written != ip:
        raise EngineError(f"{host!r} is read by the system as {ip}: write {ip}.")
    return host


def check_name(name: str) -> str:
    """``name`` if it can name a cluster (``values.NAMES``: a folder's name of
    ``<home>/clusters``, never a path); else an EngineError in the words the
    command line's own check uses, so that no message suggests creating a
    cluster of such a name."""
    try:
        return values.name("a cluster name", name)
    except values.BadValue as exc:
        raise EngineError(f"{exc}.") from None


def check_ssh(target: str) -> str:
    """mlx.launch's ``ssh`` field: a host, or ``user@host``."""
    user, at, host = target.rpartition("@")
    if at and not _SSH_USER.fullmatch(user):
        raise EngineError(f"{target!r} is not a host or user@host.")
    check_host(host)
    return target


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets or not) as (host, port)."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isascii() or not port.isdigit() or not 1 <= int(port) <= HIGHEST_PORT:
        raise EngineError(f"{text!r} is not HOST:PORT with a port from 1 to {HIGHEST_PORT}.")
    return check_host(host), int(port)


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
        return values.is_loopback(self.ip) or values.is_loopback(self.ssh)


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
            if not (len(hosts) == len(ring) == len(control)) or not 2 <= len(hosts) <= MAX_RANKS:
                raise ValueError("hosts, ring_ports and control_ports must list the same "
                                 f"2 to {MAX_RANKS} ranks")
            ranks = tuple(Rank(i, check_ssh(_text(h["ssh"])), check_host(_text(h["ips"][0])),
                               _port(ring[i]), _port(control[i]))
                          for i, h in enumerate(hosts))
            layers = own.get("layers")
            name, model = _text(own["name"]), _text(own["model"])
            check_name(name)
            spec = cls(name=name, model=model, ranks=ranks,
                       layers=tuple(_count(n) for n in layers) if layers else None,
                       remote_command=_text(own.get("remote_command") or "specchat"))
            check_layers(spec.layers, spec.size, None)
            return spec
        except (KeyError, IndexError, TypeError, ValueError, EngineError) as exc:
            raise EngineError(f"{where} is not a SpecChat cluster hostfile ({exc}).") from None


def _text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not text")
    return value


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not a whole number")
    return value


def _port(value: object) -> int:
    if not 1 <= _count(value) <= HIGHEST_PORT:
        raise ValueError(f"port {value} is not from 1 to {HIGHEST_PORT}")
    return value


def read(folder: str | os.PathLike) -> ClusterSpec:
    """The cluster in ``folder``, its hostfile read as every file SpecChat
    reads back (specchat/records.py: a regular file, bounded)."""
    path = Path(folder) / HOSTFILE
    try:
        data = records.read_json(path, MAX_HOSTFILE_BYTES)
    except (OSError, records.BadRecord) as exc:
        raise EngineError(f"Cannot read the cluster file {path} "
                          f"({getattr(exc, 'strerror', None) or exc}).") from None
    if not isinstance(data, dict):
        raise EngineError(f"{path} is not a SpecChat cluster hostfile (not a JSON object).")
    return ClusterSpec.from_json(data, str(path))


def plan(name: str, model: str | os.PathLike, ips: list[str], port: int,
         layers: list[int] | None = None, remote_command: str = "specchat") -> ClusterSpec:
    """A cluster of ``ips`` (rank 0 first: the machine running the app).
    Ranks take ring ports ``port + rank`` and control ports
    ``port + size + rank``, so several ranks can share one host."""
    n = len(ips)
    if n < 2:
        raise EngineError("A cluster needs 2 or more hosts (rank 0 is this machine).")
    if n > MAX_RANKS:
        raise EngineError(f"A cluster has at most {MAX_RANKS} hosts; got {n}.")
    ips = [check_host(ip) for ip in ips]
    values.check("cluster port", port)
    last = port + 2 * n - 1
    if last > HIGHEST_PORT:
        raise EngineError(f"--port {port} leaves no room for {n} ranks: they use ports {port} "
                          f"to {last}, past {HIGHEST_PORT}; pick a port up to "
                          f"{HIGHEST_PORT - 2 * n + 1}.")
    if not remote_command.strip() or not remote_command.isprintable():
        # ssh would run the rank's arguments as the command, or a second line as another
        got = ("nothing" if not remote_command.strip()
               else "a line break or a control character in it")
        raise EngineError("--remote-command must say how ssh runs SpecChat on the other hosts, "
                          f"on one line; got {got}.")
    folder = Path(model).expanduser().resolve()
    check_layers(layers, n, _layer_count(folder))
    ranks = tuple(Rank(i, ip, ip, port + i, port + n + i) for i, ip in enumerate(ips))
    return ClusterSpec(name, str(folder), ranks, tuple(layers) if layers else None,
                       remote_command)


def check_layers(layers: list[int] | tuple[int, ...] | None, ranks: int,
                 total: int | None) -> None:
    """Whether a split of ``total`` layers (None: unknown) over ``ranks``
    ranks is one mlx-lm can make: a positive count per rank adding up to
    the model's layers."""
    if layers is None:
        if total is not None and total < ranks:
            raise EngineError(f"The model has {total} layers, fewer than the {ranks} ranks: "
                              "each rank needs one or more.")
        return
    if len(layers) != ranks:
        raise EngineError(f"--layers lists {len(layers)} counts for {ranks} ranks.")
    if any(n < 1 for n in layers):
        raise EngineError("--layers gives each rank 1 or more layers; got "
                          f"{','.join(map(str, layers))}.")
    if total is not None and sum(layers) != total:
        raise EngineError(f"--layers adds up to {sum(layers)} layers, but the model has "
                          f"{total}.")


def _layer_count(model: Path) -> int | None:
    """The model's layer count from its config.json (None when it does not say)."""
    config = read_config(model)
    for cfg in (config, config.get("text_config")):
        n = cfg.get("num_hidden_layers") if isinstance(cfg, dict) else None
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None


def write(folder: str | os.PathLike, spec: ClusterSpec) -> Path:
    """Write the cluster folder: the hostfile, a link to each file of the
    model folder (replacing links from an earlier version), and the
    cluster's secret unless it has one. A folder that is there and is not
    a cluster (specchat/outputs.py's rule) is refused in words. All under
    the cluster's lock (``.<name>.lock`` beside its folder): two ``cluster
    create`` of one name at once write one after the other (the last one's
    hostfile stays, both keep the one secret) instead of tripping over each
    other's files."""
    folder = Path(folder)
    model = Path(spec.model)
    read_config(model)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with records.locked(records.lock_beside(folder)):
        # A cluster is written over (defined again) only where one is
        # already: never into a folder of the person's, nor through a link
        # to one.
        folder = outputs.make_folder(folder, "the cluster", is_cluster_folder,
                                     "choose another name, or remove what is there",
                                     EngineError, home_place=clusters_dir())
        secret.ensure(folder)
        for old in folder.iterdir():
            if old.is_symlink():
                old.unlink()
        own = {HOSTFILE, HOSTFILE + ".tmp", secret.SECRET, secret.SECRET + ".tmp"}
        for f in sorted(model.iterdir()):
            if f.is_file() and f.name not in own:
                (folder / f.name).symlink_to(f.resolve())
        tmp = folder / (HOSTFILE + ".tmp")
        tmp.write_text(json.dumps(spec.to_json(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(folder / HOSTFILE)
    return folder
