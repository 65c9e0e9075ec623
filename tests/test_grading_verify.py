"""math-verify answer checking: bug-report cases, the process pool, and agreement on real data."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version

import pytest
from conftest import DATA
from math_verify import parse, verify

from stepkit.errors import ConfigError
from stepkit.grading.answers import extract_final_answer, extract_gsm8k_reference, strip_calculator_annotations
from stepkit.grading.verify import (
    EXACT_DIGITS,
    FLOAT_ROUNDING,
    AnswerChecker,
    checker_settings,
    gold_problem,
    grade_text,
    verify_answer,
    whole_answer,
    wrap_answer,
)

GENERATORS = ["6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification"]


def test_unwrapped_gold_is_wrapped_before_parsing(cases, checker):
    pairs = [(p["gold"], p["pred"]) for p in cases["mv-unwrapped-gold-truncated"]["input"]["pairs"]]
    # The mechanism: math-verify parses bare gold LaTeX only up to a simple number, so it accepts.
    raw = [verify(parse(g, parsing_timeout=None), parse(p, parsing_timeout=None), timeout_seconds=None)
           for g, p in pairs]
    assert raw == [True, True, True]
    assert cases["mv-unwrapped-gold-truncated"]["expected"]["all_pairs"] is False
    assert checker.check_many(pairs) == [False, False, False]
    assert [verify_answer(g, p) for g, p in pairs] == [False, False, False]
    # ...while the right answers still verify.
    assert checker.check_many([("1 - \\sqrt{2}", "1-\\sqrt2"), ("1331 and 1728", "1331, 1728"),
                               ("3*x-1*y+13=0", "3x - y + 13 = 0")]) == [True, True, True]


def test_wrap_answer():
    assert wrap_answer("1 - \\sqrt{2}") == "\\boxed{1 - \\sqrt{2}}"
    assert wrap_answer("\\$32,\\!348") == "\\boxed{\\$32,\\!348}"  # escaped dollar is not math mode
    assert wrap_answer("$1$") == "$1$"
    assert wrap_answer("\\boxed{3}") == "\\boxed{3}"


@pytest.mark.parametrize(
    "gold",
    [
        "$1$ - \\sqrt{2}", "\\boxed{1} - \\sqrt{2}", "$\\frac{1}{2}$ or 3", "", "  ", "}", "{1", "\\boxed{",
        # The matched text is normalized (not a substring of the gold), and no digit is lost.
        "$x$ + y", "$\\frac12$ + \\sqrt{2}", "\\(x\\) + y", "$$x$$ + y", "\\fbox{x} + y", "$1$ + $2$",
    ],
)
def test_gold_parsed_from_a_strict_subset_is_a_config_error(gold):
    with pytest.raises(ConfigError, match="gold answer"):
        verify_answer(gold, "1")
    assert gold_problem(gold).startswith("gold answer")


def test_gold_pairs_reported_by_the_tester():
    for gold, pred in [("$x$ + y", "x"), ("$\\frac12$ + \\sqrt{2}", "1/2")]:
        with pytest.raises(ConfigError, match="mixes"):
            verify_answer(gold, pred)


@pytest.mark.parametrize(
    "answer, whole, mixed",
    [
        ("$\\frac12$", "\\frac12", False),
        ("$$x+1$$", "x+1", False),
        ("\\(4\\)", "4", False),
        ("\\[4\\]", "4", False),
        ("\\boxed{\\boxed{3}}", "3", False),
        ("$\\boxed{3}$", "3", False),
        ("$18", "18", False),  # currency sign
        ("\\$32,\\!348", "\\$32,\\!348", False),  # escaped dollar is text
        ("\\boxed{1} + \\boxed{2}", "{1} + {2}", True),
        ("$1$ - \\sqrt{2}", "1 - \\sqrt{2}", True),
        ("\\(4\\) - \\sqrt{2}", "4 - \\sqrt{2}", True),
    ],
)
def test_whole_answer(answer, whole, mixed):
    assert whole_answer(answer) == (whole, mixed)


@pytest.mark.parametrize(
    "gold, pred",
    [
        # math-verify would parse only the delimited piece "1" / "4" / "x" / "1/2": compared whole instead.
        ("1", "$1$ - \\sqrt{2}"),
        ("1", "\\boxed{1} - \\sqrt{2}"),
        ("4", "\\(4\\) - \\sqrt{2}"),
        ("4", "\\[4\\] - \\sqrt{2}"),
        ("x", "$x$ + y"),
        ("\\frac{1}{2}", "$\\frac12$ + \\sqrt{2}"),
        ("18", "$18$, not $20$"),
        ("20", "$18$, not $20$"),
        # math-verify's plain-number fallback would take the last number "18" of unparseable LaTeX.
        ("18", "7 (since 9 * 2 = 18)"),
        ("18", "\\boxed{7 (since 9 * 2 = 18)}"),
        ("18", "18}"),
        ("18", "{18"),
    ],
)
def test_prediction_parsed_only_in_part_is_false(gold, pred):
    assert verify_answer(gold, pred) is False


@pytest.mark.parametrize(
    "gold, pred",
    [
        ("1 - \\sqrt{2}", "$1$ - \\sqrt{2}"),
        ("4 - \\sqrt{2}", "\\(4\\) - \\sqrt{2}"),
        ("x + y", "$x$ + y"),
        ("18", "$18"),
        ("18", "$18$"),
        ("18", "\\boxed{18}"),
        ("18", "18 \\text{ dollars}"),
        ("18", "9 \\cdot 2 = 18"),
        ("18", "x = 18"),
        ("\\frac{1}{2}", "\\dfrac12"),
        ("1331 and 1728", "1331, 1728"),
    ],
)
def test_whole_predictions_still_verify(gold, pred):
    assert verify_answer(gold, pred) is True


@pytest.mark.parametrize(
    "text, gold",
    [
        ("The answer is $1$ - \\sqrt{2}.", "1"),
        ("The answer is $18$, not $20$.", "20"),
        ("The answer is \\(4\\) - \\sqrt{2}.", "4"),
        ("The answer is 20 because 2+16=18.", "18"),
        ("The answer is 20, since 2+16=18.", "18"),
        ("The answer is 7 (since 9 * 2 = 18).", "18"),
        ("The answer is 7 as 9 * 2 = 18.", "18"),
    ],
)
def test_tester_false_positives_end_to_end(checker, text, gold):
    assert grade_text(checker, gold, text)[1] is False


@pytest.mark.parametrize(
    "text",
    [
        "The answer is **18**.", "**The answer is 18.**", "The answer is 18 (dollars).", "Answer: 18",
        "Final answer: 18", "**Final Answer:** 18", "The final answer is $\\boxed{18}$.", "#### 18", "A: 18",
    ],
)
def test_answer_forms_end_to_end(checker, text):
    assert grade_text(checker, "18", text) == ("18", True)


@pytest.mark.parametrize(
    "gold, pred, expected",
    [
        # float64 prints: the comparison is never finer than 15 significant digits.
        ("\\frac{2}{3}", "0.6666666666666666", True),
        ("2/3", "0.6666666666666666", True),
        ("\\sqrt{2}", "1.4142135623730951", True),
        ("\\frac{1}{7}", "0.14285714285714285", True),
        ("\\frac{100}{3}", "33.333333333333336", True),
        ("\\pi", "3.141592653589793", True),
        ("18", "18.000000000000004", True),
        ("\\frac{2}{3}", "0.6666666666666", False),  # 13 places written: must equal 2/3 rounded to 13
        # rounded to the places written (at least 6)
        ("\\frac{1}{3}", "0.333333", True),
        ("1/3", "0.333333", True),
        ("\\frac{2}{3}", "0.666667", True),
        ("\\frac{2}{3}", "0.666666", False),
        ("\\frac{1}{3}", "0.3333333333", True),
        ("\\frac{1}{3}", "0.33", False),
        ("0.33", "\\frac{1}{3}", False),
        ("0.1", "0.15", False),
        ("0.0000001", "0.0000002", False),
        ("0.0000001", "0.0000001", True),
        ("1000000", "1000000.0000001", False),
        ("0.5", "\\frac{1}{2}", True),
        ("2.5", "\\frac{5}{2}", True),
        ("\\$18.90", "18.9", True),
        ("50\\%", "50", True),  # percentages are left to math-verify
    ],
)
def test_float_rounding_rule(gold, pred, expected):
    assert verify_answer(gold, pred) is expected


def test_gold_normalized_by_math_verify_is_accepted():
    # Normalization is not truncation: 2.5 -> 5/2, \frac12 -> \frac{1}{2}, units dropped from MATH answers.
    assert verify_answer("2.5", "\\frac{5}{2}")
    assert verify_answer("\\frac12", "0.5")
    assert verify_answer("864 \\mbox{ inches}^2", "864")


def test_config_error_crosses_the_process_pool(checker):
    with pytest.raises(ConfigError, match=r"\$1\$ - "):
        checker.check("$1$ - \\sqrt{2}", "1")
    assert checker.check("7", "7")  # the checker still works afterwards


def test_float_rounding_pinned(cases):
    case = cases["mv-float-rounding-false-positive"]
    gold, pred = case["input"]["gold"], case["input"]["pred"]
    # math-verify's default (6 places) calls these equal ...
    assert verify(parse(f"${gold}$", parsing_timeout=None), parse(f"${pred}$", parsing_timeout=None),
                  timeout_seconds=None)
    # ... stepkit rounds to max(FLOAT_ROUNDING=6, decimals written in gold or pred) = 7 places here,
    # so they differ, while 1/3 still matches its 6-place decimal and a 2-place one is still wrong.
    assert FLOAT_ROUNDING == 6
    assert verify_answer(gold, pred) is case["expected"]["verify"] is False
    assert verify_answer("\\frac{1}{3}", "0.333333")
    assert verify_answer("\\frac{1}{3}", "0.3333333333")
    assert not verify_answer("\\frac{1}{3}", "0.33")
    assert not verify_answer("\\frac{2}{3}", "0.6666666")  # truncated, not rounded, at 7 places


def test_signal_timeouts_off_in_threads(cases, checker):
    case = cases["mv-signal-timeout-in-threads"]
    gold, text = case["input"]["gold"], case["input"]["pred"]
    with ThreadPoolExecutor(2) as pool:
        graded = pool.submit(grade_text, checker, gold, text).result()
        in_process = pool.submit(verify_answer, gold, extract_final_answer(text)).result()
    assert graded == ("\\frac{1}{3}", case["expected"]["verify"])
    assert in_process is case["expected"]["verify"]
    out = []
    thread = threading.Thread(target=lambda: out.append(checker.check(gold, "0.333333")))
    thread.start()
    thread.join()
    assert out == [True]


def test_timeout_kills_and_rebuilds_pool():
    # Expanding two 10000th powers keeps sympy busy far longer than a second.
    slow = ("(x+1)^{10000}", "(x+2)^{10000}")
    with AnswerChecker(timeout=1.0, workers=2) as c:
        assert c._pool is None  # lazy
        assert c.check_many([("1", None)]) == [False] and c._pool is None
        assert c.check_many([slow, ("2", "2"), ("3", "4")]) == [False, True, False]
        assert c.timeouts == 1
        assert c._pool is None or c._pool._mp_context.get_start_method() == "spawn"
        assert c.check_many([("5", "5"), slow]) == [True, False]  # rebuilt pool; slow pair memoized
        assert c._pool._mp_context.get_start_method() == "spawn"
        assert c.timeouts == 1


def test_memoized_and_ordered(checker):
    pairs = [("18", "18"), ("18", "17"), ("18", "18"), ("18", None), ("\\frac{1}{2}", "0.5")]
    assert checker.check_many(pairs) == [True, False, True, False, True]
    assert ("18", "18") in checker._cache


def test_settings_recorded():
    s = checker_settings()
    assert s["math_verify_version"] == version("math-verify")
    assert (s["float_rounding"], s["numeric_precision"], s["strict"]) == (6, 15, True)
    assert "0.5 * 10^-d" in s["float_rounding_rule"] and "numeric_precision" in s["float_rounding_rule"]
    assert "whole" in s["whole_answer_rule"]
    assert "exactly" in s["exact_rule"] and str(EXACT_DIGITS) in s["exact_rule"]
    c = AnswerChecker(timeout=2.0, workers=1)
    assert c.settings() == {**s, "timeout_s": 2.0, "workers": 1}
    with pytest.raises(ConfigError):
        AnswerChecker(timeout=0)


def test_gsm8k_gpt3_flags_reproduced(checker):
    """Extract `A: N` + check reproduces the dataset's is_correct for all 1319 problems x 4 generators.

    Measured with math-verify 0.9.0: 5276/5276 (11 solutions have no answer line and are incorrect).
    """
    solutions = [json.loads(line) for line in open(DATA / "gsm8k" / "example_model_solutions.jsonl")]
    refs = [extract_gsm8k_reference(json.loads(line)["answer"]) for line in open(DATA / "gsm8k" / "test.jsonl")]
    rows = [(i, gen, row[gen]) for i, row in enumerate(solutions) for gen in GENERATORS]
    preds = [extract_final_answer(strip_calculator_annotations(g["solution"])) for _, _, g in rows]
    got = checker.check_many([(refs[i], p) for (i, _, _), p in zip(rows, preds)])
    mismatches = [(i, gen, refs[i], p) for (i, gen, g), p, a in zip(rows, preds, got) if a != g["is_correct"]]
    assert len(rows) == 5276 and not mismatches


def test_math500_boxed_solutions_verify(checker):
    """The boxed answer of each MATH-500 reference solution verifies against its `answer` field.

    Measured with math-verify 0.9.0: 500/500; the floor leaves room for a math-verify upgrade.
    """
    rows = [json.loads(line) for line in open(DATA / "math500" / "test.jsonl")]
    pairs = [(r["answer"], extract_final_answer(r["solution"])) for r in rows]
    got = checker.check_many(pairs)
    failed = [p for p, ok in zip(pairs, got) if not ok]
    assert len(rows) - len(failed) >= 498, failed


def test_gold_problems_before_generation(checker):
    golds = ["18", "}", "   ", "", "$1$ - \\sqrt{2}", "\\frac{1}{2}", "{1", "18"]
    problems = checker.gold_problems(golds)
    assert set(problems) == set(golds)
    assert problems["18"] is None and problems["\\frac{1}{2}"] is None
    for bad in ["}", "   ", "", "$1$ - \\sqrt{2}", "{1"]:
        assert problems[bad] and "\n" not in problems[bad], bad
    assert "mixes" in problems["$1$ - \\sqrt{2}"]
    assert "}" in checker._gold_cache  # memoized
    with pytest.raises(ConfigError, match="unbalanced"):  # check_many still raises on a bad gold
        checker.check_many([("18", "18"), ("}", "1")])
    assert checker.check("18", "18")


def test_gold_problems_timeout_is_reported_not_raised():
    """gold_problems runs on the pool machinery; a gold whose check runs past the timeout gets a reason."""
    with AnswerChecker(timeout=1.0, workers=1) as c:
        cache: dict = {}
        c._run(["slow", "fast"], lambda pool, key: pool.submit(time.sleep, 30 if key == "slow" else 0), cache,
               timed_out="took too long", crashed="crashed")
        assert cache == {"slow": "took too long", "fast": None}
        assert c.timeouts == 1
        assert c.gold_problems(["7"]) == {"7": None}  # rebuilt pool


def test_real_golds_are_usable(checker):
    golds = [json.loads(line)["answer"] for line in open(DATA / "math500" / "test.jsonl")]
    golds += [extract_gsm8k_reference(json.loads(line)["answer"]) for line in open(DATA / "gsm8k" / "test.jsonl")]
    assert {g: p for g, p in checker.gold_problems(golds).items() if p} == {}


# Exact numbers (no decimal written) compare exactly: never by rounding or chopping both to a fixed number
# of places. math-verify evaluates a difference of unevaluated exact values at numeric_precision (15)
# digits with chop=True, which sets anything below ~1e-15 to 0, so 1/2^60 "equalled" 1/2^61.
TINY_DIFFERENT = [
    ("\\frac{1}{2^{60}}", "\\frac{1}{2^{61}}"),
    ("2^{-60}", "2^{-61}"),
    ("\\frac{1}{20!}", "\\frac{1}{21!}"),
    ("\\frac{1}{100!}", "\\frac{1}{101!}"),
    ("\\frac{3}{10^{40}}", "\\frac{4}{10^{40}}"),
    ("\\sqrt{2} \\cdot 10^{-16}", "\\sqrt{3} \\cdot 10^{-16}"),
    ("e^{-40}", "e^{-41}"),
    ("\\frac{\\pi}{10^{20}}", "\\frac{\\pi}{10^{21}}"),
    ("\\frac{1}{2^{60}}", "\\frac{1}{2^{60}} + \\frac{1}{2^{200}}"),
    # inside tuples, intervals, sets, relations and expressions, where math-verify compares element-wise
    ("(\\frac{1}{2^{60}}, 1)", "(\\frac{1}{2^{61}}, 1)"),
    ("[0, \\frac{1}{2^{60}}]", "[0, \\frac{1}{2^{61}}]"),
    ("\\{\\frac{1}{20!}\\}", "\\{\\frac{1}{21!}\\}"),
    ("x = \\frac{1}{2^{60}}", "x = \\frac{1}{2^{61}}"),
    ("x^2 + \\frac{1}{2^{60}}", "x^2 + \\frac{1}{2^{61}}"),
]
HUGE_DIFFERENT = [
    ("2^{100}", "2^{100}+1"),
    ("2^{100}", "1267650600228229401496703205377"),
    ("2^{1000}", "2^{1000}+1"),
    ("100!", "100!+1"),
    ("10^{20}\\sqrt{2}", "10^{20}\\sqrt{2}+1"),
    ("(2^{100}, 1)", "(2^{100}+1, 1)"),
    ("x = 2^{100}", "x = 2^{100}+1"),
    ("\\frac{2^{1000}+1}{2^{1000}}", "1"),
]
EXACT_EQUAL = [
    ("\\frac{1}{2^{60}}", "2^{-60}"),
    ("\\frac{1}{20!}", "\\frac{1}{2432902008176640000}"),
    ("\\frac{\\sqrt{2}}{2^{60}}", "\\frac{1}{\\sqrt{2} \\cdot 2^{59}}"),
    ("e^{-40}", "\\frac{1}{e^{40}}"),
    ("2^{100}", "1267650600228229401496703205376"),
    ("20!", "2432902008176640000"),
    ("\\binom{100}{50}", "100891344545564193334812497256"),
    ("2^{1000}", "2 \\cdot 2^{999}"),
    ("\\sqrt{2}+\\sqrt{3}", "\\sqrt{5+2\\sqrt{6}}"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("(\\frac{1}{2^{60}}, 1)", "(2^{-60}, 1)"),
    ("x = \\frac{1}{2^{60}}", "x = 2^{-60}"),
]


@pytest.mark.parametrize("gold, pred", TINY_DIFFERENT + HUGE_DIFFERENT)
def test_different_exact_values_are_not_equivalent(gold, pred):
    assert verify_answer(gold, pred) is False
    assert verify_answer(pred, gold) is False


@pytest.mark.parametrize("gold, pred", EXACT_EQUAL)
def test_equal_exact_values_are_equivalent(gold, pred):
    assert verify_answer(gold, pred) is True
    assert verify_answer(pred, gold) is True


def test_exact_values_compare_exactly_in_the_pool(checker):
    pairs = TINY_DIFFERENT[:3] + HUGE_DIFFERENT[:2] + EXACT_EQUAL[:3]
    assert checker.check_many(pairs) == [False] * 5 + [True] * 3


def test_math_verify_chops_tiny_differences_stepkit_does_not():
    """The mechanism, pinned: math-verify's own numeric comparison calls 1/2^60 and 1/2^61 equal."""
    from stepkit.grading import equivalence as v

    a, b = (parse(f"\\boxed{{{s}}}", parsing_timeout=None)[0] for s in TINY_DIFFERENT[0])
    assert v._MATH_VERIFY_NUMERIC_EQ(a, b, 6, 15) is True
    assert v._exact_numeric_eq(a, b, 6, 15) is False


@pytest.mark.parametrize(
    "gold, pred, expected",
    [
        # A decimal keeps the rounding rule, at the places it is written to; in m \times 10^{-k} those are
        # the places of m plus k, so a tiny decimal is compared at its own scale, not at 6 places.
        ("\\frac{1}{2^{60}}", "8.67 \\times 10^{-19}", True),  # 8.6736...e-19 rounded to 3 figures
        ("\\frac{1}{2^{60}}", "8.68 \\times 10^{-19}", False),
        ("\\frac{1}{2^{60}}", "8.673617379884035 \\times 10^{-19}", True),
        ("\\frac{1}{2^{60}}", "1.0 \\times 10^{-30}", False),
        ("3 \\cdot 10^{-20}", "2.5 \\cdot 10^{-20}", False),
        ("2.5 \\cdot 10^{-20}", "\\frac{1}{4 \\cdot 10^{19}}", True),
        ("\\frac{1}{2^{60}}", "8.67E-19", True),
        ("\\frac{1}{2^{60}}", "1.0E-30", False),
        ("(\\frac{1}{2^{60}}, 1)", "(1.0 \\times 10^{-30}, 1)", False),
        ("x = \\frac{1}{2^{60}}", "x = 1.0 \\times 10^{-30}", False),
        # plain decimals: today's rule (the value rounded to max(6, places written) places) ...
        ("\\frac{1}{2^{30}}", "0.0000000009", True),
        ("\\frac{1}{2^{30}}", "0.0000000010", False),
        ("\\frac{1}{2^{60}}", "0.000000", True),
        ("\\frac{1}{3}", "0.333333", True),
        ("\\frac{\\sqrt{2}}{10^{3}}", "0.001414214", True),
        # ... never finer than 15 significant digits (a float64 print), so huge decimals match their value
        ("2^{100}", "1267650600228229401496703205376.0", True),
        ("2^{100}", "1267650600228229401496703205377.0", True),
        ("2^{100}", "1267650600228230000000000000000.0", True),  # 2^100 to 15 figures
        ("2^{100}", "1267650600228200000000000000000.0", False),
        ("0.5 \\pi", "\\frac{\\pi}{2}", True),
    ],
)
def test_mixed_exact_and_decimal_values(gold, pred, expected):
    assert verify_answer(gold, pred) is expected


def test_a_check_asked_before_close_does_not_start_a_new_pool():
    """A run stopped by Ctrl-C closes its checker while worker threads still wait to check the last answers
    (``acheck_many`` from the stopped chunks): such a check raises instead of starting a pool of worker
    processes that nothing would close (a breaking helper saw 2 processes alive 10 s after the run)."""
    from stepkit.errors import StepkitError

    checker = AnswerChecker(workers=1)
    assert checker.check_many([("1", "1")]) == [True]  # the pool is up
    got: list = []
    checker._lock.acquire()  # another batch is being checked: the next one waits for the lock

    def waiting() -> None:
        try:
            got.append(checker.check_many([("2", "3")]))
        except StepkitError as e:
            got.append(e)

    t = threading.Thread(target=waiting)
    t.start()
    checker.close()  # the run stops
    checker._lock.release()
    t.join(30)
    assert isinstance(got[0], StepkitError) and "closed" in str(got[0])
    assert checker._pool is None
    assert checker.check_many([("2", "2")]) == [True]  # asked for after close: a new pool, as before
    checker.close()
