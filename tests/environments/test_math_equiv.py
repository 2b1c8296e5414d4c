"""Answer extraction and the math-equivalence checker on tricky pairs (hand-checked values)."""

import time

import pytest

from environments.math_equiv import extract_answer, is_equivalent, normalize, to_sympy
from tests.helpers.math_pairs import EQUIVALENT, NOT_EQUIVALENT


@pytest.mark.parametrize(("a", "b"), EQUIVALENT)
def test_equivalent_pairs(a, b):
    assert is_equivalent(a, b)
    assert is_equivalent(b, a)


@pytest.mark.parametrize(("a", "b"), NOT_EQUIVALENT)
def test_non_equivalent_pairs(a, b):
    assert not is_equivalent(a, b)
    assert not is_equivalent(b, a)


def test_reference_may_be_a_number():
    assert is_equivalent("14", 14)
    assert is_equivalent("\\frac{7}{2}", 3.5)
    assert not is_equivalent(None, 3)
    assert not is_equivalent("3", None)


ADVERSARIAL = [
    "9^9^9^9",
    "10^{10^{10}}",
    "x^{99999999}",
    "(2^1000)^1000",
    "2^{2^{2^{2^{2}}}}",
    "(" * 400 + "1" + ")" * 400,
    "1" * 10_000,
    "\\frac" * 200,
    "__import__('os').system('echo hi')",
    "sin(sin(sin(sin(x))))^1000",
    "\\sqrt{" * 150 + "2" + "}" * 150,
]


@pytest.mark.parametrize("text", ADVERSARIAL)
def test_adversarial_answers_return_fast(text):
    t0 = time.perf_counter()
    assert is_equivalent(text, "7") is False
    assert time.perf_counter() - t0 < 1.0  # measured ~1 ms; 1 s leaves room for a busy machine


def test_guarded_parse_rejects_huge_powers():
    assert to_sympy("9^9^9") is None  # 9^(9^9) has ~370 million digits
    assert to_sympy("2^10") == 1024


def test_normalize_strips_presentation():
    assert normalize("$\\$1,234$ dollars") == "1234"
    assert normalize("\\text{x} = \\dfrac{1}{2}") == "\\frac{1}{2}"


def test_extract_answer_forms():
    assert extract_answer("so \\boxed{\\frac{1}{2}}, done") == "\\frac{1}{2}"
    assert extract_answer("\\boxed{1} then \\boxed{2}") == "2"  # the last box wins
    assert extract_answer("work\n#### 1,000") == "1,000"
    assert extract_answer("steps\nAnswer: 34") == "34"
    assert extract_answer("no answer here") is None
    assert extract_answer(None) is None
