"""Stop strings in streamed text (issue 47): the automaton that finds them
gives what a brute-force search gives, for random stop sets and random
token splits (overlapping stops, one stop a prefix of another, text of
several code points a character, stops across tokens), and a token costs
the same however many stop strings a request has.

The reference: the text the tokens make, cut where the first stop string
to complete begins (of those completing at the same character, the
longest); while none has, everything but the longest tail that is a
proper prefix of a stop string is handed out. That is what streaming one
character at a time gives, so it does not depend on how tokens split it.
"""

from __future__ import annotations

import random
import time

import pytest
from mlx_lm.utils import load_tokenizer
from specchat import values
from specchat.engine.stops import StopMatcher
from specchat.engine.textstream import TextStream

# Units random text is made of: ASCII that overlaps itself, a space (the
# BPE detokenizer holds a lone one back a token), accents as one code
# point and as two, emoji with a skin tone and a joiner, CJK.
UNITS = ["a", "b", "ab", " ", "é", "e\u0301", "🙂", "👍🏽", "👩\u200d💻", "日本", "\n"]


@pytest.fixture(scope="module")
def tok(tiny_target):
    return load_tokenizer(tiny_target)


def reference(text: str, stops: list[str]) -> tuple[str, bool]:
    """(the final text, whether a stop string ended it), by brute force."""
    stops = [s for s in stops if s]
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if text[:end].endswith(s)]
        if ending:
            return text[:end - max(map(len, ending))], True
    return text, False


def held(text: str, stops: list[str]) -> int:
    """The longest tail of ``text`` that is a proper prefix of a stop string."""
    return max((n for s in stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)


def ids_of(tok, pieces: list[str]) -> list[int]:
    """Token ids whose split follows ``pieces`` (each encoded on its own;
    byte-level BPE splits a character across tokens where it has no
    token for it)."""
    return [t for p in pieces for t in tok.encode(p, add_special_tokens=False)]


def stream(tok, ids: list[int], stops: list[str]) -> None:
    """Stream ``ids`` with ``stops`` and check every step against the
    reference: what was handed out is never taken back, holds back no more
    than a stop string could still need, and ends where the reference does."""
    whole = tok.detokenizer  # the text the tokens make, read beside the stream
    for t in ids:
        whole.add_token(t)
    whole.finalize()
    final, stopped = reference(whole.text, stops)
    s = TextStream(tok, stops)
    so_far = tok.detokenizer
    out = ""
    for t in ids:
        so_far.add_token(t)
        out += s.add(t)
        if s.stopped:
            break
        assert out == so_far.text[:len(so_far.text) - held(so_far.text, stops)], (stops, ids)
    out += s.finish()
    assert (out, s.stopped) == (final, stopped), (whole.text, stops, ids)
    assert s.text == out


def _random_case(rng: random.Random) -> tuple[list[str], list[str]]:
    """Random text in random pieces, and stop strings: pieces of the text
    itself (so they occur, overlapping and spanning tokens), their prefixes
    (one stop the prefix of another) and random units (most never occur)."""
    # Not starting with a space: the BPE detokenizer drops a reply's first one.
    text = rng.choice(UNITS[:3]) + "".join(rng.choice(UNITS) for _ in range(rng.randint(0, 30)))
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 10))))
    pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    stops = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.random()
        if kind < 0.5 and len(text) > 1:
            i = rng.randrange(len(text))
            stops.append(text[i:i + rng.randint(1, 6)])
        elif kind < 0.7 and stops:
            base = rng.choice(stops)
            stops.append(base[:rng.randint(1, len(base))])
        else:
            stops.append("".join(rng.choice(UNITS) for _ in range(rng.randint(1, 3))))
    return [p for p in pieces if p], stops


@pytest.mark.parametrize("text,stops", [
    ("xabcdy", ["abcd", "bc"]),  # a stop inside another completes first
    ("ababab", ["aba", "bab"]),  # overlapping
    ("abcabd", ["abd", "ab"]),  # a stop that is a prefix of another
    ("abcabd", ["ab", "abd"]),
    ("aab", ["aab", "ab"]),  # same end: the longer one is cut
    ("hello 👍🏽 world", ["🏽 w"]),  # across a code point pair
    ("café vs cafe\u0301", ["e\u0301"]),  # the combining accent, not the precomposed é
    ("日本語の日本", ["本語の日本", "語"]),
    ("nothing here", ["zzz", "here!"]),  # held back until the end, then handed out
])
def test_stop_strings_as_the_reference_finds_them(tok, text, stops):
    for split in (list(text), [text], [text[:len(text) // 2], text[len(text) // 2:]]):
        stream(tok, ids_of(tok, split), stops)


def test_random_stop_sets_and_token_splits_match_the_reference(tok):
    rng = random.Random(47)
    for _ in range(400):
        pieces, stops = _random_case(rng)
        stream(tok, ids_of(tok, pieces), stops)


def test_the_automaton_alone_matches_the_reference():
    """Without a tokenizer: text fed in random slices, many more cases."""
    rng = random.Random(4711)
    for _ in range(3000):
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 25)))
        stops = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 4)))
                 for _ in range(rng.randint(1, 5))]
        final, stopped = reference(text, stops)
        m = StopMatcher(stops)
        read, found = 0, None
        while read < len(text) and found is None:
            upto = rng.randint(read + 1, len(text))
            found = m.feed(text[:upto], read)
            if found is None:
                assert m.held == held(text[:upto], stops), (text[:upto], stops)
            read = upto
        assert stopped == (found is not None), (text, stops)
        if found is not None:
            end, length = found
            assert text[:end - length] == final, (text, stops)


def _per_token(tok, ids: list[int], stops: list[str]) -> float:
    """Seconds per token of streaming ``ids`` with ``stops`` (the best of
    a few runs: the machine is shared)."""
    best = float("inf")
    for _ in range(5):
        s = TextStream(tok, stops)
        started = time.perf_counter()
        for t in ids:
            s.add(t)
        best = min(best, time.perf_counter() - started)
    return best / len(ids)


def test_a_token_costs_the_same_however_many_stop_strings(tok):
    """The most stop strings a request may have, each as long as their
    bound on characters allows and none ever completing, cost a token
    about what one stop string costs (checking each stop string on its own,
    64 cost 6 times what one did: 73 us a token against 11 us)."""
    count = int(values.LIMITS["stop strings"].high)
    length = int(values.LIMITS["characters of stop strings"].high) // count
    text = "ab " * 700
    ids = tok.encode(text, add_special_tokens=False)
    # Half share long prefixes with the text (the automaton goes deep and
    # follows failure links), half start with a character it never has
    # (each checked on its own, every one of its prefixes was compared).
    many = [("ab " * length)[:length - 4] + f"#{i:02d}" if i % 2 else f"#{i:02d}" + "x" * (
        length - 3) for i in range(count)]
    assert len(many) == count and sum(map(len, many)) == count * length - count // 2
    values.stop_strings(many)  # within the bounds
    one = _per_token(tok, ids, many[:1])
    all_of_them = _per_token(tok, ids, many)
    assert all_of_them < 3 * one, (one, all_of_them)
