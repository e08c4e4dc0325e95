"""Turning a conversation into prompt ids, and knowing when a reply ends."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Sequence

from mlx_lm.tokenizer_utils import TokenizerWrapper
from transformers import PreTrainedTokenizerBase

from specchat.engine import control_tokens, template
from specchat.engine.errors import EngineError
from specchat.engine.events import Message

# End-of-turn markers used by common chat templates. One of these counts as
# an end token only if the tokenizer has it as a single token and the chat
# template mentions it.
_END_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                "</s>", "<|end_of_text|>", "<|return|>")


def end_token_ids(tokenizer: TokenizerWrapper) -> set[int]:
    ids = set(tokenizer.eos_token_ids)
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(str(v) for v in template.values())
    vocab = tokenizer.get_vocab()
    for marker in _END_MARKERS:
        if marker in template and marker in vocab:
            ids.add(vocab[marker])
    return ids


def render(tokenizer: TokenizerWrapper, messages: Sequence[Message],
           cancelled: threading.Event | None = None) -> list[int]:
    """Prompt ids for the assistant's next reply.

    The model's Jinja chat template is untrusted code: it runs under a time
    and size budget and stops on ``cancelled`` (``template.py``). Control
    tokens the user typed are encoded as text (``control_tokens.py``); a
    conversation without any renders to exactly the ids it always did."""
    if not messages or not any(m.content.strip() for m in messages if m.role == "user"):
        raise EngineError("The prompt is empty: write a message first.")
    msgs = [{"role": m.role, "content": m.content} for m in messages]
    hf = tokenizer._tokenizer if isinstance(tokenizer, TokenizerWrapper) else tokenizer
    contents = [m["content"] for m in msgs]
    if not getattr(tokenizer, "has_chat_template", False):
        # No template: a plain transcript the model can continue.
        msgs, typed = _marked(hf, "", msgs)
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in msgs) + "Assistant:"
        if typed:
            return control_tokens.encode(hf, text, typed, add_special_tokens=True)
        return list(tokenizer.encode(text))
    if not _jinja_template(tokenizer, hf):
        # mlx-lm's own Python renderers, or a tokenizer class with its own
        # renderer: code from installed packages, not from the model, so no
        # budget; typed control tokens are marked all the same.
        source = _renderer_source(tokenizer, hf)
        msgs, typed = _marked(hf, source, msgs)
        if typed:
            text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            return control_tokens.encode(hf, text, typed)
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict):  # some transformers versions return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    source = hf.get_chat_template(None, None)
    msgs, typed = _marked(hf, source, msgs)
    text = template.render(source, _variables(tokenizer, hf, msgs), cancelled=cancelled,
                           max_chars=template.budget_chars(sum(map(len, contents))))
    if typed:
        return control_tokens.encode(hf, text, typed)
    return list(hf.encode(text, add_special_tokens=False))


def _marked(hf, source: str, msgs: list[dict]) -> tuple[list[dict], tuple[str, ...]]:
    """The messages with the control tokens typed into them marked (every
    role: the system prompt and earlier replies are the user's to edit),
    and if there were any, the control tokens to encode the rendered text
    with (the user's: a conversation always has a user message); unchanged
    and () when there were none."""
    if getattr(hf, "added_tokens_decoder", None) is None:
        return msgs, ()  # not a transformers tokenizer: it has no added tokens to mark
    tokens = {role: control_tokens.control_tokens(hf, source, role)
              for role in {m["role"] for m in msgs}}
    if not any(control_tokens.typed(m["content"], tokens[m["role"]]) for m in msgs):
        return msgs, ()
    return [{**m, "content": control_tokens.mark(m["content"], tokens[m["role"]])}
            for m in msgs], tokens["user"]


def _renderer_source(tokenizer, hf) -> str:
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


def _jinja_template(tokenizer, hf) -> bool:
    """Whether the prompt comes from the model's Jinja template, rendered
    the way transformers' ``apply_chat_template`` renders it."""
    return (getattr(tokenizer, "_chat_template", None) is None
            and getattr(hf, "chat_template", None) is not None
            and type(hf).apply_chat_template is PreTrainedTokenizerBase.apply_chat_template)


def _variables(tokenizer, hf, msgs: list[dict]) -> dict:
    """What ``TokenizerWrapper.apply_chat_template`` (mlx-lm) and then
    transformers pass the template, so the text is the same as theirs."""
    kwargs = dict(hf.special_tokens_map)
    thinking = getattr(tokenizer, "_thinking_kwarg", None)
    if thinking:
        kwargs[thinking] = getattr(tokenizer, "has_thinking", False)
    return {**kwargs, "messages": msgs, "tools": None, "documents": None,
            "add_generation_prompt": True}
