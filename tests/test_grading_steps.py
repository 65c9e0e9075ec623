"""Step splitting, prefix rendering, separator round trips, and Math-Shepherd step tags."""

from __future__ import annotations

import json
import re

import pytest
from conftest import DATA, assert_linear

from stepkit.grading.answers import strip_calculator_annotations
from stepkit.grading.steps import (
    join_steps,
    math_and_code_blocks,
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
        ("a; b;; c", r"(;)\s*", ["a", "b", "c"], "\n"),  # a separator's capture groups are not steps
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


# ---- splits never cut display math or code ------------------------------------------------------------

ALIGN = "\\begin{align*}\nx &= 1 \\\\[2pt]\n\ny &= 2\n\\end{align*}"


@pytest.mark.parametrize(
    "text, mode, steps",
    [
        ("Intro.\n\n\\[\na = 1\n\nb = 2\n\\]\n\nDone.", "blank", ["Intro.", "\\[\na = 1\n\nb = 2\n\\]", "Done."]),
        ("So\n\n$$\na = 1\n\n b = 2\n$$\n\nDone.", "blank", ["So", "$$\na = 1\n\n b = 2\n$$", "Done."]),
        (f"A\n\n{ALIGN}\n\nB", "blank", ["A", ALIGN, "B"]),
        (f"A\n{ALIGN}\nB", "newline", ["A", ALIGN, "B"]),
        ("Let\n\\[\nx = 1\n\\]\nSo", "newline", ["Let", "\\[\nx = 1\n\\]", "So"]),
        ("A\n\n\\begin{align}\n\\begin{cases} 1 \\\\\n\n2 \\end{cases}\n\n\\end{align}\n\nB", "blank",
         ["A", "\\begin{align}\n\\begin{cases} 1 \\\\\n\n2 \\end{cases}\n\n\\end{align}", "B"]),
        ("Code:\n\n```python\nx = 1\n\ny = '$$'\n```\n\nEnd", "blank", ["Code:", "```python\nx = 1\n\ny = '$$'\n```", "End"]),
        ("Code:\n\n~~~~\na\n\n~~~\nb\n~~~~\n\nEnd", "blank", ["Code:", "~~~~\na\n\n~~~\nb\n~~~~", "End"]),
        ("1. Run:\n\n    ```\n    a\n\n    b\n    ```\n\n2. Done", "blank", ["1. Run:", "```\n    a\n\n    b\n    ```", "2. Done"]),
        # the block rule decides what auto sees: a blank line only inside a block is no paragraph break
        ("A\n\\[\na\n\nb\n\\]\nB", "auto", ["A", "\\[\na\n\nb\n\\]", "B"]),
        ("Step 1: a\n```\nStep 2: not a step\n```\nStep 2: b", "auto", ["Step 1: a\n```\nStep 2: not a step\n```", "Step 2: b"]),
        ("a; \\[ b; c \\]; d", r";\s*", ["a", "\\[ b; c \\]", "d"]),
        ("x (?=y) \\[ z\n\nStep w \\]\n\nStep v", "(?=Step )", ["x (?=y) \\[ z\n\nStep w \\]", "Step v"]),
        # not blocks: unclosed delimiters, a LaTeX line break, an escaped dollar, $$ between inline maths
        ("unclosed \\[ x\n\ny", "blank", ["unclosed \\[ x", "y"]),
        ("a \\\\[2pt]\n\nb \\]", "blank", ["a \\\\[2pt]", "b \\]"]),
        ("cost \\$$5\n\nand $$", "blank", ["cost \\$$5", "and $$"]),
        ("Since $x,$$y,$ and $z$\n\nnext $$a\n\nb$$ end", "blank", ["Since $x,$$y,$ and $z$", "next $$a\n\nb$$ end"]),
        ("\\[ a\n\nb \\[ c\n\nd \\] e", "blank", ["\\[ a", "b \\[ c\n\nd \\] e"]),  # the first display was left open
        ("\\begin{a}\n\nx", "blank", ["\\begin{a}", "x"]),
        # an unclosed code fence holds the rest of the text (CommonMark)
        ("Run\n\n```\nx\n\ny", "blank", ["Run", "```\nx\n\ny"]),
        ("```x```\n\ny", "blank", ["```x```", "y"]),  # backticks in the info string: not a fence
    ],
)
def test_splits_never_cut_display_math_or_code(text, mode, steps):
    assert split_steps(text, mode)[0] == steps


@pytest.mark.parametrize(
    "text, mode",
    [("a\n\n \t \n\nb", "blank"), ("a\n  \n\t\nb", "newline"), ("\n\n\n", "blank"), ("   ", "auto"), ("", "newline"),
     ("a;;  ; b", r";"), ("Step 1: a\n\n  \nStep 2: b", "step"), ("\\[ x \\]\n\n \n\n", "blank"),
     ("\u00a0\n\n\u2003\n\nb", "blank")],
)
def test_empty_and_whitespace_pieces_are_never_steps(text, mode):
    steps, _ = split_steps(text, mode)
    assert all(s and s.strip() == s for s in steps), steps


def test_math_and_code_blocks_spans():
    text = "a $$x$$ b \\[y\\] \\begin{c}z\\end{c}\n```\nw\n```\n"
    assert [text[a:b] for a, b in math_and_code_blocks(text)] == ["$$x$$", "\\[y\\]", "\\begin{c}z\\end{c}", "```\nw\n```"]
    assert math_and_code_blocks("no blocks $x$ here") == []


_GAP = {"\n\n": re.compile(r"\s*\n[ \t]*\n\s*"), "\n": re.compile(r"\s*\n\s*")}


def assert_normalised_form(text: str, steps: list[str], sep: str) -> None:
    """The contract of split_steps: every step is a piece of the text byte for byte, in order, and what lies
    between two steps is whitespace holding a separator, so joining the steps with ``sep`` gives the text
    with each such gap (and the whitespace at the ends) normalised."""
    text, pos = text.replace("\r\n", "\n"), 0
    for k, step in enumerate(steps):
        at = text.find(step, pos)
        assert at >= 0, f"step {k} is not a piece of the text: {step[:80]!r}"
        gap = text[pos:at]
        assert (not gap.strip()) if k == 0 else _GAP[sep].fullmatch(gap), f"gap before step {k}: {gap[:80]!r}"
        pos = at + len(step)
    assert not text[pos:].strip()
    assert render_prefix(steps, sep, len(steps)) == join_steps(steps, sep) + (sep if steps else "")


def _math500():
    return [json.loads(line) for line in open(DATA / "math500" / "test.jsonl")]


# Display blocks as written in the real data, found independently of the splitter.
_REAL_BLOCK = re.compile(r"\\\[(?:(?!\\\[).)*?\\\]|\\begin\{(\w+\*?)\}.*?\\end\{\1\}|\$\$[^$]+\$\$", re.DOTALL)


def _real_blocks(text: str) -> list[str]:
    return [m.group() for m in _REAL_BLOCK.finditer(text) if "\n" in m.group()]


@pytest.mark.parametrize("mode", ["newline", "auto", "blank"])
def test_real_math500_display_math_stays_in_one_step(mode):
    """MATH-500 solutions hold 183 multi-line display blocks; a line split used to cut the blocks of 132
    solutions into lines of bare LaTeX (and auto chose that split for 88 of them)."""
    rows = _math500()
    cut = []
    for i, row in enumerate(rows):
        steps, sep = split_steps(row["solution"], mode)
        assert_normalised_form(row["solution"], steps, sep)
        if any(not any(b in s for s in steps) for b in _real_blocks(row["solution"])):
            cut.append(i)
    assert sum(len(_real_blocks(r["solution"])) for r in rows) == 183
    assert cut == []


def _with_blank_lines_in_blocks(text: str) -> tuple[str, list[str]]:
    """``text`` with a blank line added after the first line of each multi-line display block (as models write
    them between the rows of an ``align``); returns the new text and its changed blocks."""
    changed = []

    def widen(m):
        block = m.group().replace("\n", "\n\n", 1) if "\n" in m.group() else m.group()
        changed.append(block)
        return block

    return _REAL_BLOCK.sub(widen, text), [b for b in changed if "\n\n" in b]


def test_real_math500_blocks_with_blank_lines_stay_whole():
    n_blocks = 0
    for row in _math500():
        text, blocks = _with_blank_lines_in_blocks(row["solution"])
        n_blocks += len(blocks)
        for mode in ("blank", "auto", "newline"):
            steps, sep = split_steps(text, mode)
            assert_normalised_form(text, steps, sep)
            assert all(any(b in s for s in steps) for b in blocks), (mode, row["solution"][:200])
        assert len(split_steps(text, "blank")[0]) == len(split_steps(row["solution"], "blank")[0])
    assert n_blocks == 183


def test_real_processbench_steps_round_trip_through_blank_lines():
    """ProcessBench steps are paragraphs: joined with a blank line they split back, all 1400 rows, and so do
    the 236 steps that hold multi-line display math with a blank line added inside each block."""
    widened = 0
    for split in ("gsm8k", "math"):
        for row in json.load(open(DATA / "processbench" / f"{split}.json")):
            steps = [s.strip() for s in row["steps"]]
            joined = "\n\n".join(row["steps"])
            assert split_steps(joined, "blank") == (steps, "\n\n"), row["id"]
            wide = [_with_blank_lines_in_blocks(s)[0] for s in steps]
            widened += sum(w != s for w, s in zip(wide, steps))
            assert split_steps("\n\n".join(wide), "blank")[0] == wide, row["id"]
    assert widened == 236


def test_real_processbench_unclosed_display_is_text():
    """ProcessBench math-85, step 1 ends inside a display its model never closed (``\\[ ... = -7.``); step 2
    opens and closes its own. The unclosed one is text, so the four steps still split back."""
    row = next(r for r in json.load(open(DATA / "processbench" / "math.json")) if r["id"] == "math-85")
    assert row["steps"][1].rstrip().endswith("= -7.") and row["steps"][1].count("\\[") == row["steps"][1].count("\\]") + 1
    assert split_steps("\n\n".join(row["steps"]), "blank")[0] == [s.strip() for s in row["steps"]]


def test_real_processbench_code_fences():
    """ProcessBench math-810 writes its sums in code fences; a fence with a blank line stays one step."""
    row = next(r for r in json.load(open(DATA / "processbench" / "math.json")) if r["id"] == "math-810")
    steps = [s.strip().replace("```\n", "```\n\n", 1) for s in row["steps"]]  # a blank line inside each fence
    assert sum("```\n\n" in s for s in steps) == 3
    assert split_steps("\n\n".join(steps), "blank")[0] == steps


def _adversarial_blocks(n: int) -> dict[str, str]:
    return {
        "unclosed displays": "\\[ a\n\n" * (n // 6),
        "closers only": "\\] a\n\n" * (n // 6),
        "dollars": "$$ a\n\n" * (n // 6),
        "single dollars": "$ a\n\n" * (n // 5),
        "unclosed environments": "\\begin{a}\n\n" * (n // 11),
        "nested environments": "\\begin{a}\n\n" * (n // 20) + "\\end{a}\n\n" * (n // 20),
        "fences with info": "```a\n\n" * (n // 6),
        "fences": "```\n\n" * (n // 5),
        "long fences": "`" * (n // 2) + "\n\n" + "`" * (n // 2),
        "escapes": "\\\\\\$" * (n // 4),
        "step markers": "Step 1: a\n```\n" * (n // 14),
    }


@pytest.mark.parametrize("name", sorted(_adversarial_blocks(10)))
@pytest.mark.parametrize("mode", ["auto", "blank", "newline"])
def test_splitting_with_blocks_is_linear(name, mode):
    assert_linear(lambda text: split_steps(text, mode), lambda n: _adversarial_blocks(n)[name], n=8_000)
