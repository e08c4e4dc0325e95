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
                extra_config: dict | None = None, amplify: dict[str, float] | None = None) -> Path:
    """A random model.

    With ``noise_from``, copy that model's weights and add relative Gaussian
    noise (a draft that agrees with its target often). With ``grow_from``,
    copy that model into the first layers and make the remaining layers
    nearly transparent (small output projections): a bigger model that
    computes almost the same function, i.e. a target for that draft.
    ``amplify`` scales the weights whose names end with a key (a model with a
    tied head whose layers barely move the residual only repeats its input
    token)."""
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
            if k.startswith("mtp."):  # the source's MTP head is not the draft's
                continue
            std = mx.std(v) if v.size > 1 else mx.array(0.0)
            params[k] = v + noise * std * mx.random.normal(v.shape)
    else:
        heads = [k for k in params if k.endswith("lm_head.weight")] or \
            [k for k in params if k.endswith("embed_tokens.weight")]
        params[heads[0]] = params[heads[0]] * logit_scale
        for k in params:
            for suffix, factor in (amplify or {}).items():
                if k.endswith(suffix):
                    params[k] = params[k] * factor
    model.update(tree_unflatten(list(params.items())))
    mx.eval(model.parameters())
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def prune_draft_head(engine, keep: int) -> None:
    """Give a loaded engine's draft the pruned output head that real
    150k-vocabulary drafts get (tiny vocabularies are never pruned on their
    own): only ids below ``keep``, the special tokens, and ids seen in context."""
    engine.model_drafter.prune(keep)
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


# A tiny Gemma 4 text config (mlx-lm's gemma4_text): heads of 16, full
# attention's of 32 with one key head whose values are its keys, a window of 8.
GEMMA4_TEXT = dict(head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                   attention_k_eq_v=True, num_kv_shared_layers=0,
                   hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
                   sliding_window=8, final_logit_softcapping=30.0,
                   use_double_wide_mlp=False, enable_moe_block=False)

# Tiny configs of the architectures people run now, for mlx-lm's own model
# classes: hybrids with recurrent state (Gated DeltaNet, Mamba 2, short
# convolutions) and a sliding window shorter than the tests' contexts.
ARCHS: dict[str, dict] = {
    "qwen3_5": dict(model_type="qwen3_5", layers=4, extra_config=dict(
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, full_attention_interval=2,
        head_dim=16)),
    "qwen3_next": dict(model_type="qwen3_next", layers=4, extra_config=dict(
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, full_attention_interval=2,
        head_dim=16, num_experts=0, num_experts_per_tok=0, decoder_sparse_step=1,
        shared_expert_intermediate_size=0, moe_intermediate_size=0, mlp_only_layers=[],
        norm_topk_prob=True, partial_rotary_factor=0.25)),
    "gemma3_text": dict(model_type="gemma3_text", layers=4, extra_config=dict(
        sliding_window=8, sliding_window_pattern=2, head_dim=16, query_pre_attn_scalar=16)),
    # Gemma 4 as the 31B is: full-attention layers of their own head width
    # whose values are their keys (attention_k_eq_v), soft-capped logits, no
    # per-layer inputs; the last layer a sliding one.
    "gemma4_text": dict(model_type="gemma4_text", layers=4, extra_config=dict(
        GEMMA4_TEXT, layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                  "sliding_attention"])),
    "falcon_h1": dict(model_type="falcon_h1", layers=2, extra_config=dict(
        mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8, mamba_n_groups=1,
        mamba_d_conv=4, mamba_expand=1, head_dim=16)),
    "nemotron_h": dict(model_type="nemotron_h", layers=4, extra_config=dict(
        hybrid_override_pattern="M*M-", mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=8,
        n_groups=1, conv_kernel=4, head_dim=16, mamba_hidden_act="silu", mlp_hidden_act="relu2",
        attention_bias=False, mlp_bias=False, use_conv_bias=True, mamba_proj_bias=False,
        use_bias=False, layer_norm_epsilon=1e-5, residual_in_fp32=False, chunk_size=16,
        time_step_limit=[0.0, 100.0], time_step_min=0.001, time_step_max=0.1,
        time_step_floor=1e-4)),
    "lfm2": dict(model_type="lfm2", layers=4, extra_config=dict(
        conv_L_cache=3, conv_bias=False, full_attn_idxs=[1, 3], block_dim=64, block_ff_dim=128,
        block_multiple_of=16, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False,
        norm_eps=1e-5), amplify={"w2.weight": 8.0, "out_proj.weight": 8.0}),
}


def build_arch(folder: Path, tokenizer_dir: Path, arch: str, seed: int = 5,
               noise_from: Path | None = None, noise: float = 0.0) -> Path:
    """A random model of one of ``ARCHS`` (a draft of it: ``noise_from``
    its target, with relative noise)."""
    return build_model(folder, tokenizer_dir, seed=seed, noise_from=noise_from, noise=noise,
                       **ARCHS[arch])


def add_mtp(folder: Path, seed: int = 7, scale: float = 1.0) -> Path:
    """Give a tiny Qwen3.5 folder an MTP head (``mtp.*`` weights beside the
    model's, as Qwen's checkpoints ship it; mlx-lm's sanitize drops them)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model
    from specchat.engine.mtp import MTPModule

    model, _ = load_model(folder)
    lm = model.language_model
    mx.random.seed(seed)
    head = MTPModule(type(lm.model.layers[0]), lm.args, 1)
    weights = dict(mx.load(str(folder / "model.safetensors")))
    for k, v in tree_flatten(head.parameters()):
        weights[f"mtp.{k}"] = v * scale if k.endswith("weight") and v.ndim > 1 else v
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return folder


def fuse_experts(folder: Path) -> Path:
    """A tiny Qwen3.5 MoE folder's experts, its MTP head's too, in the
    layout Qwen's own checkpoints ship them (and mlx-lm's qwen3_5_moe
    sanitize reads): each layer's experts as two stacked tensors,
    ``mlp.experts.gate_up_proj`` (gate, then up) and ``mlp.experts.down_proj``,
    for mlx-lm's ``mlp.switch_mlp`` projections."""
    import mlx.core as mx

    weights = dict(mx.load(str(folder / "model.safetensors")))
    for k in [k for k in weights if k.endswith(".mlp.switch_mlp.gate_proj.weight")]:
        base = k[:-len("switch_mlp.gate_proj.weight")]
        gate, up = weights.pop(k), weights.pop(base + "switch_mlp.up_proj.weight")
        weights[base + "experts.gate_up_proj"] = mx.concatenate([gate, up], axis=-2)
        weights[base + "experts.down_proj"] = weights.pop(base + "switch_mlp.down_proj.weight")
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return folder


# Qwen3.5's MoE (Qwen3.5 35B-A3B, Qwen3.6 35B-A3B): ARCHS["qwen3_5"] with experts.
QWEN3_5_MOE = dict(model_type="qwen3_5_moe", layers=4, extra_config=dict(
    ARCHS["qwen3_5"]["extra_config"], num_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=32, shared_expert_intermediate_size=32))


def build_eagle3(folder: Path, target: Path, *, layout: str = "eagle3", draft_vocab: int = 256,
                 seed: int = 11, hidden: int | None = None, layer_ids=None,
                 rope_scaling: dict | None = None, wrap: bool = True,
                 head_dim: int | None = None, stated_head_dim: int | None = None) -> Path:
    """A random EAGLE-3 head for ``target`` in a published layout: "eagle3"
    (EAGLE-3's own: a flat config, ``midlayer.`` weights) or "speculators"
    (vLLM's: ``transformer_layer_config``, ``layers.0.`` weights). Its draft
    vocabulary is every other id of the target's from 0 (``d2t`` maps it;
    ``t2d`` marks them), wrapping around the target's vocabulary; with
    ``wrap=False`` the ids run on past its end (a head for a larger one).
    ``rope_scaling`` goes in its layer's config as is. ``head_dim``: its
    attention's width per head; ``stated_head_dim``: what its config says
    instead (a published config that disagrees with its weights)."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from specchat.engine.eagle3 import Eagle3Head, HeadConfig

    tcfg = json.loads((target / "config.json").read_text())
    width = hidden or tcfg["hidden_size"]
    layer = {"hidden_size": width, "intermediate_size": width * 2, "num_hidden_layers": 1,
             "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
             "rope_theta": 10000.0, "vocab_size": tcfg["vocab_size"], "max_position_embeddings": 2048}
    if rope_scaling is not None:
        layer["rope_scaling"] = rope_scaling
    if head_dim is not None:
        layer["head_dim"] = head_dim
    extra = {"draft_vocab_size": draft_vocab, "target_hidden_size": width}
    if layer_ids is not None:
        extra["eagle_aux_hidden_state_layer_ids"] = list(layer_ids)
    if layout == "speculators":
        config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
                  "transformer_layer_config": layer, **extra}
    else:
        config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **layer,
                  **extra}
    mx.random.seed(seed)
    head = Eagle3Head(HeadConfig.from_config(config))
    weights = {}
    for k, v in tree_flatten(head.parameters()):
        if k.startswith("embed_tokens.") or k == "d2t":
            continue  # the target's embedding is shared; d2t below
        name = k.replace("layers.0.", "midlayer.", 1) if layout == "eagle3" else k
        weights[name] = v * 3.0 if k == "lm_head.weight" else v
    ids = np.arange(draft_vocab) * 2 % (tcfg["vocab_size"] if wrap else 1 << 30)
    weights["d2t"] = mx.array(ids - np.arange(draft_vocab), dtype=mx.int64)
    t2d = np.zeros(max(tcfg["vocab_size"], int(ids.max()) + 1), dtype=bool)
    t2d[ids] = True
    weights["t2d"] = mx.array(t2d)
    if stated_head_dim is not None:
        (config.get("transformer_layer_config") or config)["head_dim"] = stated_head_dim
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


# -- heads that are right part of the time ------------------------------------------------
# A random head is never right, so a test with one sees drafts rejected and
# never accepted; these agree with their target on some tokens and not on
# others, by construction (no training), so tests see blocks accepted in
# part and the rollback after them.


def build_partial_eagle3(folder: Path, target: Path, *, layout: str = "eagle3") -> Path:
    """An EAGLE-3 head for ``target`` (the tiny llama target) that is right
    part of the time: two layers that copy the target's first two (its
    other four barely move the residual stream), run over the head's own
    rows as the target runs over its positions. Row p sits at position p + 1
    with that token's embedding, so the head computes much of what the
    target's first layers compute for the token at p + 1, and reads it out
    through the target's norm and output layer. Much, not all: its first
    layer's residual is nothing where the target's is the embedding
    (``norm_before_residual`` with a zero ``hidden_norm``), and its rows lack
    the target's position 0, which a random model's choices hang on. So it
    drafts the target's next token where the reply repeats itself (the
    tiny target's greedy replies settle into loops) and now and then
    elsewhere, and is wrong on most new text. It reads none of the target's
    features (``fc`` is zero): a test of what a head makes of them uses
    ``build_eagle3``'s random heads."""
    import mlx.core as mx

    tcfg = json.loads((target / "config.json").read_text())
    hidden, vocab = tcfg["hidden_size"], tcfg["vocab_size"]
    build_eagle3(folder, target, layout=layout, draft_vocab=vocab)
    config = json.loads((folder / "config.json").read_text())
    (config.get("transformer_layer_config") or config).update(
        num_hidden_layers=2, num_attention_heads=tcfg["num_attention_heads"],
        num_key_value_heads=tcfg["num_key_value_heads"],
        intermediate_size=tcfg["intermediate_size"])
    config["norm_before_residual"] = True
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    src = mx.load(str(target / "model.safetensors"))
    weights = {"fc.weight": mx.zeros((hidden, 3 * hidden)), "norm.weight": src["model.norm.weight"],
               "lm_head.weight": src["lm_head.weight"],
               "d2t": mx.zeros((vocab,), dtype=mx.int64), "t2d": mx.ones((vocab,), dtype=mx.bool_)}
    for i in range(2):
        mine = "midlayer." if i == 0 and layout == "eagle3" else f"layers.{i}."
        theirs = {k[len(f"model.layers.{i}."):]: v for k, v in src.items()
                  if k.startswith(f"model.layers.{i}.")}
        for name, v in theirs.items():
            if i == 0 and name in ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                   "self_attn.v_proj.weight"):
                v = mx.concatenate([v, mx.zeros_like(v)], axis=1)  # reads [embedding; features]
            weights[mine + name] = v
    weights["midlayer.hidden_norm.weight" if layout == "eagle3" else
            "layers.0.hidden_norm.weight"] = mx.zeros((hidden,))
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return folder


def build_partial_mtp_target(folder: Path, tokenizer_dir: Path, seed: int = 8) -> Path:
    """A tiny Qwen3.5 whose MTP head is right part of the time. Its layers'
    outputs are scaled by 0.2, so its next token is often (not always) the
    one its output layer reads off the last token's embedding alone; its
    head drafts exactly that (``fc`` passes the embedding on, its layer is
    silent, its norm is the target's), so it is right where the target
    reads only the last token, wrong where its layers and their recurrent
    state change its mind."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model
    from specchat.engine.mtp import MTPModule

    quiet = {k: 0.2 for k in ("o_proj.weight", "out_proj.weight", "down_proj.weight")}
    build_model(folder, tokenizer_dir, seed=seed, **{**ARCHS["qwen3_5"], "amplify": quiet})
    model, _ = load_model(folder)
    lm = model.language_model
    hidden = lm.args.hidden_size
    mx.random.seed(seed)
    head = MTPModule(type(lm.model.layers[0]), lm.args, 1)
    weights = dict(mx.load(str(folder / "model.safetensors")))
    for k, v in tree_flatten(head.parameters()):
        if k == "fc.weight":  # [embedding; hidden state] -> the embedding
            v = mx.concatenate([mx.eye(hidden), mx.zeros((hidden, hidden))], axis=1)
        elif k.endswith(("o_proj.weight", "down_proj.weight")):
            v = mx.zeros_like(v)
        elif k == "norm.weight":
            v = lm.model.norm.weight
        weights[f"mtp.{k}"] = v
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return folder


def build_gemma4(folder: Path, tokenizer_dir: Path, seed: int = 5,
                 layers: float | None = None) -> Path:
    """A tiny Gemma 4 as Google ships the 31B (model type ``gemma4``, its
    text model under ``language_model``, mlx-lm's gemma4 wrapping
    gemma4_text): ARCHS["gemma4_text"]'s numbers, nested. ``layers``: the
    weight of each layer's output in its residual (its post-attention and
    post-feedforward norms'), small for a model that mostly reads its last
    token (an assistant that reads that token then drafts it often)."""
    import mlx.core as mx

    arch = dict(ARCHS["gemma4_text"])
    if layers is not None:
        arch["amplify"] = {"post_attention_layernorm.weight": layers,
                           "post_feedforward_layernorm.weight": layers}
    build_model(folder, tokenizer_dir, seed=seed, **arch)
    text = json.loads((folder / "config.json").read_text())
    config = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
              "text_config": text, "vocab_size": text["vocab_size"]}
    weights = mx.load(str(folder / "model.safetensors"))
    mx.save_safetensors(str(folder / "model.safetensors"),
                        {f"language_model.{k}": v for k, v in weights.items()})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def build_gemma4_assistant(folder: Path, target: Path, *, ordered: bool = False,
                           seed: int = 13, hidden: int = 32, layer_types=None,
                           extra: dict | None = None, mimic: float | None = None) -> Path:
    """A random Gemma 4 assistant for a tiny Gemma 4 ``target`` (either
    layout), in Google's layout: ``Gemma4AssistantForCausalLM``'s config
    and transformers' weight names, its layers KV-shared (no key or value
    projections). ``ordered``: a centroid-routed output layer (the small
    sizes'), 8 centroids of which it scores the best 2; ``extra``: fields
    of its text config changed. ``mimic``: as wide as its target, it reads
    the embedding of the token it reads as its own (``pre_projection``
    passes it on), its output layer is the target's, and its layers add
    ``mimic`` of their output to it: for a target that mostly reads its
    last token (build_gemma4's ``layers``), it drafts the target's next
    token often, not always, from what it attends to and carries."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from specchat.engine.assistant import AssistantModel
    from specchat.engine.assistant_format import AssistantConfig

    tcfg = json.loads((target / "config.json").read_text())
    tcfg = tcfg.get("text_config", tcfg)
    hidden = tcfg["hidden_size"] if mimic is not None else hidden
    text = {"model_type": "gemma4_text", "hidden_size": hidden, "intermediate_size": 2 * hidden,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
            "head_dim": tcfg["head_dim"], "global_head_dim": tcfg["global_head_dim"],
            "vocab_size": tcfg["vocab_size"], "num_kv_shared_layers": 2,
            "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
            "layer_types": layer_types or ["sliding_attention", "full_attention"],
            "sliding_window": tcfg["sliding_window"], "rms_norm_eps": 1e-6,
            "max_position_embeddings": 2048, "use_double_wide_mlp": False,
            "attention_k_eq_v": True, "final_logit_softcapping": None,
            **(extra or {})}
    config = {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
              "backbone_hidden_size": tcfg["hidden_size"], "use_ordered_embeddings": ordered,
              "num_centroids": 8, "centroid_intermediate_top_k": 2, "tie_word_embeddings": True,
              "text_config": text}
    mx.random.seed(seed)
    module = AssistantModel(AssistantConfig.from_config(config))
    weights = dict(tree_flatten(module.parameters()))
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"] * 3.0
    if mimic is not None:
        theirs = mx.load(str(target / "model.safetensors"))
        weights["model.embed_tokens.weight"] = next(
            v for k, v in theirs.items() if k.endswith("lm_head.weight"))
        pre = weights["pre_projection.weight"]
        weights["pre_projection.weight"] = mx.concatenate(
            [mx.eye(hidden), pre[:, hidden:] * mimic], axis=1)
        for k in weights:
            if k.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
                weights[k] = weights[k] * mimic
    if ordered:
        order = np.random.default_rng(seed).permutation(tcfg["vocab_size"])
        weights["masked_embedding.token_ordering"] = mx.array(order, dtype=mx.int64)
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


# Qwen3's chat template as it ships (tools in the system turn, calls as
# <tool_call> JSON, results as <tool_response> in a user turn, the
# reasoning of turns after the last query under reasoning_content, the
# enable_thinking switch).
QWEN3_TOOLS = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

# What the scripted agent model writes (build_agent_model): one text per
# added token, so its greedy reply is a chain of distinct tokens.
AGENT_TEXTS = {
    "reason": "\nThe user wants the weather in Paris.\n",
    "open1": "\n\n<tool_call>",
    "call1": '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n',
    "open2": "\n<tool_call>",
    "call2": '\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}',
    "close2": "\n</tool_call>",
    "blank": "\n\n",
    "answer": "It is sunny in Paris.",
    "named": '\n{"name": "get_time", "arguments":',
    "utc": ' {"tz": "UTC"}}\n',
    "broken": ' {"city": Paris}}\n',
}
AGENT_MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
# The calls its greedy reply makes (thinking on): (name, arguments).
AGENT_CALLS = [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})]
# The tools the agent model's calls are made to (OpenAI's shape).
AGENT_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
# Each chain: the prompt's last token (a text of AGENT_TEXTS or a marker,
# or the last token of the text given) and what the model writes after it.
# With thinking on the generation prompt ends with "\n": reasoning, then two
# calls. With it off it ends "</think>" + "\n\n": an answer. A call started
# by tool_choice required ends "<tool_call>"; one of get_time ends with
# "named"; one of get_weather with the last token of its opening, after
# which the model writes arguments that are not JSON.
AGENT_CHAINS = [
    ("\n", ["<think>", "reason", "</think>", "open1", "call1", "</tool_call>", "open2", "call2",
            "close2", "<|im_end|>"]),
    ("blank", ["answer", "<|im_end|>"]),
    ("<tool_call>", ["call1"]),
    ("named", ["utc", "</tool_call>"]),
    ('<tool_call>\n{"name": "get_weather", "arguments":', ["broken", "</tool_call>"]),
]


def build_agent_tokenizer(folder: Path) -> Path:
    """The tiny tokenizer with Qwen3's template, its <think> and
    <tool_call> markers as ordinary added tokens (as Qwen3 has them), and
    each text the scripted agent model writes as one added token."""
    from transformers import PreTrainedTokenizerFast

    build_tokenizer(folder, chat_template=QWEN3_TOOLS)
    fast = PreTrainedTokenizerFast.from_pretrained(str(folder))
    fast.add_tokens(AGENT_MARKERS + list(AGENT_TEXTS.values()))
    fast.save_pretrained(str(folder))
    return folder


def chain_script(tokenizer_dir: Path, chains, texts: dict[str, str]) -> dict[int, int]:
    """Chains of (the prompt's last text, what the model writes after it)
    as token ids: each token the model reads, and the one it writes next. A
    name in ``texts`` stands for its text; a text stands for its added
    token, or else for the last token it encodes to."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    added = fast.get_added_vocab()

    def one(text: str) -> int:
        text = texts.get(text, text)
        return added[text] if text in added else fast.encode(text, add_special_tokens=False)[-1]

    script: dict[int, int] = {}
    for key, chain in chains:
        ids = [one(key), *map(one, chain)]
        for a, b in zip(ids, ids[1:], strict=False):
            assert script.get(a, b) == b, f"the script reads {a} twice"
            script[a] = b
    return script


def agent_script(tokenizer_dir: Path) -> dict[int, int]:
    """AGENT_CHAINS as token ids."""
    return chain_script(tokenizer_dir, AGENT_CHAINS, AGENT_TEXTS)


def build_agent_model(folder: Path, tokenizer_dir: Path, *, forget: tuple[str, ...] = (),
                      seed: int = 21) -> Path:
    """A model whose greedy reply is AGENT_CHAINS' (build_scripted_model).
    ``forget``: texts (of AGENT_TEXTS, or markers) after which it has no
    script, and writes a random token: a draft that is right often, not
    always."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    forgotten = {fast.encode(AGENT_TEXTS.get(t, t), add_special_tokens=False)[-1] for t in forget}
    script = {a: b for a, b in agent_script(tokenizer_dir).items() if a not in forgotten}
    return build_scripted_model(folder, tokenizer_dir, script, seed=seed)


def build_scripted_model(folder: Path, tokenizer_dir: Path, script: dict[int, int],
                         seed: int = 21) -> Path:
    """A model whose greedy reply is known: every layer's output
    projections are zero, so it reads only the last token, and each token
    of ``script`` has its own direction in the embedding that the output
    layer maps to the token it writes next (a bigram model; any other
    token gives a random next one). Wide enough for a direction per entry."""
    import mlx.core as mx
    import numpy as np
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    hidden = max(64, -(-(len(script) + 1) // 64) * 64)
    build_model(folder, tokenizer_dir, layers=1, seed=seed, vocab=len(fast), hidden=hidden)
    weights = dict(mx.load(str(folder / "model.safetensors")))
    embed = np.array(weights["model.embed_tokens.weight"])
    head = np.array(weights["lm_head.weight"]) * 0.01
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.normal(size=(hidden, len(script))))
    for i, (read, writes) in enumerate(script.items()):
        embed[read] = basis[:, i]
        head[writes] += 4.0 * basis[:, i] * np.sqrt(hidden)
    weights["model.embed_tokens.weight"] = mx.array(embed)
    weights["lm_head.weight"] = mx.array(head)
    for k in weights:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            weights[k] = mx.zeros_like(weights[k])
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return folder


HARMONY_SPECIALS = ["<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                    "<|constrain|>", "<|return|>", "<|call|>"]
# gpt-oss's harmony chat template, shortened: its reasoning switch
# (reasoning_effort), tools in the system turn, an earlier turn's reasoning
# under "thinking", calls on the commentary channel.
HARMONY = """<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}
{%- if tools %}
# Tools
{%- for tool in tools %}
{{ tool.function.name }}: {{ tool.function.parameters | tojson }}
{%- endfor %}
{%- endif %}<|end|>
{%- for message in messages %}
  {%- if message.role == 'assistant' %}
    {%- if message.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ message.thinking }}<|end|>{%- endif %}
    {%- for tc in message.tool_calls or [] %}<|start|>assistant<|channel|>commentary to=functions.{{ tc.function.name }} <|constrain|>json<|message|>{{ tc.function.arguments | tojson }}<|call|>{%- endfor %}
    {%- if message.content %}<|start|>assistant<|channel|>final<|message|>{{ message.content }}<|end|>{%- endif %}
  {%- elif message.role == 'tool' %}<|start|>functions.{{ message.name }} to=assistant<|channel|>commentary<|message|>{{ message.content }}<|end|>
  {%- else %}<|start|>{{ message.role }}<|message|>{{ message.content }}<|end|>
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{%- endif %}"""


def build_harmony_tokenizer(folder: Path) -> Path:
    """The tiny tokenizer with gpt-oss's harmony tokens (special, as its
    tokenizer has them) and a harmony template."""
    return build_tokenizer(folder, chat_template=HARMONY, specials=HARMONY_SPECIALS,
                           eos="<|return|>")


# -- scripted reasoning models, for the window --------------------------------------------
# A Qwen3-style model (Qwen3's template, <think> markers) whose greedy reply
# is known: with thinking on, its reasoning (REASONER_THOUGHTS), then its
# answer (REASONER_ANSWER: Markdown with a code block); with thinking off
# (the template closes the reasoning itself), the same answer alone.
REASONER_THOUGHTS = ["\nThe user greets me.", " I should greet them back", " and show an example.\n\n",
                     "A short Python example", " with a **print** call will do.\n"]
REASONER_ANSWER = ["Hello! Here is *an example*:", "\n\n```python\nprint('hi')\n```",
                   "\n\nAnything else?"]


def reasoner_texts(thoughts: int = 0, answer: int = 0) -> tuple[list[str], list[str]]:
    """(the reasoning's texts, the answer's): the ones above, or a long
    reasoning of ``thoughts`` texts and an answer of ``answer`` (a
    paragraph every tenth), for measuring a long reply."""
    if not thoughts:
        return REASONER_THOUGHTS, REASONER_ANSWER

    def text(word: str, i: int) -> str:  # ten words a paragraph
        return f"{' ' if i % 10 else ''}{word}{i}{'.' + chr(10) * 2 if i % 10 == 9 else ''}"

    return [text("thought", i) for i in range(thoughts)], [text("word", i) for i in range(answer)]


def build_reasoner_tokenizer(folder: Path, *, special: bool = False, thoughts: int = 0,
                             answer: int = 0) -> Path:
    """Qwen3's template, ``<think>``/``</think>`` as added tokens (not
    special, as Qwen3 has them; ``special``: special ones) and each text
    the reasoner writes as one added token."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    build_tokenizer(folder, chat_template=QWEN3_TOOLS)
    fast = PreTrainedTokenizerFast.from_pretrained(str(folder))
    markers = [AddedToken(t, special=special, normalized=False) for t in ("<think>", "</think>")]
    fast.add_tokens(markers, special_tokens=special)
    thought, said = reasoner_texts(thoughts, answer)
    fast.add_tokens(["\n\n", *thought, *said])
    fast.save_pretrained(str(folder))
    return folder


def build_reasoner_model(folder: Path, tokenizer_dir: Path, thoughts: int = 0,
                         answer: int = 0, seed: int = 31, closes: bool = True) -> Path:
    """The scripted reasoner: after the generation prompt's "\\n" it writes
    <think>, its reasoning, </think>, "\\n\\n" and its answer; after the
    "\\n\\n" that ends a prompt with thinking off, the answer. ``closes``
    false: its reasoning never closes (it ends the reply inside it)."""
    thought, said = reasoner_texts(thoughts, answer)
    after = ["</think>", "\n\n", *said] if closes else []
    chains = [("\n", ["<think>", *thought, *after, "<|im_end|>"])]
    return build_scripted_model(folder, tokenizer_dir, chain_script(tokenizer_dir, chains, {}),
                                seed=seed)


# gpt-oss's harmony reply, scripted: its analysis channel (reasoning), then
# its final channel (the answer). A bigram model cannot write "<|channel|>"
# twice with different channels after it, so the second header is one added
# token ("assistant<|channel|>final<|message|>"), which decodes to the same text.
HARMONY_THOUGHTS = ["Greet the user", " and answer briefly."]
HARMONY_ANSWER = ["Hello from **harmony**.", " Anything else?"]
HARMONY_FINAL = "assistant<|channel|>final<|message|>"


def build_harmony_reasoner_tokenizer(folder: Path) -> Path:
    from transformers import PreTrainedTokenizerFast

    build_harmony_tokenizer(folder)
    fast = PreTrainedTokenizerFast.from_pretrained(str(folder))
    fast.add_tokens(["analysis", HARMONY_FINAL, *HARMONY_THOUGHTS, *HARMONY_ANSWER])
    fast.save_pretrained(str(folder))
    return folder


def build_harmony_reasoner_model(folder: Path, tokenizer_dir: Path, seed: int = 41) -> Path:
    """After the generation prompt's "<|start|>assistant": the analysis
    channel with HARMONY_THOUGHTS, then the final one with HARMONY_ANSWER."""
    chains = [("<|start|>assistant", ["<|channel|>", "analysis", "<|message|>", *HARMONY_THOUGHTS,
                                      "<|end|>", "<|start|>", HARMONY_FINAL, *HARMONY_ANSWER,
                                      "<|return|>"])]
    return build_scripted_model(folder, tokenizer_dir, chain_script(tokenizer_dir, chains, {}),
                                seed=seed)


# -- a tiny stand-in for every kind of pair the catalog offers ---------------------------
# What drafts for a catalog pair, by drafter kind (engine/drafter_kinds.py):
# the catalog's kinds of draft ("model", "mtp", "eagle3", "assistant").
DRAFTER_OF_KIND = {"model": "draft", "mtp": "mtp", "eagle3": "eagle3", "assistant": "assistant"}
# Model types a generic tiny config builds (build_model) as a target or a draft model.
FLAT_TYPES = {"llama": {}, "qwen2": {}, "qwen3": {"head_dim": 16}}


def _stand_in_drafts(folder: Path, tokenizer_dir: Path, target_type: str, draft_type: str):
    target = build_model(folder / "target", tokenizer_dir, model_type=target_type, layers=4,
                         seed=3, extra_config=FLAT_TYPES[target_type])
    same = draft_type == target_type  # then the target with noise: blocks are kept, some
    draft = build_model(folder / "draft", tokenizer_dir, model_type=draft_type, seed=4,
                        layers=4 if same else 2, noise_from=target if same else None,
                        noise=0.05, extra_config=FLAT_TYPES[draft_type])
    return target, draft


def _stand_in_mtp(folder: Path, tokenizer_dir: Path, target_type: str):
    if target_type == "qwen3_5":
        return add_mtp(build_arch(folder / "target", tokenizer_dir, "qwen3_5", seed=8)), "mtp"
    return fuse_experts(add_mtp(build_model(folder / "target", tokenizer_dir, seed=8,
                                            **QWEN3_5_MOE))), "mtp"


def _stand_in_eagle3(folder: Path, tokenizer_dir: Path, target_type: str):
    target = build_model(folder / "target", tokenizer_dir, model_type=target_type, seed=3,
                         layers=6, extra_config=FLAT_TYPES[target_type])
    return target, build_eagle3(folder / "head", target)


def _stand_in_assistant(folder: Path, tokenizer_dir: Path):
    target = build_gemma4(folder / "target", tokenizer_dir, layers=0.1)
    return target, build_gemma4_assistant(folder / "assistant", target, mimic=0.1)


def stand_in(kind: str, target_type: str, draft_type: str, folder: Path, tokenizer_dir: Path):
    """(target folder, draft: a folder or "mtp") of a tiny random pair of the
    catalog pair's kind and model types (``draft_type``: the draft's, "" for
    the target's own head and for a head known by its kind), built from
    mlx-lm's own classes in the layout its checkpoints ship; None for a pair
    no stand-in is known for (the catalog test fails it)."""
    if kind == "model" and target_type in FLAT_TYPES and draft_type in FLAT_TYPES:
        return _stand_in_drafts(folder, tokenizer_dir, target_type, draft_type)
    if kind == "mtp" and target_type in ("qwen3_5", "qwen3_5_moe"):
        return _stand_in_mtp(folder, tokenizer_dir, target_type)
    if kind == "eagle3" and target_type in FLAT_TYPES:
        return _stand_in_eagle3(folder, tokenizer_dir, target_type)
    if (kind, target_type, draft_type) == ("assistant", "gemma4", "gemma4_assistant"):
        return _stand_in_assistant(folder, tokenizer_dir)
    return None
