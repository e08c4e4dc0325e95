"""What a model's chat template and tokenizer do with tools and reasoning,
read once when the target loads (``events.ChatFormat``).

A Jinja template is read as a syntax tree, never run: the variables it
reads and never sets itself are what a caller can pass it (``tools``, and
switches such as ``enable_thinking``), and the keys it reads from a
message tell under which name an earlier turn's reasoning reaches it
(Qwen3's ``reasoning_content``, gpt-oss's ``thinking``). A Python renderer
(mlx-lm's own, or a tokenizer class's) is code from an installed package:
its source is searched for the same names. How a reply writes its parts
comes from mlx-lm's tokenizer wrapper (``has_thinking``, ``tool_parser``),
and from gpt-oss's harmony tokens, which mlx-lm has no parser for.
"""

from __future__ import annotations

import logging
import re

from mlx_lm.tokenizer_utils import TokenizerWrapper

from specchat.engine import chat, chat_rules, template
from specchat.engine.events import ChatFormat

log = logging.getLogger("specchat.engine")

# Variables the renderer itself sets (transformers' apply_chat_template and
# mlx-lm's wrapper): the conversation, not a switch a request may set.
RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt",
                      "continue_final_message", "bos_token", "eos_token", "unk_token",
                      "pad_token", "sep_token", "cls_token", "mask_token",
                      "additional_special_tokens"})
# The keys an earlier assistant turn's reasoning is read from, in the order
# they are looked for (Qwen3 and DeepSeek's name, gpt-oss's, vLLM's newer one).
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def read(tokenizer: TokenizerWrapper) -> ChatFormat:
    """The loaded tokenizer's ChatFormat; an empty one (no tools, no
    switches) when it has no template or its template cannot be read."""
    if not getattr(tokenizer, "has_chat_template", False):
        return ChatFormat()
    hf = chat.hf_of(tokenizer)
    harmony = chat.is_harmony(tokenizer)
    if chat.jinja_template(tokenizer, hf):
        try:
            reads, keys = _jinja_names(hf.get_chat_template(None, None))
        except template.TemplateError as exc:
            log.warning("%s; its tools and switches are unknown", exc)
            return ChatFormat(template=True)
    else:
        words = set(re.findall(r"[A-Za-z_]\w*", chat.renderer_source(tokenizer, hf)))
        reads = words & {"tools", *chat_rules.ON_OFF_SWITCHES, *chat_rules.LEVEL_SWITCHES}
        keys = words & set(REASONING_KEYS)
    switches = tuple(sorted(reads - RESERVED))
    parser = getattr(tokenizer, "tool_parser", None)
    tool_format = "harmony" if harmony else (
        parser.__module__.rpartition(".")[2] if parser is not None else "")
    effort = next((s for s in (*chat_rules.ON_OFF_SWITCHES, *chat_rules.LEVEL_SWITCHES)
                   if s in switches), "")
    return ChatFormat(
        template=True, tools="tools" in reads, tool_format=tool_format,
        reasoning="harmony" if harmony else ("markers" if tokenizer.has_thinking else ""),
        reasoning_key=next((k for k in REASONING_KEYS if k in keys), ""),
        switches=switches, effort=effort)


def _jinja_names(source: str) -> tuple[set[str], set[str]]:
    """(the variables the template reads and never sets, the attribute
    and constant item names it reads: ``message.thinking``,
    ``message['reasoning_content']``), from its syntax tree alone."""
    import jinja2
    from jinja2 import meta, nodes

    env = template.compile_template(source).environment  # the same environment, so the same syntax
    try:
        tree = env.parse(source)
    except (jinja2.TemplateError, SyntaxError, RecursionError, MemoryError) as exc:
        raise template.TemplateError(f"The model's chat template cannot be read: "
                                     f"{type(exc).__name__}") from None
    reads = meta.find_undeclared_variables(tree) - set(env.globals)
    # Jinja counts a name set in some branches as read from outside (Qwen3's
    # ``content``): a name the template sets is its own, unless it also asks
    # whether it was given (``is defined``, ``| default``), as a switch is.
    own = {n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")}
    given = {n.node.name for n in (*tree.find_all(nodes.Test), *tree.find_all(nodes.Filter))
             if n.name in ("defined", "undefined", "default") and isinstance(n.node, nodes.Name)}
    reads -= own - given
    keys = {n.attr for n in tree.find_all(nodes.Getattr)}
    keys |= {n.arg.value for n in tree.find_all(nodes.Getitem)
             if isinstance(n.arg, nodes.Const) and isinstance(n.arg.value, str)}
    return reads, keys
