"""The app's Compare, timed: the real window (offscreen works) on the real
qasync loop loads a pair and runs Compare's plain-then-speculative runs on one
prompt, ROUNDS times; one JSON line per round with both runs' speeds.

    QT_QPA_PLATFORM=offscreen python benchmarks/compare_probe.py PROMPT MAX_TOKENS [ROUNDS]
        [--target REF] [--draft REF]

Run ``specchat bench`` on the same messages (the app's system prompt and
PROMPT) to compare: docs/benchmarks.md, "Compare and the bench".
"""

from __future__ import annotations

import argparse
import asyncio
import json


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("prompt")
    p.add_argument("max_tokens", type=int)
    p.add_argument("rounds", type=int, nargs="?", default=1)
    p.add_argument("--target", default="bundled:qwen2.5-coder-1.5b")
    p.add_argument("--draft", default="bundled:qwen2.5-coder-0.5b")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    import qasync
    from specchat import startup

    startup.prepare()  # the system BLAS before anything imports MLX
    from specchat.ui.app import create_app
    from specchat.ui.compare_runner import CompareRunner
    from specchat.ui.main_window import MainWindow

    app = create_app()
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    w = MainWindow()
    w.session.update_settings(max_tokens=args.max_tokens, speculative=True, temperature=0.0)
    w.show()

    async def go() -> None:
        w.start()
        w.load_pair(args.target, args.draft)
        while w.session.engine.loading or w.session.engine.pair is None:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # the first paint and the verdict settle
        for r in range(args.rounds):
            o = await CompareRunner(w.session, w.conversation).start(args.prompt)
            p, s = o.plain.summary, o.speculative.summary
            print(json.dumps({
                "round": r, "plain_tps": round(p.tokens_per_s, 3),
                "spec_tps": round(s.tokens_per_s, 3), "speedup": round(o.speedup, 3),
                "identical": o.identical, "spec_mode": s.mode,
                "tokens": [p.new_tokens, s.new_tokens],
                "acceptance": round(s.accepted / s.drafted, 3) if s.drafted else None,
                "tokens_per_step": round(s.tokens_per_step, 2),
                "prefill_s": [round(p.prefill_s, 2), round(s.prefill_s, 2)],
                "wall_s": [round(p.wall_s, 2), round(s.wall_s, 2)],
                "blas": [p.blas_threads, s.blas_threads]}), flush=True)
        w.close()

    with loop:
        loop.run_until_complete(go())


if __name__ == "__main__":
    main()
