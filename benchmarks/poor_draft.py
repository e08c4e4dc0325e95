"""Write a deliberately poor draft for a target: a tiny random qwen2 model
with the target's own tokenizer files, so the pair passes the compatibility
check and speculation runs, but the draft almost never guesses right.

The bundled pair is a good pair, so it cannot show what break-even auto-off
(app/specchat/engine/draft_policy.py, BreakEven) is for. With this draft the
bench can:

    python benchmarks/poor_draft.py --target bundled:qwen2.5-coder-1.5b \\
        --out ~/.cache/specchat-poor-draft
    specchat bench --target bundled:qwen2.5-coder-1.5b \\
        --draft ~/.cache/specchat-poor-draft --prompts benchmarks/prompts.jsonl \\
        --modes plain spec --max-tokens 128 --auto-off on

Only the target's config.json and tokenizer files are read (never its
weights). The draft's vocabulary is the target's (its embedding as wide as
the target's), its weights random from ``--seed``; by default it has 2
layers of width 64, which makes its forward nearly free, so what the row
measures is the price of rejected drafts and probes, not of a slow draft.
``--hidden`` and ``--layers`` make it dearer.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app"))

# What a model folder holds besides its tokenizer: not copied.
NOT_TOKENIZER = {"config.json", "model.safetensors.index.json", "README.md", "LICENSE"}
# Taken from the target's config when it has them (the rest is the draft's own).
SHARED = ("vocab_size", "bos_token_id", "eos_token_id", "max_position_embeddings", "rope_theta",
          "rms_norm_eps")


def draft_config(target: dict, hidden: int, layers: int) -> dict:
    """A qwen2 config the size asked for, with the target's vocabulary."""
    cfg = target.get("text_config", target)
    heads = max(1, hidden // 32)
    config = {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": hidden * 2,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 32768,
        # Untied: with a tied head a random model mostly repeats its input token.
        "tie_word_embeddings": False,
    }
    config.update({k: cfg[k] for k in SHARED if cfg.get(k) is not None})
    return config


def write_poor_draft(target: Path, out: Path, hidden: int = 64, layers: int = 2,
                     seed: int = 0) -> Path:
    """The draft folder ``out``: the target's tokenizer files, a random qwen2
    model's config.json and model.safetensors."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen2

    target_config = json.loads((target / "config.json").read_text())
    config = draft_config(target_config, hidden, layers)
    out.mkdir(parents=True, exist_ok=True)
    for f in target.iterdir():
        if f.is_file() and f.name not in NOT_TOKENIZER and f.suffix not in (".safetensors",
                                                                              ".gguf"):
            shutil.copyfile(f, out / f.name)
    mx.random.seed(seed)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True,
                   help="the target whose tokenizer the draft shares (folder, bundled:..., hf:...)")
    p.add_argument("--out", required=True, help="folder to write the draft to")
    p.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    p.add_argument("--layers", type=int, default=2, help="transformer layers (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    args = p.parse_args(argv)
    from specchat import startup

    startup.prepare()
    from specchat.errors import SpecChatError
    from specchat.library import refs

    try:
        target = refs.resolve(args.target)
    except SpecChatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = write_poor_draft(target, Path(args.out).expanduser(), args.hidden, args.layers,
                           args.seed)
    print(f"wrote a random {args.layers}-layer qwen2 draft (hidden {args.hidden}) with "
          f"{target.name}'s tokenizer to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
