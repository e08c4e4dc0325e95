"""Tiny real models for tests: a byte-level BPE tokenizer trained here on a
small corpus (with ChatML special tokens and template), and random
llama/qwen2-shaped mlx-lm models saved as ordinary MLX model folders."""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CORPUS = """
The quick brown fox jumps over the lazy dog. Speculative decoding lets a small
draft model propose tokens that a large target model verifies in one pass.
def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
class Stack:
    def __init__(self):
        self.items = []
    def push(self, item):
        self.items.append(item)
    def pop(self):
        return self.items.pop()
Café, naïve, résumé, déjà vu. 日本語のテキスト。中文文本。 Emoji: 🙂🚀✨ and more.
Please rewrite the following paragraph to be shorter and clearer.
The system prompt tells the assistant how to behave. The user asks a question.
for i in range(10):
    print(i * i)
import numpy as np
x = np.arange(10)
print(x.sum())
Hello, world! How are you today? I am fine, thank you.
""" * 3


def build_tokenizer(folder: Path, vocab_size: int = 400, chat_template: str = CHATML,
                    specials: list[str] = SPECIALS, eos: str = "<|im_end|>",
                    corpus_extra: str = "") -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS + corpus_extra], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos,
        pad_token=specials[0],
        chat_template=chat_template,
    )
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    return folder


def build_model(folder: Path, tokenizer_dir: Path, *, model_type: str = "llama", hidden: int = 64,
                layers: int = 2, heads: int = 4, kv_heads: int = 2, vocab: int | None = None,
                seed: int = 0, logit_scale: float = 3.0, noise_from: Path | None = None,
                noise: float = 0.0, grow_from: Path | None = None,
                extra_config: dict | None = None) -> Path:
    """A random model.

    With ``noise_from``, copy that model's weights and add relative Gaussian
    noise (a draft that agrees with its target often). With ``grow_from``,
    copy that model into the first layers and make the remaining layers
    nearly transparent (small output projections): a bigger model that
    computes almost the same function, i.e. a target for that draft."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import _get_classes

    folder.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.is_file():
            (folder / f.name).write_bytes(f.read_bytes())
    n_tok = len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])
    config = {
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": hidden * 2,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab or n_tok,
        # Untied: with a tied head a random model just repeats its input token.
        "tie_word_embeddings": False,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "eos_token_id": None,
    }
    config.update(extra_config or {})
    config = {k: v for k, v in config.items() if v is not None}
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    if grow_from is not None:
        src = mx.load(str(grow_from / "model.safetensors"))
        base_layers = json.loads((grow_from / "config.json").read_text())["num_hidden_layers"]
        for k, v in params.items():
            layer = int(k.split("layers.")[1].split(".")[0]) if ".layers." in f".{k}" else None
            if layer is None or layer < base_layers:
                params[k] = src[k]
            elif k.endswith(("o_proj.weight", "down_proj.weight")):
                params[k] = v * 0.02
    elif noise_from is not None:
        src = mx.load(str(noise_from / "model.safetensors"))
        params = {}
        for k, v in src.items():
            std = mx.std(v) if v.size > 1 else mx.array(0.0)
            params[k] = v + noise * std * mx.random.normal(v.shape)
    else:
        heads = [k for k in params if k.endswith("lm_head.weight")] or \
            [k for k in params if k.endswith("embed_tokens.weight")]
        params[heads[0]] = params[heads[0]] * logit_scale
    model.update(tree_unflatten(list(params.items())))
    mx.eval(model.parameters())
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def prune_draft_head(engine, keep: int) -> None:
    """Give a loaded engine's draft the pruned output head that real
    150k-vocabulary drafts get (tiny vocabularies are never pruned on their
    own): only ids below ``keep``, the end tokens, and ids seen in context."""
    from specchat.engine.draft_model import ModelDrafter

    engine._model_drafter = ModelDrafter(engine.draft, extra_ids=sorted(engine.end_ids),
                                         prune=True, keep=keep)
    assert engine.model_drafter.head is not None


def with_chat_template(source: Path, folder: Path, template: str) -> Path:
    """A copy of a model folder whose tokenizer_config.json carries
    ``template`` as its chat template, as many Hub models ship it (any
    chat_template.jinja is left out, so this one is the template)."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        if f.is_file() and f.name != "chat_template.jinja":
            (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return folder


def build_thinking_tokenizer(folder: Path, chat_template: str) -> Path:
    """The tiny tokenizer plus ``<think>`` and ``</think>`` as ordinary
    (not special) added tokens, as Qwen3 has them."""
    from transformers import PreTrainedTokenizerFast

    build_tokenizer(folder, chat_template=chat_template)
    fast = PreTrainedTokenizerFast.from_pretrained(str(folder))
    fast.add_tokens(["<think>", "</think>"])
    fast.save_pretrained(str(folder))
    return folder


DEEPSEEK_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
                     "<｜Assistant｜>"]


def build_python_renderer_tokenizer(folder: Path, renderer: str = "deepseek_v32") -> Path:
    """The tiny tokenizer with mlx-lm's own Python chat renderer
    (``chat_template_type`` in tokenizer_config.json, as mlx-community's
    DeepSeek-V3.2 conversions have it) and that renderer's turn markers as
    special tokens."""
    build_tokenizer(folder, specials=SPECIALS + DEEPSEEK_SPECIALS)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template_type"] = renderer
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return folder
