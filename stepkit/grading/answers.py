"""Final-answer extraction from solutions and continuations (GSM8K, MATH, free-form model text).

Only *extraction* lives here; deciding whether an extracted answer is right is math-verify's job
(``stepkit.grading.verify``). Never compare answers by substring or exact string.
"""

from __future__ import annotations

import re

# GSM8K reference solutions end with "#### 18"; the GPT-3 example solutions end with "A: 18".
_HASHES = re.compile(r"####[ \t]*(?P<ans>[^\n]*)")
_A_LINE = re.compile(r"^[ \t]*A:[ \t]*(?P<ans>[^\n]*)", re.MULTILINE)
# "The answer is 18." / "the final answer is: $\frac12$" -- up to the end of the sentence or line.
# A period ends the sentence only when followed by whitespace or the end, so "2.5" stays whole.
_ANSWER_IS = re.compile(
    r"\bthe\s+(?:final\s+)?answer\s+is\b[ \t]*:?[ \t]*(?P<ans>.*?)(?=\.\s|\.$|\n|$)",
    re.IGNORECASE | re.DOTALL,
)
_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_CALC = re.compile(r"<<[^<>]*>>")
_PLAIN_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_PADDED_INTEGER = re.compile(r"-?0+\d+")
# A plain number followed only by unit words ("18 dollars", "5 cm"): words of 2+ letters, not "pi".
_NUMBER_UNITS = re.compile(r"(?P<num>-?[\d,]*\.?\d+)(?:\s+(?!pi\b)[A-Za-z]{2,})+", re.IGNORECASE)


def _boxes(text: str) -> list[tuple[int, str]]:
    r"""All ``\boxed{...}`` / ``\fbox{...}`` contents with balanced braces, as (start, content).

    An unclosed box (truncated generation) is ignored.
    """
    found = []
    for m in _BOX_START.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found.append((m.start(), text[m.end() : i - 1]))
    return found


def _clean(ans: str) -> str:
    """Normalize one captured answer: last box inside it, no ``$``/period wrapping, no thousands commas."""
    ans = ans.strip()
    boxes = _boxes(ans)
    if boxes:
        ans = boxes[-1][1].strip()
    ans = ans.rstrip(" .")
    if ans.startswith("\\$"):  # escaped currency sign
        ans = ans[2:]
    if ans.count("$") == 1 or (ans.count("$") == 2 and ans.startswith("$") and ans.endswith("$")):
        ans = ans.strip("$")  # currency "$18" or inline math "$\frac12$"
    if ans.startswith("\\(") and ans.endswith("\\)"):
        ans = ans[2:-2]
    ans = ans.strip().rstrip(" .")
    m = _NUMBER_UNITS.fullmatch(ans)
    if m:
        ans = m.group("num")
    if _PLAIN_NUMBER.fullmatch(ans):
        ans = ans.replace(",", "")
    if _PADDED_INTEGER.fullmatch(ans):  # AIME-style "004" -> "4"
        ans = str(int(ans))
    return ans


def extract_final_answer(text: str) -> str | None:
    r"""Extract the final answer of a solution or continuation.

    Patterns: GSM8K ``#### N``; ``A: N`` at a line start (GPT-3 GSM8K solutions); "the answer is N" /
    "the final answer is N" (case-insensitive, up to the end of the sentence or line); ``\boxed{...}`` and
    ``\fbox{...}`` with balanced braces. The occurrence that *starts last* in the text wins, across all
    patterns, so a repeated box (``\boxed{840} ... \boxed{840}``) gives ``840``, never a concatenation
    (math-verify issue fixed in 0.8.0, kept as case ``mv-multi-boxed-concatenation``).

    The answer is cleaned: box content taken if the captured sentence holds a box, trailing period and
    ``$`` stripped, a leading ``$``/``\$`` currency sign dropped, thousands separators removed from plain
    numbers ("1,000" -> "1000"), leading zeros dropped from integers ("004" -> "4"), trailing unit words
    after a plain number dropped ("18 dollars" -> "18"). LaTeX is kept as is.

    Args:
        text: solution or continuation text.
    Returns:
        The answer of the last non-empty occurrence, or None when there is none.
    """
    candidates = _boxes(text)
    for pattern in (_HASHES, _A_LINE, _ANSWER_IS):
        candidates += [(m.start(), m.group("ans")) for m in pattern.finditer(text)]
    for _, raw in sorted(candidates, key=lambda c: c[0], reverse=True):
        ans = _clean(raw)
        if ans:
            return ans
    return None


def strip_calculator_annotations(text: str) -> str:
    """Remove GSM8K calculator annotations: ``"16 - 3 = <<16-3=13>>13"`` -> ``"16 - 3 = 13"``."""
    return _CALC.sub("", text)


def extract_gsm8k_reference(answer_field: str) -> str:
    """The reference answer after ``####`` in a GSM8K ``answer`` field, thousands commas removed.

    Raises:
        ValueError: the field has no ``#### N`` line (or it is empty).
    """
    matches = list(_HASHES.finditer(answer_field))
    ans = _clean(matches[-1].group("ans")) if matches else ""
    if not ans:
        raise ValueError(f"no '#### <answer>' line in GSM8K answer field: {answer_field[-80:]!r}")
    return ans
