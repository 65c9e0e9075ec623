"""stepkit check-steps: claims read from real ProcessBench / MATH-500 steps, checked with sympy (a true chain
holds, a wrong fraction fails, an undefined variable is not parsed), the combination rule, and the CLI on
real ProcessBench math rows (eval, filter consensus, stats, show)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from stepkit.grading.claims import Relation, extract, to_expression
from stepkit.grading.stepcheck import check_solution
from stepkit.stages.check_steps import CheckStepsConfig, combine
from tests.conftest import DATA
from tests.conftest import run_cli as run


@pytest.fixture(scope="module")
def pb_math() -> dict:
    with open(DATA / "processbench" / "math.json") as f:
        return {r["id"]: r for r in json.load(f)}


def step(pb_math, row: str, s: int) -> str:
    return pb_math[row]["steps"][s]


def test_a_true_chain_holds(pb_math):
    text = step(pb_math, "math-519", 3)  # \text{LCM} = 2^2 \times 3^2 \times 5 = 4 \times 9 \times 5 = 36 \times 5 = 180
    items, _ = extract(text)
    rels = [r for r in items if isinstance(r, Relation)]
    assert [r.link for r in rels] == ["first", "later", "later", "later"]
    assert rels[0].lhs is None  # a word (\text{LCM}) is not parsed, never a product of letters
    (c,) = check_solution([text])
    assert (c.held, c.failed, c.not_parsed) == (3, 0, 1)


def test_a_wrong_fraction_step_fails(pb_math):
    text = step(pb_math, "math-66", 1)  # \frac{(0-2)-(3-2)}{(0-4)-(5-2)} = \frac{-3-1}{-4-3}: -3/-7 is not -4/-7
    (c,) = check_solution([text])
    assert c.failed == 1 and c.held == 2
    assert c.failures == ["\\frac{(0-2)-(3-2)}{(0-4)-(5-2)} = \\frac{-3-1}{-4-3}"]


def test_an_undefined_variable_is_not_parsed_never_failed(pb_math):
    text = step(pb_math, "math-15", 1).split(". ")[0]  # x^2 - 3x = 1: a condition on an unknown x
    (c,) = check_solution([text])
    assert c.failed == 0 and c.held == 0 and c.not_parsed == 1
    (c,) = check_solution([step(pb_math, "math-195", 0)])  # x^2 = 10n + r: n, r defined nowhere
    assert c.failed == 0 and c.held == 0 and c.not_parsed == 1


# The kinds of miss found on the tuning (even sha256-parity) half of ProcessBench math, one real row each.

def test_an_equation_rewritten_with_other_roots_fails(pb_math):
    r"""math-15 step 1 (the human first error): x^2 - 3x = 1, 'factoring' to (x - 1)(x - 3) = 0, whose roots
    1 and 3 solve no earlier equation in x."""
    (c,) = check_solution([step(pb_math, "math-15", 1)])
    assert (c.held, c.failed, c.not_parsed) == (0, 1, 1) and c.failures == ["(x - 1)(x - 3) = 0"]


def test_a_term_moved_with_a_wrong_constant_fails(pb_math):
    r"""math-59 step 0 (the human first error): 12x^2 - 32x - 7 + 2\sqrt{..} = 9 'rearranged' to
    2\sqrt{..} = 16 - 12x^2 + 32x + 7 (the 7 counted twice); the correct rearrangements before it hold."""
    (c,) = check_solution([step(pb_math, "math-59", 0)])
    assert c.failures[0].startswith("2\\sqrt{(3x^2 - 8x + 1)(9x^2 - 24x - 8)} = 16 - 12x^2 + 32x + 7")
    assert c.held >= 1


def test_a_rewritten_linear_equation_in_a_case_is_checked_within_the_case(pb_math):
    r"""math-999 step 2 (the human first error): 'For n = 2, we have 6k - 2 = 2m. Simplifying gives 3k = m'
    (it is 3k - 1 = m): inside a case the equations of the case are compared."""
    (c,) = check_solution([step(pb_math, "math-999", 2)])
    assert c.failures == ["3k = m"]


def test_a_case_split_is_no_error(pb_math):
    r"""math-741 (a correct solution): x - 8 = 12 or x - 8 = -12 are two cases of (x - 8)^2 = 144, not an
    equation rewritten with another root."""
    steps = pb_math["math-741"]["steps"]
    checks = check_solution(steps, problem=pb_math["math-741"]["problem"])
    assert all(c.failed == 0 for c in checks)


def test_a_boxed_result_is_read(pb_math):
    r"""math-101 step 3 (the human first error): (3/2)^2 - 2(2) = \boxed{\frac{1}{4}} (it is -7/4)."""
    (c,) = check_solution([step(pb_math, "math-101", 3)])
    assert c.failed == 1 and "boxed" in c.failures[0]


def test_a_defined_function_is_evaluated(pb_math):
    r"""math-940 step 0 (the human first error): p(x) = x^6 + 3ax^5 + ... defined, then p(1) = 12a^2 + 12a + 12
    (it is a^3 + 6a^2 + 12a + 8) and p(-1) = 12a^2 - 12a + 12: evaluations of the definition, both false."""
    (c,) = check_solution([step(pb_math, "math-940", 0)])
    assert c.failures == ["p(1) = 12a^2 + 12a + 12", "p(-1) = 12a^2 - 12a + 12"]
    # a true evaluation holds; an application of an undefined function is not parsed
    (c,) = check_solution(["Let \\( f(x) = 12x + 7 \\). Then \\( f(15) = 187 \\) and \\( g(2) = 5 \\)."])
    assert (c.held, c.failed, c.not_parsed) == (1, 0, 1)


def test_a_name_restated_with_another_value_fails(pb_math):
    r"""math-143 step 1 (the human first error): step 0 found c = 2d; step 1 substitutes c = \frac{1}{2}d."""
    steps = pb_math["math-143"]["steps"][:2]
    checks = check_solution(steps)
    assert checks[0].failed == 0 and checks[1].failures[0] == "c = \\frac{1}{2}d"


def test_a_rounded_value_is_not_checked_against_its_equation(pb_math):
    r"""math-908 step 1 (a correct solution): y = \frac{199.1}{2} approximates a root of y^2 + 6y - 10508 = 0."""
    (c,) = check_solution([step(pb_math, "math-908", 1)])
    assert c.failed == 0


def test_substitution_uses_earlier_definitions_and_a_wrong_evaluation_fails(pb_math):
    text = step(pb_math, "math-8", 2)  # a_3 = 1, ...; n = 1 \cdot 3^3 + ... = 81 + 18 + 6 + 2 = 107 (1 * 27 is 27)
    (c,) = check_solution([text])
    assert c.failed == 1 and "81 + 18 + 6 + 2" in c.failures[0]
    # the definitions a_3 = 1 ... are no claims, and carry to the later links of a later step's chains
    checks = check_solution([text, "So \\( s = a_3 + a_2 = 3 \\) and \\( t = a_3 + a_2 = 4 \\)."])
    assert (checks[1].held, checks[1].failed) == (1, 1)
    # a first link with symbols is a new condition, never a claim about earlier values
    checks = check_solution([text, "Suppose \\( a_3 + a_2 = 4 \\)."])
    assert (checks[1].held, checks[1].failed, checks[1].not_parsed) == (0, 0, 1)


def test_division_with_remainder_and_integer_quotients(pb_math):
    (c,) = check_solution([step(pb_math, "math-3", 1)])  # 1529 ÷ 6 = 255 with a remainder of 4 (6 * 254 + 5)
    assert c.failed == 1 and "remainder of 4" in c.failures[0]
    (c,) = check_solution(["Then \\( 2863 \\div 1344 = 2 \\) with some left over."])  # an integer quotient
    assert c.failed == 0 and c.held == 1


def test_a_math500_reference_solution_holds():
    with open(DATA / "math500" / "test.jsonl") as f:
        first = json.loads(f.readline())
    (c,) = check_solution([first["solution"]])  # r = \sqrt{0^2 + 3^2} = 3
    assert c.failed == 0 and c.held >= 1


@pytest.mark.parametrize("latex, expr", [
    ("\\frac{15}{2} \\cdot \\frac{5}{6}", "((15)/(2))*((5)/(6))"),
    ("2\\frac{6}{7}", "(2+6/7)"),
    ("0.75x", "(75/100)*x"),
    ("\\sqrt[3]{8}", "((8)**(1/(3)))"),
    ("f(2) + 1", "f(2)+1"),   # a function application: put in by the checker when f is defined
    ("AB^2", None),       # a segment, not A * B^2
    ("1 \\pm \\sqrt{19}", None),
    ("\\sin 30^\\circ", "sin((30*((pi)/(180))))"),  # degrees inside a trigonometric function: radians
    ("\\binom{6}{3}", "binomial((6),(3))"),
    ("\\left| \\frac{\\sqrt{7}}{2} \\right|", "abs(((sqrt(7))/(2)))"),
    ("|11 - (-5)|", "abs(11-(-5))"),
    ("\\log_2 256", "(log(256)/log(2))"),
    ("\\log_2 x^3", None),     # log(x^3) or (log x)^3: not read
    ("\\boxed{-8}", "(-8)"),
])
def test_to_expression(latex, expr):
    assert to_expression(latex) == expr


def test_combination_rule():
    cfg = CheckStepsConfig()
    assert combine(2, 5, True, 1, cfg) == (2, "claim")      # a failed claim first, whatever the outcome
    assert combine(-1, 5, False, 1, cfg) == (1, "clue")     # else the clue first error
    assert combine(-1, 5, False, None, cfg) == (1, "outcome")  # else an incorrect outcome's second step
    assert combine(-1, 1, False, None, cfg) == (0, "outcome")  # (clipped to the steps)
    assert combine(-1, 5, None, None, cfg) == (-1, "none")
    assert combine(-1, 5, False, None, CheckStepsConfig(incorrect_step=-1)) == (4, "outcome")


def test_cli_on_real_processbench_math_rows(tmp_path):
    pb, out = tmp_path / "pb.parquet", tmp_path / "checked.parquet"
    run("ingest", "processbench", DATA / "processbench" / "math.json", pb, "--limit", 9)
    run("check-steps", pb, out, "--no-progress")
    rows = {r["id"]: r for r in pq.read_table(out).to_pylist()}
    for r in rows.values():
        for col in ("check_claims", "check_held", "check_failed", "check_not_parsed", "check_score", "check_label"):
            assert len(r[col]) == len(r["steps"])
        assert r["check_status"] in ("failed", "held", "nothing_checkable")
        assert all(c == h + f for c, h, f in zip(r["check_claims"], r["check_held"], r["check_failed"]))
    # math-4: 6 * 518400 = 3104400 at step 2 (the human label), the outcome being incorrect
    assert rows["math-4"]["check_first_failed"] == 2 and rows["math-4"]["check_first_error_source"] == "claim"
    assert rows["math-3"]["check_first_error"] == 1 and rows["math-3"]["check_status"] == "failed"
    meta = pq.read_schema(out).field("check_status").metadata
    assert b"nothing_checkable" in meta[b"stepkit"]
    ev = run("eval", "processbench", out, "--pred", "check_first_error")
    assert "F1" in ev.stdout or "f1" in ev.stdout.lower()
    kept = tmp_path / "kept.parquet"
    run("filter", out, kept, "--rule", "consensus:check_first_error,reference_first_error",
        "--dropped", tmp_path / "dropped.parquet")
    agree = [r for r in rows.values() if r["check_first_error"] == r["reference_first_error"]]
    assert pq.read_table(kept).num_rows == len(agree) >= 2
    assert "check-steps" in run("stats", out).stdout
    sh = run("show", out, "--index", 4)  # math-4
    assert "false claim" in sh.stdout and "3104400" in sh.stdout


def test_the_exact_chance_test_of_the_benchmark():
    """bench/check_steps_processbench.py's P value: the exact upper tail of a sum of independent Bernoulli
    (the outcome + random-step floor), checked against enumeration and the binomial law."""
    import importlib.util
    import itertools
    import math

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("bench_check", ROOT / "bench" / "check_steps_processbench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    probs = [1 / 3, 1 / 5, 1 / 2, 1 / 7]
    for k in range(6):
        brute = sum(math.prod(p if x else 1 - p for p, x in zip(probs, xs))
                    for xs in itertools.product((0, 1), repeat=4) if sum(xs) >= k)
        assert bench.upper_tail(probs, k) == pytest.approx(brute, abs=1e-12)
    assert bench.upper_tail([0.25] * 10, 4) == pytest.approx(
        sum(math.comb(10, j) * 0.25 ** j * 0.75 ** (10 - j) for j in range(4, 11)))
    assert bench.half_of("math-0") in ("tune", "heldout")


def test_two_expressions_the_prose_equates_are_checked(pb_math):
    r"""math-175 step 5 (the human first error): '\(4(x^2 + \frac{1}{2}x + \frac{1}{16})\) equals
    \((2x + \frac{1}{4})^2\)' (the square is 4x^2 + x + 1/16); math-691 step 2 (a correct solution): '\(4\)
    divided by \(\frac{4}{9}\) equals \(9\)' relates 9 to the whole phrase, not to 4/9: not read."""
    (c,) = check_solution([step(pb_math, "math-175", 5)])
    assert c.failures == ["4(x^2 + \\frac{1}{2}x + \\frac{1}{16}) = (2x + \\frac{1}{4})^2"]
    (c,) = check_solution([step(pb_math, "math-691", 2)])
    assert c.failed == 0


def test_a_reversed_plain_text_product_is_checked(pb_math):
    """math-375 step 5 (the human first error): 'the GCD of 187 and 77 is 13 because 187 = 13 * 14 and
    77 = 13 * 5 + 2' (13 * 14 is 182, 13 * 5 + 2 is 67); '2 / 20 = 1 / 10' is one claim, not 20 = 1 / 10."""
    (c,) = check_solution([step(pb_math, "math-375", 5)])
    assert c.failures == ["GCD of 187 and 77 is 13", "187 = 13 * 14", "77 = 13 * 5 + 2"]  # (the gcd is 11)
    (c,) = check_solution(["Probability = 2 / 20 = 1 / 10."])
    assert c.failed == 0
    # gsm8k-304 step 2 and gsm8k-258 step 1 (correct): thousands separators and dollar amounts are not cut
    (c,) = check_solution(["Candles that can potentially explode = 1% of 50,000 = 0.01 * 50,000 = 500 candles"])
    assert c.failed == 0
    (c,) = check_solution(["Selling price = $1.60 + $0.40 = $2.00 per watermelon, so 25% of $1.60 = $0.40."])
    assert c.failed == 0
