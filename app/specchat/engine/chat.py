"""Turning a conversation into prompt ids, and knowing when a reply ends."""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Mapping, Sequence

from mlx_lm.tokenizer_utils import TokenizerWrapper
from transformers import PreTrainedTokenizerBase

from specchat import records, values
from specchat.engine import chat_rules, control_tokens, template
from specchat.engine.errors import EngineError
from specchat.engine.events import Message

# End-of-turn markers used by common chat templates. One of these counts as
# an end token only if the tokenizer has it as a single token and the chat
# template mentions it.
_END_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                "</s>", "<|end_of_text|>", "<|return|>")
# gpt-oss's harmony format: ``<|end|>`` ends one message of a reply (its
# reasoning, then its answer follows), ``<|return|>`` the reply, ``<|call|>``
# a reply that calls a tool.
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")
_HARMONY_ENDS = ("<|return|>", "<|call|>")


def is_harmony(tokenizer) -> bool:
    vocab = tokenizer.get_vocab()
    return all(t in vocab for t in HARMONY_TOKENS)


def end_token_ids(tokenizer: TokenizerWrapper) -> set[int]:
    ids = set(tokenizer.eos_token_ids)
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(str(v) for v in template.values())
    vocab = tokenizer.get_vocab()
    harmony = is_harmony(tokenizer)
    for marker in _END_MARKERS:
        if marker in template and marker in vocab and not (harmony and marker == "<|end|>"):
            ids.add(vocab[marker])
    if harmony:
        ids |= {vocab[m] for m in _HARMONY_ENDS if m in vocab}
    return ids


def render(tokenizer: TokenizerWrapper, messages: Sequence[Message],
           cancelled: threading.Event | None = None, *, tools: Sequence[dict] | None = None,
           switches: Mapping[str, object] | None = None, reasoning_key: str = "") -> list[int]:
    """Prompt ids for the assistant's next reply.

    The model's Jinja chat template is untrusted code: it runs under a time
    and size budget and stops on ``cancelled`` (``template.py``). Control
    tokens the user typed are encoded as text (``control_tokens.py``); a
    conversation without any renders to exactly the ids it always did.
    ``tools`` (OpenAI's shape) and ``switches`` (variables such as
    ``enable_thinking``) reach the template as transformers passes them;
    an assistant turn's calls and a tool turn's call id in the shapes
    transformers documents, its reasoning under ``reasoning_key`` (the key
    the template reads; none: the template never sees it)."""
    if not messages or not any(m.content.strip() for m in messages if m.role == "user"):
        raise EngineError("The prompt is empty: write a message first.")
    names = chat_rules.call_names(messages)
    msgs = [_as_dict(m, reasoning_key, names) for m in messages]
    extra = {**(switches or {}), **({"tools": list(tools)} if tools else {})}
    hf = hf_of(tokenizer)
    if not getattr(tokenizer, "has_chat_template", False):
        # No template: a plain transcript the model can continue.
        msgs, extra, typed = _marked(hf, "", msgs, extra)
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in msgs) + "Assistant:"
        _bounded(text)
        if typed:
            return control_tokens.encode(hf, text, typed, add_special_tokens=True)
        return list(tokenizer.encode(text))
    if not jinja_template(tokenizer, hf):
        # mlx-lm's own Python renderers, or a tokenizer class with its own
        # renderer: code from installed packages, not from the model, so no
        # budget; typed control tokens are marked all the same.
        msgs, extra, typed = _marked(hf, renderer_source(tokenizer, hf), msgs, extra)
        if typed:
            text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False,
                                                 **extra)
            return control_tokens.encode(hf, text, typed)
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                            **extra)
        if isinstance(ids, dict):  # some transformers versions return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    source = hf.get_chat_template(None, None)
    size = (sum(len(t) for m in messages for t in chat_rules.texts(m))
            + sum(len(v) for v in (switches or {}).values() if isinstance(v, str))
            + (len(json.dumps(tools, ensure_ascii=False)) if tools else 0))
    msgs, extra, typed = _marked(hf, source, msgs, extra)
    text = template.render(source, _variables(tokenizer, hf, msgs, extra), cancelled=cancelled,
                           max_chars=template.budget_chars(size))
    _bounded(text)
    if typed:
        return control_tokens.encode(hf, text, typed)
    return list(hf.encode(text, add_special_tokens=False))


def _bounded(text: str) -> None:
    """The prompt's bound on the text the tokenizer is given (the request's
    own texts are bounded before anything renders): a request within it
    (10,000 calls of a few bytes each, the template's text around each)
    rendered to 1.3 million tokens and held the engine for 2.7 s."""
    values.prompt_size(len(text.encode("utf-8", "surrogatepass")),
                       "the prompt as the chat template writes it")


def hf_of(tokenizer):
    """The transformers tokenizer inside mlx-lm's wrapper (or itself)."""
    return tokenizer._tokenizer if isinstance(tokenizer, TokenizerWrapper) else tokenizer


def _as_dict(m: Message, reasoning_key: str, names: Mapping[str, str]) -> dict:
    """A turn as transformers passes it to a template: a plain turn is
    {role, content}, as it always was; an assistant turn's calls are
    {id, type, function: {name, arguments}} with the arguments as an
    object (transformers' documented shape, which templates ``tojson``),
    and a tool turn names the call it answers and that call's function."""
    d: dict = {"role": m.role, "content": m.content}
    if m.reasoning and reasoning_key:
        d[reasoning_key] = m.reasoning
    if m.tool_calls:
        d["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name,
                          "arguments": records.parse_json(c.arguments,
                                                          max_depth=chat_rules.JSON_DEPTH)}}
            for c in m.tool_calls]
    if m.tool_call_id:
        d["tool_call_id"] = m.tool_call_id
        if m.tool_call_id in names:
            d["name"] = names[m.tool_call_id]
    return d


def _marked(hf, source: str, msgs: list[dict],
            extra: dict) -> tuple[list[dict], dict, tuple[str, ...]]:
    """The messages (and the template's other variables: the tools, text
    switches) with the control tokens typed into them marked: every role,
    since the system prompt and earlier replies are the user's to edit, and
    every text in them (a call's arguments, a tool's description, a tool
    result); and if there were any, the control tokens to encode the
    rendered text with (a non-assistant turn's: those include an assistant
    turn's). Unchanged and () when there were none."""
    if getattr(hf, "added_tokens_decoder", None) is None:
        return msgs, extra, ()  # not a transformers tokenizer: it has no added tokens to mark
    others = control_tokens.control_tokens(hf, source, "user")
    own = control_tokens.control_tokens(hf, source, "assistant")

    def tokens(role: str) -> tuple[str, ...]:
        return own if role == "assistant" else others

    def texts(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for k, v in value.items():
                yield from texts(k)
                yield from texts(v)
        elif isinstance(value, list):
            for v in value:
                yield from texts(v)

    def mark(value, toks):
        if isinstance(value, str):
            return control_tokens.mark(value, toks)
        if isinstance(value, dict):
            return {mark(k, toks): mark(v, toks) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v, toks) for v in value]
        return value

    def body(m: dict) -> dict:
        return {k: v for k, v in m.items() if k != "role"}

    if not any(control_tokens.typed(t, tokens(m["role"])) for m in msgs for t in texts(body(m))) \
            and not any(control_tokens.typed(t, others) for t in texts(extra)):
        return msgs, extra, ()
    return ([{"role": m["role"], **mark(body(m), tokens(m["role"]))} for m in msgs],
            mark(extra, others), others)


def renderer_source(tokenizer, hf) -> str:
    """The code of a Python renderer (mlx-lm's module, or the tokenizer
    class's), so the added tokens it writes (``<think>``) count as control
    tokens as they would in a Jinja template."""
    renderer = getattr(tokenizer, "_chat_template", None) or type(hf).apply_chat_template
    try:
        code = inspect.getsource(inspect.getmodule(renderer))
    except (TypeError, OSError):
        code = ""
    template = getattr(hf, "chat_template", None)
    return code + (template if isinstance(template, str) else "")


def jinja_template(tokenizer, hf) -> bool:
    """Whether the prompt comes from the model's Jinja template, rendered
    the way transformers' ``apply_chat_template`` renders it."""
    return (getattr(tokenizer, "_chat_template", None) is None
            and getattr(hf, "chat_template", None) is not None
            and type(hf).apply_chat_template is PreTrainedTokenizerBase.apply_chat_template)


def _variables(tokenizer, hf, msgs: list[dict], extra: dict) -> dict:
    """What ``TokenizerWrapper.apply_chat_template`` (mlx-lm) and then
    transformers pass the template, so the text is the same as theirs;
    a request's switches over mlx-lm's default for the thinking switch."""
    kwargs = dict(hf.special_tokens_map)
    thinking = getattr(tokenizer, "_thinking_kwarg", None)
    if thinking:
        kwargs[thinking] = getattr(tokenizer, "has_thinking", False)
    return {**kwargs, "tools": None, **extra, "messages": msgs, "documents": None,
            "add_generation_prompt": True}
