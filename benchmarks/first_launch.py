"""First launch of the installed package, as a person meets it: a fresh
HOME, the installed ``specchat`` opened with no arguments (the built-in
pair), a message typed into the window at once (it waits, "Will be sent
when the models are loaded"), and the clock until the reply's first text
is saved and until it is complete; then the disk used.

    flock /tmp/heavy.lock python benchmarks/first_launch.py --home /tmp/fl-home

Needs the package installed (apt install ./build/bundle/specchat_*.deb),
Xvfb and xdotool (./dev bundle installs them). Loads the real built-in
models: run it alone on the machine. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "packaging"))
import installed as inst  # noqa: E402


def du(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def peak_rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, required=True, help="a HOME to create (deleted first)")
    ap.add_argument("--message", default="Write a Python function that reverses a string.")
    ap.add_argument("--timeout", type=float, default=3600)
    args = ap.parse_args()
    if args.home.exists():
        shutil.rmtree(args.home)
    args.home.mkdir(parents=True)
    db = inst.data_dir(args.home) / "conversations.sqlite3"
    result: dict = {"package_installed_bytes": du(inst.APP_DIR)}
    with inst.xvfb() as display:
        started = time.monotonic()
        app = inst.start([str(inst.INSTALLED)], inst.clean_env(args.home, display), args.home)
        try:
            window = inst.find_window(display, "SpecChat", timeout=300, alive=app)
            result["window_s"] = round(time.monotonic() - started, 1)
            inst.type_into(display, window, args.message)
            first = None
            deadline = started + args.timeout
            while time.monotonic() < deadline:
                state = inst.last_reply(db)
                if state is not None and state.chars > 0 and first is None:
                    first = time.monotonic() - started
                    result["first_reply_text_s"] = round(first, 1)
                if state is not None and state.complete:
                    result["reply_complete_s"] = round(time.monotonic() - started, 1)
                    result["reply"] = {k: state.summary.get(k) for k in (
                        "new_tokens", "tokens_per_s", "ttft_s", "acceptance_rate", "mode")}
                    break
                if app.poll() is not None:
                    raise SystemExit(f"the app exited ({app.returncode})")
                time.sleep(0.1)
            result["peak_rss_bytes"] = (peak_rss_kb(app.pid) or 0) * 1024
            inst.close_window(display, window)
            app.wait(timeout=120)
        finally:
            inst.stop(app)
    data = inst.data_dir(args.home)
    result["home_bytes_after"] = du(data)
    result["home_parts"] = {p.name: du(p) for p in sorted(data.iterdir()) if p.is_dir()}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
