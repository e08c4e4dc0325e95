"""A picture of the app mid-reply, for the README (docs/screenshots/).

    python benchmarks/screenshot.py --target bundled:qwen2.5-coder-1.5b \\
        --draft bundled:qwen2.5-coder-0.5b [--out docs/screenshots/main-window.png]

Opens the real window on the real qasync loop (offscreen works:
QT_QPA_PLATFORM=offscreen), loads the pair and asks the prompt twice: first
plain (a short reply, so "vs plain" and the speed chart have the pair's plain
speed as their reference), then regenerates it speculatively with Colour
tokens on, and saves the window while that reply streams, with the charts
showing. The settings it changes are put back afterwards; the conversation
stays in the history (pass --home DIR to keep it out of yours).
tests/ui/test_ui_screenshot.py runs the same ``shoot`` with the tiny models.

The README's picture comes from the installed package (the .deb's code,
packages and Python; docs/app.md, "The packages"):

    QT_QPA_PLATFORM=offscreen PYTHONPATH=/usr/lib/specchat/app_packages \
        /usr/bin/python3 benchmarks/screenshot.py --app /usr/lib/specchat/app \
        --target bundled:qwen2.5-coder-1.5b --draft bundled:qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "screenshots" / "main-window.png"
PROMPT = ("Write a Python function that sorts a list of words case-insensitively, "
          "with a docstring, then show how to call it.")
SIZE = (1180, 780)


async def _until(condition, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f} s")
        await asyncio.sleep(0.05)


async def shoot(window, target: str, draft: str | None, out: Path, prompt: str = PROMPT,
                max_tokens: int = 600, after_chars: int = 500, plain_tokens: int = 64,
                timeout: float = 600.0) -> dict:
    """Drive ``window`` (shown, started, on a running loop) to a reply in
    progress and save it to ``out``; what was shown, as a dict."""
    from specchat.ui.charts import REDRAW_S

    session = window.session
    keep = {k: getattr(session.settings, k) for k in ("color_tokens", "speculative", "max_tokens")}
    try:
        window.picker.set_pair(target, draft)
        window.load_pair(target, draft)
        await _until(lambda: not session.engine.loading, timeout, "the pair to load")
        if session.engine.pair is None:
            raise RuntimeError(window.error_banner.label.text())
        window.open_conversation(None)
        # A short plain reply first: the reference line and "vs plain".
        session.update_settings(speculative=False, max_tokens=plain_tokens, color_tokens=True)
        window.composer.edit.setPlainText(prompt)
        window.composer.send_button.click()
        await _until(lambda: not window.conversation.busy, timeout, "the plain reply")
        # The same prompt again, speculative, caught while it streams.
        session.update_settings(speculative=True, max_tokens=max_tokens)
        window.regenerate()
        reply = window.chat_model.messages[-1]
        await _until(lambda: len(reply.text) >= after_chars or not window.conversation.busy,
                     timeout, "the reply")
        await asyncio.sleep(2 * REDRAW_S)  # the charts draw their latest points
        window.chat_view.stick_to_bottom()
        await asyncio.sleep(0.05)
        out.parent.mkdir(parents=True, exist_ok=True)
        if not window.grab().save(str(out)):
            raise RuntimeError(f"could not write {out}")
        shown = {"out": str(out), "chars": len(reply.text), "streaming": reply.streaming,
                 "origins": sorted({o for o, _ in reply.runs}),
                 "gauges": {"tokens": window.gauges.values.tokens,
                            "steps": window.gauges.values.steps,
                            "tokens_per_s": round(window.gauges.values.tokens_per_s, 1)}}
        window.conversation.stop()
        await _until(lambda: not window.conversation.busy, timeout, "the reply to stop")
        return shown
    finally:
        session.update_settings(**keep)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python benchmarks/screenshot.py")
    p.add_argument("--target", required=True)
    p.add_argument("--draft", help="a draft model (default: prompt lookup, no draft model)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--max-tokens", type=int, default=600)
    p.add_argument("--after-chars", type=int, default=500,
                   help="take the picture once the reply has this many characters")
    p.add_argument("--home", help="SPECCHAT_HOME for this run (default: yours)")
    p.add_argument("--app", type=Path, default=ROOT / "app",
                   help="SpecChat's sources (default: this checkout's); the installed "
                        "package's are /usr/lib/specchat/app (run with its Python, its "
                        "app_packages on PYTHONPATH)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.home:
        os.environ["SPECCHAT_HOME"] = args.home
    sys.path.insert(0, str(args.app))
    import qasync
    from specchat import startup

    startup.prepare()  # the system BLAS before anything imports MLX
    from specchat.ui.app import create_app
    from specchat.ui.main_window import MainWindow

    app = create_app()
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    window = MainWindow()
    window.resize(*SIZE)
    window.show()

    async def run() -> dict:
        window.start()
        try:
            return await shoot(window, args.target, args.draft, args.out.resolve(), args.prompt,
                               args.max_tokens, args.after_chars)
        finally:
            window.close()

    with loop:
        shown = loop.run_until_complete(run())
    import specchat

    shown["sources"] = str(Path(specchat.__file__).parent)  # which SpecChat took it
    print(json.dumps(shown))
    if not shown["streaming"]:
        print("note: the reply ended before --after-chars characters, so the picture shows it "
              "finished; lower --after-chars or ask for a longer reply", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
