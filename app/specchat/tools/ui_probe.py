"""Measure the window's event-loop lag while it streams a reply.

    python -m specchat.tools.ui_probe --target REF [--draft REF] [--max-tokens N]
                                      [--prompt TEXT] [--screenshot FILE] [--no-thinking]

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
from dataclasses import asdict
from pathlib import Path

from specchat import outputs, startup
from specchat.errors import SpecChatError

PROMPT = "Write a Python function that sorts a list of words, with a docstring and an example."
SCREENSHOT_AFTER_CHARS = 80


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specchat.tools.ui_probe")
    p.add_argument("--target", required=True)
    p.add_argument("--draft")
    p.add_argument("--max-tokens", type=int, default=400)
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--plain", action="store_true", help="speculative decoding off")
    p.add_argument("--no-thinking", action="store_true",
                   help="the conversation's thinking switch off (a model that has one)")
    p.add_argument("--screenshot", help="save the window mid-reply to this PNG")
    return p.parse_args(argv)


async def probe(window, args: argparse.Namespace) -> dict:
    """Load, send, wait for the reply; the measurements as a JSON-ready dict."""
    session = window.session
    window.start()
    window.load_pair(args.target, args.draft)
    while session.engine.loading:
        await asyncio.sleep(0.05)
    if session.engine.pair is None:
        return {"error": window.error_banner.label.text()}
    if args.no_thinking:
        window.conversation.set_reasoning_effort("none")
    await asyncio.sleep(0.5)  # let the first paint and verdict settle
    idle = session.lag.stats(last_s=0.5)
    started = time.monotonic()
    window.composer.edit.setPlainText(args.prompt)
    window.composer.send_button.click()
    shot = False
    while window.conversation.busy:
        await asyncio.sleep(0.05)
        reply = window.chat_model.messages[-1]
        last = reply.reasoning + reply.text
        if args.screenshot and not shot and len(last) > SCREENSHOT_AFTER_CHARS:
            try:  # checked again: something may be there by now
                window.grab().save(str(_screenshot(args.screenshot)))
            except SpecChatError as exc:
                print(f"ui_probe: {exc}", file=sys.stderr)
            shot = True
            started = time.monotonic()  # the grab itself blocks; measure after it
    lag = session.lag.stats(since=started)
    ended = time.monotonic()
    worst = session.lag.worst(since=started)
    msg = window.chat_model.messages[-1]
    out = {
        "worst_ms_at_s": [(round(1000 * v, 1), round(t - started, 2)) for v, t in worst],
        "generation_s": round(ended - started, 2),
        "lag_ms": asdict(lag), "idle_lag_ms": asdict(idle),
        "summary": msg.summary.to_json() if msg.summary else None,
        "chars": {"reasoning": len(msg.reasoning), "answer": len(msg.text)},
        "error": msg.error, "pair": [args.target, args.draft],
        "compute": asdict(session.engine.pair.compute),
    }
    window.close()
    return out


def _screenshot(path: str) -> Path:
    """The screenshot's file: a new one (specchat/outputs.py), never one of the person's."""
    return outputs.file(path, "the screenshot", None, "choose another --screenshot file")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.screenshot:  # before the window opens, not after a minute of loading
            _screenshot(args.screenshot)
    except SpecChatError as exc:
        print(f"ui_probe: error: {exc}", file=sys.stderr)
        return 1
    import qasync

    startup.prepare()  # the system BLAS before anything imports MLX
    from specchat.ui.app import create_app
    from specchat.ui.main_window import MainWindow

    app = create_app()
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    window = MainWindow()
    window.session.update_settings(max_tokens=args.max_tokens, speculative=not args.plain)
    window.show()
    with loop:
        out = loop.run_until_complete(probe(window, args))
    print(json.dumps(out))
    return 0 if out.get("error") is None else 1


if __name__ == "__main__":
    sys.exit(main())
