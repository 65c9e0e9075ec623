r"""check-steps, the third round of claim kinds (stepkit/grading/claim_forms.py and the new rules of
stepkit/grading/stepcheck.py), each on real ProcessBench math / MATH-500 steps: a true chain holds, the wrong
step (the human first error, found on the tuning half) fails, and a claim in an undefined variable is not
parsed, never failed."""

from __future__ import annotations

import json

import pytest

from stepkit.grading.claim_forms import based_numbers, mark_moduli, take_modulus, worded
from stepkit.grading.claims import Relation, extract, to_expression
from stepkit.grading.stepcheck import check_solution
from tests.conftest import DATA


@pytest.fixture(scope="module")
def pb() -> dict:
    with open(DATA / "processbench" / "math.json") as f:
        return {r["id"]: r for r in json.load(f)}


@pytest.fixture(scope="module")
def math500() -> list[dict]:
    with open(DATA / "math500" / "test.jsonl") as f:
        return [json.loads(line) for line in f]


def test_congruence_chains_of_math500_hold(math500):
    r"""MATH-500 #297: 2m \equiv 3 \pmod 7 \implies 8m \equiv 3\cdot 4 \pmod 7 \implies m \equiv 12 \equiv 5
    \pmod 7 (congruences in m keep their residues; 12 \equiv 5 holds); #271: 997 \equiv -3 \pmod{1000} and
    (-3)\cdot 333 = -999 = -1000+1 \equiv 1 \pmod{1000}."""
    for k in (297, 271):
        (c,) = check_solution([math500[k]["solution"]])
        assert c.failed == 0 and c.held >= 3, (k, c)


def test_a_wrong_residue_fails(pb):
    r"""math-197 step 2 (the human first error): '\(195 \mod 19 = 1\)' (195 = 10 * 19 + 5); its
    '\(13y \equiv 1 \mod 19\)' is a condition on an unknown y: not parsed, never failed; the inverse
    '\(13^{-1} \equiv 15 \mod 19\)' is not the rational 1/13: not parsed."""
    (c,) = check_solution([pb["math-197"]["steps"][2]])
    assert c.failures == ["195 ≡ 1"]
    (c,) = check_solution(["We need \\(13y \\equiv 1 \\mod 19\\) and \\(13^{-1} \\equiv 15 \\mod 19\\)."])
    assert (c.held, c.failed, c.not_parsed) == (0, 0, 2)


def test_a_congruence_simplified_to_other_residues_fails(pb):
    r"""math-451 step 5 (the human first error): 2n + 11 \equiv 1 \implies 2n \equiv -10 \implies 2n \equiv 1
    \implies n \equiv 2 \pmod 3 (-10 is 2 modulo 3, not 1); 20 \equiv 2 \pmod 3 before it holds."""
    (c,) = check_solution([pb["math-451"]["steps"][5]])
    assert c.failures == ["2n ≡ 1"] and c.held >= 2


def test_a_list_of_residues_is_no_error():
    """Residues listed as cases (the same left side, reduced residues) are not a derivation."""
    (c,) = check_solution(["Then \\(n \\equiv 1 \\pmod 3\\) or \\(n \\equiv 2 \\pmod 3\\), so \\(n^2 \\equiv 1 \\pmod 3\\)."])
    assert c.failed == 0


def test_moduli_are_marked_and_taken():
    rest, modulus = take_modulus(mark_moduli(r"2^{10} \equiv 1 \pmod{11}"))
    assert (rest.strip(), modulus) == ("2^{10} \\equiv 1", "11")
    assert take_modulus(mark_moduli(r"195 \mod 19 = 1"))[1] == "19"
    assert take_modulus(mark_moduli(r"a \equiv 1 \pmod 3, b \equiv 2 \pmod 5"))[1] == ""  # two moduli: none
    assert take_modulus("x = 2") == ("x = 2", None)


def test_numbers_in_a_base(pb, math500):
    r"""MATH-500 #30: 6_8 \cdot 7_8 = 42_{10}; math-705 (a correct solution): 321_7 = 162_{10}; a digit not
    below its base (math-147's 15_5) is not parsed."""
    assert based_numbers("1010111_2") == "87" and based_numbers("{120301232}_4") == str(int("120301232", 4))
    assert to_expression("15_5") is None and to_expression("a_3") == "a_3"
    text = math500[30]["solution"]
    assert "6_8 \\cdot 7_8 = 42_{10}" in text
    (c,) = check_solution(["\\(6_8 \\cdot 7_8 = 42_{10}\\)"])
    assert (c.held, c.failed) == (1, 0)
    checks = check_solution(pb["math-705"]["steps"])
    assert all(c.failed == 0 for c in checks) and checks[0].held >= 2


def test_gcd_and_lcm_in_math(pb):
    r"""math-463 step 4: \gcd(26, 5) = 1 holds; math-586 step 6 (a correct solution): \gcd(41^2, 41 \cdot 43)
    = 41 holds (its first side applies an unknown p: not parsed); gcd of symbols is not parsed."""
    assert to_expression("\\gcd(12, 18)") == "gcd(12,18)"
    checks = check_solution(pb["math-463"]["steps"][4:5])
    assert checks[0].failed == 0 and checks[0].held >= 1
    (c,) = check_solution([pb["math-586"]["steps"][6]])
    assert c.failed == 0 and c.held >= 1
    (c,) = check_solution(["\\(\\text{lcm}(4, 6) = 12\\) and \\(\\gcd(12x + 7, 5x + 2) = 1\\) and \\(\\text{lcm}(4, 6) = 24\\)"])
    assert (c.held, c.failed, c.not_parsed) == (1, 1, 1)


def test_a_worded_gcd_fails(pb):
    r"""math-247 step 5 (the human first error): 'The GCD of 116 and 174 is 2' (it is 58); math-550 step 3
    (the human first error, then the correct answer): 'the greatest common divisor (GCD) of \(2187\) and
    \(5625\). Using the Euclidean algorithm, we find that the GCD is \(3\)' (it is 9), while 'the GCD of
    \(729\) and \(1875\), which is \(3\)' holds."""
    (c,) = check_solution([pb["math-247"]["steps"][5]])
    assert c.failed == 1 and c.failures[0].startswith("GCD of 116 and 174")
    (c,) = check_solution([pb["math-550"]["steps"][3]])
    assert c.failed == 1 and "2187" in c.failures[0] and c.held >= 3


def test_a_worded_rounding_fails(pb):
    r"""math-713 step 0 (the human first error, then the correct letter): '$14.45001$ rounded to the nearest
    tenth: ... the number rounds down to $14.4$' (it is 14.5); its step 1, 14.54999 -> 14.5, holds."""
    (c,) = check_solution([pb["math-713"]["steps"][0]])
    assert c.failed == 1 and "14.45001" in c.failures[0]
    (c,) = check_solution([pb["math-713"]["steps"][1]])
    assert c.failed == 0 and c.held == 1
    assert [w.holds for w in worded("so 7.5 rounded to the nearest integer is 8, and 1,234 rounded to the nearest "
                                    "hundred is 1,200")] == [True, True]


def test_a_remainder_said_after_a_division_in_math_fails(pb):
    r"""math-245 step 3 (the human first error): '\(770 \div 333 = 2\) with a remainder of \(58\)' (it is 104)."""
    (c,) = check_solution([pb["math-245"]["steps"][3]])
    assert any("remainder of 58" in f for f in c.failures)


def test_a_value_against_the_formula_before_it(pb):
    r"""math-913 (the human first error at step 1, then the correct count): step 0 writes x = (120 - k^2)^2;
    step 1 'If $k=10$, then $x=400$. If $k=9$, then $x=961$' (it is 1521): checked at the values given after
    the formula; a value given before the formula, or a symbol with no value, is not checked."""
    checks = check_solution(pb["math-913"]["steps"][:2])
    assert checks[0].failed == 0
    assert checks[1].failures[0] == "x = 961" and checks[1].held >= 1
    (c,) = check_solution(["Let \\(k = 3\\). We have \\(x = (120 - k^2)^2\\), so \\(x = 5\\)."])
    assert c.failed == 0  # k's value came before the formula: the formula is in k, not at 3


def test_a_term_moved_with_its_sign_kept_fails(pb):
    r"""math-692 step 4 (the human first error, then the correct answer): 4a = k^2(a - 3), 4a = k^2a - 3k^2,
    then 0 = (k^2 - 4)a + 3k^2 (the 3k^2 kept its sign); the rearrangements before it hold."""
    checks = check_solution(pb["math-692"]["steps"][3:5])
    assert checks[1].failures == ["0 = (k^2 - 4)a + 3k^2"]
    rels = [r for r in extract(pb["math-692"]["steps"][4])[0] if isinstance(r, Relation)]
    assert len(rels) == 3


def test_a_worded_base_conversion_fails(pb):
    r"""math-851 (the human first error at step 2, then the correct count): 'in base 2, 87 can be written as
    1010111' holds, 'in base 3, 87 can be written as 10000' fails (10000_3 is 81); a numeral read in its base
    ('1010 in base 2 is 10') holds too, and a number followed by another base is not read."""
    (c,) = check_solution([pb["math-851"]["steps"][1]])
    assert c.failed == 0 and c.held >= 1
    (c,) = check_solution([pb["math-851"]["steps"][2]])
    assert c.failed == 1 and "10000" in c.failures[0]
    assert [w.holds for w in worded("so 1010 in base 2 is 10, and 12 in base 10 is 1100 in base 2")] == [True]


def test_an_inequality_rewritten_to_a_stronger_bound_fails(pb):
    r"""math-832 step 3 (the human first error, then the correct answer): 3 \ge 1 + 2(ab + ac + bc), 2 \ge 2(ab
    + ac + bc), 1 \ge ab + ac + bc hold (rearrangements), then 'ab + ac + bc \le \frac{1}{2}' fails (no such
    bound follows); bounds of an interval in one symbol (m - 4 < 0 and m + 8 < 0) are not compared."""
    (c,) = check_solution([pb["math-832"]["steps"][3]])
    assert c.failures == ["ab + ac + bc <= \\frac{1}{2}"] and c.held >= 3
    (c,) = check_solution(["So \\(m - 4 < 0\\) and \\(m + 8 < 0\\), or \\(x > 0\\) and \\(x > 2\\)."])
    assert c.failed == 0


def test_functions_without_parentheses(pb, math500):
    r"""\sin x, \sin^2 x, \log 2 are applications (sin(x), (sin(x))**2), never the symbol 'sinx'; \cos^{-1} and
    a bare degree (\sin 30) are not read. MATH-500 #326 (sin^2 chains) holds; math-90 step 2 (the human first
    error): (1)((\sin^2 x)^2 - \sin^2 x\cos^2 x + (\cos^2 x)^2) = 1 - 3\sin^2 x\cos^2 x + \sin^4 x + \cos^4 x
    fails (it is 1 - \sin^2 x\cos^2 x ... with \sin^4 x + \cos^4 x once)."""
    assert to_expression("2\\sin x\\cos x") == "2*sin(x)*cos(x)"
    assert to_expression("\\sin^2 x + \\cos^2 x") == "(sin(x))**(2)+(cos(x))**(2)"
    assert to_expression("\\cos^{-1}(0)") is None and to_expression("\\sin 30") is None
    assert to_expression("\\sin x^2") is None  # sin(x^2) or sin(x)^2: not read
    (c,) = check_solution([math500[326]["solution"]])
    assert c.failed == 0 and c.held >= 5
    (c,) = check_solution([pb["math-90"]["steps"][2]])
    assert c.failed == 1 and c.failures[0].startswith("(1)((\\sin^2 x)^2")
    (c,) = check_solution(["So \\(\\log 100 = 2\\) (base 10) and \\(\\log 100 = 3\\)."])  # \log: ln or log10
    assert c.failures == ["\\log 100 = 3"] and c.held == 1


def test_align_lines_continue_past_the_ampersand(pb):
    r"""math-468 step 4 (the human first error): \begin{align*} x^2 + x^3 + 2x^2 - 3x^2 + 3x - 6 &= x^3 + (x^2 -
    3x^2 + 2x^2) + 3x - 6 \\ &= x^3 + (-3x^2 + 2x^2) + 3x - 6 ... (an x^2 dropped): each '&=' line continues the
    line before it."""
    (c,) = check_solution([pb["math-468"]["steps"][4]])
    assert c.failures == ["x^3 + (x^2 - 3x^2 + 2x^2) + 3x - 6 = x^3 + (-3x^2 + 2x^2) + 3x - 6"]


def test_a_worded_function_value_fails(pb):
    r"""math-663 step 3 (the human first error, then the correct answer): 'we take the ceiling of
    \( \sqrt{60.8333} \), which is 7' (it is 8); math-860 (a correct solution): 'the cube root of 25 is
    approximately 2.924' holds."""
    (c,) = check_solution([pb["math-663"]["steps"][3]])
    assert c.failed == 1 and "60.8333" in c.failures[0]
    (c,) = check_solution([pb["math-860"]["steps"][0]])
    assert c.failed == 0 and c.held >= 1


def test_plus_minus_on_both_sides_is_two_claims(pb):
    r"""math-21 step 3: x = \frac{-(-53) \pm \sqrt{(-53)^2 - 4(4)(221)}}{2(4)} = \frac{53 \pm \sqrt{169}}{8}
    fails (the discriminant is -727); math-908 step 1 (a correct solution): \frac{-6 \pm \sqrt{42068}}{2} =
    \frac{-6 \pm 205.1}{2} holds (a rounded input); a side with \pm beside one without is not parsed."""
    (c,) = check_solution([pb["math-21"]["steps"][3]])
    assert c.failures == ["\\frac{-(-53) \\pm \\sqrt{(-53)^2 - 4(4)(221)}}{2(4)} = \\frac{53 \\pm \\sqrt{169}}{8}"]
    (c,) = check_solution([pb["math-908"]["steps"][1]])
    assert c.failed == 0
    (c,) = check_solution(["\\(\\frac{53 \\pm 13}{8} = 5\\)"])
    assert (c.held, c.failed, c.not_parsed) == (0, 0, 1)


def test_points_lists_and_factorials_of_groups(pb):
    r"""math-291 step 1: the midpoint (\frac{5+7}{2},\frac{3+4}{2}) = (6, \frac{7}{2}) holds entry by entry;
    math-293 step 0: (2 \cdot 1994, 2 \cdot 1994) = (3998, 3998) fails (3988); math-408 step 0: the list 1^2 =
    1, 2^2 = 4, ... holds claim by claim; math-100 step 1 (the human first error): \frac{13!}{4!(13-4)!} is read
    and the wrong cancellation after it fails."""
    (c,) = check_solution([pb["math-291"]["steps"][1]])
    assert (c.held, c.failed) == (1, 0)
    (c,) = check_solution([pb["math-293"]["steps"][0]])
    assert c.failures == ["(2 \\cdot 1994, 2 \\cdot 1994) = (3998, 3998)"]
    (c,) = check_solution([pb["math-408"]["steps"][0]])
    assert c.failed == 0 and c.held >= 10
    assert to_expression("\\frac{13!}{4!(13-4)!}") == "((factorial(13))/(factorial(4)*factorial(13-4)))"
    (c,) = check_solution([pb["math-100"]["steps"][1]])
    assert c.failed >= 1 and c.held >= 3
