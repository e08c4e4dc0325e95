"""Can the draft run on its own core while the target verifies? (the `ssd`
mode, engine/ssd/, issue 15)

Speculative speculative decoding pays only if the draft's forwards cost
little when they run at the same time as the target's verify. Decoding is
memory-bandwidth bound, so that depends on the machine: this script
measures it for any pair.

(a) Alone: the target's one-token forward, its verify forward over K + 1
    tokens, and the draft's one-token forward (over its pruned head, as
    drafting runs it), with BLAS on 1 thread and on every core.
(b) Together, one BLAS thread each:
    - threads: two Python threads in this process, each on its own MLX
      stream (the worker's is ``mx.new_stream``; MLX streams belong to the
      thread that made them, and each thread's computation runs on its
      stream's own thread, so the two really run at once);
    - processes: the draft in a second process, as a control (no shared
      allocator, no GIL).
    The target verifies ``--reps`` times while the draft drafts without
    pause; each side's forwards that fell inside the other's window are
    kept.

BLAS threads. BLIS's thread count through the CBLAS interface MLX calls is
one process-wide value (``bli_thread_set_num_threads``; BLIS 0.9 keeps it in
a global rntm_t, checked: a count set in one thread is what every other
thread reads). BLIS's per-call runtime (``rntm_t`` passed to the expert
``bli_gemm_ex``) is only reachable by calling BLIS directly, which MLX does
not. So the fallback, used here and by engine/ssd/: while the two run at
once, the one process-wide count is lowered so that both together use at
most every core (``cores // 2`` each: 1 and 1 on a two-core machine); the
second process of the control sets its own count to 1.

Derived figures (printed and in the JSON):
- ``one_core_slowdown``: one thread's forward over every core's (how much
  the target loses by giving a core to the draft);
- ``concurrent_slowdown``: each side's forward with the other running,
  over the same forward alone at one thread;
- ``draft_forwards_per_verify``: draft forwards that fit in one concurrent
  verify: the speculation budget;
- ``ssd_bound_vs_spec``: the sequential step (K draft forwards then a verify,
  each at its best thread count) over SSD's step when every block was
  speculated (the concurrent verify, or K concurrent draft forwards if
  longer): SSD's best case on this machine;
- ``break_even_hit_rate``: the hit rate SSD needs to match the sequential
  step (a miss drafts K tokens first, then verifies concurrently).

    python benchmarks/overlap_probe.py --target bundled:qwen2.5-coder-1.5b \\
        --draft bundled:qwen2.5-coder-0.5b --json docs/bench/overlap.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from specchat import startup  # noqa: E402

startup.prepare()  # the system BLAS before anything imports MLX
from specchat.engine import blas  # noqa: E402

Interval = tuple[float, float]  # (start, end), time.monotonic (shared by processes)


def context_ids(rows: int, n: int) -> list[int]:
    """A fixed context of ``n`` ids valid for a vocabulary of ``rows``."""
    return [(7 * i + 3) % rows for i in range(n)]


class Forward:
    """One model's forward over the last m context ids on its own cache,
    rewound after each call so every repetition sees the same context. The
    cache is filled in the thread that calls ``prepare``."""

    def __init__(self, fn, model, ids: list[int], m: int):
        self.fn, self.model, self.ids, self.m = fn, model, ids, m
        self.cache = None

    def prepare(self) -> None:
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache
        from specchat.tools.forward_timing import prefill

        self.cache = make_prompt_cache(self.model)
        prefill(self.model, self.cache, self.ids[:-self.m])
        mx.eval([c.state for c in self.cache])

    def __call__(self) -> Interval:
        import mlx.core as mx

        t0 = time.monotonic()
        mx.eval(self.fn(self.ids[-self.m:], self.cache))
        t1 = time.monotonic()
        for c in self.cache:
            c.trim(self.m)
        return t0, t1


def durations(intervals: list[Interval]) -> list[float]:
    return [b - a for a, b in intervals]


def median(intervals: list[Interval]) -> float | None:
    d = durations(intervals)
    return statistics.median(d) if d else None


def inside(intervals: list[Interval], window: Interval) -> list[Interval]:
    """The intervals wholly inside ``window``."""
    return [(a, b) for a, b in intervals if a >= window[0] and b <= window[1]]


def alone(fwd: Forward, reps: int) -> float:
    fwd()  # warm-up
    return median([fwd() for _ in range(reps)])


class Background:
    """Forwards without pause on a second thread, on that thread's own MLX
    stream, from ``start`` until ``stop``.

    The thread never ends: it parks once stopped. A thread that ran MLX and
    then exits runs MLX's thread-local destructors (the compile cache), which
    take the GIL; racing interpreter shutdown, that aborts the process
    (MLX 0.32 on Linux, see engine/worker.py). So it parks, and ``stop``
    returns only once it is parked: no thread is inside MLX at exit."""

    def __init__(self, fwd: Forward, device: str):
        self.fwd, self.device = fwd, device
        self.out: list[Interval] = []
        self._stop, self._started, self._parked = (threading.Event(), threading.Event(),
                                                   threading.Event())
        threading.Thread(target=self._run, daemon=True).start()
        self._started.wait()

    def _run(self) -> None:
        import mlx.core as mx

        dev = {"cpu": mx.cpu, "gpu": mx.gpu}.get(self.device, mx.default_device())
        with mx.stream(mx.new_stream(dev)):
            self.fwd.prepare()
            self.fwd()  # warm-up, outside the measured window
            self._started.set()
            while not self._stop.is_set():
                self.out.append(self.fwd())
        self._parked.set()
        threading.Event().wait()

    def stop(self) -> list[Interval]:
        self._stop.set()
        self._parked.wait()
        return self.out


def together_threads(verify: Forward, draft: Forward, reps: int, device: str) -> dict:
    """The verify on this thread, the draft on a second thread at once."""
    background = Background(draft, device)
    verify()  # warm-up with the draft running
    t0 = time.monotonic()
    verifies = [verify() for _ in range(reps)]
    window = (t0, time.monotonic())
    drafts = background.stop()
    return {"verify_s": median(verifies), "draft_s": median(inside(drafts, window)),
            "draft_forwards": len(inside(drafts, window))}


def together_processes(verify: Forward, draft_path: str, k: int, context: int, reps: int) -> dict:
    """The verify here, the draft in a second process (one BLAS thread)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-draft", draft_path,
           "--k", str(k), "--context", str(context)]
    env = {**os.environ, "BLIS_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        line = child.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the draft process did not start: {line!r}")
        verify()  # warm-up with the draft running
        t0 = time.monotonic()
        verifies = [verify() for _ in range(reps)]
        window = (t0, time.monotonic())
        child.stdin.write("stop\n")
        child.stdin.flush()
        drafts = [tuple(x) for x in json.loads(child.stdout.readline())]
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    if child.returncode:
        raise RuntimeError(f"the draft process ended with status {child.returncode}")
    return {"verify_s": median(verifies), "draft_s": median(inside(drafts, window)),
            "draft_forwards": len(inside(drafts, window))}


def serve_draft(path: str, context: int) -> None:
    """The control's second process: draft forwards until told to stop on
    stdin, then their intervals as one JSON line."""
    from specchat.engine import compute
    from specchat.engine.draft_model import ModelDrafter
    from specchat.engine.loading import load_folder

    blas.set_threads(1)
    drafter = ModelDrafter(load_folder(path, compute.detect()))
    fwd = Forward(drafter.forward_last, drafter.runner.model,
                  context_ids(drafter.runner.rows or 256, context), 1)
    background = Background(fwd, "default")
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(background.stop()), flush=True)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def derive(k: int, single: dict, threads_: dict | None, procs: dict | None) -> dict:
    cores = max(int(n) for n in single)
    one, many = single[1], single[cores]
    out = {"one_core_slowdown": {name: ratio(one[name], many[name]) for name in one}}
    best = {name: min(single[n][name] for n in single) for name in one}
    for label, conc in (("threads", threads_), ("processes", procs)):
        if not conc:
            continue
        out[f"concurrent_slowdown_{label}"] = {
            "target_verify": ratio(conc["verify_s"], one["target_verify_s"]),
            "draft": ratio(conc["draft_s"], one["draft_s"]),
        }
    conc = threads_ or procs
    if conc and conc["draft_s"]:
        v, d = conc["verify_s"], conc["draft_s"]
        spec = k * best["draft_s"] + best["target_verify_s"]
        hit = max(v, k * d)
        miss = k * best["draft_s"] + v
        out["draft_forwards_per_verify"] = v / d
        out["spec_step_s"] = spec
        out["ssd_hit_step_s"] = hit
        out["ssd_miss_step_s"] = miss
        out["ssd_bound_vs_spec"] = spec / hit
        out["break_even_hit_rate"] = (
            max(0.0, (miss - spec) / (miss - hit)) if miss > hit else None)
    return out


def probe(target: str, draft: str, k: int, context: int, reps: int, processes: bool,
          device: str) -> dict:
    from specchat.engine.session import Engine
    from specchat.library.refs import resolve

    engine = Engine()
    draft_path = str(resolve(draft))
    engine.load(resolve(target), draft_path)
    runner, drafter = engine.target_runner, engine.model_drafter
    ids = context_ids(min(runner.rows or 256, drafter.runner.rows or 256), context)

    def target_fwd(m: int) -> Forward:
        return Forward(lambda x, c: runner(x, c, "all"), runner.model, ids, m)

    def draft_fwd() -> Forward:
        return Forward(drafter.forward_last, drafter.runner.model, ids, 1)

    gov = engine_threads()
    cores = blas.cores()
    adjustable = gov.pin(1)
    if not adjustable:
        print("this BLAS cannot be told its thread count: measuring what it does")
    single: dict[int, dict] = {}
    for n in sorted({1, cores}) if adjustable else [1]:
        gov.pin(n)
        fwds = {"target_1_s": target_fwd(1), "target_verify_s": target_fwd(k + 1),
                "draft_s": draft_fwd()}
        for f in fwds.values():
            f.prepare()
        single[n] = {name: alone(f, reps) for name, f in fwds.items()}
        print(f"alone, {n} BLAS thread(s): target 1 tok {single[n]['target_1_s'] * 1e3:.1f} ms, "
              f"verify {k + 1} tok {single[n]['target_verify_s'] * 1e3:.1f} ms, "
              f"draft 1 tok {single[n]['draft_s'] * 1e3:.1f} ms")
    per_side = max(1, cores // 2)
    gov.pin(per_side)
    verify = target_fwd(k + 1)
    verify.prepare()
    t = together_threads(verify, draft_fwd(), reps, device)
    print(f"together (threads, {per_side} BLAS thread(s) each): verify "
          f"{t['verify_s'] * 1e3:.1f} ms, draft {_ms(t['draft_s'])} "
          f"({t['draft_forwards']} draft forwards)")
    p = None
    if processes:
        p = together_processes(verify, draft_path, k, context, reps)
        print(f"together (processes): verify {p['verify_s'] * 1e3:.1f} ms, draft "
              f"{_ms(p['draft_s'])} ({p['draft_forwards']} draft forwards)")
    gov.pin(None)
    derived = derive(k, single, t, p)
    _say(derived, k)
    return {
        "target": target, "draft": draft, "k": k, "context": context, "reps": reps,
        "cores": cores, "blas": blas.status().name, "device": engine.compute.device,
        "draft_device": device, "blas_threads_together": per_side,
        "alone": {str(n): v for n, v in single.items()},
        "together_threads": t, "together_processes": p, "derived": derived,
    }


def engine_threads():
    from specchat.engine import threads

    return threads.governor()


def _ms(s: float | None) -> str:
    return f"{s * 1e3:.1f} ms" if s is not None else "-"


def _say(d: dict, k: int) -> None:
    for side, r in d["one_core_slowdown"].items():
        if r is not None:
            print(f"one core vs every core, {side}: {r:.2f}x")
    for label in ("threads", "processes"):
        c = d.get(f"concurrent_slowdown_{label}")
        if c:
            print(f"slowdown from running together ({label}): target verify "
                  f"{c['target_verify']:.2f}x, draft {c['draft'] or 0:.2f}x")
    if "ssd_bound_vs_spec" in d:
        print(f"draft forwards per concurrent verify: {d['draft_forwards_per_verify']:.1f}; "
              f"spec step (K={k}) {d['spec_step_s'] * 1e3:.0f} ms, ssd step on a hit "
              f"{d['ssd_hit_step_s'] * 1e3:.0f} ms, on a miss {d['ssd_miss_step_s'] * 1e3:.0f} ms")
        be = d["break_even_hit_rate"]
        print(f"ssd's best case vs spec: {d['ssd_bound_vs_spec']:.2f}x; break-even hit rate "
              + (f"{be:.0%}" if be is not None and be <= 1 else "never"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--k", type=int, default=4, help="draft block length (verify over K + 1)")
    ap.add_argument("--context", type=int, default=200, help="context tokens in the caches")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-processes", action="store_true", help="skip the two-process control")
    ap.add_argument("--draft-device", choices=["default", "cpu", "gpu"], default="default",
                    help="the draft thread's stream (gpu target + cpu draft on Apple Silicon)")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    ap.add_argument("--serve-draft", help=argparse.SUPPRESS)  # the control's second process
    args = ap.parse_args()
    if args.serve_draft:
        serve_draft(args.serve_draft, args.context)
        return
    if not args.target or not args.draft:
        ap.error("--target and --draft are needed")
    st = blas.status()
    print(f"BLAS: {st.name} ({st.path or st.note}), {blas.cores()} cores")
    out = probe(args.target, args.draft, args.k, args.context, args.reps,
                not args.no_processes, args.draft_device)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
