"""Rank 0 for tests/engine/test_distributed.py, in a process of its own
(MLX joins a process to one ring, once): the app's engine thread, first
with the target local (the single-process reference), then with the same
target on the cluster, then a reply during which rank 1 is SIGKILLed, and
finally the local target again.

Reads a JSON plan from argv[1]; prints one JSON object.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time

from specchat import startup

startup.prepare()

from specchat.engine.client import EngineClient  # noqa: E402
from specchat.engine.errors import EngineError  # noqa: E402
from specchat.engine.events import (  # noqa: E402
    DraftSettings,
    GenerateRequest,
    Message,
    SamplingParams,
)


def request(r: dict) -> GenerateRequest:
    return GenerateRequest(messages=(Message("user", r["prompt"]),), max_tokens=r["max_tokens"],
                           sampling=SamplingParams(r.get("temperature", 0.0), 1.0, 0,
                                                   r.get("seed", 0)),
                           draft=DraftSettings(mode=r["mode"], k=r.get("k")))


def replies(client: EngineClient, plan: dict) -> list[list[int]]:
    return [list(client.generate(request(r)).wait().token_ids) for r in plan["requests"]]


def main() -> None:
    plan = json.loads(sys.argv[1])
    client = EngineClient()
    out = {}
    client.load(plan["target"], plan["draft"]).wait()
    out["reference"] = replies(client, plan)
    pair = client.load(plan["cluster"], plan["draft"]).wait()
    out["target_name"] = pair.target.name
    out["cluster"] = replies(client, plan)

    kill = plan["kill"]
    steps: list[int] = []
    killed_at: list[float] = []

    def on_step(ev) -> None:
        steps.extend(ev.token_ids)
        if ev.index == kill["step"]:
            os.kill(kill["pid"], signal.SIGKILL)
            killed_at.append(time.monotonic())
            faulthandler.dump_traceback_later(20, exit=True)  # a hang fails the test, with a trace

    try:
        client.call(lambda eng: eng.generate(request(kill["request"]), None, on_step)).wait()
        out["killed"] = {"error": None}
    except EngineError as exc:
        faulthandler.cancel_dump_traceback_later()
        out["killed"] = {"error": str(exc), "partial": steps,
                         "seconds": time.monotonic() - killed_at[0]}
    try:
        client.generate(request(kill["request"])).wait()
    except EngineError as exc:
        out["again"] = str(exc)
    client.load(plan["target"], plan["draft"]).wait()
    out["local_after"] = replies(client, plan)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
