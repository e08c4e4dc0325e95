"""Gemma 4 assistant drafters in the library: an assistant's folder is a
model reference like any other, read and checked by its format
(engine/assistant_format.py, the engine's words), imported and listed as a
head, checked against a Gemma 4 target and refused for any other, and it
drafts from the command line, its reply plain decoding's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from specchat.library import compatibility, importing, index
from tinymodels import build_gemma4, build_gemma4_assistant


@pytest.fixture(scope="module")
def gemma4(tiny_dir, tiny_tokenizer):
    return build_gemma4(tiny_dir / "lib-gemma4", tiny_tokenizer, layers=0.1)


@pytest.fixture(scope="module")
def assistant(tiny_dir, gemma4):
    return build_gemma4_assistant(tiny_dir / "lib-gemma4-assistant", gemma4, ordered=True,
                                  mimic=0.1)


def test_an_assistant_is_imported_listed_and_checked_against_its_target(
        lib_home, gemma4, assistant, tiny_target):
    model = importing.import_path(assistant, name="my-assistant")
    assert model.model_type == "assistant" and model.head["reads_width"] == 64
    assert model.head["reads"] == {"full_attention": 32, "sliding_attention": 16}
    assert [m.name for m in index.list_installed()] == ["my-assistant"]
    ok = compatibility.check(str(gemma4), "my-assistant")
    assert ok.compatible, ok.reasons
    assert ok.reasons[0] == ("a Gemma 4 assistant that reads lib-gemma4's final hidden states "
                             "(width 64) and the keys and values of its last full-attention and "
                             "sliding-window layers, and drafts over its 400 ids")
    bad = compatibility.check(str(tiny_target), "my-assistant")
    assert bad.reasons == ["my-assistant is a Gemma 4 assistant and drafts only for the Gemma 4 "
                           "it was made for; target-llama is a llama"]
    backwards = compatibility.check("my-assistant", str(gemma4))
    assert not backwards.compatible
    assert backwards.reasons[0].startswith("my-assistant is a Gemma 4 assistant draft head: a "
                                           "head drafts for a target and cannot be one.")


def test_an_assistant_drafts_from_the_command_line(gemma4, assistant):
    def generate(*args):
        done = subprocess.run([sys.executable, "-m", "specchat", "generate", "--target",
                               str(gemma4), "--prompt", "Hello, world!", "--max-tokens", "24",
                               "--json", *args], capture_output=True, text=True,
                              env=dict(os.environ), timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    plain = generate("--plain")
    spec = generate("--draft", str(assistant))
    assert spec["token_ids"] == plain["token_ids"]
    assert spec["stats"]["drafted"] > 0
