"""Final-answer extraction from solutions and continuations (GSM8K, MATH, free-form model text).

Only *extraction* lives here; deciding whether an extracted answer is right is math-verify's job
(``stepkit.grading.verify``). Never compare answers by substring or exact string.

Extraction runs in the caller's process with no timeout, so every step is linear in the length of the
text: boxes are found in one pass over the braces, answer phrases are read by a bounded scanner, no
regular expression here can backtrack quadratically, and only the last ``TAIL_CHARS`` characters of a
very long text are read (answers are at the end).
"""

from __future__ import annotations

import re

# Only this many trailing characters of a text are searched for its final answer. Answers are at the
# end, and the cap bounds the work on adversarial text (1 MB of unclosed "\boxed{" or digits).
TAIL_CHARS = 16_384
# An answer phrase ("The answer is ...") is read for at most this many characters.
_MAX_PHRASE = 1_000

# Where an answer phrase starts; the answer itself is read by ``_phrase`` from the match end.
# GSM8K reference solutions end with "#### 18"; the GPT-3 example solutions end with "A: 18".
_HASHES = re.compile(r"####")
_A_LINE = re.compile(r"^[ \t]*A:", re.MULTILINE)
# "The answer is 18", "the final answer is: ...", "The correct answer is ...", "Final answer is ..."
_ANSWER_IS = re.compile(
    r"\b(?:the\s+(?:final\s+|correct\s+)?|final\s+)answer[*_]*\s+is\b[*_]*[ \t]*:?", re.IGNORECASE
)
# A phrase starting with one of these words judges an answer ("the answer is correct") and states none.
_VERDICT = re.compile(
    r"(?:correct|incorrect|right|wrong|indeed|not|also|still|consistent|reasonable|valid|invalid|verified|"
    r"confirmed|as\s+follows|below|above|given|clear|obvious|unknown)\b",
    re.IGNORECASE,
)
# "Answer: 18", "Final answer: 18", "**Final Answer:** 18", "**Answer**: 18" -- as a label that starts a
# line or a sentence ("We may check our answer: ..." is not one).
_ANSWER_COLON = re.compile(
    r"(?:^|(?<=[.!?][ \t]))[ \t>#*_]*(?:final[ \t]+)?answer[*_]*[ \t]*:", re.IGNORECASE | re.MULTILINE
)
_PATTERNS = (_HASHES, _A_LINE, _ANSWER_IS, _ANSWER_COLON)

# One pass over box openings and (unescaped) braces.
_BRACE_TOKEN = re.compile(r"\\(?:boxed|fbox)\s*\{|(?<!\\)[{}]")
_CALC = re.compile(r"<<[^<>]*>>")
_PLAIN_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
# A plain number followed only by unit words ("18 dollars", "5 cm"): words of 2+ letters, not "pi".
# The number part has one way to match (no nested digit quantifiers), so a failing match is linear.
_NUMBER_UNITS = re.compile(r"(?P<num>-?(?:\d[\d,]*)?(?:\.\d+)?)(?:\s+(?!pi\b)[A-Za-z]{2,})+", re.IGNORECASE)
# Words that are mathematics inside an answer phrase, not prose ending it.
_MATH_WORDS = frozenset({"pi", "infinity", "inf", "sqrt", "mod", "and", "or"})
# After a comma or a top-level "and"/"or", what continues a list of answers ("1331 and 1728", "3, 4").
_LIST_CONTINUES = re.compile(r"[ \t]*(?:-|\+|\$|\\|\(|\[|\{|\d|(?!I\b)[A-Za-z](?![A-Za-z]))")
# A number as a sentence writes it: "18", "-3", "1,250", "7.00" (not a digit of a word: "5th", "x2").
_NUMBER = re.compile(r"(?<![\w.,])(?:-(?=\d))?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")
# A number stated as a result: right after "=" (through "$", "\$", "\(", emphasis).
_RESULT = re.compile(r"=[ \t]*(?:\\\(|\\\[|\\?\$|[*_]{1,2})*[ \t]*((?:-(?=\d))?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)")
# A trailing unit in LaTeX ("40 \text{ cubic inches}", "5 \mbox{cm}^2"): letters only.
_LATEX_UNIT = re.compile(r"\\(?:text|mbox|mathrm)\s*\{[^{}\d]*\}(?:\^\{?\d\}?)?\s*$")
# Mathematics in an answer: a LaTeX command (not the escaped currency sign "\$"), an operator, a brace.
_MATH_SIGN = re.compile(r"\\(?!\$)|[\^=+*/<>|_{}]")
# A prose word in an answer: three or more letters.
_PROSE_WORD = re.compile(r"(?<![A-Za-z])[A-Za-z]{3,}")
_DIGITS = re.compile(r"\d")
# A span in bold, "**12 tomatoes**" (what a concluding sentence emphasises is its result).
_BOLD = re.compile(r"\*\*([^*\n]{1,200})\*\*")
# How far back the concluding statement of a text without an answer phrase is looked for.
_STATEMENT_CHARS = 2_000


def find_boxes(text: str) -> list[tuple[int, int, int, bool]]:
    r"""All ``\boxed{...}`` / ``\fbox{...}`` with balanced braces, sorted by start, as
    (start, content start, content end, holds another box).

    One pass with a stack of open braces (escaped ``\{``/``\}`` are not counted), so nested or repeated
    boxes cost linear time. An unclosed box (truncated generation) is ignored; a stray ``}`` closes
    nothing.
    """
    found = []
    stack: list[list] = []  # [box start or -1 for a plain brace, content start, holds a box]
    for m in _BRACE_TOKEN.finditer(text):
        if m.group() == "}":
            if stack:
                start, content, inner = stack.pop()
                if start >= 0:
                    found.append((start, content, m.start(), inner))
                if stack and (start >= 0 or inner):
                    stack[-1][2] = True
        else:
            stack.append([m.start() if m.group() != "{" else -1, m.end(), False])
    found.sort()
    return found


def _skip_markup(text: str, i: int, end: int) -> int:
    """Index after spaces, tabs and markdown emphasis (``*``, ``_``) starting at ``i``."""
    while i < end and text[i] in " \t*_":
        i += 1
    return i


def _sentence_end(text: str, i: int, end: int) -> bool:
    """``text[i]`` is ``.``/``?``/``!`` that ends a sentence: followed (after emphasis) by space or end."""
    j = i + 1
    while j < end and text[j] in "*_":
        j += 1
    if j >= end or text[j] in " \t\r\n":
        if text[i] != "!":
            return True
        # "5!" is a factorial; "18! I hope it helps" ends a sentence.
        k = _skip_markup(text, j, end)
        return k < end and text[k].isupper()
    return False


def _phrase(text: str, i: int, bound: int | None = None) -> str:
    r"""The answer written from ``text[i]`` on, up to the end of its clause.

    The rule: an answer is one mathematical phrase, so it ends at the first *clause boundary* that is at
    the top level (outside ``$...$``, ``\(...\)``, ``\[...\]`` and outside ``{}``, ``()``, ``[]``):
    a newline; a sentence end (``.``, ``?`` or ``!`` before a space or the end, so ``2.5`` stays
    whole); ``;``; a comma that is not followed by another list item (``$18$, not $20$`` ends, ``3, 4``
    does not); an opening parenthesis after a space once the answer has begun (``7 (since 9*2=18)``,
    ``18 (dollars)``); and, once the answer holds mathematics (a digit, ``$``, ``\``), the first prose
    word of two or more letters (``20 because ...``, ``18 dollars``, ``\frac12 of the pizza``), except
    ``pi``/``infinity``/``mod`` and ``and``/``or`` between list items. An answer that begins with a word
    ("The answer is Devon.") is read to the end of its sentence.
    """
    end = min(len(text) if bound is None else bound, i + _MAX_PHRASE)
    i = _skip_markup(text, i, end)
    start = i
    math = None  # closing delimiter of the math mode we are in: "$", "$$", "\\)", "\\]"
    depth = 0  # {} () [] nesting outside math
    has_math = False  # the answer so far holds a digit, a math delimiter or a LaTeX command
    operand = False  # the last token ends an operand (digit, letter, closing bracket or delimiter)
    while i < end:
        c = text[i]
        if math is not None:
            if c == "\n" and math in ("$", "\\)"):
                break
            if text.startswith(math, i) and (math[0] != "$" or text[i - 1] != "\\"):
                i += len(math)
                math, operand = None, True
                continue
            i += 1
            continue
        if c == "\\" and i + 1 < end:
            nxt = text[i + 1]
            if nxt in "([":
                math, has_math = ("\\)" if nxt == "(" else "\\]"), True
                i += 2
                continue
            has_math, operand = True, False
            i += 2 if not nxt.isalpha() else 1
            while i < end and text[i].isalpha():  # a command name is not a prose word
                i += 1
            continue
        if c == "$":
            delim = "$$" if text.startswith("$$", i) else "$"
            # A "$" with no partner on its line is a currency sign, not math.
            line_end = text.find("\n", i + len(delim), end)
            if text.find(delim, i + len(delim), end if line_end < 0 else line_end) >= 0:
                math, has_math = delim, True
                i += len(delim)
                continue
            i += 1
            continue
        if c in "\r\n":
            break
        if c in " \t":
            i += 1
            continue
        spaced = text[i - 1] in " \t"
        if c in "{([":
            if c == "(" and depth == 0 and spaced and operand and has_math:
                break  # "7 (since 9 * 2 = 18)", "18 (dollars)"
            depth += 1
            operand = False
        elif c in "})]":
            depth = max(0, depth - 1)
            operand = True
        elif c.isalpha():
            j = i
            while j < end and text[j].isalpha():
                j += 1
            word = text[i:j].lower()
            if depth == 0 and has_math and spaced and operand and j - i >= 2 and word not in _MATH_WORDS:
                break  # "20 because ...", "$18$ dollars", "\\frac12 of the pizza"
            if depth == 0 and word in ("and", "or") and has_math and not _LIST_CONTINUES.match(text, j):
                break
            i, operand = j, word not in ("and", "or")
            continue
        elif depth == 0 and c == ";":
            break
        elif depth == 0 and c in ".?!" and _sentence_end(text, i, end):
            break
        elif depth == 0 and c == "," and not _LIST_CONTINUES.match(text, i + 1):
            break  # "$18$, not $20$", "18, so ..."
        elif c.isdigit():
            has_math = operand = True
        elif c not in "*_":  # markdown emphasis (or a subscript mark) after an operand keeps it one
            operand = False
        i += 1
    return text[start:i]


def _clean(ans: str) -> str:
    """Normalize one captured answer: last box inside it, no ``$``/period/emphasis wrapping, no thousands
    commas, no leading zeros."""
    ans = ans.strip().strip("*_").strip()
    boxes = find_boxes(ans)
    if boxes:  # the last box inside the phrase (the innermost, when boxes are nested)
        _, a, b, _ = boxes[-1]
        ans = ans[a:b].strip()
    ans = ans.rstrip(" .")
    if ans.startswith("\\$"):  # escaped currency sign
        ans = ans[2:]
    if ans.count("$") == 1 or (ans.count("$") == 2 and ans.startswith("$") and ans.endswith("$")):
        ans = ans.strip("$")  # currency "$18" or inline math "$\frac12$"
    if ans.startswith("\\(") and ans.endswith("\\)"):
        ans = ans[2:-2]
    ans = ans.strip().rstrip(" .").strip("*_").strip()
    if ans.startswith("\\") and ans[1:2].isdigit():  # "\15": a currency sign whose "$" was lost
        ans = ans[1:]
    m = _NUMBER_UNITS.fullmatch(ans)
    if m and m.group("num").lstrip("-"):
        ans = m.group("num")
    unit = _LATEX_UNIT.search(ans)
    if unit and _NUMBER.fullmatch(ans[: unit.start()].rstrip()):  # "40 \text{ cubic inches}"
        ans = ans[: unit.start()].rstrip()
    ans = _sentence_number(ans)
    if _PLAIN_NUMBER.fullmatch(ans):
        ans = ans.replace(",", "")
    digits = ans.lstrip("-")
    if len(digits) > 1 and digits.isdigit() and digits.isascii() and digits[0] == "0":  # AIME "004" -> "4"
        ans = ans[: len(ans) - len(digits)] + (digits.lstrip("0") or "0")
    return ans


def _sentence_number(ans: str) -> str:
    """The number of an answer written as a sentence around it ("Verna received $7.00 in change" ->
    ``7.00``): a word of three letters or more (not ``inf``, ``and``, ...), exactly one number, and no
    mathematics (no LaTeX command, operator or brace: ``x^2 + xy`` and ``5 \\sqrt{2} units`` stay).
    Any other answer is returned unchanged ("4 blue boxes and 6 red boxes" has two numbers)."""
    if _MATH_SIGN.search(ans) or not any(w.lower() not in _MATH_WORDS for w in _PROSE_WORD.findall(ans)):
        return ans
    numbers = _NUMBER.findall(ans)
    if len(numbers) != 1 or len(_DIGITS.findall(ans)) != len(_DIGITS.findall(numbers[0])):
        return ans
    return numbers[0].replace(",", "")


def _math_segments(text: str, start: int, end: int) -> tuple[int, list[tuple[int, int, int, int]]]:
    r"""One pass over ``text[start:end]`` tracking math mode (``$``, ``$$``, ``\(``, ``\[``; a ``$`` with no
    partner on its line is a currency sign, as in ``_phrase``). Returns where the last sentence starts (after
    the last top-level line break, sentence end or display math block that is not the text's own end) and
    the math segments as (open, content start, content end, close end)."""
    sentence, segments, i = start, [], start
    while i < end:
        c = text[i]
        if c == "\\" and i + 1 < end:
            if text[i + 1] in "([":
                closer = "\\)" if text[i + 1] == "(" else "\\]"
                close = text.find(closer, i + 2, end)
                if close < 0:
                    return sentence, segments
                segments.append((i, i + 2, close, close + 2))
                i = close + 2
                if closer == "\\]" and _skip_markup(text, i, end) < end:  # display math ends a sentence
                    sentence = i
            else:
                i += 2
            continue
        if c == "$":
            delim = "$$" if text.startswith("$$", i) else "$"
            line_end = text.find("\n", i + len(delim), end)
            close = text.find(delim, i + len(delim), end if line_end < 0 or delim == "$$" else line_end)
            while close > 0 and text[close - 1] == "\\":  # an escaped "\$" closes nothing
                close = text.find(delim, close + 1, end if line_end < 0 or delim == "$$" else line_end)
            if close >= 0:
                segments.append((i, i + len(delim), close, close + len(delim)))
                i = close + len(delim)
                if delim == "$$" and _skip_markup(text, i, end) < end:  # display math ends a sentence
                    sentence = i
                continue
        elif c in "\r\n" or (c in ".!?" and _sentence_end(text, i, end)):
            if _skip_markup(text, i + 1, end) < end:  # the text's own final period ends no sentence before it
                sentence = i + 1
        i += 1
    return sentence, segments


def _concluding_statement(text: str) -> str:
    r"""The result stated by the last sentence of a text that has no answer phrase or box, or "".

    ProcessBench's and other model solutions often end with a sentence such as "Therefore, the rope is 20
    centimeters long." or "Thus, \( b = 3 \)." The last sentence is read when it is a complete statement
    (it ends with ``.``/``!`` or a closing math delimiter, not ``?``) and states one result:

    * it ends with math holding an equation: the right-hand side of its last ``=`` (``b = 3`` -> ``3``,
      ``20 \times 2 = 40 \text{ inches}`` -> ``40``);
    * else the one span it sets in bold (``**12 tomatoes**`` -> ``12``, ``facing **west**`` -> ``west``);
    * else the one number it holds (``$8``, ``20 centimeters``, ``\(\$440\)``); with several, the one
      the text states as a result (after an ``=``) when exactly one is ("34 hours ... in 4 weeks", after
      "= 34 \text{ hours}").

    Anything else (no number, several candidates, a question, a cut-off sentence) states no answer.
    Only the last ``_STATEMENT_CHARS`` characters are read, from a paragraph or line start.
    """
    end = len(text.rstrip())
    if end == 0:
        return ""
    start = max(0, end - _STATEMENT_CHARS)
    if start:
        cut = text.find("\n\n", start, end)
        cut = cut if cut >= 0 else text.find("\n", start, end)
        start = cut + 1 if cut >= 0 else start
    sentence, segments = _math_segments(text, start, end)
    tail = text[sentence:end].rstrip("*_ \t")
    if not tail or not (tail[-1] in ".!" or tail.endswith(("$", "\\)", "\\]"))):
        return ""
    segments = [seg for seg in segments if seg[0] >= sentence]
    if segments and not text[segments[-1][3]:end].strip(" \t*_.!"):
        content = text[segments[-1][1]:segments[-1][2]]
        parts = _top_level_split(content, "=")
        if len(parts) > 1 and parts[-1].strip():
            return _clean(parts[-1])
    bold = _BOLD.findall(text, sentence, end)
    if len(bold) == 1 and _clean(bold[0]):
        return _clean(bold[0])
    values = {}
    for m in _NUMBER.finditer(text, sentence, end):
        values.setdefault(m.group().replace(",", "").rstrip("0").rstrip(".") if "." in m.group()
                          else m.group().replace(",", ""), m.group().replace(",", ""))
    if len(values) > 1:
        stated = {m.group(1).replace(",", "") for m in _RESULT.finditer(text, start, sentence)}
        values = {k: v for k, v in values.items() if v in stated}
    return next(iter(values.values())) if len(values) == 1 else ""


def _top_level_split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside braces."""
    parts, depth, last = [], 0, 0
    for i, c in enumerate(text):
        if c == "{":
            depth += 1
        elif c == "}":
            depth = max(0, depth - 1)
        elif c == sep and depth == 0 and text[i - 1 : i] not in ("<", ">", "!", "\\"):
            parts.append(text[last:i])
            last = i + 1
    return parts + [text[last:]]


def _tail(text: str) -> str:
    """The last ``TAIL_CHARS`` characters of ``text``, from a line start when one is near the cut."""
    if len(text) <= TAIL_CHARS:
        return text
    tail = text[-TAIL_CHARS:]
    nl = tail.find("\n", 0, 1024)
    return tail[nl + 1 :] if nl >= 0 else tail


def extract_final_answer(text: str) -> str | None:
    r"""Extract the final answer of a solution or continuation.

    Patterns: GSM8K ``#### N``; ``A: N`` at a line start (GPT-3 GSM8K solutions); "the answer is N" /
    "the final answer is: N"; "Answer: N" / "Final answer: N" (case-insensitive; markdown emphasis such as
    ``**Final Answer:** 18`` or ``The answer is **18**.`` is ignored); ``\boxed{...}`` and ``\fbox{...}``
    with balanced braces. The occurrence that *starts last* in the text wins, across all patterns, so a
    repeated box (``\boxed{840} ... \boxed{840}``) gives ``840``, never a concatenation (math-verify issue
    fixed in 0.8.0, kept as case ``mv-multi-boxed-concatenation``).

    A phrase pattern reads only its answer, up to the end of the answer's clause (see ``_phrase``):
    "The answer is 20 because 2+16=18." gives ``20``, "The answer is $18$, not $20$." gives ``18``,
    "The answer is 18 (dollars)." gives ``18``.

    The answer is cleaned: box content taken if the captured phrase holds a box, trailing period and
    ``$`` stripped, a leading ``$``/``\$`` currency sign dropped, thousands separators removed from plain
    numbers ("1,000" -> "1000"), leading zeros dropped from integers ("004" -> "4"), trailing unit words
    after a plain number dropped ("18 dollars" -> "18", "40 \text{ inches}" -> "40"), an answer written as
    a sentence around one number reduced to it ("Verna received $7.00 in change" -> "7.00"), a backslash
    before a digit dropped ("\15", a currency sign that lost its "$"). LaTeX is kept as is.

    A text with none of these patterns gives the result its last sentence states, when it states one
    (``_concluding_statement``: "Therefore, the rope is 20 centimeters long." -> ``20``).

    Only the last ``TAIL_CHARS`` characters are searched; the work is linear in their length.

    Args:
        text: solution or continuation text.
    Returns:
        The answer of the last non-empty occurrence, or None when there is none.
    """
    text = _tail(text)
    # (start, content start, content end or -1 for a phrase, holds another box)
    candidates = find_boxes(text)
    for pattern in _PATTERNS:
        candidates += [(m.start(), m.end(), -1, False) for m in pattern.finditer(text)]
    bound = len(text)  # a phrase ends where the next candidate starts, so all phrases together are linear
    for start, a, b, inner in sorted(candidates, key=lambda c: c[0], reverse=True):
        # A box holding another box would give the innermost last box, already tried (it starts later).
        ans = "" if inner else _clean(text[a:b] if b >= 0 else _phrase(text, a, bound))
        if b < 0 and _VERDICT.match(ans):
            ans = ""
        if ans:
            return ans
        bound = min(bound, start)
    return _concluding_statement(text) or None


def strip_calculator_annotations(text: str) -> str:
    """Remove GSM8K calculator annotations: ``"16 - 3 = <<16-3=13>>13"`` -> ``"16 - 3 = 13"``."""
    return _CALC.sub("", text)


def extract_gsm8k_reference(answer_field: str) -> str:
    """The reference answer after ``####`` in a GSM8K ``answer`` field, thousands commas removed.

    Raises:
        ValueError: the field has no ``#### N`` line (or it is empty).
    """
    matches = list(_HASHES.finditer(answer_field))
    ans = _clean(_phrase(answer_field, matches[-1].end())) if matches else ""
    if not ans:
        raise ValueError(f"no '#### <answer>' line in GSM8K answer field: {answer_field[-80:]!r}")
    return ans
