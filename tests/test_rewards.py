"""Reward shaping arithmetic, masking and code extraction (hand-computed values)."""

from __future__ import annotations

import pytest
from agentrl.evaluation import CaseResult, ErrorClass, Judgement
from agentrl.evaluation.judgement import build_judgement, masked_judgement
from agentrl.evaluation.rewards import (
    Reward,
    RewardConfig,
    extract_code,
    has_expected_format,
    shape,
)


def judged(
    passes: list[bool], cls: ErrorClass = ErrorClass.WRONG_ANSWER, entry: str = "f"
) -> Judgement:
    cases = [
        CaseResult(i, ok, ErrorClass.PASSED if ok else cls, None, "" if ok else "failed")
        for i, ok in enumerate(passes)
    ]
    return build_judgement("t", cases, all(passes), wall_time_s=0.0, entry_point=entry)


FENCED = "Here it is:\n```python\ndef f(x):\n    return x\n```\n"


def test_partial_credit_is_the_fraction() -> None:
    r = shape(judged([True, True, False, True]), "code")
    assert r == Reward(
        0.75, False, None, {"correctness": 0.75, "error": 0.0, "length": -0.0, "format": 0.0}
    )


def test_all_or_nothing() -> None:
    cfg = RewardConfig(partial_credit=False)
    assert shape(judged([True, True, False]), "x", cfg).value == 0.0
    assert shape(judged([True, True]), "x", cfg).value == 1.0
    assert (
        shape(judged([True, True]), "x", RewardConfig(partial_credit=False, pass_reward=2)).value
        == 2.0
    )


def test_error_class_weights() -> None:
    cfg = RewardConfig(
        error_weights={"syntax_error": -0.5, "timeout": -0.25, ErrorClass.RUNTIME_ERROR: -0.1}
    )
    assert shape(judged([False, False], ErrorClass.SYNTAX_ERROR), "x", cfg).value == -0.5
    r = shape(judged([True, False, False, False], ErrorClass.TIMEOUT), "x", cfg)
    assert r.value == pytest.approx(0.25 - 0.25)
    assert r.components["error"] == -0.25
    assert shape(judged([True, False], ErrorClass.RUNTIME_ERROR), "x", cfg).value == pytest.approx(
        0.4
    )
    # a class without a weight adds nothing; a pass adds no error term
    assert shape(judged([True, False], ErrorClass.WRONG_ANSWER), "x", cfg).value == 0.5
    assert shape(judged([True]), "x", cfg).components["error"] == 0.0
    # the default penalises syntax errors only
    assert shape(judged([False], ErrorClass.SYNTAX_ERROR), "x").value == -0.5


def test_length_penalty() -> None:
    cfg = RewardConfig(length_penalty=0.01, target_length=10)
    r = shape(judged([True]), "x" * 30, cfg)
    assert r.components["length"] == pytest.approx(-0.2)
    assert r.value == pytest.approx(0.8)
    assert shape(judged([True]), "x" * 10, cfg).value == 1.0
    capped = RewardConfig(length_penalty=0.01, target_length=10, max_length_penalty=0.05)
    assert shape(judged([True]), "x" * 1000, capped).value == pytest.approx(0.95)
    words = RewardConfig(length_penalty=0.1, target_length=2, length_fn=lambda s: len(s.split()))
    assert shape(judged([True]), "a b c d e", words).value == pytest.approx(0.7)


def test_format_bonus() -> None:
    cfg = RewardConfig(format_weight=0.2)
    assert shape(judged([True, False]), FENCED, cfg).value == pytest.approx(0.7)
    assert shape(judged([True, False]), "def f(x): return x", cfg).value == 0.5
    two = FENCED + "\n```python\nprint(1)\n```\n"
    assert shape(judged([True, False]), two, cfg).components["format"] == 0.0
    defs = RewardConfig(format_weight=0.1, format="def")
    assert shape(judged([False]), FENCED, defs).value == pytest.approx(0.1)
    assert shape(judged([False], entry="g"), FENCED, defs).value == 0.0  # defines f, not g
    both = RewardConfig(format_weight=0.3, format="fence_and_def")
    assert shape(judged([True]), FENCED, both).value == pytest.approx(1.3)
    assert shape(judged([True]), "```python\nx = 1\n```", both).value == 1.0


def test_all_terms_add_up() -> None:
    cfg = RewardConfig(
        error_weights={"wrong_answer": -0.1},
        length_penalty=0.001,
        target_length=20,
        format_weight=0.05,
    )
    text = FENCED  # 49 characters: 29 over the target
    r = shape(judged([True, False, True, False]), text, cfg)
    assert len(text) == 49
    assert r.value == pytest.approx(0.5 - 0.1 - 0.029 + 0.05)
    assert sum(r.components.values()) == pytest.approx(r.value)


def test_masked_judgement_gives_no_reward() -> None:
    j = masked_judgement("t", "sandbox error: no cgroup")
    r = shape(j, "anything", RewardConfig(format_weight=1.0))
    assert r.value is None and r.masked and r.reason == "sandbox error: no cgroup"
    assert r.components == {}


def test_extract_code() -> None:
    assert extract_code(FENCED) == "def f(x):\n    return x\n"
    assert extract_code("plain code\n") == "plain code\n"
    assert extract_code("```\nx = 1\n```") == "x = 1\n"
    assert extract_code("```text\nnot code\n```\n```py\ny = 2\n```") == "y = 2\n"
    assert extract_code("~~~python\nz = 3\n~~~") == "z = 3\n"
    assert (
        extract_code("intro\n```python\ndef f():\n    pass\n") == "def f():\n    pass\n"
    )  # unclosed
    assert extract_code("````python\na = '```'\n````") == "a = '```'\n"
    with pytest.raises(TypeError):
        extract_code(None)  # type: ignore[arg-type]


def test_has_expected_format() -> None:
    assert has_expected_format(FENCED, "fence")
    assert not has_expected_format("```python\nx\n", "fence")  # unclosed
    assert has_expected_format("def g(): pass", "def", "g")
    assert not has_expected_format("def g(: pass", "def")
    with pytest.raises(ValueError, match="format"):
        has_expected_format("x", "xml")


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="unknown error class"):
        RewardConfig(error_weights={"oops": 1.0})
    with pytest.raises(ValueError, match="unknown error class"):
        RewardConfig(error_weights={"passed": 1.0})
    with pytest.raises(TypeError, match="finite"):
        RewardConfig(error_weights={"timeout": float("nan")})
    with pytest.raises(ValueError, match="length_penalty"):
        RewardConfig(length_penalty=-1)
    with pytest.raises(ValueError, match="target_length"):
        RewardConfig(target_length=-3)
    with pytest.raises(ValueError, match="format"):
        RewardConfig(format="yaml")
    with pytest.raises(TypeError, match="judgement"):
        shape("passed", "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config"):
        shape(judged([True]), "x", {"partial_credit": True})  # type: ignore[arg-type]
