"""The catalog's file format: models, a target's own MTP head, EAGLE-3 heads
and Gemma 4 assistants, what each pair says about itself, and the catalogs
the loader refuses (in words, naming the entries)."""

from __future__ import annotations

import json

import pytest
from specchat.library import catalog, memory
from specchat.library.errors import LibraryError

TOKENIZER = {"id": "fam", "label": "Fam", "vocab": 1000, "note": "a test family"}


def _model(mid: str, params: int, **extra) -> dict:
    return {"id": mid, "name": mid.upper(), "ref": f"hf:org/{mid}", "params": params,
            "quantization": "q4", "download_bytes": params // 2, "num_layers": 4,
            "num_kv_heads": 2, "head_dim": 8, "max_context": 4096, **extra}


def _write(folder, models: list[dict], pairs: list[dict], name: str = "fam.json"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({"tokenizer": TOKENIZER, "models": models,
                                           "pairs": pairs}))
    return folder


def _catalog(tmp_path, models: list[dict], pairs: list[dict]) -> catalog.Catalog:
    return catalog.load_catalog(_write(tmp_path / "cat", models, pairs))


EAGLE = {"id": "big-eagle3", "name": "Big EAGLE-3 head", "ref": "hf:org/big-eagle3",
         "kind": "eagle3", "for": "big", "hidden_size": 2560, "draft_vocab": 32000,
         "params": 200_000_000, "quantization": "bfloat16", "download_bytes": 400_000_000,
         "num_layers": 1, "num_kv_heads": 8, "head_dim": 128}
ASSISTANT = {"id": "big-assistant", "name": "Big assistant", "ref": "hf:org/big-assistant",
             "kind": "assistant", "for": "big", "params": 500_000_000,
             "quantization": "bfloat16", "download_bytes": 1_000_000_000, "num_layers": 4}


def _full(tmp_path) -> catalog.Catalog:
    return _catalog(tmp_path, [_model("big", 8_000_000_000, mtp=True),
                               _model("small", 500_000_000), EAGLE, ASSISTANT],
                    [{"target": "big", "draft": "small"}, {"target": "big", "draft": "mtp"},
                     {"target": "big", "draft": "big-eagle3", "note": "Trained on bf16."},
                     {"target": "big", "draft": "big-assistant"}])


def test_old_files_load_as_models_and_draft_model_pairs(tmp_path):
    cat = _catalog(tmp_path, [_model("big", 8_000_000_000), _model("small", 500_000_000)],
                   [{"target": "big", "draft": "small"}])
    big, small = cat.models
    assert (big.kind, big.mtp, big.trained_for, small.kind) == ("model", False, "", "model")
    assert cat.heads == []
    (pair,) = cat.pairs
    assert (pair.id, pair.kind, pair.draft, pair.refs) == ("big+small", "model", small,
                                                           ["hf:org/big", "hf:org/small"])
    assert pair.download_bytes == 4_250_000_000


def test_heads_and_the_targets_own_head_are_parsed(tmp_path):
    cat = _full(tmp_path)
    assert [m.id for m in cat.models] == ["big", "small"]
    assert [m.id for m in cat.heads] == ["big-eagle3", "big-assistant"]
    big, eagle, assistant = cat.model("big"), cat.model("big-eagle3"), cat.model("big-assistant")
    assert big.mtp and big.kind == "model"
    assert (eagle.kind, eagle.trained_for, eagle.hidden_size, eagle.draft_vocab,
            eagle.max_context) == ("eagle3", "big", 2560, 32000, None)
    assert (assistant.kind, assistant.trained_for, assistant.num_kv_heads,
            assistant.kv_elements_per_token()) == ("assistant", "big", 0, 0)
    assert cat.model("hf:org/big-eagle3") is eagle
    assert [(p.id, p.kind) for p in cat.pairs] == [
        ("big+small", "model"), ("big+mtp", "mtp"), ("big+big-eagle3", "eagle3"),
        ("big+big-assistant", "assistant")]
    assert cat.pair("BIG+MTP").draft is None
    assert eagle.to_json()["kind"] == "eagle3" and eagle.to_json()["for"] == "big"
    # Only draft models are offered where a draft model is wanted (suggestions).
    assert [p.id for p in cat.pairs_for_target(big)] == ["big+small"]
    assert [p.id for p in cat.pairs_for_target(big, kinds=("mtp", "eagle3"))] == [
        "big+mtp", "big+big-eagle3"]
    assert cat.same_tokenizer(big) == [cat.model("small")]


def test_each_pair_kind_says_why_in_words(tmp_path):
    pairs = {p.kind: p for p in _full(tmp_path).pairs}
    assert pairs["model"].why == (
        "Both use the Fam tokenizer (1,000 tokens), so every token the draft proposes means "
        "the same text to the target; the draft has 16x fewer parameters (500M vs 8.00B), "
        "so drafting costs little next to verifying.")
    assert pairs["mtp"].why == (
        "The target drafts with its own multi-token-prediction head: the mtp.* weights in its "
        "checkpoint are a layer of the target itself that proposes the next tokens from the "
        "target's last hidden state, so there is no second model to download and no second "
        "tokenizer to disagree.")
    assert pairs["eagle3"].why == (
        "An EAGLE-3 head: one layer that reads the target's hidden states (2,560 wide) and "
        "proposes tokens from a 32,000-token draft vocabulary. It was trained for this target "
        "(big) and fits no other; it has 40x fewer parameters (200M vs 8.00B). Trained on "
        "bf16.")
    assert pairs["assistant"].why == (
        "A small drafter Google trained for this Gemma 4 (big): 4 layers that read the "
        "target's activations and KV cache instead of keeping their own, so it fits no other "
        "target; it has 16x fewer parameters (500M vs 8.00B).")


def test_an_mtp_pair_downloads_and_holds_the_target_alone(tmp_path):
    cat = _full(tmp_path)
    big = cat.model("big")
    own = cat.pair("big+mtp")
    assert own.refs == ["hf:org/big"]
    assert own.download_bytes == big.download_bytes == 4_000_000_000
    assert own.memory(dtype="q4") == memory.estimate(big, None, 4096, dtype="q4",
                                                     measure=False)
    assert own.to_json()["draft"] is None and own.to_json()["kind"] == "mtp"
    eagle = cat.pair("big+big-eagle3")
    assert eagle.refs == ["hf:org/big", "hf:org/big-eagle3"]
    assert eagle.download_bytes == 4_400_000_000
    assistant = cat.pair("big+big-assistant").memory(dtype="q4")
    assert assistant.kv_cache == memory.kv_bytes(big.kv_elements_per_token(), 4096, "q4")


def test_an_mtp_pair_for_a_target_without_a_head_is_refused(tmp_path):
    with pytest.raises(LibraryError) as err:
        _catalog(tmp_path, [_model("big", 8_000_000_000)], [{"target": "big", "draft": "mtp"}])
    assert str(err.value) == (
        'The model catalog pairs big with its own MTP head, but big (hf:org/big) ships none: '
        'its entry does not say "mtp": true.')


def test_a_head_trained_for_another_target_is_refused(tmp_path):
    models = [_model("big", 8_000_000_000), _model("other", 9_000_000_000), EAGLE, ASSISTANT]
    with pytest.raises(LibraryError) as err:
        _catalog(tmp_path, models, [{"target": "other", "draft": "big-eagle3"}])
    assert str(err.value) == (
        "The model catalog pairs other with the EAGLE-3 head big-eagle3, which was trained "
        "for big, not other: a head reads one target's hidden states and fits no other.")
    with pytest.raises(LibraryError) as err:
        _catalog(tmp_path / "b", models, [{"target": "other", "draft": "big-assistant"}])
    assert str(err.value).startswith(
        "The model catalog pairs other with the assistant drafter big-assistant, which was "
        "trained for big, not other")


@pytest.mark.parametrize(("entries", "pairs", "message"), [
    ([_model("big", 8), {**EAGLE, "kind": "medusa"}], [],
     'The model catalog file fam.json is damaged (big-eagle3 has kind "medusa"; a kind is '
     '"model", "eagle3" or "assistant")'),
    ([_model("big", 8), {k: v for k, v in EAGLE.items() if k != "for"}], [],
     'The model catalog file fam.json is damaged (the EAGLE-3 head big-eagle3 does not say '
     'which model it is "for")'),
    ([_model("big", 8), {k: v for k, v in EAGLE.items() if k != "draft_vocab"}], [],
     'The model catalog file fam.json is damaged (the EAGLE-3 head big-eagle3 has no '
     '"draft_vocab")'),
    ([_model("big", 8), {**ASSISTANT, "mtp": True}], [],
     'The model catalog file fam.json is damaged (the assistant drafter big-assistant says '
     '"mtp": true, but only a model ships its own MTP head)'),
    ([_model("big", 8, mtp="yes")], [],
     'The model catalog file fam.json is damaged (big says "mtp": "yes"; it is true or '
     'false)'),
    ([{k: v for k, v in _model("big", 8).items() if k != "num_layers"}], [],
     'The model catalog file fam.json is damaged (big has no "num_layers")'),
    ([_model("big", 8), {**ASSISTANT, "model_type": ["gemma4_assistant"]}], [],
     'The model catalog file fam.json is damaged (the assistant drafter big-assistant says '
     '"model_type": ["gemma4_assistant"]; it is a name)'),
    ([_model("big", 8), {**EAGLE, "for": "nothing"}], [],
     "The model catalog's EAGLE-3 head big-eagle3 is for nothing, which the catalog does not "
     "list"),
    ([_model("big", 8), EAGLE], [{"target": "big-eagle3", "draft": "big"}],
     "The model catalog pairs big-eagle3 as a target, but it is an EAGLE-3 head: it drafts "
     "for big"),
    ([_model("big", 8)], [{"target": "big", "draft": "nothing"}],
     "The model catalog pairs unknown models: big + nothing"),
])
def test_broken_catalogs_are_refused_in_words(tmp_path, entries, pairs, message):
    with pytest.raises(LibraryError) as err:
        _catalog(tmp_path, entries, pairs)
    assert str(err.value) == message


# -- the shipped catalog ------------------------------------------------------------


def test_the_shipped_catalog_lists_own_heads_eagle3_heads_and_assistants():
    cat = catalog.load_catalog()
    kinds = {p.id: p.kind for p in cat.pairs}
    assert {"qwen3.5-9b+mtp", "qwen3.5-35b-a3b+mtp", "qwen3.6-27b+mtp",
            "qwen3.6-35b-a3b+mtp"} <= {k for k, v in kinds.items() if v == "mtp"}
    assert kinds["qwen3-4b+qwen3-4b-eagle3"] == "eagle3"
    assert kinds["gemma-4-31b+gemma-4-31b-assistant"] == "assistant"
    for p in cat.pairs:
        if p.kind == "mtp":
            # mlx-community conversions drop the mtp.* weights: the own head needs
            # the original checkpoint.
            assert p.target.mtp and p.target.ref.startswith("hf:Qwen/"), p.id
            assert p.download_bytes == p.target.download_bytes, p.id
        elif p.kind != "model":
            assert p.draft.trained_for == p.target.id, p.id
            assert p.draft.tokenizer.id == p.target.tokenizer.id, p.id
    assert cat.model("qwen3-4b-eagle3").draft_vocab == 32000
    assert cat.model("qwen3-4b-eagle3").hidden_size == 2560
