"""Splitting solutions into steps, rendering step prefixes, and reading Math-Shepherd step tags.

Steps are split **once** and kept as a list end to end (design.md, "Record schema"); the separator they
were joined with in the original text is recorded beside them (``step_separator``) and used to render
prefixes, because a step may itself contain newlines.
"""

from __future__ import annotations

import re

_STEP_MARKER = re.compile(r"\bStep\s+\d+\s*:")
_STEP_ONE = re.compile(r"\bStep\s+1\s*:")
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_MODE_SEPARATORS = {"newline": "\n", "blank": "\n\n", "step": "\n"}


def split_steps(text: str, mode: str = "auto") -> tuple[list[str], str]:
    r"""Split a solution into steps; returns ``(steps, step_separator)``.

    Modes:
        ``newline``: one step per non-empty line (separator ``"\n"``).
        ``blank``: paragraphs separated by blank lines (separator ``"\n\n"``).
        ``step``: a new step at each ``Step k:`` marker, which stays in its step (separator ``"\n"``);
        text before the first marker is kept as a step.
        ``auto``: ``step`` if the text has ``Step 1:`` and ``Step 2:``, else ``blank`` if it has a blank
        line, else ``newline``.
        any other string: a regular expression matching the separators (recorded as ``"\n"``).
    Steps are stripped of surrounding whitespace; empty steps are dropped.

    Raises:
        ValueError: ``mode`` is not a known mode and not a valid regular expression.
    """
    text = text.replace("\r\n", "\n")
    if mode == "auto":
        if re.search(r"\bStep\s+1\s*:", text) and re.search(r"\bStep\s+2\s*:", text):
            mode = "step"
        elif _BLANK_LINE.search(text):
            mode = "blank"
        else:
            mode = "newline"
    if mode == "newline":
        parts = text.split("\n")
    elif mode == "blank":
        parts = _BLANK_LINE.split(text)
    elif mode == "step":
        starts = [m.start() for m in _STEP_MARKER.finditer(text)]
        parts = [text[i:j] for i, j in zip([0, *starts], [*starts, len(text)])]
    else:
        try:
            pattern = re.compile(mode)
        except (re.error, OverflowError, RecursionError) as e:
            raise ValueError(f"step split mode {mode[:60]!r} is neither a known mode nor a valid regex: {e}") from None
        if pattern.fullmatch(""):
            raise ValueError(f"step split regex {mode[:60]!r} matches the empty string (it would split between "
                             "every character); give a separator that consumes text, or a lookahead such as "
                             "'(?=Step )'")
        parts = pattern.split(text)
    steps = [p.strip() for p in parts if p and p.strip()]
    return steps, _MODE_SEPARATORS.get(mode, "\n")


def check_split(mode: str, option: str = "--split") -> str:
    """``mode`` if :func:`split_steps` accepts it (a known mode, or a regex that consumes text).

    Raises:
        ConfigError: naming ``option``, with why the mode cannot split.
    """
    from stepkit.errors import ConfigError

    try:
        split_steps("a\nb", mode)
    except ValueError as e:
        raise ConfigError(f"{option}: {e}") from None
    return mode


def join_steps(steps: list[str], separator: str) -> str:
    """Join steps with their recorded separator."""
    return separator.join(steps)


def render_prefix(steps: list[str], separator: str, i: int) -> str:
    """The first ``i`` steps joined with ``separator``, followed by ``separator`` when ``i > 0`` (so the
    model continues with a new step); ``""`` when ``i == 0``.

    Raises:
        ValueError: ``i`` is outside ``0..len(steps)``.
    """
    if not 0 <= i <= len(steps):
        raise ValueError(f"prefix length {i} outside 0..{len(steps)}")
    return separator.join(steps[:i]) + separator if i else ""


def split_joined(text: str, separator: str, expected: int) -> list[str]:
    """Split a separator-joined string back into its steps, checking the count.

    A step that contains the separator makes the split ambiguous (case ``step-join-newline-roundtrip``:
    two steps joined with ``"\\n"``, one holding a newline, split back into three).

    Raises:
        ValueError: the split does not give exactly ``expected`` parts.
    """
    parts = text.split(separator)
    if len(parts) != expected:
        raise ValueError(
            f"splitting on {separator!r} gives {len(parts)} steps, expected {expected}: "
            "a step contains the separator; keep steps as a list"
        )
    return parts


def parse_tagged_steps(input_text: str, label_text: str, tag: str = "ки") -> tuple[str, list[str], list[str]]:
    """Read a Math-Shepherd row: ``input`` ends every step with ``tag``; ``label`` is the same text with
    each tag replaced by one ``+``/``-`` character. Returns ``(problem_text, steps, labels)``.

    The k-th tag (0-based) at input offset ``p`` holds its label at ``p - k * (len(tag) - 1)`` in the label
    text (case ``math-shepherd-label-extraction``); keeping every ``+``/``-`` character instead also picks
    up arithmetic signs. The problem is the text before ``Step 1:``, which must occur exactly once before
    the first tag.

    Raises:
        ValueError: no tag; label text not equal to the input with tags replaced by labels; a label that
        is not ``+``/``-``; a tag before ``Step 1:`` (a stray tag in the problem makes alignment
        ambiguous, so the row is rejected rather than shifted); no ``Step 1:`` before the first tag, or
        more than one (the problem text itself contains "Step 1:", so where the steps begin is
        ambiguous); an empty step; text after the last tag.
    """
    positions = [m.start() for m in re.finditer(re.escape(tag), input_text)]
    if not positions:
        raise ValueError(f"no step tag {tag!r} in input text")
    shrink = len(tag) - 1
    if len(label_text) != len(input_text) - shrink * len(positions):
        raise ValueError(f"label text length {len(label_text)} does not match input with {len(positions)} tags")
    labels = [label_text[p - k * shrink] for k, p in enumerate(positions)]
    bad = [lab for lab in labels if lab not in "+-"]
    if bad:
        raise ValueError(f"step labels must be '+' or '-', got {bad!r}")
    rebuilt = input_text
    for lab in labels:
        rebuilt = rebuilt.replace(tag, lab, 1)
    if rebuilt != label_text:
        raise ValueError("label text is not the input text with each step tag replaced by its label")
    firsts = [m.start() for m in _STEP_ONE.finditer(input_text, 0, positions[0])]
    if not firsts:
        if _STEP_ONE.search(input_text):
            raise ValueError(f"step tag {tag!r} inside the problem text (before 'Step 1:'): ambiguous alignment")
        raise ValueError("no 'Step 1:' before the first step tag: cannot tell where the steps begin")
    if len(firsts) > 1:
        raise ValueError(
            f"'Step 1:' occurs {len(firsts)} times before the first step tag (the problem text contains it): "
            "cannot tell where the steps begin"
        )
    first = firsts[0]
    chunks = input_text[first:].split(tag)
    if chunks[-1].strip():
        raise ValueError(f"text after the last step tag: {chunks[-1].strip()[:60]!r}")
    steps = [c.strip() for c in chunks[:-1]]
    if not all(steps):
        raise ValueError("empty step between two step tags")
    return input_text[:first].strip(), steps, labels


def shepherd_labels_to_bool(labels: list[str]) -> list[bool]:
    """Math-Shepherd ``+``/``-`` labels to hard labels (``+`` -> True), as TRL's converter does.

    Raises:
        ValueError: a label other than ``+``/``-``.
    """
    if any(lab not in ("+", "-") for lab in labels):
        raise ValueError(f"step labels must be '+' or '-', got {labels!r}")
    return [lab == "+" for lab in labels]
