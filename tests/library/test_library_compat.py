"""Compatibility verdicts in words, cache kinds from config.json, draft
suggestions, and the memory check."""

from __future__ import annotations

import json

import pytest
from libtools import edited_copy
from specchat import cli
from specchat.library import compatibility, facts, importing, memory, paths
from specchat.library.errors import LibraryError


def test_same_tokenizer_smaller_draft_is_compatible(lib_home, tiny_qwen_target, tiny_qwen_draft):
    report = compatibility.check(str(tiny_qwen_target), str(tiny_qwen_draft))
    assert report.compatible, report.reasons
    assert report.verified
    text = " ".join(report.reasons)
    assert "same tokenizer" in text and "smaller" in text and "rewound" in text
    assert report.memory is not None and report.memory.total > 0


def test_different_vocabulary_is_explained(lib_home, tiny_target, mismatched_draft):
    report = compatibility.check(str(tiny_target), str(mismatched_draft))
    assert not report.compatible
    assert any(r.startswith("vocabulary size differs: target has 400 tokens, draft has 460")
               for r in report.reasons), report.reasons
    assert any("different ids" in r for r in report.reasons)


def test_different_special_tokens_are_explained(lib_home, tmp_path, tiny_qwen_target,
                                                tiny_qwen_draft):
    draft = edited_copy(tiny_qwen_draft, tmp_path / "eos-draft",
                        tokenizer_config={"eos_token": "<|endoftext|>"})
    report = compatibility.check(str(tiny_qwen_target), str(draft))
    assert not report.compatible
    assert "different EOS token: target '<|im_end|>', draft '<|endoftext|>'" in report.reasons


def test_sliding_window_and_recurrent_models_are_offered_speculation(lib_home, tmp_path,
                                                                     tiny_target, tiny_qwen_draft,
                                                                     tiny_qwen_target):
    """The engine rolls back sliding windows and recurrent state
    (engine/rollback.py): neither is a reason to refuse a pair any more."""
    target = edited_copy(tiny_target, tmp_path / "swa-target", config={
        "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]})
    assert facts.read_folder(target).attention == "sliding"
    assert compatibility.check(str(target), str(tiny_qwen_draft)).reasons == \
        compatibility.check(str(tiny_target), str(tiny_qwen_draft)).reasons
    draft = edited_copy(tiny_qwen_draft, tmp_path / "ssm-draft",
                        config={"layer_types": ["linear_attention"]})
    assert facts.read_folder(draft).attention == "recurrent"
    assert compatibility.check(str(tiny_qwen_target), str(draft)).compatible


def test_an_index_entry_from_before_rollback_does_not_refuse_speculation(
        lib_home, tmp_path, tiny_target, tiny_qwen_draft, capsys):
    """Builds before every cache kind could be rolled back (e55ecd8) wrote a
    refusal into the index entry of a sliding-window or recurrent model. The
    engine decides that when it loads a model; an old entry must not refuse
    a pair that today's engine runs."""
    target = edited_copy(tiny_target, tmp_path / "swa-target", config={
        "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]})
    importing.import_path(target, name="old-swa")
    importing.import_path(tiny_qwen_draft, name="small-qwen")
    data = json.loads(paths.index_file().read_text())
    data["models"]["old-swa"]["untrimmable_reason"] = (
        "it uses sliding-window attention, whose cache drops old tokens and "
        "cannot be rewound after rejected draft tokens")
    paths.index_file().write_text(json.dumps(data))
    assert compatibility.check("old-swa", str(tiny_qwen_draft)).reasons == \
        compatibility.check(str(target), str(tiny_qwen_draft)).reasons
    assert cli.main(["models", "list"]) == 0
    assert "no speculation" not in capsys.readouterr().out


def test_draft_not_smaller_is_explained(lib_home, tiny_qwen_target, tiny_qwen_draft,
                                        tiny_target):
    swapped = compatibility.check(str(tiny_qwen_draft), str(tiny_qwen_target))
    assert not swapped.compatible
    assert any(r.startswith("the draft is not smaller than the target")
               for r in swapped.reasons), swapped.reasons
    itself = compatibility.check(str(tiny_target), str(tiny_target))
    assert any("the draft is the target itself" in r for r in itself.reasons)


def test_catalog_only_verdicts_say_they_are_unverified(lib_home):
    ok = compatibility.check("qwen2.5-7b", "qwen2.5-0.5b")
    assert ok.compatible and not ok.verified
    assert any("Qwen2.5 tokenizer" in r for r in ok.reasons)
    assert any("catalog" in n for n in ok.notes)
    bad = compatibility.check("qwen2.5-7b", "llama3.2-1b")
    assert not bad.compatible
    assert bad.reasons == ["different tokenizers: the target uses Qwen2.5, the draft Llama 3"]


def test_unknown_hf_reference_needs_a_pull(lib_home):
    with pytest.raises(LibraryError, match="models pull hf:someone/unknown"):
        compatibility.check("hf:someone/unknown", "qwen2.5-0.5b")


@pytest.mark.parametrize("config,kind", [
    ({"model_type": "qwen2", "sliding_window": 32768, "use_sliding_window": False,
      "max_window_layers": 21}, "full"),
    ({"model_type": "llama"}, "full"),
    ({"model_type": "mistral", "sliding_window": 4096, "use_sliding_window": True,
      "max_position_embeddings": 32768}, "sliding"),
    ({"model_type": "gemma3_text", "sliding_window": 512}, "sliding"),
    ({"model_type": "llama", "layer_types": ["full_attention", "sliding_attention"]}, "sliding"),
    ({"model_type": "mamba"}, "recurrent"),
    ({"model_type": "qwen3_next"}, "recurrent"),
    ({"model_type": "lfm2", "layer_types": ["conv", "full_attention"]}, "recurrent"),
    ({"model_type": "llava", "text_config": {"model_type": "llama"}}, "full"),
])
def test_cache_kind_from_config(config, kind):
    assert facts.cache_kind(config) == kind


def test_suggest_drafts_prefers_installed_then_catalog(lib_home, tiny_qwen_target,
                                                       tiny_qwen_draft, mismatched_draft):
    importing.import_path(tiny_qwen_draft, name="small-qwen")
    importing.import_path(mismatched_draft, name="other-vocab")
    found = compatibility.suggest_drafts(str(tiny_qwen_target))
    assert [s.name for s in found] == ["small-qwen"]
    assert found[0].installed and "same tokenizer" in found[0].why

    catalog = compatibility.suggest_drafts("qwen2.5-7b")
    assert catalog[0].ref == "qwen2.5-0.5b" and catalog[0].recommended
    assert not catalog[0].installed and catalog[0].download_bytes > 0
    assert all(s.params < 7_615_616_512 for s in catalog)
    assert "llama3.2-1b" not in [s.ref for s in catalog]


# -- memory ------------------------------------------------------------------------


def test_estimate_is_computed_from_parameters_and_config():
    from specchat.library.catalog import load_catalog

    cat = load_catalog()
    target, draft = cat.model("qwen2.5-7b"), cat.model("qwen2.5-0.5b")
    est = memory.estimate(target, draft, 4096, dtype="q4", measure=False)
    assert est.target_weights == int(7_615_616_512 * 4.5 / 8)
    kv_t = 2 * 28 * 4 * 128 * 4096 * 2
    kv_d = 2 * 24 * 2 * 64 * 4096 * 2
    assert est.kv_cache == kv_t + kv_d
    assert est.total == est.target_weights + est.draft_weights + est.kv_cache + est.runtime
    f32 = memory.estimate(target, None, 4096, dtype="float32", measure=False)
    assert f32.target_weights == 7_615_616_512 * 4


def test_check_pair_refuses_with_the_numbers(lib_home, tiny_qwen_target, tiny_qwen_draft,
                                             monkeypatch):
    est = memory.check_pair(tiny_qwen_target, tiny_qwen_draft, available=10**12)
    assert est.fits
    with pytest.raises(LibraryError) as err:
        memory.check_pair(tiny_qwen_target, tiny_qwen_draft, 4096, available=100_000_000,
                          dtype="float32")
    msg = str(err.value)
    assert f"needs {memory.gb(est.total)}, 0.1 GB available" in msg
    assert "target-qwen2 + draft-qwen2" in msg

    # The same through the environment (what a subprocess or the app would see).
    monkeypatch.setenv("SPECCHAT_MEMORY_AVAILABLE", "100MB")
    with pytest.raises(LibraryError, match=r"needs \d+\.\d GB, 0\.1 GB available"):
        memory.check_pair(tiny_qwen_target, None, context_tokens=200_000)


def test_dtype_and_available_memory(monkeypatch):
    monkeypatch.setenv("SPECCHAT_DTYPE", "q4")
    assert memory.compute_dtype() == "q4"
    monkeypatch.setenv("SPECCHAT_DTYPE", "int3")
    with pytest.raises(LibraryError, match="SPECCHAT_DTYPE"):
        memory.compute_dtype()
    monkeypatch.delenv("SPECCHAT_DTYPE")
    assert memory.parse_size("6GB") == 6 * 10**9
    assert memory.parse_size("1.5 GiB") == int(1.5 * 2**30)
    monkeypatch.delenv("SPECCHAT_MEMORY_AVAILABLE", raising=False)
    avail = memory.available_memory()
    assert avail is None or avail > 0


def test_tokenizer_facts_are_parsed_once_and_reread_when_the_file_changes(tmp_path,
                                                                          tiny_qwen_draft):
    # Re-parsing a real tokenizer.json holds the GIL for ~200 ms (a GUI stall),
    # so a re-check of the same folder must not parse again, but an edited
    # tokenizer must not be answered from the cache.
    import json
    import os

    folder = edited_copy(tiny_qwen_draft, tmp_path / "tok-cache")
    first = facts.tokenizer_facts(folder)
    assert facts.tokenizer_facts(folder) is first
    assert first.fingerprint() == first.fingerprint()

    path = folder / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["added_tokens"].append({"id": 999, "content": "<|new|>", "special": True,
                                 "single_word": False, "lstrip": False, "rstrip": False,
                                 "normalized": False})
    path.write_text(json.dumps(data), encoding="utf-8")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    second = facts.tokenizer_facts(folder)
    assert second is not first
    assert second.added["<|new|>"] == 999
    assert second.fingerprint() != first.fingerprint()
