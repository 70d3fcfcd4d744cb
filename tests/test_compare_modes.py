"""The comparison modes of agentrl.languages.compare: each project's rule on the cases that
tell the rules apart, and properties (hypothesis) every mode must keep."""

from __future__ import annotations

import pytest
from agentrl.evaluation import outputs_match
from agentrl.languages import COMPARE_MODES, compare_output, normalize_mode
from hypothesis import given, settings
from hypothesis import strategies as st


def cmp(got: str, want: str, mode: str) -> bool:
    return compare_output(got, want, mode)


def test_exact_and_whitespace() -> None:
    assert cmp("a\r\nb\n\n", "a\nb", "exact")
    assert not cmp("a \n", "a\n", "exact")
    assert not cmp("A", "a", "exact")
    assert cmp("1  2\n3\t", "1 2 3", "whitespace")
    assert not cmp("1 2", "1 2 3", "whitespace")
    assert cmp("0.30000001", "0.3", "float") and not cmp("0.31", "0.3", "float")


def test_sandboxfusion_rule() -> None:
    # line-wise, each line stripped, case-insensitive
    assert cmp("YES\n  2 3  \n\n", "yes\n2 3", "sandboxfusion")
    assert not cmp("2  3", "2 3", "sandboxfusion")  # inside a line, spacing counts
    assert not cmp("1\n2", "1\n2\n3", "sandboxfusion")
    assert not cmp("1 2", "1\n2", "sandboxfusion")
    # a float line: relative tolerance 1e-5 against the expected value
    assert cmp("1000005.0", "1000000", "sandboxfusion")  # 5e-6 relative
    assert not cmp("1000020", "1000000", "sandboxfusion")  # 2e-5 relative
    assert not cmp("0.00002", "0.00001", "sandboxfusion")
    assert cmp("1e-16", "0", "sandboxfusion")  # |diff| / 1e-10 = 1e-6
    assert not cmp("1e-12", "0", "sandboxfusion")
    assert cmp("NaN", "nan", "sandboxfusion")  # equal once lower-cased
    assert not cmp("nan", "1", "sandboxfusion")
    assert not cmp("1.0 2.0", "1 2", "sandboxfusion")  # a line of two numbers is no float


def test_codecontests_rule() -> None:
    assert cmp("1 2\n3", "1\n2   3\n", "codecontests")  # tokens, any whitespace
    assert cmp("Yes", "YES", "codecontests")
    assert cmp("0.123456", "0.123459", "codecontests")  # absolute 3e-6
    assert not cmp("0.12345", "0.12347", "codecontests")  # absolute 2e-5
    assert not cmp("1000000.0", "1000000.00002", "codecontests")  # absolute, not relative
    assert cmp("+5", "5.000001", "codecontests")
    assert not cmp("0x10", "16", "codecontests")  # not a decimal number: a string
    assert not cmp("abc", "abd", "codecontests")
    assert not cmp("1 2", "1 2 3", "codecontests")
    # numbers compare as doubles: 1e16 and 1e16 + 1 are the same double
    assert cmp("10000000000000001", "10000000000000000", "codecontests")
    assert cmp("nan", "nan", "codecontests")  # equal token lists match first
    assert not cmp("nan 1", "nan 2", "codecontests")
    assert cmp("1\f2", "1\f2", "codecontests") and not cmp("1\f2", "1 2", "codecontests")


def test_livecodebench_rule() -> None:
    assert cmp("1.0", "1", "livecodebench")  # Decimal equality
    assert cmp("1   2\n", "1 2", "livecodebench")
    assert not cmp("0.1", "0.1000001", "livecodebench")  # exact decimals, no tolerance
    assert not cmp("50000000000000001", "50000000000000000", "livecodebench")
    assert not cmp("yes", "YES", "livecodebench")  # case counts
    assert not cmp("1\n\n2", "1\n2", "livecodebench")  # an empty line counts
    assert cmp("  a b  \n c ", "a b\nc", "livecodebench")
    assert not cmp("a  b", "a b", "livecodebench")  # not numbers: the stripped lines differ
    assert not cmp("NaN", "nan", "livecodebench")  # Decimal NaNs never compare equal
    assert not cmp("sNaN", "1", "livecodebench")


def test_names_aliases_and_types() -> None:
    assert set(COMPARE_MODES) == {
        "exact",
        "whitespace",
        "float",
        "sandboxfusion",
        "codecontests",
        "livecodebench",
    }
    assert normalize_mode("SF") == "sandboxfusion"
    assert normalize_mode("code_contests") == "codecontests"
    assert normalize_mode("lcb") == "livecodebench"
    assert normalize_mode("tokens") == "whitespace"
    with pytest.raises(ValueError, match="sandboxfusion"):
        normalize_mode("fuzzy")
    with pytest.raises(TypeError):
        compare_output(1, "1")  # type: ignore[arg-type]
    assert compare_output(b"caf\xc3\xa9\n", "café", "exact")
    assert compare_output(b"\xff", "\ufffd", "exact")  # bad bytes replaced
    assert outputs_match("1 2", "1  2", "whitespace")  # the old entry point
    with pytest.raises(TypeError):
        outputs_match(b"1", "1")  # type: ignore[arg-type]


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
TOKEN = st.text(st.sampled_from("abcXYZ019.-+e"), min_size=1, max_size=8)
SEP = st.text(st.sampled_from(" \n\t\r\v"), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(TEXT, st.sampled_from(COMPARE_MODES))
def test_every_mode_is_reflexive(text: str, mode: str) -> None:
    assert compare_output(text, text, mode)


@settings(max_examples=200, deadline=None)
@given(st.lists(TOKEN, min_size=1, max_size=8), st.data())
def test_token_modes_ignore_spacing(tokens: list[str], data: st.DataObject) -> None:
    seps_a = [data.draw(SEP) for _ in tokens]
    seps_b = [data.draw(SEP) for _ in tokens]
    a = "".join(t + s for t, s in zip(tokens, seps_a, strict=True))
    b = data.draw(SEP) + "".join(t + s for t, s in zip(tokens, seps_b, strict=True))
    assert compare_output(a, b, "whitespace")
    assert compare_output(a, b, "codecontests")


@settings(max_examples=200, deadline=None)
@given(st.lists(TOKEN, min_size=1, max_size=5), st.integers(0, 3), st.integers(0, 3))
def test_line_modes_ignore_line_ends(lines: list[str], pad: int, trailing: int) -> None:
    want = "\n".join(lines)
    got = "\n".join(line + " " * pad for line in lines) + "\n" * trailing
    assert compare_output(got, want, "sandboxfusion")
    assert compare_output(got, want, "livecodebench")
    if pad == 0:
        assert compare_output(got, want, "exact")


@settings(max_examples=200, deadline=None)
@given(TEXT, TEXT)
def test_exact_implies_whitespace(a: str, b: str) -> None:
    if compare_output(a, b, "exact"):
        assert compare_output(a, b, "whitespace")


@settings(max_examples=300, deadline=None)
@given(st.floats(-1e6, 1e6), st.floats(-4e-6, 4e-6), st.floats(2e-5, 1.0))
def test_codecontests_absolute_tolerance(x: float, near: float, far: float) -> None:
    assert compare_output(repr(x + near), repr(x), "codecontests")
    assert not compare_output(repr(x + far), repr(x), "codecontests")
    assert not compare_output(repr(x - far), repr(x), "codecontests")


@settings(max_examples=300, deadline=None)
@given(
    st.floats(1.0, 1e12) | st.floats(-1e12, -1.0),
    st.floats(-4e-6, 4e-6),
    st.floats(2e-5, 0.5),
)
def test_sandboxfusion_relative_tolerance(x: float, near: float, far: float) -> None:
    assert compare_output(repr(x * (1 + near)), repr(x), "sandboxfusion")
    assert not compare_output(repr(x * (1 + far)), repr(x), "sandboxfusion")


@settings(max_examples=200, deadline=None)
@given(st.integers(-(10**30), 10**30), st.integers(1, 10))
def test_livecodebench_integers_are_exact(n: int, d: int) -> None:
    assert compare_output(str(n), f"{n}.000", "livecodebench")
    assert not compare_output(str(n + d), str(n), "livecodebench")
