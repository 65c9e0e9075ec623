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

from stepkit.grading.answers import find_boxes


class VerdictParseError(ValueError):
    """A judge reply that states no usable verdict. ``str(e)`` is a short reason for the row record."""


# Phrases that introduce a verdict ("Final verdict:", "The final grade is"): a statement, not a question
# ("Is the grade A or B?" is no marker).
_MARKER = re.compile(r"\b(?:final\s+(?:verdict|answer|grade|judge?ment)|verdict|grade|rating|judge?ment)"
                     r"(?:\s+is\b|\s*[:=])", re.IGNORECASE)
_NEGATION = re.compile(r"\b(?:not|no|never|cannot|can't|isn't|wasn't)\b", re.IGNORECASE)
# Label words end at a letter, digit, '+' or '-' boundary: "A-" / "B+" are not grades "A" / "B".
_WORD_START, _WORD_END = r"(?<![A-Za-z0-9+-])", r"(?![A-Za-z0-9+-])"


def _label_pattern(labels: list[str]) -> re.Pattern:
    """Whole-word alternation, longest label first; multi-letter labels ignore case, single letters do not."""
    parts = []
    for lab in labels:
        body = r"\s+".join(re.escape(w) for w in lab.split())
        parts.append(f"(?-i:{body})" if len(lab.strip()) == 1 else body)
    return re.compile(_WORD_START + "(?:" + "|".join(f"({p})" for p in parts) + ")" + _WORD_END, re.IGNORECASE)


def _sentence_before(text: str, i: int) -> str:
    """The text of the sentence that ends at ``i`` (at most 40 characters back)."""
    start = max(0, i - 40)
    cut = max(text.rfind(c, start, i) for c in ".!?\n")
    return text[max(start, cut + 1):i]


def parse_label(text: str, labels: list[str]) -> str:
    """The final verdict of ``text`` among ``labels``.

    With a verdict marker ("Final verdict:", "The final grade is"), the verdict is the label on the rest
    of the line after the last marker (or on the next non-empty line when the marker ends its line);
    without one, the last label in the text. Labels match as whole words, the longest first.

    Args:
        text: the judge's reply.
        labels: the allowed verdicts, e.g. ``["SUCCESS", "NOT SUCCESS"]`` or ``["A", "B"]``.

    Returns:
        The label as given in ``labels``.

    Raises:
        VerdictParseError: no label where the verdict is expected, two different labels in the verdict
            ("Final verdict: correct? No, incorrect"), or a negated label ("Final verdict: not correct").
    """
    if not labels:
        raise ValueError("labels must not be empty")
    ordered = sorted(set(labels), key=len, reverse=True)
    pat = _label_pattern(ordered)
    markers = list(_MARKER.finditer(text))
    if markers:
        seg_start = markers[-1].end()
        seg_end = text.find("\n", seg_start)
        segment = text[seg_start: seg_end if seg_end >= 0 else len(text)]
        if not segment.strip() and seg_end >= 0:  # "Final verdict:\nNOT SUCCESS"
            segment = next((ln for ln in text[seg_end:].splitlines() if ln.strip()), "")
        found = list(pat.finditer(segment))
        if not found:
            raise VerdictParseError(f"no verdict after {markers[-1].group().strip()!r}")
        if len({m.lastindex for m in found}) > 1:
            raise VerdictParseError("ambiguous verdict: " + " and ".join(sorted({m.group() for m in found})))
        if _NEGATION.search(segment[:found[0].start()]):
            raise VerdictParseError(f"negated verdict: {segment.strip()[:60]!r}")
        return ordered[found[0].lastindex - 1]
    found = list(pat.finditer(text))
    if not found:
        raise VerdictParseError("no verdict: none of " + ", ".join(repr(x) for x in labels) + " stated")
    last = found[-1]
    if _NEGATION.search(_sentence_before(text, last.start())):
        raise VerdictParseError(f"negated verdict: {text[max(0, last.start() - 30):last.end()]!r}")
    return ordered[last.lastindex - 1]


# A step index inside a box, after unwrapping \text{...} and friends: "2", "-1", "Paragraph 2".
_INDEX = re.compile(r"(?:(?:paragraph|step)_?)?([+-]?[0-9]{1,6})", re.IGNORECASE)
_WRAPPER = re.compile(r"\\[A-Za-z]+\s*\{([^{}]*)\}")
_NOISE = re.compile(r"\\(?:displaystyle|textstyle|left|right|[,;:!()\[\] ])|[$\s~]")


def _box_index(content: str) -> int | None:
    """The integer a box states (``\\text{2}``, ``$-1$``, ``−1`` with a Unicode minus), or None."""
    s = content.replace("\u2212", "-")
    for _ in range(3):
        s = _WRAPPER.sub(r"\1", s)
    m = _INDEX.fullmatch(_NOISE.sub("", s))
    return int(m.group(1)) if m else None


def _norm_quote(s: str) -> str:
    return re.sub(r"\s+", "", s)


def parse_first_error(text: str, n_steps: int, quotes: tuple[str, ...] | set[str] = ()) -> int:
    r"""The earliest-error index of a first-error reply: its last ``\boxed{}`` (ProcessBench's protocol).

    A box whose content repeats the solution's own answer (``quotes``: the boxed answers in the steps
    and the extracted final answer) is a quotation, not a verdict, unless every box is one. When a
    quotation that is itself a valid, different index follows the last other box, the reply is
    ambiguous ("Earliest error: \boxed{2}. The solution's answer \boxed{3} is wrong.") and is a parse
    failure rather than a guess.

    Args:
        text: the judge's reply.
        n_steps: M >= 1, the number of steps judged.
        quotes: answers of the judged solution, as written.

    Returns:
        An index in ``-1 .. M-1`` (``-1``: no step is wrong).

    Raises:
        VerdictParseError: no ``\boxed{}``, a box that is not an integer, an index outside -1..M-1, or
            an ambiguous quotation.
    """
    boxes = [(text[b[1]:b[2]], _box_index(text[b[1]:b[2]])) for b in find_boxes(text) if not b[3]]
    if not boxes:
        raise VerdictParseError("no verdict: no \\boxed{} index in the reply")
    quoted = {_norm_quote(q) for q in quotes if q}
    own = [i for i, (c, _) in enumerate(boxes) if _norm_quote(c) not in quoted]
    pick = own[-1] if own else len(boxes) - 1
    content, k = boxes[pick]
    for c, q in boxes[pick + 1:]:  # quotations after the verdict
        if q is not None and -1 <= q < n_steps and q != k:
            raise VerdictParseError(f"ambiguous verdict: \\boxed{{{content[:20]}}} then the solution's "
                                    f"answer \\boxed{{{c[:20]}}}")
    if k is None:
        raise VerdictParseError(f"verdict \\boxed{{{content[:40]}}} is not a step index")
    if not -1 <= k < n_steps:
        raise VerdictParseError(f"verdict index {k} is outside -1..{n_steps - 1} ({n_steps} steps)")
    return k


_LINE_CAP = 300  # characters of a line examined: bounds the work on adversarial replies
_LEAD = " \t>*#-•|"
_SEP = " \t*_:.)=|`'\"-\u2013\u2014"
_STEP_HEAD = re.compile(r"(?:[0-9]{1,3}[.)][ \t]+)?[*_]*(paragraph|step)[ \t_]?([0-9]{1,4})(?![0-9])", re.IGNORECASE)
_VERDICT_WORD = re.compile(r"(?<![A-Za-z0-9-])(incorrect|correct)(?![A-Za-z0-9-])", re.IGNORECASE)


def parse_step_verdicts(text: str, n_steps: int) -> list[bool]:
    """Per-step verdicts of a per-step reply: lines ``Paragraph k: correct|incorrect``.

    A verdict line starts with ``Paragraph k`` (or ``Step k``; when a reply uses both, only the
    ``Paragraph`` lines count), then separators, then the verdict word first (markdown bold, list
    numbers and table pipes are allowed). A step stated more than once counts with its last statement
    (the reply's final verdict). Each line is examined up to 300 characters, so parsing is linear.

    Args:
        text: the judge's reply.
        n_steps: M >= 1.

    Returns:
        M booleans, True for a correct step.

    Raises:
        VerdictParseError: no verdict line; a verdict line that also states the other verdict
            ("Paragraph 1: correct? No, incorrect"); a verdict for a step that does not exist; or
            verdicts for fewer than M steps (a count that differs from the step count is never read
            as verdicts).
    """
    found: dict[str, dict[int, bool]] = {"paragraph": {}, "step": {}}
    for line in text.splitlines():
        line = line[:_LINE_CAP].lstrip(_LEAD)
        head = _STEP_HEAD.match(line)
        if head is None or (len(head.group(2)) > 1 and head.group(2).startswith("0")):
            continue
        rest = line[head.end():].lstrip(_SEP)
        if rest[:3].lower() == "is ":
            rest = rest[3:].lstrip(_SEP)
        word = _VERDICT_WORD.match(rest)
        if word is None:
            continue
        k = int(head.group(2))
        if len({w.lower() for w in _VERDICT_WORD.findall(rest)}) > 1:
            raise VerdictParseError(f"ambiguous verdict for paragraph {k}: {rest[:60]!r}")
        found[head.group(1).lower()][k] = word.group(1).lower() == "correct"
    last = found["paragraph"] or found["step"]
    if not last:
        raise VerdictParseError("no verdict: no 'Paragraph k: correct/incorrect' line")
    return _one_per_step(last, n_steps, "verdict", "paragraph", "the solution has {n} steps")


def _one_per_step(found: dict, n_steps: int, what: str, unit: str, has: str) -> list:
    """``found[0..M-1]`` when ``found`` holds exactly the M step indices.

    Raises:
        VerdictParseError: an index past the last step, or a step with nothing found.
    """
    extra = sorted(k for k in found if k >= n_steps)
    if extra:
        raise VerdictParseError(f"{what} for {unit} {extra[0]} but {has.format(n=n_steps)}")
    if len(found) != n_steps:
        missing = [k for k in range(n_steps) if k not in found]
        raise VerdictParseError(f"{what}s for {len(found)} of {n_steps} {'steps' if unit == 'paragraph' else 'turns'} "
                                f"(missing {unit} {missing[0]})")
    return [found[k] for k in range(n_steps)]


_SCORE_SEP = re.compile("[ \t*_:.)=|`'\"\u2013\u2014\u2212-]*")
_SCORE = re.compile(r"(?:score[ \t]*(?:of|is|=|:)?[ \t]*)?[*_]*([-\u2212]?[0-9]{1,2}(?:\.[0-9]+)?)(?![0-9])[*_]*"
                    r"(?:[ \t]*(?:/|out[ \t]+of)[ \t]*([0-9]+(?:\.[0-9]+)?))?", re.IGNORECASE)
# What may follow a score on its line: nothing, or a delimiter before a comment ("7 - asks for the id",
# "7 (good)", "7. Good", "| 7 |"). A number, word, sign or exponent right after it ("7,5", "6-7", "6 or 3",
# "0.5e1", "7%", "2 tool calls were wrong") makes the line ambiguous.
_SCORE_END = re.compile(r"[*_]*(?:[.,;!]?[ \t]*$|[.,;!:]?[ \t]*[(\[|\u2013\u2014](?![ \t]*[0-9])"
                        r"|[.,;!:][ \t]+[^0-9 \t]|[ \t]+-[ \t]+[^0-9 \t])")


def _score_head(tags: tuple[str, ...]) -> re.Pattern:
    words = "|".join(re.escape(t) for t in tags)
    return re.compile(rf"(?:[0-9]{{1,3}}[.)][ \t]+)?[*_]*({words})[ \t_]?([0-9]{{1,4}})(?![0-9])", re.IGNORECASE)


def parse_step_scores(text: str, n_steps: int, scale: float = 10.0, tags: tuple[str, ...] = ("turn",)) -> list[float]:
    """Per-turn scores of a scored per-step reply: lines ``Turn k: score S`` with ``0 <= S <= scale``
    (also ``Turn k: S``, ``Turn k - S/10``, ``Turn k: S out of 10``; markdown bold, list numbers and table
    pipes allowed; after the score, a delimiter may start a comment: ``Turn 2: 7 - asks for the id``), the
    format of the ``judge-agent-step`` template (WebSTAR / StepRM-style 0-10 turn scores). A turn stated
    more than once counts with its last statement (the reply's final verdict). Each line is examined up to
    300 characters.

    ``tags`` are the words that start a score line (``turn``; a template with another ``step_tag`` adds
    its own): when a reply uses several, only the lines of the first one it uses count.

    A line that names a turn and then a number is a score statement and must be unambiguous: never a
    negative score read without its sign (``Turn 0: -3``), a range of turns (``Turn 0-2: 4``), a score on
    another scale (``4/5``, ``8 out of 100``), or a number followed by more number or words (``7,5``,
    ``6-7``, ``6 or 3``, ``2 tool calls failed``), all of which used to be read as a score. A line whose
    turn is followed by words (``Turn 1 was fine``) says nothing and is skipped.

    Args:
        text: the judge's reply.
        n_steps: M >= 1 turns.
        scale: the top of the score range.
        tags: the head words of a score line.

    Returns:
        M scores (floats in [0, scale]), turn 0 first.

    Raises:
        VerdictParseError: no score line; a score outside [0, scale] or on another scale; an ambiguous score
            line (above); a score for a turn that does not exist; or scores for fewer than M turns (never
            read as a verdict).
    """
    head_re = _score_head(tags)
    found: dict[str, dict[int, float]] = {t.lower(): {} for t in tags}
    for line in text.splitlines():
        line = line[:_LINE_CAP].lstrip(_LEAD)
        head = head_re.match(line)
        if head is None or (len(head.group(2)) > 1 and head.group(2).startswith("0")):
            continue
        k, rest = int(head.group(2)), line[head.end():]
        if re.match(r"[-\u2013\u2014\u2212][0-9]", rest):
            raise VerdictParseError(f"score line for a range of turns: {line.strip()[:60]!r}")
        sep = _SCORE_SEP.match(rest).group()
        body = rest[len(sep):]
        m = _SCORE.match(body)
        if m is None:
            continue
        number = m.group(1).replace("\u2212", "-")
        if len(sep) > 1 and sep[-1] in "-\u2212" and sep[-2] in " \t:=":  # "Turn 0: -3", "Turn 0 -3"
            number = "-" + number
        score = float(number)
        if not 0 <= score <= scale:
            raise VerdictParseError(f"score {number} for turn {k} is outside 0..{scale:g}")
        if m.group(2) is not None and float(m.group(2)) != scale:
            raise VerdictParseError(f"score {m.group(1)}/{m.group(2)} for turn {k} is not on the 0..{scale:g} scale")
        if not _SCORE_END.match(body, m.end()):
            raise VerdictParseError(f"ambiguous score for turn {k}: {line.strip()[:60]!r}")
        found[head.group(1).lower()][k] = score
    found_tag = next((f for f in found.values() if f), {})
    if not found_tag:
        raise VerdictParseError(f"no verdict: no '{tags[0].title()} k: score S' line")
    return _one_per_step(found_tag, n_steps, "score", "turn", "the conversation has {n} turns")


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
