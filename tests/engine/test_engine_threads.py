"""BLAS threads follow the machine's load (engine/threads.py), the background
load of the benchmarks really loads the machine and never outlives it
(tools/cpuload.py), and the thread count never changes the tokens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from specchat.engine import blas, threads
from specchat.engine.events import DraftSettings, GenerateRequest, SamplingParams
from specchat.tools import cpuload

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")


# -- the rule --------------------------------------------------------------------------------

def test_a_busy_machine_means_one_thread_at_once():
    assert threads.decide(2, 2, others=0.9, calm=2) == (1, 0)
    assert threads.decide(2, 2, others=threads.BUSY_CORES + 0.01, calm=0) == (1, 0)
    assert threads.decide(2, 2, others=0.1, calm=0) == (2, 0)


def test_threads_come_back_only_after_calm_windows():
    n, calm = 1, 0
    for _ in range(threads.CALM_WINDOWS - 1):
        n, calm = threads.decide(n, 2, others=0.05, calm=calm)
        assert n == 1
    n, calm = threads.decide(n, 2, others=0.05, calm=calm)
    assert n == 2
    # One busy window in between starts the count again.
    n, calm = threads.decide(1, 2, others=0.05, calm=threads.CALM_WINDOWS - 1)
    assert n == 2
    n, calm = threads.decide(1, 2, others=0.05, calm=0)
    n, calm = threads.decide(n, 2, others=1.0, calm=calm)
    assert (n, calm) == (1, 0)


def test_on_many_cores_each_busy_core_costs_one_thread():
    assert threads.decide(8, 8, others=1.0, calm=0) == (7, 0)
    assert threads.decide(8, 8, others=2.9, calm=0) == (5, 0)
    assert threads.decide(8, 8, others=20.0, calm=0) == (1, 0)
    assert threads.decide(1, 1, others=0.0, calm=5) == (1, 0)  # a ceiling of one is final


def test_small_models_get_one_thread():
    assert threads.parallel_ceiling(64 * 128) == 1
    assert threads.parallel_ceiling(896 * 4864) == blas.cores()  # Qwen2.5-0.5B's MLP


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_governor_applies_what_the_cpu_accounting_says():
    """Busy core-seconds grow faster than our own CPU time: others are
    running, so one thread; when only we run, threads come back."""
    clock, busy, own, applied = Clock(), [0.0], [0.0], []
    gov = threads.ThreadGovernor(2, set_threads=lambda n: applied.append(n) or True,
                                 busy=lambda: busy[0], own=lambda: own[0], clock=clock)
    gov.start()
    assert gov.active and gov.threads == 2

    def window(ours: float, others: float) -> int:
        clock.t += 0.5
        own[0] += ours * 0.5
        busy[0] += (ours + others) * 0.5
        return gov.tick()

    assert window(ours=2.0, others=0.0) == 2
    assert window(ours=1.2, others=0.8) == 1
    assert gov.others == pytest.approx(0.8)
    assert [window(ours=1.0, others=0.0) for _ in range(threads.CALM_WINDOWS)][-1] == 2
    assert applied == [2, 1, 2]
    # Ticks at each count: the calm windows before the rise still ran on one.
    assert gov.take_counts() == {2: 2, 1: threads.CALM_WINDOWS}
    assert gov.take_counts() == {}


def test_a_count_the_user_fixed_is_never_changed():
    applied = []
    gov = threads.ThreadGovernor(2, set_threads=lambda n: applied.append(n) or True,
                                 busy=lambda: 0.0, fixed=2)
    gov.start()
    gov.set_ceiling(1)
    assert not gov.active and not gov.pin(1)
    assert gov.tick() == 2 and applied == []


def test_without_proc_stat_nothing_changes(tmp_path):
    assert threads.read_busy_seconds(frozenset({0}), str(tmp_path / "nope")) is None
    gov = threads.ThreadGovernor(2, set_threads=lambda n: True, busy=lambda: None)
    gov.start()
    assert not gov.active and gov.tick() == 2


def test_proc_stat_is_read_per_core(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  500 0 100 9000 10 0 5 0 0 0\n"
        "cpu0 300 0 60 4000 10 0 3 7 0 0\n"
        "cpu1 200 0 40 5000 0 0 2 0 0 0\n"
        "intr 12345\n")
    tck = os.sysconf("SC_CLK_TCK")  # the kernel's clock ticks per second
    assert threads.read_busy_seconds(frozenset({0}), str(stat)) == pytest.approx((300 + 60 + 3 + 7) / tck)
    assert threads.read_busy_seconds(frozenset({0, 1}), str(stat)) == pytest.approx(612 / tck)
    assert threads.read_busy_seconds(frozenset({5}), str(stat)) is None


# -- the real machine --------------------------------------------------------------------------

def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        sum(range(1000))


@linux
def test_under_a_real_load_the_real_governor_drops_to_one_thread():
    """Real /proc/stat, real CPU time, the real BLAS: with a spinning process
    on every core, the governor gives BLAS one thread within a window."""
    if blas.get_threads() is None:
        pytest.skip("this BLAS cannot be told its thread count")
    cores = blas.cores()
    if cores < 2:
        pytest.skip("one core: there is only ever one thread")
    gov = threads.ThreadGovernor(cores)
    gov.start()
    try:
        with cpuload.BackgroundLoad(cores) as load:
            time.sleep(0.5)
            assert load.running() == cores
            for _ in range(6):
                _spin(0.15)
                gov.tick()
            assert gov.others > 0.5 * cores, gov.others
            assert gov.threads == 1
            assert blas.get_threads() == 1
    finally:
        blas.set_threads(threads.governor().threads)


@linux
def test_engine_steps_run_on_one_thread_under_load(tiny_engine):
    """Through the engine: a reply generated beside a spinning process per
    core runs its steps on one BLAS thread once the first window has shown the
    load (the tiny pair's ceiling is raised so that two would be allowed)."""
    engine = tiny_engine
    if blas.get_threads() is None or blas.cores() < 2:
        pytest.skip("needs a BLAS with a settable thread count and two cores")
    gov = threads.governor()
    if not gov.active:
        pytest.skip("the thread count is fixed in this environment")
    gov.set_ceiling(2)
    gov.pin(2)
    gov.pin(None)  # following the load again, from two threads
    try:
        with cpuload.BackgroundLoad(blas.cores()):
            time.sleep(0.5)
            r = engine.generate(GenerateRequest(prompt_ids=tuple(range(40, 80)), max_tokens=600,
                                                draft=DraftSettings(mode="draft", k=4)))
        used = r.summary.blas_threads
        assert r.summary.steps > 50 and sum(used.values()) >= r.summary.steps
        assert used.get(1, 0) > 0.8 * sum(used.values()), used
    finally:
        gov.set_ceiling(1)


def test_thread_count_does_not_change_tokens(tiny_engine):
    engine = tiny_engine
    if blas.get_threads() is None:
        pytest.skip("this BLAS cannot be told its thread count")
    gov = threads.governor()
    requests = [GenerateRequest(prompt_ids=tuple(range(40, 80)), max_tokens=48,
                                draft=DraftSettings(mode=m, k=k), sampling=s)
                for m, k in (("plain", None), ("draft", 5), ("hybrid", None))
                for s in (SamplingParams(), SamplingParams(temperature=0.9, seed=3))]
    out = {}
    try:
        for n in (1, 2):
            if not gov.pin(n):
                pytest.skip("the thread count is fixed in this environment")
            out[n] = [engine.generate(r) for r in requests]
            assert all(set(r.summary.blas_threads) == {n} for r in out[n])
    finally:
        gov.pin(None)
    assert [r.token_ids for r in out[1]] == [r.token_ids for r in out[2]]


# -- the background load ---------------------------------------------------------------------

@linux
def test_background_load_spins_and_stops():
    with cpuload.BackgroundLoad(2) as load:
        time.sleep(0.3)
        assert load.running() == 2
        pids = load.pids
        t0 = [_cpu_seconds(p) for p in pids]
        time.sleep(0.6)
        used = [_cpu_seconds(p) - t for p, t in zip(pids, t0, strict=True)]
    assert all(u > 0.1 for u in used), used  # really spinning
    assert not any(_alive(p) for p in pids)


@linux
def test_background_load_ends_when_its_owner_is_killed():
    code = textwrap.dedent("""
        import os, signal, sys, time
        sys.path.insert(0, sys.argv[1])
        from specchat.tools.cpuload import BackgroundLoad
        load = BackgroundLoad(2).__enter__()
        print(*load.pids, flush=True)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    app = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "app")
    p = subprocess.run([sys.executable, "-c", code, app], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == -signal.SIGKILL
    pids = [int(x) for x in p.stdout.split()]
    assert len(pids) == 2
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(x) for x in pids):
        time.sleep(0.1)
    assert not any(_alive(x) for x in pids)


def test_a_negative_load_is_refused():
    with pytest.raises(ValueError):
        cpuload.BackgroundLoad(-1)


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
