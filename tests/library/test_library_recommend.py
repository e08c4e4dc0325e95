"""Recommending a draft by measured acceptance: ``specchat models recommend``
on the tiny models (ranked drafts, the incompatible one listed with its
reason, the results file written and then reused), and the formula and the
ranking the numbers go through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from specchat import cli
from specchat.library import importing
from specchat.library import recommendations as rec
from tinymodels import build_model


@pytest.fixture(scope="module")
def random_draft(tiny_dir, tiny_tokenizer) -> Path:
    """A 1-layer llama with the target's tokenizer and weights of its own:
    compatible, but it rarely agrees with the target."""
    return build_model(tiny_dir / "draft-random-llama", tiny_tokenizer, layers=1, seed=7)


@pytest.fixture
def installed(lib_home, tiny_draft, random_draft, tiny_qwen_draft,
              mismatched_draft) -> dict[str, str]:
    """Installed drafts for the tiny target: the noisy copy of its base
    (agrees often), a random one, one with another tokenizer (the check
    refuses it), and a qwen2 one that passes the check but that the engine
    refuses at load (its tokenizer sets no UNK token)."""
    return {key: importing.import_path(path, name=key).name for key, path in (
        ("noisy", tiny_draft), ("random", random_draft), ("qwen", tiny_qwen_draft),
        ("other-vocab", mismatched_draft))}


def _history(home, prompts: list[str]) -> None:
    """A history with these user prompts, as the app saves one."""
    from specchat.store import db
    from specchat.store.conversations import ConversationStore

    conn = db.connect(db.default_path())
    store = ConversationStore(conn)
    for text in prompts:
        c = store.create("chat")
        store.add_message(c.id, "user", text)
        store.add_message(c.id, "assistant", "Sure.")
    conn.close()


def _recommend(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["models", "recommend", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_recommend_ranks_lists_the_incompatible_and_remembers(capsys, lib_home, installed,
                                                               tiny_target):
    _history(lib_home, ["Write a function that adds two numbers.",
                        "print the squares of 1 to 10"])
    target = str(tiny_target)
    code, out, err = _recommend(capsys, "--target", target, "--prompts", "2",
                                "--max-tokens", "12", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["from_history"] is True
    # Newest first: the person's own prompts are the sample.
    assert report["prompts"] == ["print the squares of 1 to 10",
                                 "Write a function that adds two numbers."]
    ranked = report["ranked"]
    assert {r["draft"] for r in ranked} == {installed["noisy"], installed["random"]}
    speedups = [r["measured_speedup"] for r in ranked]
    assert speedups == sorted(speedups, reverse=True)
    by_draft = {r["draft"]: r for r in ranked}
    noisy, random = by_draft[installed["noisy"]], by_draft[installed["random"]]
    # Greedy runs on fixed weights: the acceptance is a property of the pair.
    assert noisy["acceptance"] > random["acceptance"]
    for r in ranked:
        assert r["prompts"] == 2 and r["tokens"] > 0 and r["draft_cost"] > 0
        assert r["predicted_speedup"] == pytest.approx(
            rec.predicted_speedup(r["acceptance"], r["draft_cost"], r["verify_slope"])[0])
        assert r["remembered"] is False
    refused = {r["draft"]: r["reason"] for r in report["incompatible"]}
    assert "vocabulary size differs" in refused[installed["other-vocab"]]
    assert "cannot draft for target-llama: different UNK token" in refused[installed["qwen"]]
    assert "[" in err and "Plain decoding: prompt 2 of 2" in err  # progress on stderr

    # Remembered per (target, draft, machine) in <home>/recommendations.json ...
    stored = json.loads((lib_home / "recommendations.json").read_text())["results"]
    assert {(r["target"], r["draft"], r["machine"]) for r in stored} == {
        (target, installed["noisy"], rec.machine()), (target, installed["random"], rec.machine())}

    # ... and reused by the next run, which measures nothing.
    code, out, err = _recommend(capsys, "--target", target, "--prompts", "2",
                                "--max-tokens", "12")
    assert code == 0, err
    # (qwen is loaded again: the engine refused it, and files can change.)
    assert "Plain decoding" not in err and "Loading noisy" not in err
    rows = [line for line in out.splitlines() if "remembered from" in line]
    assert [next(d for d in by_draft if d in row) for row in rows] == [r["draft"] for r in ranked]
    assert "Not measured:" in out and "vocabulary size differs" in out
    assert "--again measures them anew" in out

    # --again measures anew (here one draft, named with --draft).
    code, out, err = _recommend(capsys, "--target", target, "--draft", installed["noisy"],
                                "--prompts", "1", "--max-tokens", "8", "--again", "--json")
    assert code == 0, err
    again = json.loads(out)
    assert [r["draft"] for r in again["ranked"]] == [installed["noisy"]]
    assert again["ranked"][0]["remembered"] is False and again["ranked"][0]["prompts"] == 1
    assert again["from_history"] is True and len(again["prompts"]) == 1


def test_recommend_without_history_uses_built_in_prompts(capsys, lib_home, tiny_target,
                                                          tiny_draft):
    code, out, err = _recommend(capsys, "--target", str(tiny_target), "--draft", str(tiny_draft),
                                "--prompts", "1", "--max-tokens", "8")
    assert code == 0, err
    assert "1 built-in prompt (your history is empty)" in out
    assert "draft-noisy" in out and "×" in out


@pytest.mark.parametrize("stop_at", ["Plain decoding: prompt 1 of 2", "noisy: prompt 1 of 2"])
def test_a_cancelled_search_stops_at_the_next_step_and_keeps_nothing_half_measured(
        lib_home, installed, tiny_target, stop_at):
    """Cancelling from the progress callback (it runs on the engine thread,
    between two prompts) stops the run at once: the draft being measured is
    left out, not remembered, and named as not measured."""
    import threading

    from specchat.library import draft_search
    from specchat.library.engine_link import make_client

    cancelled = threading.Event()
    seen: list[str] = []

    def progress(p) -> None:
        seen.append(p.message)
        if p.message == stop_at:
            cancelled.set()

    client = make_client()
    try:
        out = draft_search.search(client, str(tiny_target), rec.Sample.choose([], 2),
                                  drafts=[installed["noisy"], installed["random"]],
                                  max_tokens=8, cancelled=cancelled, progress=progress)
    finally:
        client.close()
    assert out.cancelled and out.ranked == ()
    assert out.not_measured == (installed["noisy"], installed["random"])
    assert seen[-1] == stop_at  # nothing ran after it
    assert rec.remembered(str(tiny_target)) == {}


def test_recommend_refuses_bad_arguments(capsys, lib_home):
    with pytest.raises(SystemExit) as exc:
        cli.main(["models", "recommend", "--target", "t", "--prompts", "0"])
    assert exc.value.code == 2
    assert "prompts must be a whole number from 1 to 20" in capsys.readouterr().err


# -- the formula and the ranking -------------------------------------------------------


def test_predicted_speedup_is_leviathans_formula_at_the_best_k():
    # a = 0.8, c = 0.25, s = 0.1: E(K) / (K c + 1 + s K) is 1.333, 1.435,
    # 1.440, 1.401 for K = 1..4: best at K = 3, E(3) = (1 - 0.8^4) / 0.2 = 2.952
    # over 3 * 0.25 + 1.3 = 2.05.
    speedup, k = rec.predicted_speedup(0.8, 0.25, 0.1)
    assert k == 3
    assert speedup == pytest.approx(2.952 / 2.05)
    # A perfect free draft gains K + 1 tokens per verify of K + 1 tokens.
    assert rec.predicted_speedup(1.0, 0.0, 0.0, cap=5) == (6.0, 5)
    # A draft that is never accepted only costs: below 1 at its cheapest (K = 1).
    assert rec.predicted_speedup(0.0, 0.3, 0.1) == (pytest.approx(1 / 1.4), 1)
    assert rec.predicted_speedup(None, 0.3, 0.1) is None


def test_acceptance_counts_judged_tokens_only():
    # Blocks of 4: 4 accepted (4 judged), 1 accepted (2 judged), 0 accepted (1 judged).
    assert rec.per_token_acceptance(5, 7) == pytest.approx(5 / 7)
    assert rec.per_token_acceptance(0, 0) is None


def _result(draft: str, measured: float, predicted: float | None) -> rec.DraftResult:
    return rec.DraftResult(
        target="t", draft=draft, name=draft, machine="m", compute="cpu/float32",
        acceptance=0.5, acceptance_rate=0.4, draft_cost=0.3, verify_slope=0.1,
        predicted_speedup=predicted, best_k=2, measured_speedup=measured, tokens_per_s=10.0,
        plain_tokens_per_s=10.0 / measured, prompts=3, tokens=100, measured_at="now")


def test_rank_and_best():
    a, b, c = _result("a", 1.2, 1.5), _result("b", 1.6, 1.4), _result("c", 1.2, 1.9)
    assert [r.draft for r in rec.rank([a, b, c])] == ["b", "c", "a"]
    sample = rec.Sample.choose([])
    assert rec.Recommendation("t", "m", sample, (b, a), ()).best == b
    slow = _result("s", 0.9, 1.1)
    assert rec.Recommendation("t", "m", sample, (slow,), ()).best is None


def test_make_result_measures_against_plain():
    r = rec.make_result("t", "d", "D", "m", "cpu/float32", drafted=10, accepted=6, judged=8,
                        draft_cost=0.25, verify_slope=0.1, tokens=40, tokens_per_s=15.0,
                        plain_tokens_per_s=10.0, prompts=2)
    assert r.measured_speedup == pytest.approx(1.5)
    assert r.acceptance == pytest.approx(0.75) and r.acceptance_rate == pytest.approx(0.6)
    assert (r.predicted_speedup, r.best_k) == rec.predicted_speedup(0.75, 0.25, 0.1)
    assert r.summary().startswith("1.50× measured (predicted ")


def test_recent_prompts_newest_first_without_repeats():
    conversations = [  # newest first
        [("user", "first of new"), ("assistant", "ok"), ("user", "second of new")],
        [("user", "  "), ("user", "second of new"), ("user", "x" * 5000)],
    ]
    got = rec.recent_prompts(conversations, 3)
    assert got == ["second of new", "first of new", "x" * rec.MAX_PROMPT_CHARS]
    assert rec.Sample.choose(got, 2).prompts == ("second of new", "first of new")
    assert rec.Sample.choose([], 2).prompts == rec.BUILT_IN_PROMPTS[:2]


def test_the_results_file_keeps_one_result_per_key_and_survives_garbage(lib_home):
    rec.results_file().parent.mkdir(parents=True)
    rec.results_file().write_text("{not json")
    assert rec.remembered("t", "m") == {}
    rec.remember(_result("a", 1.2, 1.5))
    rec.remember(_result("a", 1.4, 1.5))  # the same key: replaced
    rec.remember(_result("b", 1.1, 1.5))
    kept = rec.remembered("t", "m")
    assert sorted(kept) == ["a", "b"] and kept["a"].measured_speedup == 1.4
    assert kept["a"].remembered and rec.remembered("t", "another machine") == {}
