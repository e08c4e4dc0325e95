"""Every pair the catalog offers speculates (issue 49): for each, a tiny
random stand-in of the same model types and the same kind of drafter (a
draft model, the target's own MTP head, an EAGLE-3 head, a Gemma 4
assistant; tinymodels.stand_in), built from mlx-lm's own classes in the
layout the pair's checkpoints ship and loaded through the normal path,
drafts tokens and gives plain decoding's greedy ids. A pair no stand-in is
known for fails, by name: the catalog offers no pair this engine has not
run in kind."""

from __future__ import annotations

import json

import pytest
from specchat.engine import modes
from specchat.engine.events import DraftSettings, GenerateRequest
from specchat.engine.session import Engine
from specchat.library.catalog import MTP, load_catalog
from tinymodels import DRAFTER_OF_KIND, stand_in

PROMPT = (275, 364, 311, 78, 161, 53, 376, 40) * 3
PAIRS = load_catalog().pairs


def _key(pair) -> tuple[str, str, str]:
    """(the drafter's kind, the target's model type, the draft's: "" for
    the target's own head and a head the catalog knows by its kind)."""
    return pair.kind, pair.target.model_type, pair.draft.model_type if pair.draft else ""


@pytest.fixture(scope="module")
def stand_ins(tiny_dir, tiny_tokenizer):
    """``get(pair)``: its stand-in, built once per key (pairs of the same
    kinds share one)."""
    built: dict = {}

    def get(pair):
        key = _key(pair)
        if key not in built:
            built[key] = stand_in(*key, tiny_dir / ("stand-in-" + "-".join(filter(None, key))),
                                  tiny_tokenizer)
        return built[key]

    return get


def _model_type(folder) -> str:
    return json.loads((folder / "config.json").read_text())["model_type"]


@pytest.mark.parametrize("pair", PAIRS, ids=[p.id for p in PAIRS])
def test_every_catalog_pair_speculates_on_a_tiny_stand_in(stand_ins, pair):
    kind, target_type, draft_type = _key(pair)
    assert target_type, f"{pair.id}: the catalog does not say {pair.target.id}'s model_type"
    built = stand_ins(pair)
    assert built is not None, (f"{pair.id}: no tiny stand-in runs its kind of pair ({kind} "
                               f"for {target_type}{' with ' + draft_type if draft_type else ''})")
    target, draft = built
    assert _model_type(target) == target_type
    if draft_type:
        assert _model_type(draft) == draft_type
    engine = Engine()
    loaded = engine.load(target, modes.OWN_HEAD if kind == MTP else draft)
    assert loaded.speculative_ok, loaded.reason
    drafter = DRAFTER_OF_KIND[kind]
    plain = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=24,
                                            draft=DraftSettings(mode="plain")))
    spec = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=24, draft=DraftSettings(
        mode="mtp" if kind == MTP else "draft", k=3)))
    assert spec.summary.drafted_by.get(drafter, {}).get("drafted", 0) > 0, spec.summary.drafted_by
    assert spec.token_ids == plain.token_ids
