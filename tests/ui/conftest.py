"""Fixtures for the UI tests (a private SPECCHAT_HOME and ``aloop``, asyncio on
the Qt loop, are tests/conftest.py's): a window on the tiny pair's
settings. Qt runs offscreen (tests/conftest.py)."""

from __future__ import annotations

import pytest
from ui_support import make_window


@pytest.fixture
def window(qtbot, aloop, home):
    w = make_window(qtbot)
    # Short replies keep the suite fast; tests that need more set their own.
    w.session.update_settings(max_tokens=48)
    yield w
    w.close()


# Scripted reasoning models (tests/tinymodels.py): their greedy replies are
# known, reasoning first.
@pytest.fixture(scope="session")
def reasoner_tokenizer(tiny_dir):
    """Qwen3's template, <think>/</think> as added tokens that are not special (as Qwen3's)."""
    from tinymodels import build_reasoner_tokenizer

    return build_reasoner_tokenizer(tiny_dir / "tok-reasoner")


@pytest.fixture(scope="session")
def reasoner(tiny_dir, reasoner_tokenizer):
    """Reasoning, then a Markdown answer with a code block (thinking off: the answer)."""
    from tinymodels import build_reasoner_model

    return build_reasoner_model(tiny_dir / "reasoner", reasoner_tokenizer)


@pytest.fixture(scope="session")
def special_reasoner(tiny_dir):
    """The same, its <think> markers special tokens."""
    from tinymodels import build_reasoner_model, build_reasoner_tokenizer

    tok = build_reasoner_tokenizer(tiny_dir / "tok-reasoner-special", special=True)
    return build_reasoner_model(tiny_dir / "reasoner-special", tok)


@pytest.fixture(scope="session")
def unclosed_reasoner(tiny_dir, reasoner_tokenizer):
    """Its reasoning never closes: it ends the reply inside it."""
    from tinymodels import build_reasoner_model

    return build_reasoner_model(tiny_dir / "reasoner-unclosed", reasoner_tokenizer, closes=False)


@pytest.fixture(scope="session")
def long_reasoner(tiny_dir):
    """200 pieces of reasoning, then a short answer: it streams over many updates."""
    from tinymodels import build_reasoner_model, build_reasoner_tokenizer

    tok = build_reasoner_tokenizer(tiny_dir / "tok-reasoner-long", thoughts=200, answer=20)
    return build_reasoner_model(tiny_dir / "reasoner-long", tok, thoughts=200, answer=20)


@pytest.fixture(scope="session")
def harmony_reasoner(tiny_dir):
    """gpt-oss's harmony: an analysis channel, then the final one."""
    from tinymodels import build_harmony_reasoner_model, build_harmony_reasoner_tokenizer

    tok = build_harmony_reasoner_tokenizer(tiny_dir / "tok-harmony-reasoner")
    return build_harmony_reasoner_model(tiny_dir / "harmony-reasoner", tok)
