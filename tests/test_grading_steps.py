"""Step splitting, prefix rendering, separator round trips, and Math-Shepherd step tags."""

from __future__ import annotations

import json

import pytest
from conftest import DATA

from stepkit.grading.answers import strip_calculator_annotations
from stepkit.grading.steps import (
    join_steps,
    parse_tagged_steps,
    render_prefix,
    shepherd_labels_to_bool,
    split_joined,
    split_steps,
)


@pytest.mark.parametrize(
    "text, mode, steps, sep",
    [
        ("a = 1\n\n  b = 2 \nc = 3\n", "newline", ["a = 1", "b = 2", "c = 3"], "\n"),
        ("First para\nstill first.\n\nSecond.\n \nThird.", "blank", ["First para\nstill first.", "Second.", "Third."],
         "\n\n"),
        ("Intro.\nStep 1: x = 2.\nso 2x = 4\nStep 2: Done.", "step", ["Intro.", "Step 1: x = 2.\nso 2x = 4",
                                                                       "Step 2: Done."], "\n"),
        ("Step 1: a ки Step 2: b ки", "step", ["Step 1: a ки", "Step 2: b ки"], "\n"),
        ("Step 1: a\nStep 2: b\n\nmore", "auto", ["Step 1: a", "Step 2: b\n\nmore"], "\n"),
        ("Step 1: only one\n\nPara two", "auto", ["Step 1: only one", "Para two"], "\n\n"),
        ("line one\r\nline two\n", "auto", ["line one", "line two"], "\n"),
        ("a; b;; c", r";\s*", ["a", "b", "c"], "\n"),
        ("", "auto", [], "\n"),
    ],
)
def test_split_steps(text, mode, steps, sep):
    assert split_steps(text, mode) == (steps, sep)


def test_split_steps_bad_regex():
    with pytest.raises(ValueError, match="valid regex"):
        split_steps("a", "(unclosed")


def test_real_gsm8k_solution_lines():
    row = json.loads(open(DATA / "gsm8k" / "test.jsonl").readline())
    body = strip_calculator_annotations(row["answer"].rsplit("####", 1)[0])
    steps, sep = split_steps(body)
    assert sep == "\n"
    assert steps == ["Janet sells 16 - 3 - 4 = 9 duck eggs a day.",
                     "She makes 9 * 2 = $18 every day at the farmer’s market."]


def test_render_prefix():
    steps = ["Let x = 2.\nThen 2x = 4.", "So the answer is 4."]
    assert render_prefix(steps, "\n", 0) == ""
    assert render_prefix(steps, "\n", 1) == "Let x = 2.\nThen 2x = 4.\n"
    assert render_prefix(steps, "\n\n", 2) == "Let x = 2.\nThen 2x = 4.\n\nSo the answer is 4.\n\n"
    assert join_steps(steps, "\n\n") == "Let x = 2.\nThen 2x = 4.\n\nSo the answer is 4."
    with pytest.raises(ValueError):
        render_prefix(steps, "\n", 3)


def test_join_newline_roundtrip_detected(cases):
    case = cases["step-join-newline-roundtrip"]
    steps, labels, sep = case["input"]["completions"], case["input"]["labels"], case["input"]["separator"]
    joined = join_steps(steps, sep)
    assert len(joined.split(sep)) == case["expected"]["observed_if_joined_then_split_on_separator"]
    with pytest.raises(ValueError, match="expected 2"):
        split_joined(joined, sep, len(labels))
    # A separator no step contains round-trips.
    back = split_joined(join_steps(steps, "\n\n"), "\n\n", len(labels))
    assert back == steps and len(back) == case["expected"]["split_back_count"]


def test_processbench_steps_with_newlines():
    """77 of ProcessBench's 400 gsm8k rows have a step holding a newline (design.md): "\\n" cannot round-trip."""
    rows = json.load(open(DATA / "processbench" / "gsm8k.json"))
    failures = 0
    for row in rows:
        try:
            assert split_joined(join_steps(row["steps"], "\n"), "\n", len(row["steps"])) == row["steps"]
        except ValueError:
            failures += 1
    assert failures == 77


def _label_text(input_text: str, labels: list[str], tag: str = "ки") -> str:
    for lab in labels:
        input_text = input_text.replace(tag, lab, 1)
    return input_text


def test_math_shepherd_labels(cases):
    case = cases["math-shepherd-label-extraction"]
    text, tag, expected = case["input"]["input_field"], case["input"]["step_tag"], case["expected"]
    label_text = _label_text(text, expected["labels"], tag)
    naive = "".join(ch for ch in label_text if ch in "+-")
    assert naive == expected["naive_char_filter_result"].split()[0]  # the bug: arithmetic signs picked up
    problem, steps, labels = parse_tagged_steps(text, label_text, tag)
    assert problem == "<problem>"
    assert len(steps) == expected["n_steps"]
    assert steps[0] == "Step 1: The total ratio representing the pizza is 5+8 = <<5+8=13>>13."
    assert steps[-1] == "Step 5: The waiter ate 52 slices of the pizza. The answer is: 52"
    assert labels == expected["labels"]
    assert shepherd_labels_to_bool(labels) == expected["trl_labels"]


def test_math_shepherd_stray_tag_in_problem_rejected():
    text = "How many is 2 ки 3? Step 1: 2 + 3 = 5. ки Step 2: The answer is: 5 ки"
    with pytest.raises(ValueError, match="inside the problem"):
        parse_tagged_steps(text, _label_text(text, ["+", "+", "-"]))


@pytest.mark.parametrize(
    "text",
    [
        # The problem itself says "Step 1:", so the first step cannot be told from the problem.
        "Do this. Step 1: add 2. Step 2: double. What is it? Step 1: 2 + 2 = 4. ки Step 2: 4 * 2 = 8. ки",
        "Follow Step 1: add.\nStep 1: 2 + 2 = 4. ки\nStep 2: The answer is: 4 ки",
        "Step 1: given x. Find y. Step 1: y = 2x. ки",
        "Step  1 : as in the book. Step 1: y = 2x. ки",
    ],
)
def test_math_shepherd_step_one_in_problem_rejected(text):
    labels = ["+"] * text.count("ки")
    with pytest.raises(ValueError, match="Step 1:"):
        parse_tagged_steps(text, _label_text(text, labels))


def test_math_shepherd_other_step_markers_in_problem_are_fine():
    text = "Skip Step 2: of the recipe. Step 1: 2 + 2 = 4. ки Step 2: The answer is: 4 ки"
    problem, steps, labels = parse_tagged_steps(text, _label_text(text, ["+", "-"]))
    assert problem == "Skip Step 2: of the recipe."
    assert steps == ["Step 1: 2 + 2 = 4.", "Step 2: The answer is: 4"] and labels == ["+", "-"]


@pytest.mark.parametrize(
    "text, label_text, match",
    [
        ("P Step 1: a ки Step 2: b ки", "P Step 1: a + Step 2: b x", "'\\+' or '-'"),
        ("P Step 1: a ки Step 2: b ки", "P Step 1: a + Step 2: b -!", "length"),
        ("P Step 1: a ки Step 2: b ки", "P Step 1: A + Step 2: b -", "replaced by its label"),
        ("P Step 1: a ки Step 2: b ки tail", "P Step 1: a + Step 2: b - tail", "after the last"),
        ("P Step 1: a ки ки", "P Step 1: a + +", "empty step"),
        ("P Step 1: a", "P Step 1: a", "no step tag"),
        ("P a ки b ки", "P a + b -", "no 'Step 1:'"),
    ],
)
def test_math_shepherd_malformed_rows(text, label_text, match):
    with pytest.raises(ValueError, match=match):
        parse_tagged_steps(text, label_text)


def test_shepherd_labels_to_bool():
    assert shepherd_labels_to_bool(["+", "-", "+"]) == [True, False, True]
    with pytest.raises(ValueError):
        shepherd_labels_to_bool(["+", "0"])
