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
    text = step(pb_math, "math-15", 1)  # x^2 - 3x = 1 and (x - 1)(x - 3) = 0: conditions on an unknown x
    (c,) = check_solution([text])
    assert c.failed == 0 and c.held == 0 and c.not_parsed == 2


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
    ("f(2) + 1", None),   # a function application: its definition is unknown here
    ("AB^2", None),       # a segment, not A * B^2
    ("1 \\pm \\sqrt{19}", None),
    ("\\sin 30^\\circ", None),  # degrees inside a trigonometric function
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
