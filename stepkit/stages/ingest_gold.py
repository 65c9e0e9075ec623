"""Gold answers and human step labels as ``ingest``'s source formats write them.

* GSM8K (Cobbe et al. 2021) writes the gold answer after ``#### `` on the last line of its ``answer`` field
  (:func:`gsm8k_reference`), its example model solutions after ``A:`` in ``ground_truth``
  (:func:`solutions_reference`). A gold answer on such a marker line is read whole, never with the length
  bound meant for model output.
* PRM800K (Lightman et al. 2023) rates steps -1/0/1 (:func:`ratings_to_labels`); ProcessBench (Zheng et al.
  2024) labels the first erroneous step (:func:`first_error_status` checks it against the outcome).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from stepkit.errors import InputError
from stepkit.grading.answers import _MAX_PHRASE as ANSWER_PHRASE_CHARS
from stepkit.grading.answers import extract_final_answer, extract_gsm8k_reference, strip_calculator_annotations

# A plain number as GSM8K's own grader reads it after "####" (digits, thousands commas, a decimal part).
_PLAIN_GOLD = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_A_LINE = re.compile(r"^[ \t]*A:", re.MULTILINE)


def _marker_gold(line: str, read: Callable[[], str | None], marker: str, path: Path, row: int, column: str) -> str:
    """The gold answer written after ``marker`` on ``line``, read whole.

    A plain number (the GSM8K format) is taken as it is, thousands commas and leading zeros dropped, at any
    length. Other text goes through the answer reader ``read`` (which ends an answer at its clause and
    reads at most ``ANSWER_PHRASE_CHARS`` characters, a bound for model output): a longer line is refused
    rather than cut."""
    line = line.strip()
    if _PLAIN_GOLD.fullmatch(line):
        ans = line.replace(",", "")
        sign, digits = ("-", ans[1:]) if ans.startswith("-") else ("", ans)
        return sign + (digits.lstrip("0") or "0") if digits.isdigit() else ans
    if len(line) > ANSWER_PHRASE_CHARS:
        raise InputError(path, f"the answer after {marker!r} is {len(line)} characters of text that is not a number; "
                               f"answers are read for at most {ANSWER_PHRASE_CHARS} characters, so it would be cut",
                         row=row, column=column)
    ans = read()
    if not ans:
        raise InputError(path, f"no answer after {marker!r}", row=row, column=column)
    return ans


def gsm8k_reference(answer: str, path: Path, row: int, column: str = "answer") -> str:
    """The gold answer of a GSM8K ``answer`` field: the text after its last ``####``, read whole.

    Raises:
        InputError: no ``####``, nothing after it, or a non-numeric answer too long to read whole.
    """
    k = answer.rfind("####")
    if k < 0:
        raise InputError(path, "no '#### N' final answer line", row=row, column=column)

    def read():
        try:
            return extract_gsm8k_reference(answer)
        except ValueError:
            return None

    return _marker_gold(answer[k + 4:].split("\n", 1)[0], read, "####", path, row, column)


def solutions_reference(ground_truth: str, path: Path, row: int) -> str:
    """The gold answer of a GSM8K example-solutions ``ground_truth``: its last ``A: N`` line, read whole
    (without such a line, the final answer its text gives).

    Raises:
        InputError: no final answer, or a non-numeric answer too long to read whole.
    """
    text = strip_calculator_annotations(ground_truth)
    lines = list(_A_LINE.finditer(text))
    if not lines:
        ref = extract_final_answer(text)
        if ref is None:
            raise InputError(path, "no final answer in the ground truth", row=row, column="ground_truth")
        return ref
    line = text[lines[-1].end():].split("\n", 1)[0]
    return _marker_gold(line, lambda: extract_final_answer("A: " + line.strip()), "A:", path, row, "ground_truth")


def ratings_to_labels(ratings: list, neutral_as: str = "positive") -> list[bool]:
    """Map per-step ratings to hard labels.

    PRM800K rates steps -1/0/1. The PRM800K paper and Qwen's baselines count a neutral 0 as positive;
    TRL's converter keeps only 1 as true (case ``prm800k-neutral-rating-mapping``), so the choice is
    explicit. Booleans pass through; ``"+"``/``"-"`` map to True/False.

    Raises:
        ValueError: unknown ``neutral_as`` or a rating outside {-1, 0, 1, True, False, "+", "-"}.
    """
    if neutral_as not in ("positive", "negative"):
        raise ValueError(f"neutral_as must be 'positive' or 'negative', got {neutral_as!r}")
    out = []
    for r in ratings:
        if isinstance(r, bool):
            out.append(r)
        elif r in ("+", "-"):
            out.append(r == "+")
        elif r in (1, -1, 0):
            out.append(r == 1 or (r == 0 and neutral_as == "positive"))
        else:
            raise ValueError(f"unknown step rating {r!r}")
    return out


def first_error_status(outcome_correct: bool | None, first_error: int | None, n_steps: int) -> str:
    """Check a first-error label against its outcome (case ``first-error-step-missing-for-incorrect``).

    An incorrect outcome must have ``0 <= first_error < n_steps``; a correct one may have -1 or a step
    (ProcessBench: correct answers can hide process errors). Returns ``"ok"`` or
    ``"inconsistent: <why>"`` — such rows are flagged, never silently relabelled.
    """
    if first_error is None or not isinstance(first_error, int) or isinstance(first_error, bool):
        return f"inconsistent: first error {first_error!r} is not an integer"
    if not -1 <= first_error < n_steps:
        return f"inconsistent: first error {first_error} outside -1..{n_steps - 1}"
    if outcome_correct is False and first_error == -1:
        return "inconsistent: incorrect outcome with no erroneous step"
    return "ok"
