"""A rank's control port facing strangers: real ``specchat cluster rank``
processes on loopback, real sockets, and the real ``cluster start``.

A rank obeys only a rank 0 that proves the cluster's secret
(engine/distributed/handshake.py); anything else a connection sends
closes that connection, and the rank keeps waiting for the real rank 0.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from clustertools import Lines, Trap, exchange, free_base, start_rank, stop
from specchat.engine.distributed import control, handshake, hostfile, wire
from specchat.engine.distributed.wire import MAX_LINE, Line
from specchat.engine.errors import EngineError

HERE = Path(__file__).parent


def _line(msg: dict) -> bytes:
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()


def _refused(why: str) -> bytes:
    """The line a rank sends before it closes a connection it refuses."""
    return _line({"error": {"text": f"refused: {why}"}})


def _spec(tiny_target, base: int) -> hostfile.ClusterSpec:
    """Cluster "lab": rank 0 here, rank 1 with control port base + 3."""
    return hostfile.plan("lab", tiny_target, ["127.0.0.1", "127.0.0.1"], base)


@pytest.fixture
def trap():
    with Trap() as t:
        yield t


def test_a_stranger_cannot_make_a_rank_its_own(tiny_target, trap: Trap):
    """The attack: connect to rank 1's control port and send a join naming
    your own ring address. Today's rank answered, dialled that address and
    closed its port; now it refuses, dials nothing, and the real rank 0
    still joins."""
    key = secrets.token_bytes(32)
    base = free_base(4)
    port, calls = trap.port, trap.calls
    rank, out = start_rank(1, base + 3, key)
    try:
        evil = {"cluster": "evil", "rank": 1, "size": 2, "model": str(tiny_target),
                "layers": None, "ring": [[f"127.0.0.1:{port}"], [f"127.0.0.1:{base + 1}"]]}
        assert exchange(base + 3, _line({"join": evil})) == _refused(
            "a message other than hello")
        # With the handshake, and a proof made with another secret.
        hello = _line({"hello": {"nonce": secrets.token_hex(32)}})
        got = exchange(base + 3, hello, _line({"join": evil, "proof": "0" * 64}))
        challenge, answer = got.splitlines(keepends=True)
        assert json.loads(challenge)["challenge"]["rank"] == 1
        assert answer == _refused("a request without proof of the cluster's secret")
        time.sleep(1.0)
        assert calls == [] and rank.poll() is None
        # The real rank 0 joins after them, and leaves before the ring starts:
        # the rank sees it at once (it waits for rank 0's word before it
        # enters MLX's ring, which would hold the GIL for about 30 s).
        peers = control.Peers(_spec(tiny_target, base), key)
        peers.connect()
        out.wait_for("rank 0 joined cluster lab")
        peers.close()
        out.wait_for("rank 0 left; exiting", timeout=10)
        assert rank.wait(10) == 0
        assert calls == []
    finally:
        stop(rank)


def test_a_bad_line_closes_its_connection_and_nothing_else(tiny_target):
    """Each of these ended today's rank with a traceback. Now each closes
    its own connection (with the reason), a connection that says nothing
    holds up no other, and the rank still answers its cluster's probe."""
    key = secrets.token_bytes(32)
    base = free_base(4)
    spec = _spec(tiny_target, base)
    rank, out = start_rank(1, base + 3, key)
    silent = socket.create_connection(("127.0.0.1", base + 3))
    try:
        cases = {
            b"x\n": "a line that is not UTF-8 JSON",
            b"[1,2]\n": "a line that is not a JSON object",
            b"\xff\xfe{}\n": "a line that is not UTF-8 JSON",
            b'{"join": "x"}\n': "a message other than hello",
            b"[" * 50_000 + b"\n": "a line that is not UTF-8 JSON",
            b'{"hello": {"nonce": "zz"}}\n': "a hello message with a bad nonce",
            b'{"hello": {"nonce": "' + b"a" * 64 + b'", "x": 1}}\n':
                "a hello message without exactly the fields ['nonce']",
        }
        for data, why in cases.items():
            assert exchange(base + 3, data) == _refused(why), data[:40]
        # A line past the limit, never ended: cut off (the reason may be
        # lost to the reset of the bytes the rank did not read).
        assert exchange(base + 3, b"a" * (MAX_LINE + 2)) in (
            b"", _refused(f"a line longer than {MAX_LINE} bytes"))
        # Someone else's secret: both ends refuse.
        other = secrets.token_bytes(32)
        lost = control.probe(spec, other, timeout=2.0)
        assert lost == (1, f"the process at 127.0.0.1:{base + 3} holds another secret than "
                           "this cluster's (a rank of another cluster, or of this one created "
                           "again): restart the ranks with `specchat cluster start lab`")
        with pytest.raises(EngineError, match=r"^The process at 127\.0\.0\.1:\d+ holds another "
                                              r"secret than this cluster's"):
            control.Peers(spec, other).connect()
        # The silent connection is closed at its deadline; nothing waited for it.
        silent.settimeout(10)
        assert silent.recv(1000) == _refused("no answer within 5 s")
        out.wait_for("refused a connection from 127.0.0.1: no answer within 5 s")
        assert control.probe(spec, key, timeout=2.0) is None
        assert rank.poll() is None
        assert "Traceback" not in out.text()
        # Each refusal in words: the cases, the long line, the two of
        # another secret (they hang up after the rank's proof), the silent one.
        assert out.text().count("refused a connection from 127.0.0.1") == len(cases) + 4
    finally:
        silent.close()
        stop(rank)


def test_a_recorded_join_replayed_to_the_next_rank_is_refused(tiny_target):
    """Someone who recorded rank 0's join on the network and replays it to
    the rank the supervisor starts next gets nothing: the rank's nonce is
    new, so the old proof does not match."""
    key = secrets.token_bytes(32)
    base = free_base(4)
    upstream = base + 3
    relay = socket.create_server(("127.0.0.1", 0))
    recorded = bytearray()

    def record() -> None:
        client, _ = relay.accept()
        rank_side = socket.create_connection(("127.0.0.1", upstream))

        def pump(src, dst, keep) -> None:
            try:
                while data := src.recv(65536):
                    if keep is not None:
                        keep += data
                    dst.sendall(data)
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        threading.Thread(target=pump, args=(rank_side, client, None), daemon=True).start()
        pump(client, rank_side, recorded)

    recorder = threading.Thread(target=record, daemon=True)
    recorder.start()
    spec = _spec(tiny_target, base)
    via = hostfile.ClusterSpec(spec.name, spec.model, (spec.ranks[0], hostfile.Rank(
        1, "127.0.0.1", "127.0.0.1", spec.ranks[1].ring_port, relay.getsockname()[1])))
    first, out = start_rank(1, upstream, key)
    try:
        peers = control.Peers(via, key)
        peers.connect()
        out.wait_for("rank 0 joined cluster lab")
        peers.close()
        recorder.join(10)
        hello, join = bytes(recorded).splitlines(keepends=True)
        assert json.loads(join)["join"]["model"] == str(tiny_target)
    finally:
        stop(first)
        relay.close()
    second, out = start_rank(1, upstream, key)
    try:
        got = exchange(upstream, hello, join)
        challenge, answer = got.splitlines(keepends=True)
        assert "challenge" in json.loads(challenge)
        assert answer == _refused("a request without proof of the cluster's secret")
        assert second.poll() is None
        assert "rank 0 joined" not in out.text()
        assert control.probe(spec, key, timeout=2.0) is None
    finally:
        stop(second)


def test_strangers_do_not_make_cluster_start_give_up(tmp_path, tiny_target):
    """Today three bad lines in a row ended rank 1 three times within
    seconds, and `cluster start` gave up on it for good."""
    env = dict(os.environ, SPECCHAT_HOME=str(tmp_path / "home"))
    base = free_base(4)
    subprocess.run([sys.executable, "-m", "specchat", "cluster", "create", "lab", "--hosts",
                    "127.0.0.1,127.0.0.1", "--model", str(tiny_target), "--port", str(base)],
                   env=env, check=True, capture_output=True, timeout=60)
    sup = subprocess.Popen([sys.executable, "-m", "specchat", "cluster", "start", "lab"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = Lines(sup)
    try:
        out.wait_for("waiting for rank 0")
        for data in (b"x\n", b"[1,2]\n", b"\xff\n", b'{"join": "x"}\n'):
            deadline = time.monotonic() + 20
            while True:  # today's rank is being restarted between them
                try:
                    exchange(base + 3, data)
                    break
                except ConnectionRefusedError:
                    assert time.monotonic() < deadline, out.text()
                    time.sleep(0.2)
        time.sleep(4)  # longer than a quick exit and a restart
        assert sup.poll() is None, out.text()
        assert "exited" not in out.text()
        listed = subprocess.run([sys.executable, "-m", "specchat", "cluster", "list"], env=env,
                                capture_output=True, text=True, timeout=60)
        assert listed.stdout == f"lab: {tiny_target.name}, 2 ranks, every rank answers\n"
    finally:
        sup.send_signal(signal.SIGTERM)
        try:
            sup.wait(15)
        except subprocess.TimeoutExpired:
            sup.kill()
        sup.stdout.close()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_rank_killed_in_the_ring_leaves_no_file(tmp_path, tiny_target, sig):
    """Today the ring layout sat in $TMPDIR while the rank waited in MLX's
    ring, and stayed there when it was killed. Now it is a pipe: nothing
    on disk, during or after."""
    key = secrets.token_bytes(32)
    base = free_base(4)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    rank, out = start_rank(1, base + 3, key, tmp)
    peers = control.Peers(_spec(tiny_target, base), key)
    try:
        peers.connect()
        peers.open_ring()  # rank 0 never opens its ring port: rank 1 waits in init
        out.wait_for("rank 0 joined cluster lab")
        time.sleep(1.5)
        assert rank.poll() is None
        assert list(tmp.iterdir()) == []
        rank.send_signal(sig)
        assert rank.wait(10) == -sig
        assert list(tmp.iterdir()) == []
    finally:
        peers.close()
        stop(rank)


def test_a_rank_whose_ring_port_is_taken_refuses_to_join_in_words(tiny_target):
    """MLX would find the taken port only inside ``init``, while rank 0
    waited there for this rank with the GIL held (the app frozen for about
    30 s); the rank checks before it joins, and keeps waiting."""
    key = secrets.token_bytes(32)
    base = free_base(4)
    spec = _spec(tiny_target, base)
    ring = spec.ranks[1].ring_port
    rank, out = start_rank(1, base + 3, key)
    squatter = socket.create_server(("127.0.0.1", ring))
    try:
        with pytest.raises(EngineError) as got:
            control.Peers(spec, key).connect()
        assert str(got.value) == (
            f"Rank 1 of cluster lab (127.0.0.1:{base + 3}) refused to join: this rank cannot "
            f"listen on its ring address 127.0.0.1:{ring} (Address already in use).")
        assert rank.poll() is None and "rank 0 joined" not in out.text()
        squatter.close()
        peers = control.Peers(spec, key)
        peers.connect()  # the port is free again: the same rank joins
        out.wait_for("rank 0 joined cluster lab")
        peers.close()
        assert rank.wait(10) == 0
    finally:
        squatter.close()
        stop(rank)


def test_a_rank_checks_what_rank_0_sends_after_the_join(tiny_target):
    """After the join, rank 0 may only say ``ring``: anything else ends the
    rank, in words, before it enters MLX's ring."""
    key = secrets.token_bytes(32)
    base = free_base(4)
    rank, out = start_rank(1, base + 3, key)
    peers = control.Peers(_spec(tiny_target, base), key)
    try:
        peers.connect()
        out.wait_for("rank 0 joined cluster lab")
        peers.lines[1].sock.sendall(b'{"ring": {"host": "10.0.0.9"}}\n')
        out.wait_for("rank 1: rank 0 sent a ring message without exactly the fields []; "
                     "exiting", timeout=10)
        assert rank.wait(10) == 0
    finally:
        peers.close()
        stop(rank)


def test_a_joined_rank_that_sends_nonsense_is_lost_in_words(tiny_target):
    """Rank 0's watchdog checks what a joined rank sends as the rank checks
    rank 0's: a bad line loses that rank, with the reason."""
    key = secrets.token_bytes(32)
    base = free_base(4)
    server = socket.create_server(("127.0.0.1", base + 3))

    def fake_rank() -> None:
        conn, _ = server.accept()
        line = Line(conn)
        assert handshake.answer(line, key, 1, 5.0).kind == "join"
        line.send({"joined": {"rank": 1, "pid": os.getpid()}})
        line.send({"beat": {}})
        conn.sendall(b'{"loaded": {"seq": "1"}}\n')
        time.sleep(5)
        conn.close()

    threading.Thread(target=fake_rank, daemon=True).start()
    peers = control.Peers(_spec(tiny_target, base), key)
    try:
        peers.connect()
        peers.watch()
        assert peers.wait_lost(5) == (1, "sent a loaded message without exactly the fields "
                                         "['layer_bytes', 'layer_params', 'layers', 'seq'], "
                                         "which SpecChat does not understand")
    finally:
        peers.close()
        server.close()


def test_ssh_gets_the_host_after_a_double_dash_and_the_secret_on_stdin(tmp_path, tiny_target):
    """`cluster start` runs a remote rank as ``ssh -o BatchMode=yes --
    HOST COMMAND`` (a host is never an option), with the secret as the
    session's stdin and nowhere in the command (a stand-in ssh records
    both)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SSH_ARGS"\n'
                                 'cat > "$SSH_STDIN"\n')
    (bin_dir / "ssh").chmod(0o755)
    home = tmp_path / "home"
    env = dict(os.environ, SPECCHAT_HOME=str(home), PATH=f"{bin_dir}:{os.environ['PATH']}",
               SSH_ARGS=str(tmp_path / "args"), SSH_STDIN=str(tmp_path / "stdin"))
    subprocess.run([sys.executable, "-m", "specchat", "cluster", "create", "lab", "--hosts",
                    "127.0.0.1,10.0.0.2", "--model", str(tiny_target), "--port", "39100"],
                   env=env, check=True, capture_output=True, timeout=60)
    start = subprocess.run([sys.executable, "-m", "specchat", "cluster", "start", "lab", "--once"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert start.returncode == 0, start.stderr
    assert "specchat cluster: rank 1 exited (0)" in start.stdout
    args = (tmp_path / "args").read_text().splitlines()
    assert args == ["-o", "BatchMode=yes", "--", "10.0.0.2",
                    "specchat cluster rank --rank 1 --listen 10.0.0.2:39103"]
    key = (home / "clusters" / "lab" / "secret").read_text()
    assert (tmp_path / "stdin").read_text() == key


def test_a_rank_listens_and_joins_only_on_one_machines_address(tiny_target):
    """The one host check (hostfile.check_host, on the address as the
    system reads it) for every host a rank takes: its ``--listen``, and the
    ring addresses of a join."""
    for listen, why in (
            ("0:39103", "0 (which the system reads as 0.0.0.0) is not a host: it means any "
                        "address of a machine; give each machine's own address."),
            ("127.1:39103", "'127.1' is read by the system as 127.0.0.1: write 127.0.0.1.")):
        proc = subprocess.run([sys.executable, "-m", "specchat", "cluster", "rank", "--rank", "1",
                               "--listen", listen], input=b"", capture_output=True, timeout=60)
        assert (proc.returncode, proc.stderr.decode()) == (1, f"specchat: error: {why}\n")
    join = {"cluster": "lab", "rank": 1, "size": 2, "model": str(tiny_target), "layers": None,
            "ring": [["127.0.0.1:39100"], ["127.0.0.1:39101"]]}
    assert wire.check({"join": join, "proof": "0" * 64}, ["join"], proof=True).kind == "join"
    for bad in ("0x0:39101", "0x7f.1:39101", "255.255.255.255:39101", "[::ffff:0.0.0.0]:39101"):
        join["ring"][1] = [bad]
        with pytest.raises(wire.ProtocolError, match="^a join message with a bad ring$"):
            wire.check({"join": join, "proof": "0" * 64}, ["join"], proof=True)


def test_a_rank_without_the_secret_on_stdin_refuses_to_start():
    for stdin in (b"", b"not a secret\n"):
        proc = subprocess.run([sys.executable, "-m", "specchat", "cluster", "rank", "--rank", "1",
                               "--listen", "127.0.0.1:39103"], input=stdin,
                              capture_output=True, timeout=60)
        assert proc.returncode == 1
        assert proc.stderr.decode() == (
            "specchat: error: The standard input of specchat cluster rank does not hold a "
            "cluster secret (64 hex digits).\n")


def test_a_flood_of_strangers_never_keeps_rank_0_out(tiny_target):
    """Today 33 idle connections locked rank 0 out for as long as the
    stranger kept reconnecting (32 handshake slots, each held 5 s). Now a
    stranger keeping 256 connections open (idle, sending a byte a second,
    stalling after a valid hello, or churning), from several loopback
    addresses and from rank 0's own, reconnecting whenever one is closed,
    does not keep the real rank 0 out: each probe answers, and the join
    gets through, within seconds, every time. The rank says what it
    dropped in a few lines, not one per connection."""
    key = secrets.token_bytes(32)
    base = free_base(4)
    spec = _spec(tiny_target, base)
    rank, out = start_rank(1, base + 3, key)
    flood = subprocess.Popen([sys.executable, str(HERE.parent / "clusterflood.py"),
                              str(base + 3), "256"], stdout=subprocess.PIPE, text=True)
    flooded = Lines(flood)
    try:
        flooded.wait_for("open 256", timeout=30)
        time.sleep(1.0)  # long enough for every kind of stranger to be in place
        for _ in range(10):
            start = time.monotonic()
            assert control.probe(spec, key, timeout=2.0) is None, out.text()[-2000:]
            assert time.monotonic() - start < 4.0
        start = time.monotonic()
        peers = control.Peers(spec, key)
        peers.connect()
        assert time.monotonic() - start < 5.0
        out.wait_for("rank 0 joined cluster lab")
        opened = int(flooded.wait_for("opened", after=len(flooded.lines))[1].split()[1])
        assert opened > 2 * 256  # the stranger really did reconnect, over and over
        out.wait_for(f"to keep at most {control.PENDING} waiting")  # and filled the rank
        peers.close()
        out.wait_for("rank 0 left; exiting", timeout=10)
        assert rank.wait(10) == 0
        assert "Traceback" not in out.text()
        assert len(out.lines) < 100, out.text()[-2000:]
    finally:
        flood.kill()
        flood.wait(10)
        flood.stdout.close()
        stop(rank)
