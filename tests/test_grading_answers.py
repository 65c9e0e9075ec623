"""Final-answer extraction: patterns, bug-report cases, and the real GSM8K files."""

from __future__ import annotations

import json

import pytest
from conftest import DATA

from stepkit.grading.answers import extract_final_answer, extract_gsm8k_reference, strip_calculator_annotations
from stepkit.grading.verify import grade_text

GENERATORS = ["6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She makes 9 * 2 = 18 dollars.\n#### 18", "18"),
        ("#### 1,000", "1000"),
        ("Janet sells 9 eggs.\nA: 18", "18"),
        ("A: $1,250", "1250"),
        ("The answer is 2.5.", "2.5"),
        ("So x = 12. The answer is 12.", "12"),
        ("the final answer is: $\\frac{1}{3}$.", "\\frac{1}{3}"),
        ("THE ANSWER IS 7\nbut wait", "7"),
        ("The answer is 18 dollars.", "18"),
        ("The answer is 2 pi", "2 pi"),
        ("The answer is \\$36.", "36"),
        ("The answer is \\boxed{2}. I hope this helps!", "2"),
        ("so $x = \\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("\\fbox{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("The answer is 5. Check: \\boxed{6}", "6"),  # the last occurrence wins across patterns
        ("\\boxed{6}. So the answer is 5.", "5"),
        ("no answer here", None),
        ("The answer is", None),
        ("truncated \\boxed{3", None),
        ("", None),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


def test_multi_boxed_not_concatenated(cases, checker):
    case = cases["mv-multi-boxed-concatenation"]
    golds = [c["gold"] for c in case["input"]["cases"]]
    extracted = [extract_final_answer(c["pred"]) for c in case["input"]["cases"]]
    assert extracted == case["expected"]["extracted"]
    assert checker.check_many(list(zip(golds, extracted))) == case["expected"]["verify"]


def test_rollout_check_is_math_aware_not_substring(cases, checker):
    case = cases["omegaprm-substring-answer-check"]
    got = [grade_text(checker, c["expected_answer"], c["rollout"])[1] for c in case["input"]["cases"]]
    assert got == case["expected"]["correct"]
    assert got != case["expected"]["observed_with_substring_rule"]


def test_strip_calculator_annotations():
    assert strip_calculator_annotations("16 - 3 - 4 = <<16-3-4=9>>9 eggs, $<<9*2=18>>18") == "16 - 3 - 4 = 9 eggs, $18"


def test_extract_gsm8k_reference():
    assert extract_gsm8k_reference("It takes 2/2=<<2/2=1>>1 bolt\n#### 3") == "3"
    assert extract_gsm8k_reference("...\n#### 1,080") == "1080"
    with pytest.raises(ValueError):
        extract_gsm8k_reference("no final line")


def test_real_gsm8k_references_are_integers():
    refs = [extract_gsm8k_reference(json.loads(line)["answer"]) for line in open(DATA / "gsm8k" / "test.jsonl")]
    assert len(refs) == 1319
    assert all(r.lstrip("-").isdigit() for r in refs)


def test_real_gpt3_solutions_answer_lines():
    """Every GPT-3 solution's answer is its `A: N` line; 11 degenerate ones have none (design.md)."""
    rows = [json.loads(line) for line in open(DATA / "gsm8k" / "example_model_solutions.jsonl")]
    missing = 0
    for row in rows:
        for gen in GENERATORS:
            solution = row[gen]["solution"]
            answer = extract_final_answer(strip_calculator_annotations(solution))
            a_lines = [ln for ln in solution.splitlines() if ln.startswith("A:")]
            if answer is None:
                missing += 1
                assert not a_lines
            elif a_lines:
                assert a_lines[-1][2:].strip().lstrip("$").replace(",", "").startswith(answer)
    assert missing == 11
