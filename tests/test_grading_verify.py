"""math-verify answer checking: bug-report cases, the process pool, and agreement on real data."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version

import pytest
from conftest import DATA
from math_verify import parse, verify

from stepkit.errors import ConfigError
from stepkit.grading.answers import extract_final_answer, extract_gsm8k_reference, strip_calculator_annotations
from stepkit.grading.verify import (
    FLOAT_ROUNDING,
    AnswerChecker,
    checker_settings,
    grade_text,
    verify_answer,
    wrap_answer,
)


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


@pytest.mark.parametrize("gold", ["$1$ - \\sqrt{2}", "\\boxed{1} - \\sqrt{2}", "$\\frac{1}{2}$ or 3", "", "  "])
def test_gold_parsed_from_a_strict_subset_is_a_config_error(gold):
    with pytest.raises(ConfigError, match="gold answer"):
        verify_answer(gold, "1")


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
    c = AnswerChecker(timeout=2.0, workers=1)
    assert c.settings() == {**s, "timeout_s": 2.0, "workers": 1}
    with pytest.raises(ConfigError):
        AnswerChecker(timeout=0)


def test_gsm8k_gpt3_flags_reproduced(checker):
    """Extract `A: N` + check reproduces the dataset's is_correct on the first 200 problems.

    Measured with math-verify 0.9.0: 200/200 for 175b_verification (and 1319/1319 for each generator).
    """
    solutions = [json.loads(line) for line in open(DATA / "gsm8k" / "example_model_solutions.jsonl")][:200]
    refs = [extract_gsm8k_reference(json.loads(line)["answer"]) for line in open(DATA / "gsm8k" / "test.jsonl")]
    gen = [row["175b_verification"] for row in solutions]
    preds = [extract_final_answer(strip_calculator_annotations(g["solution"])) for g in gen]
    got = checker.check_many(list(zip(refs, preds)))
    mismatches = [(i, refs[i], preds[i]) for i, (a, g) in enumerate(zip(got, gen)) if a != g["is_correct"]]
    assert not mismatches


def test_math500_boxed_solutions_verify(checker):
    """The boxed answer of each MATH-500 reference solution verifies against its `answer` field.

    Measured with math-verify 0.9.0: 500/500; the floor leaves room for a math-verify upgrade.
    """
    rows = [json.loads(line) for line in open(DATA / "math500" / "test.jsonl")]
    pairs = [(r["answer"], extract_final_answer(r["solution"])) for r in rows]
    got = checker.check_many(pairs)
    failed = [p for p, ok in zip(pairs, got) if not ok]
    assert len(rows) - len(failed) >= 498, failed
