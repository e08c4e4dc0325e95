"""Record an agent workload: the OpenAI Agents SDK (a chat-completions model)
drives `specchat serve` on small coding tasks in a throwaway repository,
with read, write, list and run-the-tests tools; every request it sends is
saved as a bench prompt set (messages and tools as sent).

    specchat serve --plain --port 8321 &       # the bundled pair's target; greedy
    python benchmarks/record_agent.py --out benchmarks/prompts-agent.jsonl

Greedy replies are the target's own whatever the decoding mode, so the
requests recorded do not depend on how the server decodes; --plain only
makes the recording quicker. Each line: {"id", "kind": "agent", "task",
"turn", "messages", "tools"} with messages and tools exactly as the SDK
sent them (tools/prompts.py reads them through the API's own parser).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx2 as httpx
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

REPO = {
    "calc.py": '''"""Small arithmetic helpers."""


def add(a, b):
    """The sum of a and b."""
    return a - b


def mean(values):
    """The arithmetic mean of a non-empty list of numbers."""
    return sum(values) / len(values) + 1


def clamp(x, low, high):
    """x limited to the range [low, high]."""
    if x < low:
        return low
    return x
''',
    "test_calc.py": '''from calc import add, clamp, mean


def test_add():
    assert add(2, 3) == 5


def test_mean():
    assert mean([1, 2, 3]) == 2


def test_clamp():
    assert clamp(5, 0, 3) == 3
    assert clamp(-1, 0, 3) == 0
''',
    "text.py": '''"""Text helpers."""


def slugify(title):
    """A lower-case, dash-separated form of title for URLs."""
    return title.lower().replace(" ", "_")


def word_count(text):
    return len(text.split(" "))
''',
    "test_text.py": '''from text import slugify, word_count


def test_slugify():
    assert slugify("Hello World") == "hello-world"


def test_word_count():
    assert word_count("one  two\\nthree") == 3
''',
}

TASKS = {
    "fix-add": "The test test_add in test_calc.py fails. Read calc.py, fix the bug in add, "
               "then run the tests.",
    "fix-calc": "Run the tests, then fix every failing test in test_calc.py by editing calc.py "
                "(not the tests). Run the tests again at the end.",
    "fix-text": "Read text.py and test_text.py, fix slugify and word_count so the tests pass, "
                "and run the tests.",
    "add-docs": "Add a docstring to word_count in text.py that says what it counts, keeping "
                "the code the same, then show me the new file.",
    "review": "List the files, read calc.py, and tell me which functions have a bug, quoting "
              "the lines.",
    "test-clamp": "Read calc.py and test_calc.py, then add a test for clamp with a value above "
                  "the range to test_calc.py and run the tests.",
    "explain": "Read text.py and explain what each function does, quoting its code.",
}

INSTRUCTIONS = ("You are a coding agent working in a small Python repository. Use the tools "
                "to read files, write files and run the tests. Write whole files with "
                "write_file. Be brief.")


def make_tools(root: Path):
    @function_tool
    def list_files() -> str:
        """List the files of the repository."""
        return "\n".join(sorted(p.name for p in root.iterdir() if p.is_file()))

    @function_tool
    def read_file(path: str) -> str:
        """Read a file of the repository.

        Args:
            path: the file's name, e.g. calc.py
        """
        target = (root / path).resolve()
        if target.parent != root or not target.is_file():
            return f"no such file: {path}"
        return target.read_text(encoding="utf-8")

    @function_tool
    def write_file(path: str, content: str) -> str:
        """Replace a file of the repository with new content.

        Args:
            path: the file's name, e.g. calc.py
            content: the whole new text of the file
        """
        target = (root / path).resolve()
        if target.parent != root:
            return f"not in the repository: {path}"
        target.write_text(content, encoding="utf-8")
        return f"wrote {len(content)} characters to {path}"

    @function_tool
    def run_tests() -> str:
        """Run the repository's tests with pytest and return the output."""
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                              cwd=root, capture_output=True, text=True, timeout=120)
        return (proc.stdout + proc.stderr)[-3000:]

    return [list_files, read_file, write_file, run_tests]


async def record(base_url: str, model: str, out: Path, tasks: list[str], max_turns: int) -> int:
    sent: list[tuple[str, dict]] = []
    current = {"task": ""}

    async def keep(request: httpx.Request) -> None:
        if request.url.path.endswith("/chat/completions"):
            sent.append((current["task"], json.loads(request.content)))

    http = httpx.AsyncClient(event_hooks={"request": [keep]}, timeout=3600)
    client = AsyncOpenAI(base_url=base_url, api_key="unused", http_client=http)
    set_tracing_disabled(True)
    for name in tasks:
        root = Path(tempfile.mkdtemp(prefix=f"agent-{name}-"))
        for fname, text in REPO.items():
            (root / fname).write_text(text, encoding="utf-8")
        agent = Agent(name="coder", instructions=INSTRUCTIONS, tools=make_tools(root),
                      model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                      model_settings=ModelSettings(temperature=0.0, max_tokens=512))
        current["task"] = name
        try:
            result = await Runner.run(agent, TASKS[name], max_turns=max_turns,
                                      run_config=RunConfig(tracing_disabled=True))
            print(f"{name}: {str(result.final_output)[:200]!r}", file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 - a task that ran out of turns still recorded
            print(f"{name}: ended with {type(exc).__name__}: {exc}", file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)
    await http.aclose()
    turns: dict[str, int] = {}
    with out.open("w", encoding="utf-8") as f:
        for task, body in sent:
            turns[task] = turns.get(task, 0) + 1
            line = {"id": f"agent-{task}-{turns[task]}", "kind": "agent", "task": task,
                    "turn": turns[task], "messages": body["messages"]}
            if body.get("tools"):
                line["tools"] = body["tools"]
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    return len(sent)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8321/v1")
    p.add_argument("--model", default=None, help="default: the one GET /v1/models lists")
    p.add_argument("--out", type=Path, default=Path("benchmarks/prompts-agent.jsonl"))
    p.add_argument("--tasks", nargs="*", default=list(TASKS))
    p.add_argument("--max-turns", type=int, default=8)
    args = p.parse_args()
    model = args.model or httpx.get(args.base_url + "/models").json()["data"][0]["id"]
    n = asyncio.run(record(args.base_url, model, args.out, args.tasks, args.max_turns))
    print(f"{n} requests recorded in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
