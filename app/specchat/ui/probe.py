"""Measure the window's event-loop lag while it streams a reply.

    python -m specchat.ui.probe --target REF [--draft REF] [--max-tokens N]
                                [--prompt TEXT] [--screenshot FILE]

Opens the real window on the real qasync loop (offscreen works), loads the
pair, sends one prompt, and prints one JSON object: the lag monitor's
numbers during generation and the reply's summary. The UI tests use it;
docs/benchmarks.md quotes it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, replace


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specchat.ui.probe")
    p.add_argument("--target", required=True)
    p.add_argument("--draft")
    p.add_argument("--max-tokens", type=int, default=400)
    p.add_argument("--prompt", default="Write a Python function that sorts a list of words, "
                   "with a docstring and an example.")
    p.add_argument("--plain", action="store_true", help="speculative decoding off")
    p.add_argument("--screenshot", help="save the window mid-reply to this PNG")
    args = p.parse_args(argv)

    import qasync

    from specchat import startup
    startup.prepare()  # the system BLAS before anything imports MLX
    from specchat.ui.app import create_app
    from specchat.ui.main_window import MainWindow

    app = create_app()
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    window = MainWindow()
    window.settings = replace(window.settings, max_tokens=args.max_tokens,
                              speculative=not args.plain)
    window.show()
    out: dict = {}

    async def run() -> None:
        window.start()
        window.load_pair(args.target, args.draft)
        while window.engine.loading:
            await asyncio.sleep(0.05)
        if window.engine.pair is None:
            out["error"] = window.error_banner.label.text()
            return
        await asyncio.sleep(0.5)  # let the first paint and verdict settle
        idle = window.lag.stats(last_s=0.5)
        started = time.monotonic()
        window.composer.edit.setPlainText(args.prompt)
        window.composer.send_button.click()
        shot = False
        while window.controller.busy:
            await asyncio.sleep(0.05)
            if args.screenshot and not shot and len(window.chat_model.messages[-1].text) > 80:
                window.grab().save(args.screenshot)
                shot = True
                started = time.monotonic()  # the grab itself blocks; measure after it
        lag = window.lag.stats(since=started)
        ended = time.monotonic()
        worst = sorted(((lag_s, t) for t, lag_s in window.lag._samples if t >= started),
                       reverse=True)[:3]
        out["worst_ms_at_s"] = [(round(1000 * v, 1), round(t - started, 2)) for v, t in worst]
        out["generation_s"] = round(ended - started, 2)
        msg = window.chat_model.messages[-1]
        out.update(lag_ms=asdict(lag), idle_lag_ms=asdict(idle), summary=msg.summary,
                   error=msg.error, pair=[args.target, args.draft],
                   compute=asdict(window.engine.pair.compute))
        window.close()

    with loop:
        loop.run_until_complete(run())
    print(json.dumps(out))
    return 0 if "error" not in out or out["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
