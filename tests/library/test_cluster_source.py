"""``cluster:NAME`` (library/sources/cluster.py): a cluster folder written by
``specchat cluster create`` reads as its target for the library's checks."""

from __future__ import annotations

import pytest
from specchat.engine.distributed import hostfile
from specchat.library import compatibility, refs, sources
from specchat.library.errors import LibraryError
from specchat.library.sources.cluster import ClusterSource, clusters_dir


def test_a_cluster_resolves_to_a_folder_that_reads_as_its_target(lib_home, monkeypatch,
                                                                  tiny_target, tiny_draft):
    assert any(isinstance(s, ClusterSource) for s in sources.SOURCES)  # registered
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
    from specchat.engine.errors import EngineError

    with pytest.raises(EngineError, match="2 or more hosts"):
        hostfile.plan("one", tiny_target, ["127.0.0.1"], 39100)
    with pytest.raises(EngineError, match="lists 3 counts for 2 ranks"):
        hostfile.plan("two", tiny_target, ["127.0.0.1", "10.0.0.2"], 39100, [2, 2, 2])


def test_the_memory_check_counts_rank_0s_share_of_a_cluster_target(lib_home, tiny_target):
    """The other ranks' layers are in the other machines' memory: a 3:1
    split leaves three quarters of the target on rank 0."""
    from specchat.library.memory import check_pair

    spec = hostfile.plan("split", tiny_target, ["127.0.0.1", "127.0.0.1"], 39100, [3, 1])
    folder = hostfile.write(clusters_dir() / "split", spec)
    whole = check_pair(tiny_target, available=None).target_weights
    share = check_pair(folder, available=None).target_weights
    assert share == pytest.approx(whole * 3 / 4, rel=0.01)


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
