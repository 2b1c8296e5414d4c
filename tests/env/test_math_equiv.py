"""Answer extraction and the math-equivalence checker on tricky pairs (hand-checked values)."""

import time

import pytest

from environments.math_equiv import extract_answer, is_equivalent, normalize, to_sympy

EQUIVALENT = [
    ("1/2", "0.5"),  # exact rationals
    ("0.5", "\\frac{1}{2}"),
    ("\\dfrac12", "1/2"),  # \dfrac with one-character arguments
    ("\\tfrac{3}{4}", "0.75"),
    ("-\\frac{1}{2}", "-0.5"),
    ("\\frac{-1}{2}", "-1/2"),
    ("5.0", "5"),
    ("5.", "5"),
    ("1e3", "1000"),
    ("2\\sqrt{2}", "\\sqrt{8}"),  # sqrt(8) = 2 sqrt(2)
    ("\\sqrt[3]{8}", "2"),
    ("\\frac{\\sqrt{3}}{2}", "\\sqrt{3}/2"),
    ("\\pi/2", "\\frac{\\pi}{2}"),
    ("1,000", "1000"),  # thousands separators
    ("1{,}000", "1000"),
    ("1\\,000", "1000"),
    ("50\\%", "50"),  # documented choice: the percent sign is dropped
    ("\\$5.00", "5"),
    ("5 dollars", "5"),  # trailing units
    ("10\\text{ inches}", "10"),
    ("12 cm^2", "12"),
    ("30^\\circ", "30"),
    ("x = 5", "5"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("(1,2]", "(1, 2]"),
    ("3, 1", "1, 3"),  # a bare list is unordered
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("2(x+1)", "2x+2"),  # polynomial identity at random points
    ("x^2+2x+1", "(x+1)^2"),
    ("\\infty", "\\infty"),
    ("\\text{(A)}", "(A)"),
    ("\\text{Evelyn}", "Evelyn"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),  # a box left inside the extracted answer
]

NOT_EQUIVALENT = [
    ("1/3", "0.33"),
    ("0.3333333333333333", "1/3"),  # close is not equal
    ("\\sqrt{2}", "1.41421356"),
    ("x+1", "x-1"),
    ("x", "y"),
    ("(1,2]", "(1,2)"),  # interval ends differ
    ("(1,2)", "(2,1)"),  # ordered pair
    ("50\\%", "0.5"),
    ("1,2", "12"),
    ("2\\sqrt{2}", "\\sqrt{6}"),
    ("\\infty", "-\\infty"),
    ("Evelyn", "Nevely"),  # words are text, not products of letters
    ("2", "3"),
    ("", "0"),
]


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
