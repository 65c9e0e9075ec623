r"""More forms of claim for :mod:`stepkit.grading.claims`: number-theory notation and worded claims.

Pure string work, no sympy (as :mod:`stepkit.grading.claims`). Found on the tuning (even sha256-parity) half
of ProcessBench math, where a solution's first error is often written in a form the base reader refused:

* **congruences** ``2^{10} \equiv 1 \pmod{11}``: :func:`mark_moduli` marks the modulus of a math span
  (``\pmod{m}``, ``\pmod m``, ``(\bmod m)``, ``\mod m``, ``(\text{mod } m)``) and :func:`take_modulus`
  takes it out of one relation piece: every ``=`` and ``\equiv`` link of a piece with a modulus is then a
  congruence modulo it (an exact equality is a true congruence too, so nothing true is lost; ``17 \mod 5
  = 2`` reads as ``17 \equiv 2 \pmod 5``). A link ``\equiv`` without a modulus is not parsed;
* **numbers written in a base** ``1010111_2``, ``{120301232}_4``: :func:`based_numbers` writes their value
  in base ten; a digit not below the base (``19_8``) makes the side not parsed;
* **gcd and lcm** ``\gcd(12, 18)``, ``\text{lcm}(4, 6)``, ``\operatorname{lcm}``, ``GCD(..)``:
  :func:`gcd_lcm` names them ``gcd(..)`` / ``lcm(..)`` (the checker evaluates them on integers only);
* **worded claims** (:func:`worded`), in plain text or with each number in its own math span: ``the GCD of
  729 and 1875 is 3``, ``x rounded to the nearest tenth is 14.4`` (``rounds down to``), ``the remainder when
  194 is divided by 11 is 7``, ``194 mod 11 = 7``;
* **angles in degrees** (:func:`degrees`: radians inside a trigonometric function, ``\cos 208^\circ``; else
  the sign dropped) and **Greek letters** as variables (``GREEK``, lower case; ``\pi`` stays the number).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from math import gcd

_MODULUS = re.compile(r"\\pmod\s*\{([^{}]+)\}|\\pmod\s*(\d+|[A-Za-z])|\(\s*\\(?:bmod|mod)\s*\{?([^(){}]+?)\}?\s*\)|"
                      r"\(\s*\\(?:text|mathrm|textrm|operatorname)\s*\{\s*mod\s*\}\s*\{?([^(){}]+?)\}?\s*\)|"
                      r"\\(?:text|mathrm|textrm|operatorname)\s*\{\s*\(?\s*mod\s+(\d+)\s*\)?\s*\}|"
                      r"\\(?:bmod|mod)\s*\{([^{}]+)\}|\\(?:bmod|mod)(?![A-Za-z])\s*(\d+|[A-Za-z](?![A-Za-z]))")
MARK = "\x04"


def mark_moduli(math: str) -> str:
    r"""Every modulus of one math span as ``\x04m\x04`` (``m`` as written); the rest unchanged."""
    if "mod" not in math:
        return math
    return _MODULUS.sub(lambda m: f" {MARK}{next(g for g in m.groups() if g is not None).strip()}{MARK} ", math)


def take_modulus(piece: str) -> tuple[str, str | None]:
    r"""``(piece without its modulus marks, the modulus as written)``; the modulus None when there is none,
    ``""`` when the piece names two different moduli (then none of its congruences is read)."""
    found = re.findall(MARK + "([^" + MARK + "]*)" + MARK, piece)
    if not found:
        return piece, None
    rest = re.sub(MARK + "[^" + MARK + "]*" + MARK, " ", piece)
    return rest, found[0] if len(set(f.strip() for f in found)) == 1 else ""


_BASED = re.compile(r"(?<![\w.}])(?:\{\s*(\d+)\s*\}|\((\d+)\)|(\d+))\s*_\s*(?:\{\s*(\d{1,2})\s*\}|(\d))(?!\d)")


def based_numbers(s: str) -> str:
    r"""``1010111_2`` -> ``87`` (bases 2 to 36, digits only); ``\x00`` where a digit is not below its base."""
    def one(m: re.Match) -> str:
        digits = next(g for g in m.groups()[:3] if g is not None)
        base = int(m.group(4) or m.group(5))
        if not 2 <= base <= 36 or any(int(d) >= base for d in digits):
            return "\x00"
        return str(int(digits, base))
    return _BASED.sub(one, s) if "_" in s else s


_GCD = re.compile(r"\\(?:text|operatorname|mathrm|textrm)\s*\{\s*(gcd|lcm|GCD|LCM)\s*\}(?=\s*(?:\\left)?\s*\()|"
                  r"\\(gcd|lcm)(?![A-Za-z])|(?<![A-Za-z\\])(GCD|LCM|gcd|lcm)(?=\s*(?:\\left)?\s*\()")


def gcd_lcm(math: str) -> str:
    r"""``\gcd(12, 18)``, ``\text{lcm}(4, 6)``, ``GCD(12, 18)`` written as ``gcd(..)`` / ``lcm(..)``."""
    if not re.search(r"gcd|lcm", math, re.I):
        return math
    return _GCD.sub(lambda m: " " + next(g for g in m.groups() if g is not None).lower() + " ", math)


@dataclass(frozen=True)
class Worded:
    """A claim written in words: ``text`` as written and whether it ``holds`` (exact integers/decimals)."""

    text: str
    holds: bool
    at: int


_N = r"(-?\d[\d,]*(?:\.\d+)?)"
_INT = r"(\d[\d,]*)"
_WHICH = r"\s*,?\s*(?:is|are|equals|=|which is|giving|gives|we get|is equal to)\s+(?:just\s+|simply\s+)?"
_GCD_WORDS = re.compile(r"\b(greatest common (?:divisor|factor)|gcd|G\.C\.D\.|highest common factor|HCF|"
                        r"least common multiple|lcm|L\.C\.M\.)\s*(?:\((?:GCD|LCM|GCF|HCF)\)\s*)?of\s+" + _INT +
                        r"\s*,?\s+and\s+" + _INT + r"[^\d\x03]{0,80}?(?:\b(?:is|are|equals|gives|get)|=)\s+"
                        r"(?:just\s+|simply\s+)?" + _INT + r"(?!\d|[.,]\d)", re.I)
_PLACES = {"whole number": 0, "integer": 0, "one": 0, "unit": 0, "tenth": 1, "hundredth": 2, "thousandth": 3,
           "ten": -1, "hundred": -2, "thousand": -3}
_PLACE = r"(whole number|integer|one|unit|tenth|hundredth|thousandth|ten|hundred|thousand)s?(?:\s+place)?"
_ROUND = re.compile(_N + r"\s*,?\s+(?:is\s+)?rounded\s+(?:off\s+)?to\s+the\s+nearest\s+" + _PLACE +
                    r"(?:\s*,?\s*(?:is|gives|=|becomes|would be|which is)\s+|(?:(?!rounded\s)[^\x03]){0,120}?\b(?:rounds|"
                    r"round|rounded|rounding)\s+(?:it\s+)?(?:down\s+|up\s+)?to\s+)" + _N + r"(?!\d|[.,]\d)", re.I)
_ROUNDS = re.compile(_N + r"\s+(?:rounds|is rounded)\s+(?:down\s+|up\s+)?to\s+" + _N +
                     r"\s+(?:when rounded\s+)?(?:to\s+)?(?:the\s+)?nearest\s+" + _PLACE, re.I)
_REMAINDER_WORDS = re.compile(r"\bremainder\s+(?:when|of)\s+" + _INT + r"\s+(?:is\s+)?divided\s+by\s+" + _INT + _WHICH
                              + _INT + r"(?!\d|[.,]\d)", re.I)
_B = r"(\d+)(?:_\{?(\d+)\}?)?"  # digits, with the base as a subscript or not
_AS = r"\s+(?:can be (?:written|expressed|represented) as|is (?:written|expressed|represented) as|is|becomes|=|equals)\s+"
_NOT_BASE = r"(?!\d|[.,]\d|\s*(?:\(|in\s+base|to\s+base|base))"
_BASE_WORDS = (re.compile(r"\b(?:in|to)\s+base[- ](\d+)\s*,\s*(?:the number\s+)?" + _B + _AS + _B + _NOT_BASE, re.I),
               re.compile(r"(?<![\w.])" + _B + r"\s+(?:in|to)\s+base[- ](\d+)" + _AS + _B + _NOT_BASE, re.I))
_MOD_WORDS = re.compile(r"(?<![\w.^])" + _INT + r"\s+(?:mod|modulo)\s+" + _INT + r"\s*(?:=|is|equals)\s+" + _INT +
                        r"(?!\d|[.,]\d|\s*\()", re.I)


def _int(s: str) -> int:
    return int(s.replace(",", ""))


def _decimal(s: str) -> Decimal | None:
    try:
        return Decimal(s.replace(",", ""))
    except InvalidOperation:
        return None


def worded(text: str) -> list[Worded]:
    r"""The worded claims of one step's plain text (math spans already replaced by their bare contents when
    they are a single number: ``\(729\)`` -> ``729``), each checked exactly (module docstring)."""
    out = []
    for m in _GCD_WORDS.finditer(text):
        a, b, c = _int(m.group(2)), _int(m.group(3)), _int(m.group(4))
        is_gcd = m.group(1).lower().startswith(("g", "h"))
        value = gcd(a, b) if is_gcd else a * b // gcd(a, b) if a and b else 0
        out.append(Worded(m.group()[:200], value == c, m.start()))
    for m, (x, place, y) in [(m, (m.group(1), m.group(2), m.group(3))) for m in _ROUND.finditer(text)] + \
            [(m, (m.group(1), m.group(3), m.group(2))) for m in _ROUNDS.finditer(text)]:
        xv, yv = _decimal(x), _decimal(y)
        places = _PLACES.get(place.lower())
        if xv is None or yv is None or places is None or (xv < 0 and xv * Decimal(10) ** places % 1 == Decimal("-0.5")):
            continue  # (a negative half: conventions differ)
        exact = xv.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
        out.append(Worded(m.group()[:200], exact == yv, m.start()))
    for k, rx in enumerate(_BASE_WORDS):
        for m in rx.finditer(text):
            g = m.groups()
            base, n, n_base, d, d_base = (g[0], g[1], g[2], g[3], g[4]) if k == 0 else (g[2], g[0], g[1], g[3], g[4])
            base = int(base)
            if not 2 <= base <= 10 or n_base or d_base:
                continue
            # either reading: n converted to base b is d, or the numeral n in base b is d (1010 in base 2 is 10)
            readings = [int(x, base) == int(y) for x, y in ((d, n), (n, d)) if all(int(ch) < base for ch in x)]
            if readings:
                out.append(Worded(m.group()[:200], any(readings), m.start()))
    for rx in (_REMAINDER_WORDS, _MOD_WORDS):
        for m in rx.finditer(text):
            a, b, r = _int(m.group(1)), _int(m.group(2)), _int(m.group(3))
            if b > 0 and not re.search(r"inverse\s+(?:of\s+)?$|\^\s*\{?\s*-\s*1\s*\}?\s*$", text[max(0, m.start() - 30):m.start()]):
                out.append(Worded(m.group()[:200], a % b == r, m.start()))
    return out


_OF = {"ceiling": "\\lceil {} \\rceil", "floor": "\\lfloor {} \\rfloor", "square root": "\\sqrt{{{}}}",
       "cube root": "\\sqrt[3]{{{}}}", "absolute value": "\\left| {} \\right|", "factorial": "({})!"}
_FUNCTION_OF = re.compile(r"\b(ceiling|floor|square root|cube root|absolute value|factorial) of\s*(?:\\\((.{1,80}?)\\\)|"
                          r"\$([^$]{1,80})\$|(\d+(?:\.\d+)?)(?![\d.]))\s*,?\s*(?:which\s+)?(?:is|equals|=|gives)\s*"
                          r"(approximately\s*)?(?:\\\(\s*(-?\d+(?:\.\d+)?)\s*\\\)|\$(-?\d+(?:\.\d+)?)\$|(-?\d+(?:\.\d+)?))"
                          r"(?!\d|[.,]\d)")


def function_of(step: str) -> list[tuple[int, str, str, str]]:
    r"""Worded function values ``the ceiling of \( \sqrt{60.8333} \), which is 7``, ``the cube root of 25 is
    approximately 2.924``: ``(where, the value as LaTeX, the result, "=" or "~")``."""
    out = []
    for m in _FUNCTION_OF.finditer(step):
        arg = next(g for g in m.groups()[1:4] if g is not None)
        result = next(g for g in m.groups()[5:8] if g is not None)
        out.append((m.start(), _OF[m.group(1)].format(arg), result, "~" if m.group(5) else "="))
    return out


def both_signs(part: str, read) -> tuple[str, str] | None:
    r"""A side with ``\pm`` / ``\mp`` read twice by ``read`` (:func:`claims.to_expression`): ``(+ reading,
    - reading)``, None when it has neither or a reading fails."""
    if not re.search(r"\\(?:pm|mp)(?![A-Za-z])", part):
        return None
    plus = read(re.sub(r"\\pm(?![A-Za-z])", "+", re.sub(r"\\mp(?![A-Za-z])", "-", part)))
    minus = read(re.sub(r"\\pm(?![A-Za-z])", "-", re.sub(r"\\mp(?![A-Za-z])", "+", part)))
    return (plus, minus) if plus is not None and minus is not None else None


def spans_as_numbers(step: str, spans: list[tuple[int, int, str]]) -> str:
    r"""The step's text with every math span that is one number (``\(729\)``, ``$14.4$``) or one division of
    numbers (``\(770 \div 333 = 2\)``, for a remainder said after it) written plain and every other span as one
    mark ``\x03`` (so a worded claim never reaches into a formula);
    ``spans`` are ``(start, end, body)``."""
    out, pos = [], 0
    for start, end, body in spans:
        out.append(step[pos:start])
        b = body.strip().replace("{,}", ",").replace("\\!", "")
        division = re.sub(r"\\div(?![A-Za-z])", "÷", b)
        out.append(b if re.fullmatch(r"-?\d[\d,]*(?:\.\d+)?|\d+_\{?\d+\}?", b) else
                   division if re.fullmatch(r"[\d\s,.÷=]+", division) and "÷" in division else "\x03")
        pos = end
    out.append(step[pos:])
    return "".join(out)


# Moved from stepkit.grading.claims (its 600-line bound): absolute values and logarithms of a side.

def bars(s: str) -> str | None:
    r"""Absolute values ``\left| x \right|``, ``|x|`` (one pair) as ``abs(x)``; a norm ``\|`` or more bars than
    one pair outside ``\left \right``: None."""
    if s is None or "\\|" in s:
        return None
    s = re.sub(r"\\left\s*\||\\lvert", " abs(", s)
    s = re.sub(r"\\right\s*\||\\rvert", ") ", s)
    if s.count("|") == 2:
        i = s.index("|")
        j = s.index("|", i + 1)
        s = s[:i] + " abs(" + s[i + 1:j] + ") " + s[j + 1:]
    return None if "|" in s else s


_LOG = re.compile(r"\\log_\s*(\{[^{}]*\}|\d+|[A-Za-z])\s*")


def logs(s: str) -> str | None:
    r"""``\log_b x`` as ``(log(x)/log(b))``: the argument a brace group, a parenthesised group, a number or one
    letter (not followed by ``^``: ``\log_2 x^3`` is ambiguous); None for any other."""
    while True:
        m = _LOG.search(s)
        if not m:
            return s
        base = m.group(1).strip("{}")
        i = m.end()
        j = None
        if s.startswith("\\left(", i) or s.startswith("(", i) or s.startswith("{", i):
            opener = "{" if s[i] == "{" else "("
            closer = "}" if opener == "{" else ")"
            depth = 0
            for k in range(i, len(s)):
                depth += s[k] == opener
                depth -= s[k] == closer
                if depth == 0 and s[k] == closer:
                    j = k + 1
                    break
            if j is None:
                return None
            arg = s[i:j]
            if opener == "{":
                arg = "(" + arg[1:-1] + ")"
        else:
            a = re.match(r"\d+(?:\.\d+)?|[A-Za-z](?![A-Za-z])", s[i:])
            if not a or s[i + a.end():].lstrip().startswith("^"):
                return None
            j = i + a.end()
            arg = a.group()
        s = s[:m.start()] + "{\\log(" + arg + ")/\\log(" + base + ")}" + s[j:]


# Functions written without parentheses (tokens of claims._explicit).

def _group(toks: list, i: int) -> int | None:
    """The index after the parenthesised group opening at ``toks[i]``, or None."""
    depth = 0
    for j in range(i, len(toks)):
        depth += toks[j][1] == "("
        depth -= toks[j][1] == ")"
        if depth == 0:
            return j + 1
    return None


def applied(toks: list) -> list | None:
    r"""``sin x``, ``\sin^2 x``, ``\log 2``, ``\sin x \cos x`` (a function before a run of numbers and names)
    as ``sin(x)``, ``(sin(x))**(2)``...; None when the reading is ambiguous (``\sin x^2``) or the function has
    no argument."""
    out, i = [], 0
    while i < len(toks):
        kind, text = toks[i]
        if kind != "func" or text not in ("sin", "cos", "tan", "sec", "csc", "cot", "log", "exp") or \
                (i + 1 < len(toks) and toks[i + 1][1] == "("):
            out.append(toks[i])
            i += 1
            continue
        j, power = i + 1, []
        if j < len(toks) and toks[j][1] == "**" and j + 1 < len(toks) and toks[j + 1][1] == "(":
            end = _group(toks, j + 1)
            if end is None:
                return None
            power, j = toks[j:end], end
            if any(t[1] == "-" for t in power):
                return None  # \cos^{-1}: the inverse function, not a power
        k = j
        while k < len(toks) and toks[k][0] in ("num", "name"):
            k += 1
        if power and k == j and j < len(toks) and toks[j][1] == "(":  # \sin^2(x)
            k = _group(toks, j)
            if k is None:
                return None
        elif k == j or (k < len(toks) and toks[k][1] in ("**", "(")):
            return None
        call = [("func", text), ("op", "(")] + toks[j:k] + [("op", ")")]
        out += ([("op", "(")] + call + [("op", ")")] + power) if power else call
        i = k
    return out


# Angles in degrees and Greek letters (tokens of claims.to_expression).

GREEK = {"alpha": "\u03b1", "beta": "\u03b2", "gamma": "\u03b3", "delta": "\u03b4", "epsilon": "\u03b5",
         "varepsilon": "\u03b5", "zeta": "\u03b6", "eta": "\u03b7", "theta": "\u03b8", "vartheta": "\u03b8",
         "kappa": "\u03ba", "lambda": "\u03bb", "mu": "\u03bc", "nu": "\u03bd", "xi": "\u03be", "rho": "\u03c1",
         "sigma": "\u03c3", "tau": "\u03c4", "phi": "\u03c6", "varphi": "\u03c6", "chi": "\u03c7", "psi": "\u03c8",
         "omega": "\u03c9"}  # lower case only (\Delta, \Sigma name shapes, sums, changes); \pi is the number
_DEGREE = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°")
_TRIG = re.compile(r"\\(?:sin|cos|tan|sec|csc|cot)(?![A-Za-z])")
_IN_DEGREES = re.compile(r"(\d+(?:\.\d+)?|(?<![A-Za-z\\])[A-Za-z](?![A-Za-z])|\\(?:" + "|".join(GREEK) + r")(?![A-Za-z]))\s*"
                         r"(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°)")


def degrees(s: str) -> str | None:
    r"""A side's degree signs: with no trigonometric function they are dropped (an angle is its number of
    degrees: ``180^\circ - 2 \cdot 40^\circ = 100^\circ``); with one, each number or letter written in
    degrees becomes radians, ``\cos 208^\circ`` -> ``\cos {(208 \cdot \frac{\pi}{180})}`` (so ``\tan 45^\circ
    = 1`` holds and ``\cos 208^\circ = \cos(180^\circ - 208^\circ)`` fails); a degree sign on anything else
    there (``\csc (2^3)^\circ``): None."""
    if not _DEGREE.search(s):
        return s
    if not _TRIG.search(s):
        return _DEGREE.sub("", s)
    s = _IN_DEGREES.sub(lambda m: "{(" + m.group(1) + r" \cdot \frac{\pi}{180})}", s)
    return None if _DEGREE.search(s) else s


# Percent (sides of claims.Relation).

_PERCENT = re.compile(r"\\%")


def percent(part: str, read) -> tuple[str | None, str | None] | None:
    r"""A side with ``\%`` read twice by ``read`` (:func:`claims.to_expression`): ``(as hundredths, the sign
    dropped)`` (``60\% \cdot 20\% = 12\%`` holds in hundredths; ``0.6 \times 100 = 60\%`` with the sign
    dropped, as solutions write it); None when the side has no percent."""
    if not _PERCENT.search(part) or "%" in _PERCENT.sub("", part):
        return None
    return read(_PERCENT.sub(r" \\cdot \\frac{1}{100} ", part)), read(_PERCENT.sub(" ", part))


def percent_pair(left, right, lhs, rhs) -> tuple[str | None, str | None] | None:
    """The other reading (``Relation.alt``) of a relation one of whose sides has a percent (``left``/``right``:
    :func:`percent` of each side, ``lhs``/``rhs`` the sides as read), or None."""
    if left is None and right is None:
        return None
    return (left[1] if left else lhs), (right[1] if right else rhs)
