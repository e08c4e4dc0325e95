"""A small Python API in the shape SSD's ports made familiar:

    from specchat.engine.simple_api import LLM, SamplingParams

    llm = LLM(model="/path/to/target", draft="/path/to/draft", speculate=True, speculate_k=3)
    outputs = llm.generate(["def fibonacci(n):"], SamplingParams(max_tokens=64))
    print(outputs[0].text, outputs[0].token_ids)   # or outputs[0]["text"]

It runs SpecChat's own engine (session.Engine) in the calling thread:
``speculate=True`` with a draft decodes in the ``ssd`` mode (engine/ssd.py),
without a draft in the mode the app would pick; ``mode=`` names any other.
Models are MLX folders: the engine layer does not read the model library,
so a reference such as ``bundled:qwen2.5-coder-1.5b`` is resolved first
with ``specchat.library.refs.resolve``. Use an LLM from the thread that
made it (MLX streams are per thread).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specchat.engine import events, modes
from specchat.engine.events import DraftSettings, GenerateRequest, Message, Summary


@dataclass(frozen=True)
class SamplingParams:
    """Per-call settings. ``top_k`` of 0 or less and ``top_p`` of 1 are off;
    ``temperature`` 0 is greedy. ``stop_token_ids`` end a reply besides the
    model's own end tokens."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()

    def sampling(self) -> events.SamplingParams:
        return events.SamplingParams(self.temperature, self.top_p, max(0, self.top_k), self.seed)


@dataclass(frozen=True)
class Output:
    """One prompt's completion. Readable as attributes or as a mapping
    (``out["text"]``), as the ports' dict outputs are."""

    prompt: str | tuple[int, ...]
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    summary: Summary = field(repr=False)

    def __getitem__(self, key: str):
        return getattr(self, key)

    def keys(self) -> list[str]:
        return ["prompt", "text", "token_ids", "finish_reason", "summary"]


class LLM:
    """A loaded target (and draft) with ``generate``."""

    def __init__(self, model: str | Path, draft: str | Path | None = None, speculate: bool = True,
                 speculate_k: int | None = None, mode: str | None = None, chat: bool = False):
        """``speculate_k``: a fixed draft length (None: the adaptive policy's).
        ``chat``: wrap each text prompt as a user message in the model's chat
        template instead of encoding it as it is."""
        from specchat.engine.session import Engine

        self.engine = Engine()
        pair = self.engine.load(model, draft)
        if mode is not None:
            self.mode = modes.get(mode)
        elif not speculate:
            self.mode = modes.PLAIN
        elif pair.draft is not None:
            self.mode = modes.SSD
        else:
            self.mode = modes.for_pair(True, False, pair.speculative_ok)
        self.k = speculate_k
        self.chat = chat

    @property
    def tokenizer(self):
        return self.engine.target.tokenizer

    def _request(self, prompt: str | Sequence[int], params: SamplingParams) -> GenerateRequest:
        common = {"max_tokens": params.max_tokens, "sampling": params.sampling(),
                  "draft": DraftSettings(mode=self.mode.name, k=self.k),
                  "stop_strings": tuple(params.stop),
                  "stop_token_ids": tuple(params.stop_token_ids)}
        if not isinstance(prompt, str):
            return GenerateRequest(prompt_ids=tuple(int(t) for t in prompt), **common)
        if self.chat:
            return GenerateRequest(messages=(Message("user", prompt),), **common)
        return GenerateRequest(prompt_ids=tuple(self.tokenizer.encode(prompt)), **common)

    def generate(self, prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
                 sampling_params: SamplingParams | None = None) -> list[Output]:
        """One Output per prompt (a string, or a list of token ids), in order."""
        params = sampling_params or SamplingParams()
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        out = []
        for prompt in prompts:
            r = self.engine.generate(self._request(prompt, params))
            out.append(Output(prompt if isinstance(prompt, str) else tuple(prompt), r.text,
                              r.token_ids, r.summary.finish_reason, r.summary))
        return out
