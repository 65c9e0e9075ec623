r"""The mathematical claims a step makes, read from LaTeX and plain text: pure string work, no sympy.

``stepkit check-steps`` (:mod:`stepkit.stages.check_steps`) checks each claim with sympy
(:mod:`stepkit.grading.stepcheck`); this module only finds them. Method: GroundedPRM's fidelity-aware
verification (each step's own mathematics checked by a math tool) on the forms MATH solutions write:

* a **relation** ``a = b``, ``a < b``, ``a \le b``, ``a \approx b``... inside math mode (``\( \)``, ``\[ \]``,
  ``$ $``, ``$$ $$``, ``align`` lines), a chain ``a = b = c`` giving one relation per link. A link is
  ``first`` (the chain's first), ``later`` (a later link: a simplification or evaluation of the side
  before it) or ``continued`` (a math block that opens with ``=``: it continues the last expression the
  solution wrote). A first link whose left side is one variable (``n = 81 + 27``, ``a_3 = 1``) *names* it:
  the checker keeps its value as a definition for later claims (a substitution);
* an **arithmetic claim** ``a op b = c`` of plain text outside math mode, as ``clue score`` reads them
  (:func:`stepkit.grading.clues.read_step`, exact rationals);
* a **division with remainder** ``1529 ÷ 6 = 255 with a remainder of 4`` (checked as ``a = b q + r``,
  ``0 <= r < b``); congruences, numbers in a base, gcd/lcm and worded claims: :mod:`.claim_forms`.

Each side is turned into a plain expression (:func:`to_expression`: ``\frac{a}{b}`` -> ``((a)/(b))``,
``\sqrt`` -> ``sqrt``, ``^`` -> ``**``, implicit products made explicit, decimals as exact fractions) over a
small closed vocabulary: numbers, one-letter variables (with a subscript: ``a_3``; lower-case Greek letters,
``\theta``, ``\omega``), ``pi``, ``sqrt``, ``sin``, ``cos``, ``tan``, ``sec``, ``csc``, ``cot``, ``log``, ``exp``,
``binomial``, ``factorial``, ``floor``, ``ceiling``, ``gcd``, ``lcm``, angles in degrees (radians inside a
trigonometric function, :func:`.claim_forms.degrees`) and applications of a one-letter function ``f(2)`` (the
checker puts in the definition when a step or the problem gave one). Anything else (an unknown command,
``\pm``, sets, percent, a word) makes the side ``None``: **not parsed**, which the checker never counts as an
error. Linear in the text; raises nothing on odd text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from stepkit.grading import claim_forms as cf
from stepkit.grading.clues import read_step

FUNCTIONS = ("sqrt", "sin", "cos", "tan", "sec", "csc", "cot", "log", "exp", "binomial", "factorial", "floor", "ceiling", "abs", "gcd", "lcm")
RELATIONS = {"=": "=", "<": "<", ">": ">", "\\le": "<=", "\\leq": "<=", "\\ge": ">=", "\\geq": ">=",
             "\\ne": "!=", "\\neq": "!=", "\\approx": "~", "≈": "~", "≤": "<=", "≥": ">=", "≠": "!=",
             "\\leqslant": "<=", "\\geqslant": ">=", "\\equiv": "≡"}


@dataclass(frozen=True)
class Relation:
    r"""One link ``lhs op rhs`` of a chain in math mode.

    Attributes:
        lhs, rhs: the sides as plain expressions (:func:`to_expression`), None when not parsed.
        op: ``=``, ``<``, ``<=``, ``>``, ``>=``, ``!=`` or ``~`` (approximately).
        text: the link as written (LaTeX), for reports.
        link: ``first``, ``later`` or ``continued`` (module docstring).
        name: the variable a ``first`` ``=`` link names (its left side is that one variable), else None.
        decimals: the decimals the right side is written with (a rounded result may differ by half a unit
            of its last place).
        whole: the left side divides (``\div``, ``÷``) and the right side is a whole number: an integer
            quotient (``2863 \div 1344 = 2``), which may be the exact value rounded down.
        rounded_input: the left side holds a decimal (``(2.8284)^2 = 8``), or the right side inside an
            expression (``= \frac{-6 \pm 205.1}{2}``): its inputs were rounded, so the claim holds within 1%.
        at: where its math span starts in the step's text (-1: not set).
        call: a first link whose left side applies a one-letter function, ``f(2x + 1)``: ``(f, argument as a
            plain expression)``; the argument one variable (``f(x) = x^2 + 1``) defines ``f``, any other
            evaluates an earlier definition (a substitution: ``f(15) = 12(15) + 7``).
        modulus: the modulus (a plain expression) of a congruence ``op == "≡"`` (:mod:`.claim_forms`), else None.
        minus: both sides have ``\pm``: ``lhs``/``rhs`` are the ``+`` reading and this the ``-`` one (both must hold).
        alt: a side has a percent: ``lhs``/``rhs`` read it as hundredths, this with the sign dropped (``\frac{15}{60}
            \times 100 = 25\%``); failed only when both readings fail.
    """

    lhs: str | None
    rhs: str | None
    op: str
    text: str
    link: str
    name: str | None = None
    decimals: int = 0
    whole: bool = False
    rounded_input: bool = False
    at: int = -1
    call: tuple[str, str] | None = None
    modulus: str | None = None
    minus: tuple[str | None, str | None] | None = None
    alt: tuple[str | None, str | None] | None = None


@dataclass(frozen=True)
class Arithmetic:
    """A plain-text arithmetic claim ``a op b = c`` (:class:`stepkit.grading.clues.Claim`), exact values
    known: ``holds`` says whether it is true with the rounding its result allows."""

    text: str
    holds: bool


@dataclass(frozen=True)
class Remainder:
    """``dividend ÷ divisor = quotient with a remainder of remainder`` (integers as written)."""

    text: str
    dividend: int
    divisor: int
    quotient: int
    remainder: int

    @property
    def holds(self) -> bool:
        return self.divisor > 0 and self.dividend == self.divisor * self.quotient + self.remainder and \
            0 <= self.remainder < self.divisor


Item = Relation | Arithmetic | Remainder

_MATH = re.compile(r"\\\[(.+?)\\\]|\$\$(.+?)\$\$|\\\((.+?)\\\)|(?<![\\$])\$([^$]+?)\$|"
                   r"\\begin\{(align\*?|aligned|equation\*?|gather\*?|eqnarray\*?)\}(.+?)\\end\{\5\}", re.S)
_REMAINDER = re.compile(r"(\d[\d,]*)\s*(?:÷|\\div|/|divided by)\s*(\d+)\s*(?:=|is|equals|gives)\s*(\d[\d,]*)\s*"
                        r"(?:,?\s*(?:with\s+)?(?:a\s+)?(?:remainder|R|r)\b(?:\s+of)?\s*:?\s*)(\d+)", re.I)
_SPLIT = re.compile(r"\\(?:text|mbox|mathrm)\s*\{\s*(?:and|or|so|thus|hence|then|where|since|because|if|when|for|"
                    r"gives|and so|which gives|we get|or|is)\s*,?\s*\}|\\q?quad|\\implies|\\Rightarrow|\\Longrightarrow|"
                    r"\\rightarrow|\\to\b|\\iff|\\therefore|\\because|\\\\|(?<=[^\d\s]),|,(?=\s*[A-Za-z\\])|;|"
                    r"\\(?:text|mathrm)\{\s*(?:and|or|so|thus)\s*\}|\band\b|\bor\b")
_REL = re.compile(r"\\(?:leqslant|geqslant|leq|geq|le|ge|neq|ne|approx|equiv)(?![A-Za-z])|[=<>≈≤≥≠]")
_THOUSANDS = re.compile(r"(?<=\d)(?:,\\!|\{,\}|,\\,|\\,|,)(?=\d{3}(?!\d))")
_DROP = re.compile(r"\\left|\\right|\\bigl|\\bigr|\\Bigl|\\Bigr|\\big|\\Big|\\displaystyle|\\[,;:! ]|&|\\limits")
_UNITS = re.compile(r"\\(?:text|mathrm|textbf|mbox|operatorname)\s*\{[^{}]*\}")
_COMMAND = re.compile(r"\\([A-Za-z]+)")
_REFUSE = re.compile(r"\\(?:pm|mp|infty|in|notin|cup|cap|sum|prod|int|lim|vec|overline|angle|triangle|mid|equiv|"
                     r"pmod|bmod|mod|cdots|ldots|dots|subset|cong|sim|perp|parallel)(?![A-Za-z])|%|\||\\?\$")
_TOKEN = re.compile(r"\s*(?:(\d+\.\d*|\.\d+|\d+)|([A-Za-z\u03b1-\u03c9]+(?:_\d+)?)|(\*\*|[-+*/(),]))")
_LATEX_FUNCS = {"sin": "sin", "cos": "cos", "tan": "tan", "sec": "sec", "csc": "csc", "cot": "cot", "log": "log", "ln": "log", "exp": "exp", "pi": "pi",
                "sqrt": "sqrt", "cdot": "*", "times": "*", "div": "/", "ast": "*", "lfloor": "floor(",
                "rfloor": ")", "lceil": "ceiling(", "rceil": ")", "gcd": "gcd"}


def _braced(s: str, i: int) -> tuple[str, int] | None:
    """The contents of the brace group opening at ``s[i]`` (skipping spaces) and the index after it; a single
    character or digit without braces (``\\frac12``) is a group of one. None when unbalanced."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return None
    if s[i] != "{":
        return (s[i], i + 1) if s[i].isalnum() else None
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return s[i + 1:j], j + 1
    return None


def _latex_structures(s: str) -> str | None:
    r"""``\frac``, ``\sqrt``, ``\binom``, ``^{..}`` and ``_{..}`` rewritten with parentheses (recursively);
    None when a group is unbalanced."""
    out, i = [], 0
    while i < len(s):
        m = re.match(r"\\(?:[dt]?frac|binom|dbinom|tbinom)(?![A-Za-z])", s[i:])
        if m:
            a = _braced(s, i + m.end())
            b = _braced(s, a[1]) if a else None
            if not b:
                return None
            x, y = _latex_structures(a[0]), _latex_structures(b[0])
            if x is None or y is None:
                return None
            out.append(f"(({x})/({y}))" if "frac" in m.group() else f"binomial(({x}),({y}))")
            i = b[1]
            continue
        m = re.match(r"\\sqrt(?![A-Za-z])\s*(?:\[([^\[\]]*)\])?", s[i:])
        if m:
            a = _braced(s, i + m.end())
            if not a:
                return None
            x = _latex_structures(a[0])
            n = _latex_structures(m.group(1)) if m.group(1) else None
            if x is None or (m.group(1) and n is None):
                return None
            out.append(f"(({x})**(1/({n})))" if n else f"sqrt({x})")
            i = a[1]
            continue
        if s[i] in "^_" and i + 1 < len(s):
            a = _braced(s, i + 1)
            if not a:
                return None
            x = _latex_structures(a[0])
            if x is None:
                return None
            if s[i] == "_":
                if not re.fullmatch(r"\d+", x.strip()):
                    return None  # a subscript that is no index (x_{n+1}): not read
                out.append("_" + x.strip())
            else:
                out.append(f"**({x})")
            i = a[1]
            continue
        out.append(s[i])
        i += 1
    return "".join(out)


def _unbox(s: str) -> str:
    r"""``\boxed{x}`` (and ``\fbox``) replaced by ``x``: the answer box is no part of the value."""
    while True:
        m = re.search(r"\\(?:boxed|fbox)(?![A-Za-z])", s)
        if not m:
            return s
        g = _braced(s, m.end())
        if not g:
            return s
        s = s[:m.start()] + "{" + g[0] + "}" + s[g[1]:]


def to_expression(latex: str) -> str | None:
    r"""A side of a relation (LaTeX or plain) as a plain expression over the closed vocabulary of the module
    docstring, with every product explicit (``2x(x+1)`` -> ``2*x*(x+1)``) and every decimal an exact
    fraction (``0.75`` -> ``(75/100)``); None when any part of it is outside that vocabulary."""
    s = cf.based_numbers(_unbox(latex.strip()).rstrip(".,;:").strip())
    s = _UNIT.sub(" ", s).replace("\\$", " ").strip()  # (\$4.50: a currency sign is a unit)
    if not s or len(s) > 400 or "\x01" in s or "\x00" in s or s[0] in "+*/^" or s[-1] in "+-*/^":
        return None  # a word, or a part cut out of a longer expression
    s = cf.bars(cf.logs(s)) if "|" in s or "\\log_" in s else s
    if s is None:
        return None
    if _REFUSE.search(s) or re.search(r"[A-Za-z]\s*\^\s*\{\s*-\s*1\s*\}\s*\(", s):
        return None  # (f^{-1}(2): an inverse function)
    s = cf.degrees(s)  # (\cos 208^\circ: in radians inside a trigonometric function; else the sign dropped)
    if s is None:
        return None
    s = _THOUSANDS.sub("", s.replace("\u2212", "-"))
    s = _MIXED.sub(lambda m: f"({m.group(1)}+{m.group(2)}/{m.group(3)})" if int(m.group(2)) < int(m.group(3))
                   else "\x00", s)  # a mixed number 2\frac{6}{7}; an improper one is a typo or a product
    if "\x00" in s:
        return None
    s = _UNITS.sub(" ", s)
    s = _DROP.sub(" ", s)
    s = s.replace("×", "*").replace("·", "*").replace("÷", "/").replace("\\{", "\x00").replace("\\}", "\x00")
    if "\x00" in s:
        return None
    s = _latex_structures(s)
    if s is None:
        return None
    s = re.sub(r"\(([^()]*)\)\s*!", r"factorial(\1)", re.sub(r"(\d+)\s*!", r"factorial(\1)", s))  # (13 - 4)!
    if "!" in s:
        return None

    def command(m: re.Match) -> str:
        name = m.group(1)
        return f" {_LATEX_FUNCS[name]} " if name in _LATEX_FUNCS else f" {cf.GREEK[name]} " if name in cf.GREEK else "\x00"

    s = _COMMAND.sub(command, s)
    if "\x00" in s or "\\" in s:
        return None
    s = s.replace("{", "(").replace("}", ")").replace("[", "(").replace("]", ")").replace("^", "**")
    return _explicit(s)


def _explicit(s: str) -> str | None:
    """Tokenise a plain expression and make implicit products explicit; None outside the vocabulary (a
    word of four or more letters, a one-letter function application ``f(2)``, two numbers side by side)."""
    toks, pos = [], 0
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if not m:
            if s[pos:].strip():
                return None
            break
        pos = m.end()
        num, name, op = m.groups()
        if num is not None:
            if "." in num:
                whole, _, frac = num.partition(".")
                num = f"({int((whole or '0') + frac)}/{10 ** len(frac)})" if frac else whole
            toks.append(("num", num))
        elif name is not None:
            base, _, sub = name.partition("_")
            if base in FUNCTIONS or base == "pi":
                if sub:
                    return None
                toks.append(("func" if base != "pi" else "name", base))
            elif sub:
                if len(base) != 1:
                    return None
                toks.append(("name", name))
            else:
                if len(base) > 3 or (len(base) > 1 and any(c.isupper() for c in base)):
                    return None  # a word, or a segment between two points (AB): not a product of variables
                for ch in base:
                    toks.append(("name", ch))
        else:
            toks.append(("op", op))
    toks = cf.applied(toks)
    if not toks:
        return None
    out = []
    for k, (kind, text) in enumerate(toks):
        if k:
            pk, pt = toks[k - 1]
            operand_end = pk in ("num", "name") or pt == ")"
            operand_start = kind in ("num", "name", "func") or text == "("
            if operand_end and operand_start:
                if kind == "num" and pk in ("num", "name"):
                    return None  # 2 3, b32: no product anyone writes
                if not (pk == "name" and text == "(" and pt in "fghpqPQFGH"):  # (f(2): an application, put
                    out.append("*")  # in by the checker when the solution or the problem defined f)
        out.append(text)
    expr = "".join(out)
    if re.search(r"\*\*\s*\(?\s*\d{4,}", expr) or re.search(r"factorial\(\d{4,}", expr):
        return None  # too large to evaluate in a claim's time
    if re.search(r"(?:sin|cos|tan|sec|csc|cot)\(+\d+\)", expr):
        return None  # \sin 30, \cos(60): degrees without the sign, not radians
    return expr


def _decimals(text: str) -> int:
    m = re.fullmatch(r"\s*\{?\s*-?\d*\.(\d+)\s*\}?\s*", _unbox(text))
    return len(m.group(1)) if m else 0


_MIXED = re.compile(r"(?<![\d.])(\d+)[ \t]*\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_NAME = re.compile(r"\s*([A-Za-z]|\\(?:" + "|".join(cf.GREEK) + r")(?![A-Za-z]))(?:_\{?(\d+)\}?)?\s*")


_TEXT = re.compile(r"\\(?:text|mbox|mathrm|textbf|operatorname)\s*\{[^{}]*\}")


_CONNECTIVE = re.compile(r",?\s*(?:and|or|so|thus|hence|then|where|since|because|if|when|gives|and so|which gives|we get|"
                         r"is|i\.e\.|therefore|but)\s*,?")


def _words(math: str) -> str:
    r"""``\text{..}`` in math mode: a unit after a number or a closing bracket is marked as a unit (dropped from
    the value, compared between the sides: ``2 \text{ dozen} = 24`` converts units and is not read); any
    other is a word (``\text{LCM} = ...``), marked so that its side is not parsed."""
    def one(m: re.Match) -> str:
        before = math[:m.start()].rstrip()
        raw = re.sub(r"^\\\w+\s*\{|\}$", "", m.group()).strip().lower()
        unit = raw.rstrip("s")
        if _CONNECTIVE.fullmatch(raw):
            return " ; "  # \text{ or }, \text{and}: two claims, split as in prose
        if before and (before[-1].isdigit() or before[-1] in ")}]") and len(unit.split()) <= 2 and \
                not re.search(r"\b(?:for|some|where|with|and|or|if|is|of|integer)\b", unit):
            return f" \x02{unit}\x02 "
        return " \x01 "
    return _TEXT.sub(one, math)


_UNIT = re.compile("\x02([^\x02]*)\x02")


def _units(part: str) -> set[str]:
    return set(_UNIT.findall(part))


_CALL = re.compile(r"\s*([fghpqPQFGH])\s*(?:\\left\s*)?\(\s*(.+?)\s*(?:\\right\s*)?\)\s*")


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += ch in "({["
        depth -= ch in ")}]"
        if depth < 0:
            return False
    return depth == 0


def _split_top(math: str) -> list[str]:
    r"""``math`` cut at the separators of ``_SPLIT`` outside brackets (``\gcd(p(41), p(42))`` stays whole)."""
    out, pos, depth, at = [], 0, 0, 0
    for m in _SPLIT.finditer(math):
        depth += sum((ch in "([{") - (ch in ")]}") for ch in math[at:m.start()])
        at = m.start()
        if depth <= 0 or m.group() != ",":
            out.append(math[pos:m.start()])
            pos = m.end()
    out.append(math[pos:])
    return [p for piece in out for p in _split_list(piece)]


def _split_list(piece: str) -> list[str]:
    """A piece cut at its commas outside brackets when the parts on both sides are relations (``1^2 = 1, 2^2 =
    4``: a list); a tuple ``(6, \\frac{7}{2})`` or ``x = 1, 2`` stays whole."""
    cuts, depth = [-1], 0
    for i, ch in enumerate(piece):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            cuts.append(i)
    cuts.append(len(piece))
    segs = [piece[a + 1:b] for a, b in zip(cuts, cuts[1:])]
    if len(segs) < 2 or not all(_REL.search(g) for g in segs):
        return [piece]
    return segs


def _relations(math: str, previous: str | None) -> tuple[list[Relation], str | None]:
    """The relations of one math-mode span; ``previous`` is the last expression written before it (for a span
    opening with ``=``). Returns them and the last expression of this span."""
    math = _words(cf.gcd_lcm(cf.mark_moduli(math.replace("&", " "))))  # (& = x^3 - x^2: an align line continues)
    out: list[Relation] = []
    last = previous
    for piece in _split_top(math):
        if not piece or not piece.strip():
            continue
        piece, modulus = cf.take_modulus(piece)
        parts, ops, pos = [], [], 0
        depth = 0
        for m in re.finditer(r"[(\[{]|[)\]}]|" + _REL.pattern, piece):
            ch = m.group()
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            elif depth == 0:
                if ch in "<>" and (piece[m.end():m.end() + 1] == "=" or piece[m.start() - 1:m.start()] in "<>="):
                    continue
                parts.append(piece[pos:m.start()])
                ops.append(RELATIONS.get(ch, "=") if ch != "=" or piece[m.start() - 1:m.start()] not in "<>" else "=")
                pos = m.end()
        parts.append(piece[pos:])
        ops = ["≡" if modulus is not None and op == "=" else op for op in ops]  # an equality modulo m
        if not ops:
            if piece.strip():
                last = piece
            continue
        continued = not parts[0].strip()
        if continued:
            if previous is None and last is None:
                parts, ops = parts[1:], ops[1:]
            else:
                parts[0] = last if last is not None else previous
        exprs = [to_expression(p) for p in parts]
        pct = [cf.percent(p, to_expression) for p in parts]  # (hundredths, dropped) of a side with \%, else None
        both = [cf.both_signs(p, to_expression) for p in parts]  # (+, -) readings of a side with \pm, else None
        units = [_units(p) for p in parts]
        for k, op in enumerate(ops):
            left, right = _UNIT.sub(" ", parts[k]), _UNIT.sub(" ", parts[k + 1])
            if not right.strip():
                continue
            if units[k] and units[k] != units[k + 1]:
                exprs[k] = None  # a conversion between units (2 dozen = 24 cups): not read
            link = "continued" if continued and k == 0 else "first" if k == 0 else "later"
            name = None
            m = _NAME.fullmatch(left)
            signs = (both[k], both[k + 1]) if both[k] and both[k + 1] else None  # \pm on both sides: two claims
            if signs:
                exprs[k], exprs[k + 1] = signs[0][0], signs[1][0]
            exprs[k], exprs[k + 1] = (x[0] if x else e for x, e in ((pct[k], exprs[k]), (pct[k + 1], exprs[k + 1])))
            if link == "first" and op == "=" and m and not both[k + 1]:
                name = cf.GREEK.get(m.group(1).lstrip("\\"), m.group(1)) + (f"_{m.group(2)}" if m.group(2) else "")
            call = None
            mc = _CALL.fullmatch(left) if link == "first" and op == "=" else None
            if mc and _balanced(mc.group(2)):
                arg = to_expression(mc.group(2))
                call = (mc.group(1), arg) if arg is not None else None
            whole = bool(re.search(r"\\div|÷", left)) and bool(re.fullmatch(r"\s*\d+\s*\.?\s*", right))
            out.append(Relation(exprs[k], exprs[k + 1], op, f"{left.strip()} {op} {right.strip()}".replace("\x01", "[text]")[:200], link, name,
                                _decimals(right), whole, bool(re.search(r"\d\.\d", left) or (  # (or inside the right side)
                                    re.search(r"\d\.\d", right) and not _decimals(right))), call=call,
                                modulus=(to_expression(modulus) if modulus else None) if op == "≡" else None,
                                minus=(signs[0][1], signs[1][1]) if signs else None,
                                alt=cf.percent_pair(pct[k], pct[k + 1], exprs[k], exprs[k + 1])))
        last = parts[-1] if parts[-1].strip() else last
    return out, last


_SAID = re.compile(r"\s*(?:equals|is equal to|is the same as|simplifies to|reduces to|evaluates to)\s*", re.I)
_OPERAND = re.compile(r"(?:divided by|times|plus|minus|of|multiplied by|over|power|and|from|by|[-+*/=×÷])\s*$", re.I)
_REVERSED = re.compile(r"(?<![\w.,$^/*+×÷=-])(?<![/*+×÷=-]\s)(\d+(?:\.\d+)?)[ \t]*=[ \t]*"
                       r"(\d+(?:\.\d+)?(?:[ \t]*[-+*/×÷x][ \t]*\d+(?:\.\d+)?)+)(?![\w^$]|[.,]\d|[ \t]*[-+*/×÷=(])")
_SAID_END = re.compile(r"\s*(?:[.,;:]|$|(?:and|so|which|since|because|as|when)\b)")


def extract(step: str, previous: str | None = None) -> tuple[list[Item], str | None]:
    r"""Every claim of one step, in text order: the :class:`Relation` links of its math-mode spans (and of two
    bare expressions the prose relates, ``\(a\) equals \(b\)``, ``simplifies to``: a ``later`` link), the
    :class:`Arithmetic` claims and :class:`Remainder` divisions of its plain text.

    Args:
        step: the step's text (LaTeX and prose).
        previous: the last expression the solution wrote before this step (a span opening with ``=``
            continues it), or None.

    Returns:
        ``(items, last)``: the claims and the last expression this step writes (for the next step).
    """
    items: list[tuple[int, Item]] = []
    plain, pos = [], 0
    last = previous
    bare = None  # the previous span when it was a bare expression: (its body, where it ends, where it starts)
    spans = []
    for m in _MATH.finditer(step):
        plain.append(step[pos:m.start()])
        body = next(g for g in (m.group(1), m.group(2), m.group(3), m.group(4), m.group(6)) if g is not None)
        spans.append((m.start(), m.end(), body))
        said = bare is not None and _SAID.fullmatch(step[bare[1]:m.start()]) and \
            _SAID_END.match(step[m.end():m.end() + 12]) and not _OPERAND.search(step[max(0, bare[2] - 30):bare[2]])
        if said and not _REL.search(body):  # \(4(x^2 + \frac{1}{2}x)\) equals \((2x + \frac{1}{4})^2\)
            items.append((m.start(), Relation(to_expression(bare[0]), to_expression(body), "=",
                                              f"{bare[0].strip()} = {body.strip()}"[:200], "later", at=m.start())))
        bare = (body, m.end(), m.start()) if not _REL.search(body) else None
        pos = m.end()
        rels, after = _relations(body, last)
        if rels or m.group(3) is None and m.group(4) is None:
            last = after  # a bare expression inline in prose (``distribute \(7a^3\)``) is a mention, not a result
        items += [(m.start(), replace(r, at=m.start())) for r in rels]
        plain.append(" " * (m.end() - m.start()))
    plain.append(step[pos:])
    text = "".join(plain)
    marked = "".join(p if k % 2 == 0 else "\x03" for k, p in enumerate(plain))  # a math span: one mark
    for m in _REVERSED.finditer(marked):  # plain text 187 = 13 * 14 (read_step reads a op b = c only)
        lhs, rhs = to_expression(m.group(1)), to_expression(re.sub(r"(?<=\d)\s*x\s*(?=\d)", "*", m.group(2)))
        if lhs is not None and rhs is not None:
            items.append((m.start(), Relation(lhs, rhs, "=", m.group()[:200], "first", decimals=_decimals(m.group(1)))))
    numbered = cf.spans_as_numbers(step, spans)  # \(770 \div 333 = 2\) with a remainder of \(58\): plain
    for m in _REMAINDER.finditer(numbered):
        a, b, q, r = (int(g.replace(",", "")) for g in m.groups())
        items.append((m.start(), Remainder(m.group()[:200], a, b, q, r)))
    items += [(w.at, Arithmetic(w.text, w.holds)) for w in cf.worded(numbered)]  # the gcd of a and b is c
    for at, value, result, op in cf.function_of(step):  # the ceiling of \( \sqrt{60.8333} \), which is 7
        items.append((at, Relation(to_expression(value), to_expression(result), op, f"{value} {op} {result}", "first",
                                   decimals=_decimals(result), at=at)))
    offset = 0  # where the line starts in the step (math spans are blanked to their length: offsets agree)
    for line in text.split("\n"):
        cursor = 0  # claims come in line order: each is looked for from the previous one on (linear in the line)
        for c in read_step(line).claims:
            at = line.find(c.lhs, cursor)
            if at < 0:
                at = line.find(c.lhs)
            # the quotient of a division with remainder (the Remainder item checks it), looked for near the claim,
            # not over the whole line once per claim (a 500 KB step of 50,000 claims took hours: quadratic)
            near = line if at < 0 else line[max(0, at - 40):at + len(c.lhs) + len(c.rhs) + 80]
            if re.search(r"(?<![\d.])\d+\s*(?:÷|/)\s*\d+\s*=\s*" + re.escape(c.rhs) + r"\s*,?\s*(?:with|r\b|R\b|remainder)",
                         near):
                continue
            if at >= 0:
                cursor = at + len(c.lhs)
            pos = offset + at if at >= 0 else step.find(c.lhs) if c.lhs in step else len(step)
            items.append((pos, Arithmetic(f"{c.lhs} = {c.rhs}", _holds(c))))
        offset += len(line) + 1
    items.sort(key=lambda x: x[0])
    return [it for _, it in items], last


def _holds(claim) -> bool:
    from stepkit.grading.clues import claim_holds

    return claim_holds(claim)
