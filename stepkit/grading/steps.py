"""Splitting solutions into steps, rendering step prefixes, and reading Math-Shepherd step tags.

Steps are split **once** and kept as a list end to end (design.md, "Record schema"); the separator they
were joined with in the original text is recorded beside them (``step_separator``) and used to render
prefixes, because a step may itself contain newlines.

A split never cuts a display-math block or a code block (``math_and_code_blocks``): a blank line inside
``\\begin{align} ... \\end{align}`` or a fenced code block is part of its step, in every split mode.
"""

from __future__ import annotations

import re
from bisect import bisect_right

_STEP_MARKER = re.compile(r"\bStep\s+(\d+)\s*:")
_STEP_ONE = re.compile(r"\bStep\s+1\s*:")
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_NEWLINE = re.compile(r"\n")
_MODE_SEPARATORS = {"newline": "\n", "blank": "\n\n", "step": "\n"}
# What math_and_code_blocks reads, in one left-to-right pass. "\\" and "\$" are consumed first, so in
# "\\[2pt]" (a LaTeX line break) and "\$$" (an escaped dollar) no delimiter is seen.
_BLOCK_TOKEN = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)$"  # a code fence line
    r"|\\\\|\\\$"  # an escaped backslash or dollar
    r"|(?P<math>\\\[|\\\]|\$\$?)"  # display math \[ \], $$ (or a $ of inline math)
    r"|\\(?P<env>begin|end)[ \t]*\{(?P<name>[^{}\n]*)\}"  # an environment's start or end
    r"|\n",  # a line end (inline $...$ math ends with its line)
    re.MULTILINE,
)


def math_and_code_blocks(text: str) -> list[tuple[int, int]]:
    r"""The ``(start, end)`` character spans of the display-math and code blocks of ``text``, sorted and
    disjoint: the places a step split must not cut.

    Blocks:
        * display math ``\[ ... \]`` and ``$$ ... $$`` (TeX/LaTeX display delimiters), with ``$$``
          read as TeX does: inside inline math (``$x,$$y,$``) it closes one ``$...$`` and opens the next,
          so it starts display math only outside inline math; inline math ends at the end of its line;
        * an environment ``\begin{name} ... \end{name}`` (any name, nested ones paired by name:
          ``align``, ``cases`` inside ``align``, ``pmatrix``, ...);
        * a fenced code block (CommonMark 0.31, "Fenced code blocks"): a line of at least three backticks
          or tildes (backtick fences take no backtick in their info string) up to a line of at least as
          many of the same character and nothing else. Unlike CommonMark, a fence may be indented by any
          amount (fences in list items of model output).

    Inside a block nothing else is read (a ``$$`` in a code block is code). An opening delimiter with no
    closing one (a truncated generation) is text, as MathJax treats an unmatched delimiter, and so is a
    ``\[`` followed by another ``\[`` before any ``\]`` (TeX allows no display inside display: the
    first was left open, as in ProcessBench ``math-85``); an unclosed code fence runs to the end of the
    text, as in CommonMark. Escaped ``\$`` and ``\\[`` (a line break)
    are not delimiters. One pass over the text: linear time, also for adversarial input.
    """
    tokens = list(_BLOCK_TOKEN.finditer(text))
    closers: dict[str, list[int]] = {"\\[": [], "\\]": [], "$$": []}  # token indices of each, for the next one
    env_end: dict[int, int] = {}  # \begin token index -> its \end token index
    open_envs: dict[str, list[int]] = {}
    for k, m in enumerate(tokens):
        if m.group("math") in closers:
            closers[m.group("math")].append(k)
        elif m.group("env") == "begin":
            open_envs.setdefault(m.group("name"), []).append(k)
        elif m.group("env") == "end" and open_envs.get(m.group("name")):
            env_end[open_envs[m.group("name")].pop()] = k

    def next_closer(delim: str, k: int) -> int | None:
        at = closers[delim]
        j = bisect_right(at, k)
        return at[j] if j < len(at) else None

    spans: list[tuple[int, int]] = []
    inline = False  # inside $...$ math
    k = 0
    while k < len(tokens):
        m = tokens[k]
        close: int | None = None
        if m.group("fence"):
            fence, info = m.group("fence"), m.group("info")
            if fence[0] != "`" or "`" not in info:
                j = k + 1
                while j < len(tokens) and close is None:
                    f = tokens[j].group("fence")
                    if f and f[0] == fence[0] and len(f) >= len(fence) and not tokens[j].group("info").strip():
                        close = j
                    j += 1
                if close is None:  # an unclosed fence holds the rest of the text
                    spans.append((m.start(), len(text)))
                    break
        elif m.group("math") == "\\[":
            close = next_closer("\\]", k)
            reopened = next_closer("\\[", k)
            if close is not None and reopened is not None and reopened < close:
                close = None  # "\[" inside display math is not TeX: this one was left open
        elif m.group("math") == "$$" and not inline:
            close = next_closer("$$", k)
        elif m.group("math") == "$":
            inline = not inline
        elif m.group("env") == "begin":
            close = env_end.get(k)
        elif m.group() == "\n":
            inline = False
        if close is None:
            k += 1
        else:
            spans.append((m.start(), tokens[close].end()))
            inline, k = False, close + 1
    return spans


def _outside(matches, spans: list[tuple[int, int]]) -> list[re.Match]:
    """The separator matches (in text order) that do not cut into a block span: a match that only touches
    a span's edge is kept; a zero-width match (a lookahead) strictly inside a span is dropped."""
    kept, j = [], 0
    for m in matches:
        start, end = m.span()
        while j < len(spans) and spans[j][1] <= start:  # spans ending before this match cannot be cut
            j += 1
        if j < len(spans) and (end > spans[j][0] if end > start else start > spans[j][0]):
            continue
        kept.append(m)
    return kept


def _between(text: str, cuts: list[re.Match]) -> list[str]:
    """The pieces of ``text`` between the separator matches ``cuts`` (in order)."""
    parts, prev = [], 0
    for m in cuts:
        parts.append(text[prev:m.start()])
        prev = m.end()
    parts.append(text[prev:])
    return parts


def split_steps(text: str, mode: str = "auto") -> tuple[list[str], str]:
    r"""Split a solution into steps; returns ``(steps, step_separator)``.

    Modes:
        ``newline``: one step per non-empty line (separator ``"\n"``).
        ``blank``: paragraphs separated by blank lines (separator ``"\n\n"``).
        ``step``: a new step at each ``Step k:`` marker, which stays in its step (separator ``"\n"``);
        text before the first marker is kept as a step.
        ``auto``: ``step`` if the text has ``Step 1:`` and ``Step 2:``, else ``blank`` if it has a blank
        line, else ``newline`` (markers and blank lines inside blocks do not count).
        any other string: a regular expression matching the separators (recorded as ``"\n"``); what it
        matches is dropped, its capture groups too.

    In every mode, a separator inside a display-math or code block (``math_and_code_blocks``:
    ``\[ ... \]``, ``$$ ... $$``, ``\begin{env} ... \end{env}``, a fenced code block) does not split:
    the block stays whole in one step, blank lines and all. Steps are stripped of surrounding whitespace;
    empty and whitespace-only pieces are dropped, never steps.

    The contract with ``step_separator``: every step is a piece of the text, byte for byte (after CRLF ->
    LF); ``join_steps(steps, sep)`` is the text in normalised form, where each separator with the
    whitespace around it is replaced by ``sep`` and whitespace at the ends is dropped, and
    ``render_prefix`` renders the prefixes of that form. The text comes back exactly when its steps
    were already separated by ``sep`` alone.

    Linear in the length of the text for the built-in modes.

    Raises:
        ValueError: ``mode`` is not a known mode and not a valid regular expression, or a regular
        expression that matches the empty string.
    """
    text = text.replace("\r\n", "\n")
    blocks = math_and_code_blocks(text)
    markers = None
    if mode == "auto":
        markers = _outside(_STEP_MARKER.finditer(text), blocks)
        numbers = {m.group(1) for m in markers}
        if "1" in numbers and "2" in numbers:
            mode = "step"
        elif _outside(_BLANK_LINE.finditer(text), blocks):
            mode = "blank"
        else:
            mode = "newline"
    if mode == "newline":
        parts = _between(text, _outside(_NEWLINE.finditer(text), blocks))
    elif mode == "blank":
        parts = _between(text, _outside(_BLANK_LINE.finditer(text), blocks))
    elif mode == "step":
        markers = _outside(_STEP_MARKER.finditer(text), blocks) if markers is None else markers
        starts = [m.start() for m in markers]
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
        parts = _between(text, _outside(pattern.finditer(text), blocks))
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
