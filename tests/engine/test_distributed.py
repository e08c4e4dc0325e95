"""The target sharded over two ranks on the loopback interface (MLX's ring
backend, CPU), with the tiny models: two real processes besides pytest,
started the way a user starts them (``specchat cluster create``, ``specchat
cluster start``), and rank 0 in a process of its own (tests/engine/
cluster_rank0.py), because MLX joins a process to one ring only once."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from clustertools import Lines, free_base

HERE = Path(__file__).parent
PROMPT = "def fibonacci(n): the quick brown fox"
REQUESTS = [
    {"mode": "plain", "prompt": PROMPT, "max_tokens": 48},
    {"mode": "draft", "prompt": PROMPT, "max_tokens": 48},  # adaptive K
    {"mode": "draft", "k": 3, "prompt": PROMPT, "max_tokens": 48},
    {"mode": "suffix", "prompt": "Hello, world! Hello, world! Hello,", "max_tokens": 32},
    {"mode": "draft", "k": 4, "prompt": PROMPT, "max_tokens": 32, "temperature": 0.8, "seed": 7},
]
LONG = {"mode": "plain", "prompt": PROMPT, "max_tokens": 200}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_target):
    """Cluster "lab": rank 0 here, rank 1 a second local process, kept
    running by ``specchat cluster start``."""
    home = tmp_path_factory.mktemp("cluster-home")
    # Without the BLAS thread count conftest's startup.prepare() set here, as
    # for any process the user starts (it would pass for the user's own).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BLIS_", "OPENBLAS_"))}
    env["SPECCHAT_HOME"] = str(home)
    base = free_base(4)
    create = subprocess.run(
        [sys.executable, "-m", "specchat", "cluster", "create", "lab", "--hosts",
         "127.0.0.1,127.0.0.1", "--model", str(tiny_target), "--port", str(base),
         "--layers", "4,2", "--json"],  # rank 0: the last 4 of 6 layers
        env=env, capture_output=True, text=True, timeout=60)
    assert create.returncode == 0, create.stderr
    folder = Path(json.loads(create.stdout)["folder"])
    sup = subprocess.Popen([sys.executable, "-m", "specchat", "cluster", "start", "lab"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = Lines(sup)
    out.wait_for("waiting for rank 0")
    yield {"env": env, "folder": folder, "out": out, "home": home, "base": base}
    sup.send_signal(signal.SIGTERM)
    try:
        sup.wait(15)
    except subprocess.TimeoutExpired:
        sup.kill()


def _rank1_pid(out: Lines) -> int:
    """The pid of the rank 1 that waits for rank 0 now (the supervisor
    restarts it after each rank 0 session)."""
    i, line = out.wait_for("waiting for rank 0")
    while True:
        try:
            i, line = out.wait_for("waiting for rank 0", after=i + 1, timeout=0.5)
        except AssertionError:
            break
    return int(line.split("(pid ")[1].split(")")[0])


@pytest.fixture(scope="module")
def rank0(cluster, tiny_target, tiny_draft):
    """One rank 0 session: references, cluster replies, the kill, and the
    local target again (see cluster_rank0.py)."""
    plan = {"target": str(tiny_target), "draft": str(tiny_draft), "cluster": str(cluster["folder"]),
            "requests": REQUESTS,
            "kill": {"pid": _rank1_pid(cluster["out"]), "step": 3, "request": LONG}}
    proc = subprocess.run([sys.executable, str(HERE / "cluster_rank0.py"), json.dumps(plan)],
                          env=cluster["env"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_hostfile_is_the_one_mlx_launch_reads(cluster):
    from mlx._distributed_utils.common import Hostfile
    from specchat.engine.distributed import hostfile

    path = cluster["folder"] / hostfile.HOSTFILE
    parsed = Hostfile.from_file(path)
    assert parsed.backend == "ring"
    assert [(h.ssh_hostname, h.ips) for h in parsed.hosts] == [("127.0.0.1", ["127.0.0.1"])] * 2
    spec = hostfile.read(cluster["folder"])
    base = cluster["base"]
    assert spec.ring_hostfile() == [[f"127.0.0.1:{base}"], [f"127.0.0.1:{base + 1}"]]
    assert spec.layers == (4, 2)
    # The folder reads as the target: its config and weights are links.
    assert (cluster["folder"] / "config.json").is_symlink()
    listed = subprocess.run([sys.executable, "-m", "specchat", "cluster", "list", "--json"],
                            env=cluster["env"], capture_output=True, text=True, timeout=60)
    assert json.loads(listed.stdout) == ["lab"]
    # Without --json the list asks each rank (a probe it answers without
    # joining; the sessions below show it still joins afterwards).
    listed = subprocess.run([sys.executable, "-m", "specchat", "cluster", "list"],
                            env=cluster["env"], capture_output=True, text=True, timeout=60)
    assert listed.stdout.strip() == "lab: target-llama, 2 ranks, every rank answers"


def test_the_secret_is_the_owners_alone_and_never_in_a_ranks_arguments(cluster):
    """`cluster create` made a random secret readable by its owner only;
    `cluster start` handed it to rank 1 on stdin, so neither `ps` (its
    arguments) nor its environment shows it, and nothing printed it."""
    path = cluster["folder"] / "secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = path.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}\n", key)
    pid = _rank1_pid(cluster["out"])
    args = subprocess.run(["ps", "-ww", "-o", "args=", "-p", str(pid)], capture_output=True,
                          text=True, check=True).stdout
    assert f"cluster rank --rank 1 --listen 127.0.0.1:{cluster['base'] + 3}" in args
    assert key.strip() not in args
    assert key.strip().encode() not in Path(f"/proc/{pid}/environ").read_bytes()
    assert key.strip() not in cluster["out"].text()


def test_two_ranks_give_one_process_ids_plain_and_speculative(rank0):
    assert rank0["target_name"] == "target-llama on lab"
    assert all(len(ids) >= 8 for ids in rank0["reference"])
    assert rank0["cluster"] == rank0["reference"]


def test_a_killed_rank_ends_the_reply_with_an_error_and_keeps_it(rank0):
    killed = rank0["killed"]
    assert killed["error"] is not None, "the reply finished although rank 1 was killed"
    assert killed["error"].startswith("Rank 1 of cluster lab (127.0.0.1) stopped")
    assert "the reply stops here" in killed["error"]
    # What was streamed before is the single-process reply's beginning.
    reference = rank0["reference"][0]
    assert 4 <= len(killed["partial"]) < LONG["max_tokens"]
    assert killed["partial"] == reference[:len(killed["partial"])]
    # The cluster stays refused in words; local models work as before.
    assert rank0["again"].startswith("Rank 1 of cluster lab (127.0.0.1) stopped")
    assert "restart its ranks (specchat cluster start lab)" in rank0["again"]
    assert rank0["local_after"] == rank0["reference"]


def test_specchat_generate_runs_as_rank_0(cluster, rank0):
    """The real command loads the cluster folder as its target (rank 1 was
    restarted by the supervisor after the kill)."""
    out = cluster["out"]
    exited, _ = out.wait_for("rank 1 exited")
    out.wait_for("waiting for rank 0", after=exited)
    proc = subprocess.run(
        [sys.executable, "-m", "specchat", "generate", "--target", str(cluster["folder"]),
         "--plain", "--prompt", PROMPT, "--max-tokens", "48", "--json"],
        env=cluster["env"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["token_ids"] == rank0["reference"][0]
    assert out["models"]["target"] == "target-llama on lab"
