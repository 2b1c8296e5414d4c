"""Hand-checked answer pairs shared by the math-equivalence tests (test_math_equiv.py and the
differential test against math-verify)."""

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
