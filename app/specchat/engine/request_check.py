"""The whole request checked before any MLX call.

``Engine.generate`` is the one door every reply goes through (the window,
Compare, the CLI, the bench and any caller of the API), so a request is
checked here, field by field, against ``specchat.values``: a bad value
becomes the same one line the CLI and the settings dialog give
(``BadValue``, a ``SpecChatError``), never an exception from deep inside
sampling or the tokenizer that the engine thread would have to report as an
internal error. Pure Python: no MLX.
"""

from __future__ import annotations

import operator
from dataclasses import replace

from specchat import values
from specchat.engine import chat_rules, modes
from specchat.engine.errors import EngineError
from specchat.engine.events import DraftSettings, GenerateRequest, Message, SamplingParams

ACCEPTANCE = ("rejection", "equality")
# How each role's text is named in a message about it.
_ROLE_NAMES = {"system": "the system prompt", "user": "the message",
               "assistant": "an earlier reply", "tool": "a tool result"}


def checked(request: GenerateRequest) -> GenerateRequest:
    """``request`` with every value in its range and in its kind (a seed
    folded into 64 bits, a K of "auto" as None), or ``BadValue`` /
    ``EngineError`` naming the first one that is not."""
    s = request.sampling
    sampling = SamplingParams(
        temperature=values.check("temperature", s.temperature),
        top_p=values.check("top-p", s.top_p),
        top_k=values.check("top-k", s.top_k),
        seed=values.check("seed", s.seed),
    )
    d = request.draft
    mode = modes.get(d.mode)  # EngineError naming the modes there are
    if d.acceptance not in ACCEPTANCE:
        raise EngineError(f"acceptance must be one of {', '.join(ACCEPTANCE)}; "
                          f"got {d.acceptance!r}")
    if not isinstance(d.auto_off, bool):
        raise EngineError(f"auto_off must be true or false; got {d.auto_off!r}")
    draft = DraftSettings(mode=mode.name, k=values.check("K", d.k), acceptance=d.acceptance,
                          auto_off=d.auto_off)
    # Each size before what it sizes is used: a list's count before its
    # items are read; the prompt in UTF-8 bytes (a bound on its tokens)
    # before the template and the tokenizer, which would hold the engine
    # thread for seconds, only to find it longer than the model reads.
    values.size("messages", len(request.messages))
    values.size("tool calls in all", sum(len(m.tool_calls) for m in request.messages))
    messages = tuple(_message(m, i) for i, m in enumerate(request.messages))
    chat_rules.conversation(messages)
    tools_text = values.text("tools", request.tools)
    values.prompt_size(chat_rules.prompt_bytes(messages, tools_text))
    if not isinstance(request.parallel_tool_calls, bool):
        raise EngineError(f"parallel_tool_calls must be true or false; got "
                          f"{request.parallel_tool_calls!r}")
    tools = chat_rules.tool_list(tools_text)
    choice, tool_name = chat_rules.tool_choice(request.tool_choice, request.tool_name,
                                               [t["function"]["name"] for t in tools])
    prompt_ids = request.prompt_ids
    if prompt_ids is not None:
        values.prompt_tokens(len(prompt_ids))
        prompt_ids = _ids("prompt token", prompt_ids)
    return replace(
        request,
        messages=messages,
        prompt_ids=prompt_ids,
        max_tokens=values.check("max tokens", request.max_tokens),
        sampling=sampling,
        draft=draft,
        stop_strings=values.stop_strings(request.stop_strings),
        stop_token_ids=_ids("stop token", request.stop_token_ids),
        tool_choice=choice,
        tool_name=tool_name,
        template_switches=chat_rules.switches(request.template_switches),
        reasoning_effort=chat_rules.effort(request.reasoning_effort),
    )


def _message(m: Message, i: int) -> Message:
    if not isinstance(m.role, str):
        raise EngineError(f"a message role must be text; got {type(m.role).__name__}")
    name = _ROLE_NAMES.get(m.role, f"the {values.text('a message role', m.role)} message")
    where = f"messages[{i}]"
    values.size("tool calls", len(m.tool_calls))
    return Message(m.role, values.text(name, m.content),
                   reasoning=values.text(f"{where}'s reasoning", m.reasoning),
                   tool_calls=tuple(chat_rules.tool_call(c, f"{where}.tool_calls[{j}]")
                                    for j, c in enumerate(m.tool_calls)),
                   tool_call_id=values.text(f"{where}.tool_call_id", m.tool_call_id))


def _ids(name: str, ids) -> tuple[int, ...]:
    """Token ids must be whole numbers (their range is the vocabulary's,
    checked where the vocabulary is known)."""
    out = []
    for t in ids:
        try:
            out.append(operator.index(t))  # ints, and numpy's
        except TypeError:
            raise EngineError(f"a {name} id must be a whole number; got {t!r}") from None
    return tuple(out)
