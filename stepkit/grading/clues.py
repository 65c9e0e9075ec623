r"""Clues and the numbers a step states: stepkit's own small parsers for ``stepkit clue``.

A **clue** (ABSeeker, "Training Long-Horizon Search Agents via Answer-Backtracked Credit Assignment") is an
intermediate fact any sufficient solution must establish: ``Clue(text, value, depends_on)``, ``value``
the number as written (None when the clue is not numeric), ``depends_on`` the indices of earlier clues it
is computed from. The last clue of a list is always the reference answer.

This module holds the parts that are not answer checking (that is math-verify's job,
:class:`stepkit.grading.verify.AnswerChecker`):

* :func:`reference_clues`: clues from a GSM8K reference solution's calculator annotations. GSM8K
  (Cobbe et al. 2021) writes every intermediate computation as ``<<expression=value>>`` right after the
  text that states it (``16 - 3 - 4 = <<16-3-4=9>>9``); each annotation is one clue, exactly.
* :func:`read_step`: the numbers a step states, the values it computes (the right side of each ``=``
  and its ``\boxed{}`` answers) and its arithmetic claims ``a op b = c``, from plain text or LaTeX.
* :func:`claim_holds`: whether an arithmetic claim is true, in exact rational arithmetic, with the
  rounding its written result allows.
* :func:`problem_numbers`: the numbers a problem gives (digits and common number words).

Everything is linear in the text and raises nothing on odd text: what does not parse is not a claim. A
false claim marks a first error, so the reader prefers missing a claim to inventing one: a side it cannot
read reliably (variables, subscripts, LaTeX it does not know) makes no claim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction

from stepkit.grading.answers import find_boxes, strip_calculator_annotations


@dataclass(frozen=True)
class Clue:
    """One clue: ``text`` (str), ``value`` (the number as written, or None), ``depends_on`` (earlier
    clue indices, ascending)."""

    text: str
    value: str | None = None
    depends_on: tuple[int, ...] = ()


@dataclass(frozen=True)
class Claim:
    """An arithmetic claim a step writes, ``lhs = rhs`` (each side plain arithmetic, one with an
    operator, or a later link of a chain ``a op b = c = d``, read as ``c = d``); ``left``/``right`` are their
    exact values."""

    lhs: str
    rhs: str
    left: Fraction
    right: Fraction


@dataclass
class StepNumbers:
    """What :func:`read_step` finds in one step.

    Attributes:
        stated: every number in the step, as written after normalisation (commas dropped, LaTeX
            fractions as ``a/b``), in order; a leading minus that is a sign (``has -3 dollars``, not
            ``5 -3``) is part of the number.
        computed: the values the step computes: the right side of each ``=`` that is one number (or a
            fraction), and the contents of its ``\boxed{}``; as text, in order.
        claims: its arithmetic claims.
        fractions: the fractions it writes, ``a/b`` (``3/4``, ``\frac{3}{4}``), and each percentage as a
            decimal (``75%`` -> ``0.75``, as the answer checker reads ``75%`` as 0.75 as well as 75):
            matched against clues, never counted as new numbers (their parts are in ``stated``).
    """

    stated: list[str] = field(default_factory=list)
    fractions: list[str] = field(default_factory=list)
    computed: list[str] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)


_ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>]*)>>")
_NUM = re.compile(r"\d+(?:\.\d+)?|\.\d+")


def number_value(text: str) -> Fraction | None:
    """``"1200"``, ``"-3.5"``, ``"3/4"`` -> exact value, else None. ``"12%"`` is None here (a percentage has
    two readings, 12 and 0.12: :func:`read_step` states the 12 and lists ``0.12`` among its fractions)."""
    s = text.strip().replace(",", "").lstrip("$").rstrip(".")
    try:
        if re.fullmatch(r"-?\d+(?:\.\d+)?|-?\.\d+", s):
            return Fraction(s)
        if re.fullmatch(r"-?\d+\s*/\s*\d+", s):
            a, b = s.split("/")
            return Fraction(int(a), int(b)) if int(b) else None
    except (ValueError, ZeroDivisionError):
        return None
    return None


def reference_clues(annotated: str, reference_answer: str | None = None) -> list[Clue]:
    """Clues from a GSM8K-annotated reference solution, one per ``<<expression=value>>``, in order (a solution
    with no annotation at all gives one clue per arithmetic claim ``a op b = c`` it writes, :func:`read_step`).

    ``text`` is the line stating it (annotations removed; ``expression = value`` is added when a line
    holds several), ``value`` the annotation's result as written, ``depends_on`` the earlier clues whose
    value is an operand of the expression. ``reference_answer`` (GSM8K's ``#### N``) is appended as the
    last clue unless the last annotation already has its value.

    Returns:
        A list, empty when the text has no annotation and no reference answer is given.
    """
    clues: list[Clue] = []
    bare = not _ANNOTATION.search(annotated)
    for line in annotated.splitlines():
        found = list(_ANNOTATION.finditer(line))
        plain = " ".join(strip_calculator_annotations(line).split())
        pairs = [(m.group(1).strip(), _annotation_value(m.group(2))) for m in found]
        if bare and not line.lstrip().startswith("####"):  # a solution with no annotation: its own claims
            pairs = [(c.lhs, c.rhs) for c in read_step(line).claims if not _OPERATOR.search(c.rhs)]
        for expr, value in pairs:
            operands = {number_value(x) for x in _NUM.findall(expr)}
            deps = tuple(i for i, c in enumerate(clues) if c.value is not None and number_value(c.value) in operands)
            value = value if value is None or number_value(value) is not None else None
            text = plain if len(pairs) == 1 else f"{plain} [{expr} = {value}]"
            clues.append(Clue(text, value, deps))
    if reference_answer is not None and str(reference_answer).strip():
        ans = str(reference_answer).strip()
        last = number_value(clues[-1].value) if clues and clues[-1].value else None
        if last is None or last != number_value(ans):
            v = number_value(ans)
            deps = tuple(i for i, c in enumerate(clues) if c.value is not None and number_value(c.value) == v)
            clues.append(Clue(f"The answer is {ans}", ans, deps[-1:]))
    return clues


def _annotation_value(text: str) -> str | None:
    """An annotation's result as written (``<<2+3=5>>`` -> ``5``); a chain (``<<2+3=5=6>>``) gives its
    last link; anything that is not a number is None, never a string such as ``5=6``."""
    value = text.split("=")[-1].strip()
    return value if number_value(value) is not None else None


# --- reading a step ------------------------------------------------------------------------------------

_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_MIXED = re.compile(r"(?<![\d.])(\d+)[ \t]*\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_LATEX_TEXT = re.compile(r"\\(?:text|mathrm|textbf|mbox|operatorname)\s*\{([^{}]*)\}")
_TIMES = re.compile(r"\\times|\\cdot|\\ast|[×·∗]")
_DIVIDE = re.compile(r"\\div|÷")
_LATEX_THOUSANDS = re.compile(r"(?<=\d)(?:,\\!|\{,\}|,\\,|\\,|,\\ )(?=\d{3}(?!\d))")
_DROP = re.compile(r"\\left|\\right|\\[()\[\]]|\\[,;:! ]|\$|\\boxed|\\fbox|\\quad|\\qquad")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_X_TIMES = re.compile(r"(?<=\d)[ \t]*[xX][ \t]*(?=\d)|(?<=\d)[ \t]+[xX][ \t]+(?=\()|(?<=\))[ \t]*[xX][ \t]*(?=[\d(])")
_ALLOWED = frozenset("0123456789.+-*/()%^ \t")
_FRACTION = re.compile(r"(?<![\d.(])\(*(\d+)\)*\s*/\s*\(*(\d+)\)*(?![\d.])")
_OPERATOR = re.compile(r"[\d)%]\s*[-+*/^]\s*-?\s*[\d(.]")
_PERCENT = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*%")
# a list label or bullet at the start of a line: "- ", "* ", "1. ", "2) ", "(a) ", "(iv) " (not before an
# operator or "=", so "(3) + 4" keeps its first operand)
_LABEL = re.compile(r"(?m)^([ \t]*)(?:[-*+•][ \t]+|\(?(?:\d{1,3}|[A-Za-z]|[ivxIVX]{1,4})[.)][ \t]+|"
                    r"\((?:\d{1,3}|[A-Za-z]|[ivxIVX]{1,4})\)[ \t]+)(?![-+*/^=\s])")
# characters that, glued to the far end of a side, make it part of something unreadable: a variable or
# subscript (a_1, 2x), a LaTeX command, a prime, a factorial, an absolute value
_GLUE = frozenset("_\\'!|&#@~`")
# LaTeX commands that may stand next to a side without changing its value
_BENIGN_COMMANDS = frozenset({"approx", "quad", "qquad", "text", "implies", "Rightarrow", "rightarrow", "to",
                              "Longrightarrow", "le", "ge", "leq", "geq", "ne", "neq", "lt", "gt", "therefore",
                              "circ", "degree", "newline", "hline", "end", "begin", "item", "hspace"})
_COMMAND = re.compile(r"\\([A-Za-z]+)")


def normalise(text: str) -> str:
    r"""Step text as plain arithmetic where it is arithmetic: ``\frac{a}{b}`` -> ``((a)/(b))``, a mixed
    number ``1\frac{1}{4}`` -> ``((1+(1)/(4)))`` (an improper one, ``2\frac{5}{4}``, is left unreadable),
    ``\times``, ``×``, ``\cdot`` and ``3 x 4``/``30 x (1/2)`` -> ``*``, ``\div`` -> ``/``, thousands commas
    (also LaTeX's ``729,\!000``, ``729{,}000``, ``729\,000``), ``$``, ``\(``/``\)`` and braces dropped,
    ``\%`` -> ``%``, a Unicode minus -> ``-``. Calculator annotations are removed."""
    t = strip_calculator_annotations(text).replace("\u2212", "-").replace("\u2013", "-").replace("\\%", "%")
    t = _LATEX_THOUSANDS.sub("", t)
    t = _MIXED.sub(_mixed, t)
    for _ in range(2):
        t = _LATEX_FRAC.sub(r"((\1)/(\2))", t)
    t = _LATEX_TEXT.sub(r" \1 ", t)
    t = _TIMES.sub("*", t)
    t = _DIVIDE.sub("/", t)
    t = _DROP.sub(" ", t)
    t = t.replace("{", "").replace("}", "")
    t = _THOUSANDS.sub("", t)
    return _X_TIMES.sub("*", t)


def _mixed(m: re.Match) -> str:
    whole, num, den = m.group(1), m.group(2), m.group(3)
    if int(num) < int(den):
        return f"(({whole}+({num})/({den})))"
    return f"{whole}_(({num})/({den}))"  # ``2\frac{5}{4}``: a product or a typo, not read (``_`` glues)


def _numbers(t: str) -> list[str]:
    """The numbers of normalised text, in order; a minus right before one is its sign when it follows no
    operand (start, a space after a word or a separator, ``(``, ``=``, an operator), so ``-3`` in ``he has
    -3 dollars`` or ``2 * -3`` is negative and ``5 -3``, ``5-3`` are a subtraction."""
    out = []
    for m in _NUM.finditer(t):
        text, i = m.group(), m.start()
        if i > 0 and t[i - 1] == "-":
            j = i - 2
            while j >= 0 and t[j] in " \t":
                j -= 1
            if j < 0 or not (t[j].isalnum() or t[j] in ")%._") or (t[j].isalpha() and j < i - 2):
                text = "-" + text
        out.append(text)
    return out


def _unmatched(s: str) -> set[int]:
    """Positions of the parentheses of ``s`` that match none, in one pass."""
    opened, lone = [], set()
    for i, ch in enumerate(s):
        if ch == "(":
            opened.append(i)
        elif ch == ")":
            if opened:
                opened.pop()
            else:
                lone.add(i)
    return lone | set(opened)


def _trim(expr: str) -> str:
    """An arithmetic side cut out of text, without unmatched parentheses at its ends and markdown ``*``
    (``**3 + 4 = 7**``), in linear time. A leading dot is a decimal point (``.20*10``) and stays; a
    sentence's full stop never reaches a side (:func:`_side`)."""
    s = expr.strip()
    lone = _unmatched(s)
    a, b = 0, len(s)
    while a < b and (s[a] in " \t*" or (s[a] == "(" and a in lone)):
        a += 1
    while b > a and (s[b - 1] in " \t*+-/^" or (s[b - 1] == ")" and b - 1 in lone)):
        b -= 1
    return s[a:b]


MAX_BITS = 1 << 16  # the largest power the arithmetic reader evaluates (about 20,000 digits)


class _Parser:
    """Recursive descent over ``+ - * / ^ ( )`` and ``N%`` (N/100), in exact rationals."""

    _TOKEN = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+|[-+*/^()%])")

    def __init__(self, s: str):
        self.toks, pos = [], 0
        while pos < len(s):
            m = self._TOKEN.match(s, pos)
            if not m:
                if s[pos:].strip():
                    raise ValueError(s)
                break
            self.toks.append(m.group(1))
            pos = m.end()
        self.i = 0

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self):
        self.i += 1
        return self.toks[self.i - 1]

    def parse(self) -> Fraction:
        v = self.sum()
        if self.peek() is not None:
            raise ValueError("trailing tokens")
        return v

    def sum(self):
        v = self.product()
        while self.peek() in ("+", "-"):
            v = v + self.product() if self.take() == "+" else v - self.product()
        return v

    def product(self):
        v = self.power()
        while self.peek() in ("*", "/") or (self.peek() == "(" and self.i > 0):
            op = self.take() if self.peek() in ("*", "/") else "*"
            w = self.power()
            if op == "/" and w == 0:
                raise ValueError("division by zero")
            v = v * w if op == "*" else v / w
        return v

    def power(self):
        v = self.unary()
        if self.peek() == "^":
            self.take()
            e = self.unary()
            if e.denominator != 1 or abs(e) > 64:
                raise ValueError("exponent")
            # a power of a power ((9^64)^64)^64...: each level multiplies the digits by up to 64, so a 30-character
            # claim would take hours (and all memory) to evaluate; no step's arithmetic is that large
            if max(v.numerator.bit_length(), v.denominator.bit_length()) * abs(int(e)) > MAX_BITS:
                raise ValueError("too large")
            v = v ** int(e)
        return v

    def unary(self):
        if self.peek() == "-":
            self.take()
            return -self.unary()
        return self.atom()

    def atom(self):
        t = self.peek()
        if t is None:
            raise ValueError("end")
        if t == "(":
            self.take()
            v = self.sum()
            if self.take() != ")":
                raise ValueError("paren")
        elif _NUM.fullmatch(t):
            v = Fraction(self.take())
        else:
            raise ValueError(t)
        if self.peek() == "%":
            self.take()
            v = v / 100
        return v


def evaluate(expr: str) -> Fraction | None:
    """The exact value of a plain arithmetic expression (``16 - 3 - 4``, ``(1)/(3)*18``, ``150%*80``), or
    None when it is not one."""
    if not expr or len(expr) > 200:
        return None
    try:
        return _Parser(expr).parse()
    except (ValueError, ZeroDivisionError, OverflowError, IndexError):
        return None


def _far_command(text: str, i: int, step: int) -> str | None:
    """The LaTeX command name next to position ``i`` (skipping spaces) going ``step``, else None."""
    while 0 <= i < len(text) and text[i] in " \t":
        i += step
    if step < 0:
        j = i
        while j >= 0 and text[j].isalpha():
            j -= 1
        return text[j + 1:i + 1] if j >= 0 and text[j] == "\\" and j < i else None
    m = _COMMAND.match(text, i) if 0 <= i < len(text) else None
    return m.group(1) if m else None


def _side(text: str, start: int, step: int) -> str | None:
    """The longest run of arithmetic characters from ``start`` going left (step -1) or right (+1), or
    None when it cannot be read reliably: glued at its far end to a letter, a subscript, a LaTeX command and
    the like (``2f``, ``1.5x``, ``a_1``), next to a LaTeX command that changes it (``\\sqrt``, ``\\choose``),
    or with an operator there whose operand is outside it (``Alyana's age - 4``, ``x + 5 - 5``, ``f(x) + 3``).

    A dot belongs to the run only as a decimal point (followed by a digit), so the full stop of the previous
    sentence (``5 apples. 5 - 2``) or a list label (``1. 2 * 3``) ends it; so do an open parenthesis
    followed by a word going right (``7 (cm)``) and a close parenthesis after a word going left (``(a) 3+4``).
    Going left, a dash or star and a space at the start of a line is a bullet (``- 24/60``), not a sign."""
    n, i = len(text), start
    while 0 <= i < n and text[i] in _ALLOWED:
        ch = text[i]
        if ch == "." and not (i + 1 < n and text[i + 1].isdigit()):
            break
        if step > 0 and ch == "(":
            k = i + 1
            while k < n and text[k] in " \t":
                k += 1
            if k < n and text[k].isalpha():
                break
        if step < 0 and ch == ")" and i > 0 and (text[i - 1].isalpha() or text[i - 1] == "_"):
            break
        i += step
    run = text[i + 1:start + 1] if step < 0 else text[start:i]
    if not run.strip():
        return run
    inside = i < n if step > 0 else i >= 0
    command = _far_command(text, i, step) if inside else None
    if command is not None and command not in _BENIGN_COMMANDS:
        return None
    glued = inside and not run[0 if step < 0 else -1].isspace()
    if glued and (text[i].isalnum() or (text[i] in _GLUE and command is None)):
        return None
    far = run.strip()
    if step < 0:
        if far.startswith("**"):  # markdown bold: **3 + 4 = 7**
            far = far.lstrip("*").lstrip()
            run = " " + far
        if far[:1] in ("+", "/", "^"):
            return None
        if far[:1] == "*" or (far[:1] == "-" and far[1:2] in (" ", "\t")):
            line_start = text.rfind("\n", 0, i + 1) + 1
            if text[line_start:i + 1].strip():  # a binary operator whose left operand is outside the run
                return None
            return " " + far[1:]  # a bullet at the start of a line
    elif far.rstrip("*")[-1:] in ("+", "-", "/", "^") and inside and (text[i].isalpha() or text[i] in "'_"):
        return None
    return run


_EQUALS = re.compile(r"(?<![<>=!])=(?!=)")


def read_step(step: str) -> StepNumbers:
    r"""The numbers, computed values and arithmetic claims of one step (plain text or LaTeX).

    For each ``=`` (not ``<=``, ``>=``, ``!=``, ``==``), the arithmetic text right before and right after it
    are its sides (:func:`_side`); a pair whose left side has an operator (``a op b = c``) and both evaluate
    is a :class:`Claim`; a side that runs on into words (``x + 5 - 5 = 27 - 5``, ``28 = 2 * 2f``) is none.
    In a chain ``a op b = c = d`` each later link is checked against the previous side: ``c = d`` is a
    claim too. An expression that divides by zero (``10/0 = 5``) has no value, so it makes no claim: the
    reader cannot tell a wrong step from one that is showing a value is undefined (``\frac{1}{0}``), and a
    missed claim costs less than a false one. The right side, when it is one number, is a computed value.
    The contents of each ``\boxed{}`` are computed values too. List labels and bullets at the start of a
    line (``1.``, ``(a)``, ``- ``) are not read as operands.
    """
    out = StepNumbers()
    for _, a, b, inner in find_boxes(step):
        if not inner and b > a:
            val = normalise(step[a:b]).strip().rstrip(".")
            if number_value(val) is not None:
                out.computed.append(val.replace(" ", ""))
    t = normalise(step)
    out.stated = _numbers(t)
    out.fractions = [f"{m.group(1)}/{m.group(2)}" for m in _FRACTION.finditer(t)]
    out.fractions += [_percent_decimal(m.group(1)) for m in _PERCENT.finditer(t)]
    t = _LABEL.sub(lambda m: m.group(1) + " " * (m.end() - m.end(1)), t)
    prev = None  # the previous "=": (its right side, value, where it ends, whether its chain has an operator)
    for m in _EQUALS.finditer(t):
        if prev is not None and prev[2] == m.start():
            lhs, left, chained = prev[0], prev[1], prev[3]
        else:
            lhs_run = _side(t, m.start() - 1, -1)
            lhs = _trim(lhs_run) if lhs_run else ""
            left, chained = (evaluate(lhs) if lhs else None), False
        rhs_run = _side(t, m.end(), 1)
        rhs = _trim(rhs_run) if rhs_run else ""
        right = evaluate(rhs) if rhs else None
        if right is None:
            prev = None
            continue
        if not _OPERATOR.search(rhs):
            out.computed.append(rhs.replace(" ", ""))
        has_op = bool(lhs) and bool(_OPERATOR.search(lhs))
        if left is not None and (has_op or chained):
            out.claims.append(Claim(lhs, rhs, left, right))
        end = m.end() + len(rhs_run)
        prev = (rhs, right, end, left is not None and (has_op or chained or bool(_OPERATOR.search(rhs))))
    return out


def _percent_decimal(number: str) -> str:
    """``"75"`` (of ``75%``) -> ``"0.75"``, exactly."""
    return format(Decimal(number).scaleb(-2).normalize(), "f")


def _decimals(text: str) -> int:
    m = re.search(r"\.(\d+)\s*%?\s*$", text.strip())
    return len(m.group(1)) if m else 0


_REL_TOL = Fraction(1, 10 ** 9)


def claim_holds(claim: Claim) -> bool:
    """Whether ``lhs = rhs`` is true, allowing the rounding the written result implies.

    The result (the right side when it is one number, else the left) may be the exact value rounded to
    its written decimals (``100/3 = 33.33``); a whole result may also be the value rounded down or up
    (``7/2 = 3`` "full boxes", ``7/2 = 4`` "boxes needed"): GSM8K solutions round that way. A result written
    with decimals may also be within a relative 1e-9 of the exact value: a float printed in full
    (``50 / 6 = 8.333333333333334``, ``30/100*9 = 2.6999999999999997``) has 17 significant digits, the last
    one or two of them noise. A percentage written on one side only is accepted as N or N/100
    (``10/40*100 = 25%``).
    """
    a, b = claim.left, claim.right
    d = _decimals(claim.rhs if not _OPERATOR.search(claim.rhs) else claim.lhs)
    tol = Fraction(1, 2 * 10 ** d) if d else Fraction(1)
    candidates = {b}
    if "%" in claim.rhs or "%" in claim.lhs:
        candidates |= {b * 100, b / 100}
    for c in candidates:
        diff = abs(a - c)
        if diff == 0 or (diff < tol if not d else diff <= tol or diff <= _REL_TOL * abs(a)):
            return True
    return False


_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
          "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16,
          "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
          "hundred": 100, "thousand": 1000, "dozen": 12, "half": Fraction(1, 2), "twice": 2, "double": 2,
          "triple": 3, "quarter": Fraction(1, 4), "third": Fraction(1, 3), "week": 7, "hour": 60, "minute": 60,
          "year": 12, "percent": 100}


def problem_numbers(prompt: str) -> set[Fraction]:
    """The numbers a problem gives: its digits (``$80,000`` -> 80000, ``150%`` -> 150 and 1.5), and the
    common number words and units that imply one (``three``, ``half``, ``dozen``; ``week`` -> 7, ``hour``
    -> 60)."""
    t = normalise(prompt)
    nums: set[Fraction] = set()
    for m in re.finditer(r"(\d+(?:\.\d+)?|\.\d+)\s*(%?)", t):
        try:
            v = Fraction(m.group(1))
        except ValueError:  # more digits than Python converts (4,300): no step states it (number_value)
            continue
        nums.add(v)
        if m.group(2):
            nums |= {v / 100, 1 + v / 100, 1 - v / 100}
    for w in re.findall(r"[a-z]+", prompt.lower()):
        w = w[:-1] if w.endswith("s") and w[:-1] in _WORDS else w
        if w in _WORDS:
            nums.add(Fraction(_WORDS[w]))
    return nums
