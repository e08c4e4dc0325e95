"""Turning a conversation into prompt ids, and knowing when a reply ends."""

from __future__ import annotations

from collections.abc import Sequence

from mlx_lm.tokenizer_utils import TokenizerWrapper

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


def render(tokenizer: TokenizerWrapper, messages: Sequence[Message]) -> list[int]:
    """Prompt ids for the assistant's next reply."""
    if not messages or not any(m.content.strip() for m in messages if m.role == "user"):
        raise EngineError("The prompt is empty: write a message first.")
    msgs = [{"role": m.role, "content": m.content} for m in messages]
    if getattr(tokenizer, "has_chat_template", False):
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict):  # some transformers versions return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    # No template: a plain transcript the model can continue.
    text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in msgs) + "Assistant:"
    ids = tokenizer.encode(text)
    return list(ids)
