"""specchat.values: every number a user can type has one range and one line
that names it; text that is not UTF-8 is refused without repeating it."""

from __future__ import annotations

import pytest
from specchat import values
from specchat.errors import SpecChatError


@pytest.mark.parametrize("name,typed,allowed", [
    ("temperature", "nan", "from 0 to 5"),
    ("temperature", float("nan"), "from 0 to 5"),
    ("temperature", float("inf"), "from 0 to 5"),
    ("temperature", "-inf", "from 0 to 5"),
    ("temperature", -0.5, "from 0 to 5"),
    ("temperature", "", "from 0 to 5"),
    ("top-p", 0, "above 0 and at most 1"),
    ("top-p", "1.5", "above 0 and at most 1"),
    ("top-p", "nan", "above 0 and at most 1"),
    ("top-k", -1, "from 0 to 1000000"),
    ("top-k", "2.5", "from 0 to 1000000"),
    ("max tokens", 0, "from 1 to 1048576"),
    ("max tokens", True, "from 1 to 1048576"),
    ("context", 8, "from 16 to 1048576"),
    ("K", 0, "from 1 to 32"),
    ("K", "33", "from 1 to 32"),
    ("seed", "1.5", "any integer"),
    ("seed", "abc", "any integer"),
])
def test_a_bad_value_is_one_line_naming_its_range(name, typed, allowed):
    with pytest.raises(values.BadValue) as caught:
        values.check(name, typed)
    message = str(caught.value)
    assert isinstance(caught.value, SpecChatError)
    assert message.startswith(f"{name} must be") and allowed in message
    assert "\n" not in message and "got" in message


@pytest.mark.parametrize("name,typed,expected", [
    ("temperature", " 0.7 ", 0.7),
    ("temperature", 0, 0.0),
    ("top-p", 1, 1.0),
    ("top-k", "40", 40),
    ("max tokens", 2.0, 2),
    ("K", "auto", None),
    ("K", None, None),
    ("K", "8", 8),
    ("seed", "", None),
    ("seed", "random", None),
    ("seed", 7, 7),
    ("seed", "-1", 2 ** 64 - 1),
    ("seed", -(2 ** 64) - 5, 2 ** 64 - 5),
    ("seed", str(10 ** 30), 10 ** 30 % 2 ** 64),
])
def test_good_values_come_back_in_their_kind(name, typed, expected):
    got = values.check(name, typed)
    assert got == expected and type(got) is type(expected)


def test_what_was_typed_is_shown_on_one_line():
    with pytest.raises(values.BadValue) as caught:
        values.check("temperature", "1\n2\udcff")
    assert str(caught.value).endswith("got 1\\n2\\udcff")
    str(caught.value).encode("utf-8")  # printable anywhere


@pytest.mark.parametrize("text,where", [
    ("ab\udcffc", "byte 0xFF at character 3"),  # argv's surrogate escape for b"\xff"
    ("\udcc3(", "byte 0xC3 at character 1"),
    ("x\ud800", "the lone surrogate U+D800 at character 2"),
])
def test_text_that_is_not_utf8_is_refused_without_repeating_it(text, where):
    with pytest.raises(values.BadValue) as caught:
        values.text("the prompt", text)
    message = str(caught.value)
    assert message.startswith("the prompt is not valid UTF-8 text") and where in message
    message.encode("utf-8")
    assert values.text("the prompt", "café 🙂") == "café 🙂"


@pytest.mark.parametrize("name,typed,expected", [
    ("max tokens", "2.0", 2),  # as the JSON number 2.0 is: the CLI and the API agree
    ("top-k", " 40.0 ", 40),
    ("seed", "1e3", 1000),
    ("K", "8.0", 8),
])
def test_a_whole_number_may_be_typed_with_a_decimal_point(name, typed, expected):
    got = values.check(name, typed)
    assert got == expected and type(got) is int


@pytest.mark.parametrize("name,typed", [("max tokens", "2.5"), ("seed", "nan"),
                                        ("top-k", "inf"), ("K", "1e400")])
def test_a_typed_number_that_is_not_whole_shows_as_typed(name, typed):
    with pytest.raises(values.BadValue) as caught:
        values.check(name, typed)
    assert str(caught.value).endswith(f"; got {typed}")


@pytest.mark.parametrize("name", sorted(values.NOT_EMPTY))
def test_text_that_means_nothing_empty_is_refused(name):
    with pytest.raises(values.BadValue) as caught:
        values.text(name, "")
    assert str(caught.value) == f"{name} must not be empty"
    assert values.text(name, " ") == " "  # a space is a stop string like any other
    assert values.text("the system prompt", "") == ""


@pytest.mark.parametrize("name,typed,expected", [
    ("SPECCHAT_DTYPE", "float16", "float16"),
    ("SPECCHAT_DTYPE", " Q4 ", "q4"),
    ("SPECCHAT_DTYPE", "", None),
    ("SPECCHAT_DTYPE", None, None),
    ("SPECCHAT_BLAS", "BLIS", "blis"),
    ("SPECCHAT_BLAS", "bundled", "bundled"),
    ("SPECCHAT_BLAS", "/opt/blas/libcblas.so.3", "/opt/blas/libcblas.so.3"),
])
def test_an_environment_choice_comes_back_as_its_word_or_path(name, typed, expected):
    assert values.choice(name, typed) == expected


@pytest.mark.parametrize("name,typed,words", [
    ("SPECCHAT_DTYPE", "float8", "SPECCHAT_DTYPE must be float32, float16, bfloat16 or q4; "
                                 "got float8"),
    ("SPECCHAT_DTYPE", "q8", "SPECCHAT_DTYPE must be float32, float16, bfloat16 or q4; got q8"),
    ("SPECCHAT_BLAS", "blsi", "SPECCHAT_BLAS must be blis, openblas, bundled or the path of a "
                              "CBLAS library; got blsi"),
    ("SPECCHAT_BLAS", "libcblas.so\n", "got libcblas.so"),  # no such file here: a typo
])
def test_a_bad_environment_choice_is_one_line_naming_the_variable(name, typed, words):
    with pytest.raises(values.BadValue) as caught:
        values.choice(name, typed)
    assert str(caught.value).endswith(words) and "\n" not in str(caught.value)


def test_a_library_file_named_without_a_slash_is_a_path(tmp_path, monkeypatch):
    (tmp_path / "libcblas.so").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECCHAT_BLAS", "libcblas.so")
    assert values.environment("SPECCHAT_BLAS") == "libcblas.so"
@pytest.mark.parametrize("typed,kept", [
    ("http://localhost:5173", "http://localhost:5173"),
    (" HTTPS://App.Example/ ", "https://app.example"),
    ("http://app.example:80", "http://app.example"),  # as a browser sends it
    ("https://app.example:443", "https://app.example"),
    ("http://[::1]:3000", "http://[::1]:3000"),
    ("vscode-webview://abc123", "vscode-webview://abc123"),
])
def test_an_origin_is_kept_as_a_browser_sends_it(typed, kept):
    assert values.origin(typed) == kept


@pytest.mark.parametrize("typed", ["app.example", "null", "*", "http://*.example", "http://",
                                   "http://app.example/path", "http://app.example?q",
                                   "http://user@app.example", "http://app.example:99999",
                                   "http://app example", "ftp:/x", ""])
def test_a_bad_origin_is_one_line(typed):
    with pytest.raises(values.BadValue) as caught:
        values.origin(typed)
    message = str(caught.value)
    assert message.startswith("an allowed origin must be scheme://host[:port] with no path, "
                              "as a browser sends it (http://localhost:5173); got ")
    assert "\n" not in message


def test_a_prompt_is_bounded_in_utf8_bytes():
    """Bytes, not characters: a token covers at least one byte, so the
    bound holds for the tokens whatever the script."""
    bound = int(values.LIMITS["prompt"].high)
    assert bound == 1_000_000
    values.prompt_size(values.utf8_size(["é" * (bound // 2)]))
    values.prompt_tokens(bound)
    with pytest.raises(values.BadValue) as caught:
        values.prompt_size(values.utf8_size(["🙂" * 999_000]))
    assert str(caught.value) == ("the prompt is 3,996,000 bytes of UTF-8 text, more than "
                                 "SpecChat reads at once (1,000,000 bytes, at most as many "
                                 "tokens); shorten it")
    with pytest.raises(values.BadValue) as caught:
        values.prompt_tokens(bound + 1)
    assert str(caught.value) == ("the prompt is 1,000,001 tokens, more than SpecChat reads "
                                 "at once (1,000,000); shorten it")


@pytest.mark.parametrize("name,bound,where", [
    ("stop strings", 64, "in one request"),
    ("characters of stop strings", 4096, "in one request"),
    ("messages", 10_000, "in one request"),
    ("input items", 10_000, "in one request"),
    ("content parts", 1_000, "in one message"),
    ("tools", 128, "in one request"),
    ("bytes of tools", 1_000_000, "in one request, as UTF-8 JSON"),
    ("tool calls", 128, "in one message"),
    ("tool calls in all", 10_000, "in one request"),
])
def test_every_list_a_request_carries_has_a_bound(name, bound, where):
    values.size(name, bound)
    with pytest.raises(values.BadValue) as caught:
        values.size(name, bound + 1)
    assert str(caught.value) == f"too many {name}: {bound + 1:,}; at most {bound:,} {where}"


def test_stop_strings_are_bounded_in_count_before_they_are_read():
    assert values.stop_strings(["x" * 64] * 64) == ("x" * 64,) * 64
    with pytest.raises(values.BadValue, match="too many stop strings: 400,000; at most 64"):
        values.stop_strings([object()] * 400_000)  # not one of them is looked at
    with pytest.raises(values.BadValue, match="too many characters of stop strings: 4,097"):
        values.stop_strings(["x" * 4096, "y"])
    with pytest.raises(values.BadValue, match="a stop string must not be empty"):
        values.stop_strings(["ok", ""])
