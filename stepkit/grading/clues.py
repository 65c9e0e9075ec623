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

Everything is linear in the text and raises nothing on odd text: what does not parse is not a claim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
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
    operator); ``left``/``right`` are their exact values."""

    lhs: str
    rhs: str
    left: Fraction
    right: Fraction


@dataclass
class StepNumbers:
    """What :func:`read_step` finds in one step.

    Attributes:
        stated: every number in the step, as written after normalisation (commas dropped, LaTeX
            fractions as ``a/b``), in order.
        computed: the values the step computes: the right side of each ``=`` that is one number (or a
            fraction), and the contents of its ``\boxed{}``; as text, in order.
        claims: its arithmetic claims.
        fractions: the fractions it writes, ``a/b`` (``3/4``, ``\frac{3}{4}``): matched against clues,
            never counted as new numbers (their parts are in ``stated``).
    """

    stated: list[str] = field(default_factory=list)
    fractions: list[str] = field(default_factory=list)
    computed: list[str] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)


_ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>]*)>>")
_NUM = re.compile(r"\d+(?:\.\d+)?|\.\d+")


def number_value(text: str) -> Fraction | None:
    """``"1200"``, ``"-3.5"``, ``"3/4"``, ``"12%"`` (as 0.12 is *not* done here) -> exact value, else None."""
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
        pairs = [(m.group(1).strip(), m.group(2).strip()) for m in found]
        if bare and not line.lstrip().startswith("####"):  # a solution with no annotation: its own claims
            pairs = [(c.lhs, c.rhs) for c in read_step(line).claims if not _OPERATOR.search(c.rhs)]
        for expr, value in pairs:
            operands = {number_value(x) for x in _NUM.findall(expr)}
            deps = tuple(i for i, c in enumerate(clues) if c.value is not None and number_value(c.value) in operands)
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


# --- reading a step ------------------------------------------------------------------------------------

_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_LATEX_TEXT = re.compile(r"\\(?:text|mathrm|textbf|mbox|operatorname)\s*\{([^{}]*)\}")
_TIMES = re.compile(r"\\times|\\cdot|\\ast|[×·∗]")
_DIVIDE = re.compile(r"\\div|÷")
_DROP = re.compile(r"\\left|\\right|\\[()\[\]]|\\[,;:! ]|\$|\\boxed|\\fbox|\\quad|\\qquad")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_X_TIMES = re.compile(r"(?<=\d)[ \t]*[xX][ \t]*(?=\d)")
_ALLOWED = frozenset("0123456789.+-*/()%^ \t")
_FRACTION = re.compile(r"(?<![\d.])\(*(\d+)\)*\s*/\s*\(*(\d+)\)*(?![\d.])")
_OPERATOR = re.compile(r"[\d)%]\s*[-+*/^]\s*[\d(.]")


def normalise(text: str) -> str:
    r"""Step text as plain arithmetic where it is arithmetic: ``\frac{a}{b}`` -> ``(a)/(b)``, ``\times``,
    ``×``, ``\cdot`` and ``3 x 4`` -> ``*``, ``\div`` -> ``/``, thousands commas, ``$``, ``\(``/``\)`` and
    braces dropped, ``\%`` -> ``%``, a Unicode minus -> ``-``. Calculator annotations are removed."""
    t = strip_calculator_annotations(text).replace("\u2212", "-").replace("\u2013", "-").replace("\\%", "%")
    for _ in range(2):
        t = _LATEX_FRAC.sub(r"((\1)/(\2))", t)
    t = _LATEX_TEXT.sub(r" \1 ", t)
    t = _TIMES.sub("*", t)
    t = _DIVIDE.sub("/", t)
    t = _DROP.sub(" ", t)
    t = t.replace("{", "").replace("}", "")
    t = _THOUSANDS.sub("", t)
    return _X_TIMES.sub("*", t)


def _trim(expr: str) -> str:
    """An arithmetic side cut out of text, without dangling operators, dots and unmatched parentheses."""
    s = expr.strip()
    while True:
        before = s
        s = s.strip().rstrip(".").lstrip(".").strip()
        s = s.rstrip("+-*/^").lstrip("+*/^").strip()
        if s.startswith("(") and s.count("(") > s.count(")"):
            s = s[1:]
        if s.endswith(")") and s.count(")") > s.count("("):
            s = s[:-1]
        if s == before:
            return s


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


def _side(text: str, start: int, step: int) -> str | None:
    """The longest run of arithmetic characters from ``start`` going left (step -1) or right (+1), or
    None when the run is part of a longer expression written with words: glued to a letter at its far end
    (``2f``, ``1.5x``) or with an operator there (``Alyana's age - 4``, ``x + 5 - 5``)."""
    i = start
    while 0 <= i < len(text) and text[i] in _ALLOWED:
        i += step
    run = text[i + 1:start + 1] if step < 0 else text[start:i]
    if 0 <= i < len(text) and text[i].isalpha() and run and not run[0 if step < 0 else -1].isspace():
        return None
    far = run.strip()
    if far and (far[0] in "+-*/^" if step < 0 else far.rstrip(".")[-1:] in ("+", "-", "*", "/", "^")):
        if 0 <= i < len(text) and (text[i].isalpha() or text[i] in "'_"):
            return None
    return run


def read_step(step: str) -> StepNumbers:
    r"""The numbers, computed values and arithmetic claims of one step (plain text or LaTeX).

    For each ``=`` (not ``<=``, ``>=``, ``!=``, ``==``), the arithmetic text right before and right after it
    are its sides; a pair whose left side has an operator (``a op b = c``) and both evaluate is a
    :class:`Claim`; a side that runs on into words (``x + 5 - 5 = 27 - 5``, ``28 = 2 * 2f``) is none. The right
    side, when it is one number, is a computed value. The contents of each ``\boxed{}`` are computed
    values too.
    """
    out = StepNumbers()
    for _, a, b, inner in find_boxes(step):
        if not inner and b > a:
            val = normalise(step[a:b]).strip().rstrip(".")
            if number_value(val) is not None:
                out.computed.append(val.replace(" ", ""))
    t = normalise(step)
    out.stated = [m.group() for m in _NUM.finditer(t)]
    out.fractions = [f"{m.group(1)}/{m.group(2)}" for m in _FRACTION.finditer(t)]
    for m in re.finditer(r"(?<![<>=!])=(?!=)", t):
        lhs_run, rhs_run = _side(t, m.start() - 1, -1), _side(t, m.end(), 1)
        rhs = _trim(rhs_run) if rhs_run else ""
        right = evaluate(rhs) if rhs else None
        if right is None:
            continue
        if not _OPERATOR.search(rhs):
            out.computed.append(rhs.replace(" ", ""))
        lhs = _trim(lhs_run) if lhs_run else ""
        if lhs and _OPERATOR.search(lhs):
            left = evaluate(lhs)
            if left is not None:
                out.claims.append(Claim(lhs, rhs, left, right))
    return out


def _decimals(text: str) -> int:
    m = re.search(r"\.(\d+)\s*%?\s*$", text.strip())
    return len(m.group(1)) if m else 0


def claim_holds(claim: Claim) -> bool:
    """Whether ``lhs = rhs`` is true, allowing the rounding the written result implies.

    The result (the right side when it is one number, else the left) may be the exact value rounded to
    its written decimals (``100/3 = 33.33``); a whole result may also be the value rounded down or up
    (``7/2 = 3`` "full boxes", ``7/2 = 4`` "boxes needed"): GSM8K solutions round that way. A percentage
    written on one side only is accepted as N or N/100 (``10/40*100 = 25%``).
    """
    a, b = claim.left, claim.right
    d = _decimals(claim.rhs if not _OPERATOR.search(claim.rhs) else claim.lhs)
    tol = Fraction(1, 2 * 10 ** d) if d else Fraction(1)
    candidates = {b}
    if "%" in claim.rhs or "%" in claim.lhs:
        candidates |= {b * 100, b / 100}
    for c in candidates:
        diff = abs(a - c)
        if diff == 0 or (diff < tol if not d else diff <= tol):
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
        v = Fraction(m.group(1))
        nums.add(v)
        if m.group(2):
            nums |= {v / 100, 1 + v / 100, 1 - v / 100}
    for w in re.findall(r"[a-z]+", prompt.lower()):
        w = w[:-1] if w.endswith("s") and w[:-1] in _WORDS else w
        if w in _WORDS:
            nums.add(Fraction(_WORDS[w]))
    return nums
