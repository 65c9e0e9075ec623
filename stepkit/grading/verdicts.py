r"""Reading verdicts out of LLM-judge replies, and voting over several replies.

A judge is asked to reason first and give its verdict last, so every parser here reads the *final*
verdict, never the first verdict-looking word (case ``judge-verdict-first-match``), matches labels as
whole words with the longest label first (``NOT SUCCESS`` is never read as ``SUCCESS``), and matches
single-letter grades case-sensitively as standalone words (the ``a`` of "As a judge" is not grade
``A``, case ``judge-grade-letter-unanchored``). A reply with no usable verdict raises
:class:`VerdictParseError`: the caller records a parse failure and never turns it into a verdict.

Reply formats (the prompt templates in :mod:`stepkit.prompts` ask for them):

* first error (ProcessBench critic protocol, Zheng et al. 2024): the 0-based index of the earliest
  wrong paragraph, or ``-1`` when none is wrong, in the last ``\boxed{}`` of the reply;
* per step: one line per step at the end, ``Paragraph k: correct`` / ``Paragraph k: incorrect``
  (``Step k`` also accepted); a step stated twice counts with its last statement.
"""

from __future__ import annotations

import re
from collections import Counter

from stepkit.grading.answers import _boxes


class VerdictParseError(ValueError):
    """A judge reply that states no usable verdict. ``str(e)`` is a short reason for the row record."""


# Phrases that introduce a verdict: the verdict is the first label after the last of them.
_MARKER = re.compile(r"\b(?:final\s+(?:verdict|answer|grade|judg(?:e)?ment)|verdict|grade|rating|judg(?:e)?ment)"
                     r"\s*(?:is|was|:|=|-)?", re.IGNORECASE)


def _label_pattern(labels: list[str]) -> re.Pattern:
    """Whole-word alternation, longest label first; multi-letter labels ignore case, single letters do not."""
    parts = []
    for lab in sorted(set(labels), key=len, reverse=True):
        body = r"\s+".join(re.escape(w) for w in lab.split())
        parts.append(f"(?-i:{body})" if len(lab.strip()) == 1 else body)
    return re.compile(r"(?<![\w-])(?:" + "|".join(f"({p})" for p in parts) + r")(?![\w-])", re.IGNORECASE)


def parse_label(text: str, labels: list[str]) -> str:
    """The final verdict of ``text`` among ``labels``.

    After the last verdict marker ("Final verdict:", "The final grade is" ...) the first label is the
    verdict; without a marker, the last label in the text is.

    Args:
        text: the judge's reply.
        labels: the allowed verdicts, e.g. ``["SUCCESS", "NOT SUCCESS"]`` or ``["A", "B"]``.

    Returns:
        The label as given in ``labels``.

    Raises:
        VerdictParseError: no label occurs where a verdict is expected.
    """
    if not labels:
        raise ValueError("labels must not be empty")
    ordered = sorted(set(labels), key=len, reverse=True)
    pat = _label_pattern(ordered)
    markers = list(_MARKER.finditer(text))
    if markers:
        m = pat.search(text, markers[-1].end())
        if m is not None:
            return ordered[m.lastindex - 1]
    found = list(pat.finditer(text))
    if not found:
        raise VerdictParseError("no verdict: none of " + ", ".join(repr(x) for x in labels) + " stated")
    return ordered[found[-1].lastindex - 1]


_INDEX = re.compile(r"[+-]?\d+")
_MARKUP = re.compile(r"\\(?:text|mathrm|mathbf|textbf)\s*\{([^{}]*)\}|[$\s]")


def parse_first_error(text: str, n_steps: int) -> int:
    r"""The earliest-error index of a first-error reply: the content of its last ``\boxed{}``.

    Args:
        text: the judge's reply.
        n_steps: M >= 1, the number of steps judged.

    Returns:
        An index in ``-1 .. M-1`` (``-1``: no step is wrong).

    Raises:
        VerdictParseError: no ``\boxed{}``, a box that is not an integer, or an index outside -1..M-1.
    """
    boxes = [b for b in _boxes(text) if not b[3]]
    if not boxes:
        raise VerdictParseError("no verdict: no \\boxed{} index in the reply")
    _, start, end, _ = boxes[-1]
    content = _MARKUP.sub(lambda m: m.group(1) or "", text[start:end])
    if not _INDEX.fullmatch(content):
        raise VerdictParseError(f"verdict \\boxed{{{text[start:end][:40]}}} is not a step index")
    k = int(content)
    if not -1 <= k < n_steps:
        raise VerdictParseError(f"verdict index {k} is outside -1..{n_steps - 1} ({n_steps} steps)")
    return k


_STEP_LINE = re.compile(
    r"^[ \t>*#\-]*\**(?:paragraph|step)[ \t_]*(\d+)\**[ \t]*(?:[:.)=\-]|is)\**[ \t]*\**[ \t]*"
    r"(incorrect|correct)\b", re.IGNORECASE | re.MULTILINE)


def parse_step_verdicts(text: str, n_steps: int) -> list[bool]:
    """Per-step verdicts of a per-step reply: lines ``Paragraph k: correct|incorrect``.

    A step stated more than once counts with its last statement (the reply's final verdict).

    Args:
        text: the judge's reply.
        n_steps: M >= 1.

    Returns:
        M booleans, True for a correct step.

    Raises:
        VerdictParseError: no verdict line, a verdict for a step that does not exist, or verdicts for
            fewer than M steps (a count that differs from the step count is never read as verdicts).
    """
    last: dict[int, bool] = {}
    for m in _STEP_LINE.finditer(text):
        last[int(m.group(1))] = m.group(2).lower() == "correct"
    if not last:
        raise VerdictParseError("no verdict: no 'Paragraph k: correct/incorrect' line")
    extra = sorted(k for k in last if k >= n_steps)
    if extra:
        raise VerdictParseError(f"verdict for paragraph {extra[0]} but the solution has {n_steps} steps")
    if len(last) != n_steps:
        missing = [k for k in range(n_steps) if k not in last]
        raise VerdictParseError(f"verdicts for {len(last)} of {n_steps} steps (missing paragraph {missing[0]})")
    return [last[k] for k in range(n_steps)]


def first_error_of(labels: list[bool | None]) -> int | None:
    """Index of the first False in ``labels``, -1 when all are True, None when a null comes first."""
    for i, ok in enumerate(labels):
        if ok is None:
            return None
        if not ok:
            return i
    return -1


def labels_from_first_error(first_error: int, n_steps: int) -> list[bool]:
    """Hard labels implied by a first-error index: True before it, False from it on (Math-Shepherd /
    ProcessBench convention: every prefix that contains the error is wrong)."""
    return [first_error == -1 or s < first_error for s in range(n_steps)]


def vote_first_error(votes: list[int]) -> tuple[int, bool]:
    """Majority vote over first-error indices.

    Returns:
        (index, tie). On a tie the earliest tied error wins (``-1`` counts as after every step), so a
        tie never hides a claimed error; ``tie`` records that it happened.

    Raises:
        ValueError: no votes.
    """
    if not votes:
        raise ValueError("no votes")
    counts = Counter(votes)
    top = max(counts.values())
    best = [k for k, c in counts.items() if c == top]
    return min(best, key=lambda k: float("inf") if k == -1 else k), len(best) > 1


def vote_steps(votes: list[list[bool]]) -> tuple[list[bool], list[int], list[bool]]:
    """Per-step majority vote over per-step verdicts (SPARK-style self-consistency).

    Args:
        votes: V lists of M booleans.

    Returns:
        (labels, correct_votes, ties): a step is correct only with a strict majority of "correct"
        votes, so a tie resolves to incorrect and is recorded in ``ties``.

    Raises:
        ValueError: no votes, or votes of different lengths.
    """
    if not votes:
        raise ValueError("no votes")
    m = len(votes[0])
    if any(len(v) != m for v in votes):
        raise ValueError("votes of different lengths")
    correct = [sum(v[s] for v in votes) for s in range(m)]
    n = len(votes)
    return [2 * c > n for c in correct], correct, [2 * c == n for c in correct]
