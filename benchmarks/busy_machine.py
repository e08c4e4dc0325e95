"""Decoding speed on an idle and on a busy machine: every BLAS library, every
BLAS thread policy, several background loads, in one table.

    python benchmarks/busy_machine.py --target bundled:qwen2.5-coder-1.5b \\
        --draft bundled:qwen2.5-coder-0.5b --blas blis openblas \\
        --threads 1 2 auto --loads 0 2 4 --modes plain spec --json out.json

Each BLAS runs in its own process (it is chosen before MLX is imported),
which loads the pair once. For each thread policy ("1", "2": pinned counts;
"auto": the governor in app/specchat/engine/threads.py) and each load (that
many processes spinning at normal priority beside it: tools/cpuload.py),
every prompt runs in every mode from an empty cache. A run that has not
finished after --budget seconds of decoding is cancelled and its rate is what
it produced in that time, so a collapse ends the run instead of the
benchmark. Rates are decoding only (prefill excluded), as in the bench.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app"))


def run(engine, prompt, mode: str, max_tokens: int, budget: float) -> dict:
    """One prompt in one bench variant from an empty cache, cut after
    ``budget`` seconds (on the engine thread)."""
    from specchat.engine.events import GenerateRequest, SamplingParams
    from specchat.tools.variants import VARIANTS

    engine.reset_cache()
    cancel = threading.Event()
    timer = threading.Timer(budget, cancel.set)
    req = GenerateRequest(messages=prompt.messages, max_tokens=max_tokens,
                          sampling=SamplingParams(), draft=VARIANTS[mode].settings())
    t0 = time.perf_counter()
    timer.start()
    try:
        r = engine.generate(req, cancelled=cancel)
    finally:
        timer.cancel()
    s = r.summary
    return {"tokens": s.new_tokens, "tokens_per_s": s.tokens_per_s, "ttft_s": s.ttft_s,
            "wall_s": time.perf_counter() - t0, "cancelled": s.finish_reason == "cancelled",
            "accepted": s.accepted, "drafted": s.drafted, "steps": s.steps,
            "blas_threads": s.blas_threads, "token_ids": list(r.token_ids)}


def child(args: argparse.Namespace) -> None:
    from specchat import startup  # noqa: E402

    startup.prepare()  # the system BLAS before anything imports MLX
    from specchat.engine import blas, threads
    from specchat.library.engine_link import make_client
    from specchat.tools import cpuload
    from specchat.tools.prompts import load_prompts

    prompts = [p for p in load_prompts(args.prompts) if not args.ids or p.id in args.ids]
    client = make_client()
    pair = client.load(args.target, args.draft).wait()
    gov = threads.governor()

    def emit(obj: dict) -> None:
        print(json.dumps(obj), flush=True)

    emit({"event": "loaded", "blas": pair.compute.blas, "blas_path": blas.status().path,
          "cores": blas.cores(), "ceiling": gov.ceiling, "pid": os.getpid()})

    if args.nice:
        # After loading, so only decoding runs at the lower priority. Linux
        # keeps a niceness per thread: set it on the engine thread, whose BLAS
        # threads inherit it when they are created.
        client.call(lambda eng: os.nice(args.nice)).wait()
    # Warm-up, not recorded: first-call allocations.
    for mode in args.modes:
        client.call(lambda eng, m=mode: run(eng, prompts[0], m, 4, 60)).wait()
    # Policies are interleaved run by run (the order rotating from prompt to
    # prompt), so a machine whose speed drifts over the minutes a load level
    # takes affects every policy alike.
    for load in args.loads:
        with cpuload.BackgroundLoad(load):
            time.sleep(args.settle if load else 0.5)
            for i, prompt in enumerate(prompts):
                for mode in args.modes:
                    order = args.threads[i % len(args.threads):] + args.threads[:i % len(args.threads)]
                    for policy in order:
                        ok = gov.pin(None if policy == "auto" else int(policy))
                        if policy == "auto":
                            # The governor runs all the time in the app: let it
                            # see the machine as it is before the request starts.
                            for _ in range(threads.CALM_WINDOWS + 1):
                                time.sleep(threads.WINDOW_S * 1.2)
                                gov.tick()
                        res = client.call(lambda eng, p=prompt, m=mode: run(
                            eng, p, m, args.max_tokens, args.budget)).wait()
                        res.update({"event": "run", "policy": policy, "pinned": ok, "load": load,
                                    "nice": args.nice,
                                    "prompt": prompt.id, "mode": mode,
                                    "loadavg": cpuload.load_average(), "others": gov.others})
                        emit(res)
    client.close()


def parent(args: argparse.Namespace) -> int:
    rows = []
    meta = {}
    for lib in args.blas:
        # "openblas", "blis", a library path, each optionally followed by
        # ":VAR=VALUE,VAR=VALUE" for the child's environment.
        name, _, extra = lib.partition(":")
        env = dict(os.environ, SPECCHAT_BLAS=name)
        env.update(kv.split("=", 1) for kv in extra.split(",") if "=" in kv)
        cmd = [sys.executable, __file__, "--child", *sys.argv[1:]]
        print(f"[{lib}] starting", file=sys.stderr, flush=True)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            ev = json.loads(line)
            if ev["event"] == "loaded":
                meta[lib] = ev
                print(f"[{lib}] loaded: {ev['blas']} ({ev['blas_path']}), {ev['cores']} cores, "
                      f"thread ceiling {ev['ceiling']}", file=sys.stderr, flush=True)
                continue
            ev["lib"] = lib
            rows.append(ev)
            print(f"[{lib}] threads {ev['policy']:>4} load {ev['load']} {ev['prompt']:<20} "
                  f"{ev['mode']:<8} {ev['tokens']:>4} tok {ev['tokens_per_s']:8.2f} tok/s"
                  f"{' (cut at budget)' if ev['cancelled'] else ''} threads used "
                  f"{ev['blas_threads']} loadavg {ev['loadavg']}", file=sys.stderr, flush=True)
        if proc.wait() != 0:
            print(f"[{lib}] failed with exit code {proc.returncode}", file=sys.stderr)
            return 1
    table = summarize(rows)
    print(format_table(table))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"command": " ".join(["python", "benchmarks/busy_machine.py", *sys.argv[1:]]),
             "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "libraries": meta,
             "table": table, "runs": rows}, indent=1))
    return 0


def summarize(rows: list[dict]) -> list[dict]:
    """Median decode rate per (library, policy, load, mode), over prompts."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["lib"], r["policy"], r["load"], r["mode"]), []).append(r)
    out = []
    for (lib, policy, load, mode), rs in groups.items():
        threads_used: dict[str, int] = {}
        for r in rs:
            for k, v in r["blas_threads"].items():
                threads_used[str(k)] = threads_used.get(str(k), 0) + v
        out.append({"lib": lib, "policy": policy, "load": load, "mode": mode,
                    "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
                    "runs": len(rs), "cut": sum(r["cancelled"] for r in rs),
                    "threads_used": threads_used})
    return out


def format_table(table: list[dict]) -> str:
    modes = sorted({t["mode"] for t in table}, key=["plain", "spec"].index
                   if all(t["mode"] in ("plain", "spec") for t in table) else str)
    lines = [f"{'BLAS':<10}{'threads':>8}{'load':>6}" + "".join(f"{m:>12}" for m in modes)
             + ("   spec/plain" if {"plain", "spec"} <= set(modes) else "")]
    keys = sorted({(t["lib"], t["policy"], t["load"]) for t in table},
                  key=lambda k: (k[0], str(k[1]), k[2]))
    for lib, policy, load in keys:
        cells = {t["mode"]: t for t in table if (t["lib"], t["policy"], t["load"]) == (lib, policy, load)}
        line = f"{lib:<10}{policy:>8}{load:>6}"
        for m in modes:
            t = cells.get(m)
            line += (f"{t['tokens_per_s']:>11.2f}{'*' if t['cut'] else ' '}" if t else f"{'-':>12}")
        if "plain" in cells and "spec" in cells and cells["plain"]["tokens_per_s"] > 0:
            line += f"{cells['spec']['tokens_per_s'] / cells['plain']['tokens_per_s']:>12.2f}x"
        lines.append(line)
    lines.append("tok/s: decoding only, median over prompts; * = a run was cut at the time budget")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", default=str(ROOT / "benchmarks" / "prompts.jsonl"))
    p.add_argument("--ids", nargs="*", default=["code-binary-search", "grounded-fix-bug"],
                   help="prompt ids to run (default: one code, one grounded; none = all)")
    p.add_argument("--blas", nargs="+", default=["blis", "openblas"],
                   help="libraries to compare: blis, openblas or a path, each optionally "
                        "with :VAR=VALUE,... for its environment (e.g. OMP_WAIT_POLICY)")
    p.add_argument("--threads", nargs="+", default=["1", "2", "auto"])
    p.add_argument("--loads", nargs="+", type=int, default=[0, 2, 4])
    p.add_argument("--modes", nargs="+", default=["plain", "spec"])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--budget", type=float, default=120.0,
                   help="seconds a run may decode before it is cut (default 120)")
    p.add_argument("--settle", type=float, default=3.0,
                   help="seconds between starting a load and the first run (default 3)")
    p.add_argument("--nice", type=int, default=0,
                   help="run the decoding at this niceness (the loads stay at 0), as a "
                        "background-priority app would")
    p.add_argument("--json", dest="json_out")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
