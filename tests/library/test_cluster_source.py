"""``cluster:NAME`` (library/sources/cluster.py): a cluster folder written by
``specchat cluster create`` reads as its target for the library's checks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest
from clustertools import Trap
from specchat import values
from specchat.engine import folders
from specchat.engine.distributed import hostfile, secret
from specchat.engine.errors import EngineError
from specchat.errors import SpecChatError
from specchat.library import compatibility, refs
from specchat.library.errors import LibraryError
from specchat.library.sources.cluster import ClusterSource, clusters_dir


def test_a_cluster_resolves_to_a_folder_that_reads_as_its_target(lib_home, monkeypatch,
                                                                  tiny_target, tiny_draft):
    assert any(isinstance(s, ClusterSource) for s in refs.SOURCES)  # registered
    spec = hostfile.plan("lab", tiny_target, ["127.0.0.1", "127.0.0.1"], 39100)
    folder = hostfile.write(clusters_dir() / "lab", spec)

    assert refs.resolve("cluster:lab") == folder
    assert hostfile.read(folder) == spec
    check = compatibility.check("cluster:lab", str(tiny_draft))
    assert check.compatible
    assert compatibility.describe("cluster:lab").params == compatibility.describe(
        str(tiny_target)).params
    with pytest.raises(LibraryError, match=r"No cluster named 'lap'.*Defined: lab\."):
        refs.resolve("cluster:lap")


def test_a_cluster_needs_two_hosts_and_a_split_per_rank(tiny_target):
    with pytest.raises(EngineError, match="2 or more hosts"):
        hostfile.plan("one", tiny_target, ["127.0.0.1"], 39100)
    with pytest.raises(EngineError, match="lists 3 counts for 2 ranks"):
        hostfile.plan("two", tiny_target, ["127.0.0.1", "10.0.0.2"], 39100, [2, 2, 2])


def test_the_memory_check_counts_rank_0s_share_of_a_cluster_target(lib_home, tiny_target):
    """The other ranks' layers are in the other machines' memory: a 4:2
    split of the 6 layers leaves two thirds of the target on rank 0."""
    from specchat.library.memory import check_pair

    spec = hostfile.plan("split", tiny_target, ["127.0.0.1", "127.0.0.1"], 39100, [4, 2])
    folder = hostfile.write(clusters_dir() / "split", spec)
    whole = check_pair(tiny_target, available=None).target_weights
    share = check_pair(folder, available=None).target_weights
    assert share == pytest.approx(whole * 4 / 6, rel=0.01)


def test_asking_the_ranks_names_what_is_wrong_and_one_bad_cluster_spoils_no_other(
        lib_home, tiny_target):
    """`states()` (the pair picker's and `cluster list`'s question): a port
    nobody listens on, a server that is not a SpecChat rank, and a damaged
    hostfile are each reported in words, cluster by cluster."""
    import socket
    import threading

    from specchat.library.sources.cluster import model_name, states

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    # An HTTP-ish server on rank 1's control port of "web".
    server = socket.create_server(("127.0.0.1", 0))
    web_port = server.getsockname()[1]

    def answer() -> None:
        conn, _ = server.accept()
        conn.recv(100)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n{not json\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    ips = ["127.0.0.1", "127.0.0.1"]
    hostfile.write(clusters_dir() / "web", hostfile.plan("web", tiny_target, ips, web_port - 3))
    hostfile.write(clusters_dir() / "off", hostfile.plan("off", tiny_target, ips, free_port() - 3))
    bad = hostfile.write(clusters_dir() / "bad", hostfile.plan("bad", tiny_target, ips, 39100))
    (bad / hostfile.HOSTFILE).write_text('{"hosts": []}')
    try:
        got = {s.name: s for s in states(timeout=2.0)}
    finally:
        server.close()
    assert sorted(got) == ["bad", "off", "web"]
    assert got["web"].waiting.endswith("did not answer as a SpecChat rank")
    assert got["off"].waiting.startswith("rank 1 is not running at 127.0.0.1:")
    assert "specchat cluster start off" in got["off"].waiting
    assert got["off"].model == tiny_target.name and got["off"].ranks == 2
    assert "is not a SpecChat cluster hostfile" in got["bad"].waiting
    # A Hub download's folder is named by its repository, not its commit.
    snap = "/cache/models--Qwen--Qwen2.5-7B-Instruct/snapshots/" + "a" * 40
    assert model_name(snap) == "Qwen/Qwen2.5-7B-Instruct"


LOCAL2 = ["127.0.0.1", "127.0.0.1"]


@pytest.mark.parametrize("hosts, port, layers, message", [
    (["127.0.0.1", "-oProxyCommand=touch x"], 39100, None,
     "'-oProxyCommand=touch x' is not an IP address or a host name."),
    (["127.0.0.1", "host name"], 39100, None, "'host name' is not an IP address or a host name."),
    (["0.0.0.0", "10.0.0.2"], 39100, None,
     "0.0.0.0 is not a host: it means any address of a machine; give each machine's own address."),
    (["127.0.0.1", "::"], 39100, None,
     ":: is not a host: it means any address of a machine; give each machine's own address."),
    (["127.0.0.1", "224.0.0.1"], 39100, None, "224.0.0.1 is a multicast address, not a host."),
    # Every address as the system's resolver reads it (inet_aton's short,
    # octal and hex forms; IPv4 inside IPv6), not only as written.
    *((["127.0.0.1", host], 39100, None,
       f"{host} (which the system reads as {ip}) is not a host: it means any address of a "
       "machine; give each machine's own address.")
      for host, ip in (("0", "0.0.0.0"), ("0x0", "0.0.0.0"), ("00", "0.0.0.0"),
                       ("0.0", "0.0.0.0"), ("::ffff:0.0.0.0", "0.0.0.0"))),
    (["127.0.0.1", "0:0:0:0:0:0:0:0"], 39100, None, "0:0:0:0:0:0:0:0 is not a host: it means "
                                                    "any address of a machine; give each "
                                                    "machine's own address."),
    (["127.0.0.1", "0.1.2.3"], 39100, None,
     "0.1.2.3 is not a host: 0.0.0.0/8 means this network, not one machine."),
    (["127.0.0.1", "255.255.255.255"], 39100, None,
     "255.255.255.255 is a broadcast or reserved address, not a host."),
    (["127.0.0.1", "4294967295"], 39100, None, "4294967295 (which the system reads as "
                                               "255.255.255.255) is a broadcast or reserved "
                                               "address, not a host."),
    (["127.0.0.1", "::ffff:240.0.0.1"], 39100, None, "::ffff:240.0.0.1 (which the system reads "
                                                     "as 240.0.0.1) is a broadcast or reserved "
                                                     "address, not a host."),
    (["127.0.0.1", "0xe0.1"], 39100, None,
     "0xe0.1 (which the system reads as 224.0.0.1) is a multicast address, not a host."),
    (["127.0.0.1", "ff02::1"], 39100, None, "ff02::1 is a multicast address, not a host."),
    *((["127.0.0.1", host], 39100, None, f"'{host}' is read by the system as {ip}: write {ip}.")
      for host, ip in (("127.1", "127.0.0.1"), ("0177.0.0.1", "127.0.0.1"),
                       ("0x7f.0.0.1", "127.0.0.1"), ("2130706433", "127.0.0.1"),
                       ("10.2", "10.0.0.2"), ("::ffff:10.0.0.2", "10.0.0.2"))),
    *((["127.0.0.1", host], 39100, None, f"'{host}' is not an IP address or a host name.")
      for host in ("1.2.3.256", "4294967296", "0x", "10.0.0.2.", "host.123")),
    (LOCAL2, 65533, None, "--port 65533 leaves no room for 2 ranks: they use ports 65533 to "
                          "65536, past 65535; pick a port up to 65532."),
    (LOCAL2, 70000, None,
     "cluster port must be a whole number from 1 to 65535 (a cluster's first port); got 70000"),
    (LOCAL2, 0, None,
     "cluster port must be a whole number from 1 to 65535 (a cluster's first port); got 0"),
    (LOCAL2, 39100, [6, 0], "--layers gives each rank 1 or more layers; got 6,0."),
    (LOCAL2, 39100, [-1, 7], "--layers gives each rank 1 or more layers; got -1,7."),
    (LOCAL2, 39100, [4, 4], "--layers adds up to 8 layers, but the model has 6."),
    (["127.0.0.1"] * 7, 39100, None,
     "The model has 6 layers, fewer than the 7 ranks: each rank needs one or more."),
    (["127.0.0.1"] * 65, 1000, None, "A cluster has at most 64 hosts; got 65."),
])
def test_create_refuses_what_cannot_be_a_cluster(tiny_target, hosts, port, layers, message):
    with pytest.raises(SpecChatError) as err:
        hostfile.plan("lab", tiny_target, hosts, port, layers)
    assert str(err.value) == message


def test_a_host_written_as_the_system_reads_it_is_taken():
    for host in ("10.0.0.2", "127.0.0.2", "::1", "fe80::1%lo", "2001:db8::7", "mac-studio.local",
                 "deadbeef", "host-7"):
        assert hostfile.check_host(host) == host


def test_create_says_what_is_wrong_in_one_line_and_writes_nothing(lib_home, tiny_target):
    for hosts, port, message in (
            ("127.0.0.1,-oProxyCommand=x", "39100",
             "'-oProxyCommand=x' is not an IP address or a host name."),
            *((f"127.0.0.1,{host}", "39100", f"{host} (which the system reads as 0.0.0.0) is "
                                             "not a host: it means any address of a machine; "
                                             "give each machine's own address.")
              for host in ("::ffff:0.0.0.0", "0", "0x0")),
            ("127.0.0.1,255.255.255.255", "39100",
             "255.255.255.255 is a broadcast or reserved address, not a host."),
            ("127.1,10.0.0.2", "39100", "'127.1' is read by the system as 127.0.0.1: write "
                                        "127.0.0.1."),
            ("127.0.0.1,10.0.0.2", "65535", "--port 65535 leaves no room for 2 ranks: they use "
                                            "ports 65535 to 65538, past 65535; pick a port up "
                                            "to 65532.")):
        proc = subprocess.run([sys.executable, "-m", "specchat", "cluster", "create", "lab",
                               f"--hosts={hosts}", "--model", str(tiny_target), "--port", port],
                              capture_output=True, text=True, timeout=60)
        assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", f"specchat: error: {message}\n")
    assert not clusters_dir().exists()


def test_a_hostfile_edited_to_a_bad_host_or_port_is_refused_when_read(lib_home, tiny_target):
    folder = hostfile.write(clusters_dir() / "lab",
                            hostfile.plan("lab", tiny_target, LOCAL2, 39100))
    path = folder / hostfile.HOSTFILE
    good = json.loads(path.read_text())
    for edit, why in (
            (lambda d: d["hosts"][1].update(ssh="-oProxyCommand=x"),
             "'-oProxyCommand=x' is not an IP address or a host name."),
            (lambda d: d["hosts"][1].update(ips=["0.0.0.0"]),
             "0.0.0.0 is not a host: it means any address of a machine; give each machine's own "
             "address."),
            (lambda d: d["hosts"][1].update(ips=["0x0"]),
             "0x0 (which the system reads as 0.0.0.0) is not a host: it means any address of a "
             "machine; give each machine's own address."),
            (lambda d: d["hosts"][1].update(ssh="user@0"),
             "0 (which the system reads as 0.0.0.0) is not a host: it means any address of a "
             "machine; give each machine's own address."),
            (lambda d: d["hosts"][1].update(ips=["0177.0.0.1"]),
             "'0177.0.0.1' is read by the system as 127.0.0.1: write 127.0.0.1."),
            (lambda d: d["specchat"].update(control_ports=[39102, 70000]),
             "port 70000 is not from 1 to 65535"),
            (lambda d: d["specchat"].update(layers=[7, -1]),
             "--layers gives each rank 1 or more layers; got 7,-1.")):
        data = json.loads(json.dumps(good))
        edit(data)
        path.write_text(json.dumps(data))
        with pytest.raises(EngineError) as err:
            hostfile.read(folder)
        assert str(err.value) == f"{path} is not a SpecChat cluster hostfile ({why})."


def test_the_secret_is_made_once_for_the_owner_alone(lib_home, tiny_target):
    """Made by the first write, kept by the next (ranks started with it
    still answer), readable by its owner only; one others can read is
    refused."""
    from specchat.engine.distributed import secret

    spec = hostfile.plan("lab", tiny_target, LOCAL2, 39100)
    folder = hostfile.write(clusters_dir() / "lab", spec)
    key = secret.read(folder)
    assert len(key) == 32 and (folder / "secret").stat().st_mode & 0o777 == 0o600
    hostfile.write(folder, spec)
    assert secret.read(folder) == key
    (folder / "secret").chmod(0o644)
    with pytest.raises(EngineError) as err:
        secret.read(folder)
    assert str(err.value) == (f"{folder / 'secret'} can be read by other users (mode 0644): "
                              f"run `chmod 600 {folder / 'secret'}`.")


WRITE_CLUSTER = """
import sys
from pathlib import Path
from specchat.engine.distributed import hostfile
from specchat.engine.folders import clusters_dir
spec = hostfile.plan("lab", Path(sys.argv[1]), ["127.0.0.1", "127.0.0.1"], int(sys.argv[2]))
for _ in range(20):
    hostfile.write(clusters_dir() / "lab", spec)
"""


def test_one_cluster_created_by_processes_at_once_is_whole(lib_home, tmp_path, tiny_target):
    """What `cluster create` writes, by four processes at once, many times
    each: each once tripped over another's links, secret or hostfile being
    replaced (FileExistsError, FileNotFoundError) and ended on a traceback.
    Now they write one after the other; the cluster reads whole, with one
    secret for the owner alone."""
    from atonce import run_at_once
    from libtools import specchat_env
    from specchat.engine.distributed import secret

    env = specchat_env(tmp_path, lib_home)
    runs = run_at_once([[sys.executable, "-c", WRITE_CLUSTER, str(tiny_target), str(port)]
                        for port in (39100, 39200, 39300, 39400)], env)
    assert [r.returncode for r in runs] == [0] * 4, [r.stderr[-300:] for r in runs]
    folder = clusters_dir() / "lab"
    assert hostfile.read(folder).ranks[0].ring_port in (39100, 39200, 39300, 39400)
    assert len(secret.read(folder)) == 32
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*(f.name for f in tiny_target.iterdir()), "hostfile.json", "secret"])


def _hostfile_dialling(trap: Trap, tiny_target) -> bytes:
    """A hostfile whose rank 1 listens on the trap: what loading a folder
    holding it as a cluster would dial."""
    spec = hostfile.plan("evil", tiny_target, LOCAL2, trap.port - 3)
    return json.dumps(spec.to_json()).encode()


def test_a_model_folder_holding_a_hostfile_loads_as_a_model(lib_home, tmp_path, tiny_target):
    """Only `specchat cluster create` makes a cluster: a folder elsewhere
    with a hostfile loads on this machine and dials nobody."""
    from specchat.engine.session import Engine

    folder = shutil.copytree(tiny_target, tmp_path / "downloaded-model")
    with Trap() as trap:
        (folder / hostfile.HOSTFILE).write_bytes(_hostfile_dialling(trap, tiny_target))
        assert not folders.is_cluster_folder(folder)
        pair = Engine().load(folder)
        assert pair.target.name == "downloaded-model" and pair.target.path == str(folder)
        time.sleep(0.5)
        assert trap.calls == []
    assert compatibility.describe(str(folder)).params == compatibility.describe(
        str(tiny_target)).params


def _specchat(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specchat", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_a_fifo_in_a_clusters_files_is_refused_in_words_not_waited_on(lib_home, tiny_target):
    """Every file of a cluster folder is read as specchat/records.py reads
    files: a FIFO as the secret hung `cluster list`, `cluster start` and
    `generate --target cluster:NAME` for good; as the hostfile it read as
    "no cluster named". Now each says what is there, at once; `cluster
    create` again makes a new secret in the FIFO's place, and `cluster rm`
    removes a cluster whose hostfile is one."""
    import os

    folder = hostfile.write(clusters_dir() / "lab", hostfile.plan("lab", tiny_target, LOCAL2,
                                                                  39100))
    (folder / "secret").unlink()
    os.mkfifo(folder / "secret", 0o600)
    why = (f"The cluster in {folder} has no readable secret ({folder / 'secret'}: it is a FIFO "
           "(named pipe), not a regular file); run `specchat cluster create` for it again.")
    listed = _specchat("cluster", "list", timeout=30)
    assert (listed.returncode, listed.stdout) == (0, f"lab: ?, 0 ranks, {why}\n")
    started = _specchat("cluster", "start", "lab", "--once", timeout=30)
    assert (started.returncode, started.stderr) == (1, f"specchat: error: {why}\n")
    generated = _specchat("generate", "--target", "cluster:lab", "--plain", "--prompt", "Hi",
                          "--max-tokens", "1", timeout=120)
    assert generated.returncode == 1 and why in generated.stderr, generated.stderr
    assert "Traceback" not in generated.stderr
    created = _specchat("cluster", "create", "lab", "--hosts", "127.0.0.1,127.0.0.1",
                        "--model", str(tiny_target))
    assert created.returncode == 0, created.stderr
    assert len(secret.read(folder)) == 32

    (folder / hostfile.HOSTFILE).unlink()
    os.mkfifo(folder / hostfile.HOSTFILE)
    why = (f"Cannot read the cluster file {folder / hostfile.HOSTFILE} (it is a FIFO (named "
           "pipe), not a regular file).")
    shown = _specchat("cluster", "show", "lab", timeout=30)
    assert (shown.returncode, shown.stderr) == (1, f"specchat: error: {why} None is defined "
                                                   "yet.\n")
    with pytest.raises(LibraryError) as err:
        refs.resolve("cluster:lab")
    assert str(err.value) == f"{why} None is defined yet."
    removed = _specchat("cluster", "rm", "lab")  # how such a cluster is mended
    assert removed.returncode == 0, removed.stderr
    assert not folder.exists()


def test_a_cluster_name_with_path_parts_is_refused_as_a_name(lib_home, tiny_target):
    """`cluster:../../tmp` suggested `specchat cluster create ../../tmp`;
    every place that takes a cluster's name refuses one that cannot be a
    name, in the same words, and suggests nothing."""
    hostfile.write(clusters_dir() / "lab", hostfile.plan("lab", tiny_target, LOCAL2, 39100))
    for name in ("../../tmp", "a/b", "..", ".hidden", "l\tab", "x" * 65):
        with pytest.raises(LibraryError) as err:
            refs.resolve(f"cluster:{name}")
        assert str(err.value).startswith("a cluster name must be letters, digits"), name
        assert str(err.value).endswith(f"got '{values.shown(name)}'. Defined: lab."), name
        assert "create" not in str(err.value)
    for args in (("show", "../../tmp"), ("rm", "../lab"), ("start", "a/b"),
                 ("create", "lab\n", "--hosts", "127.0.0.1,127.0.0.1", "--model",
                  str(tiny_target))):
        proc = _specchat("cluster", *args)
        assert proc.returncode == 2 and "a cluster name must be" in proc.stderr, proc.stderr
        assert f"cluster create {args[1]}" not in proc.stderr  # no suggestion to make it
    assert [p.name for p in clusters_dir().iterdir() if p.suffix != ".lock"] == ["lab"]
