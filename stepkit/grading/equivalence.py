"""Answer equivalence with math-verify: parsing gold answers and predictions whole, and comparing them.

Pure functions, in-process and with no timeout (math-verify's own signal timeouts are disabled, so they
are safe in any thread): :class:`stepkit.grading.verify.AnswerChecker` runs them in a process pool with a
wall-clock timeout for untrusted model output. This is the only stepkit module that imports sympy and
math-verify (importing it takes about a second); every other grading module stays light.

Exact numbers compare exactly. math-verify decides ``a == b`` for two unevaluated numbers by evaluating
``a - b`` at ``numeric_precision`` digits with ``chop=True`` (``math_verify.grader.sympy_numeric_eq``),
which sets any difference below about 10^-15 to zero: 1/2^60 "equals" 1/2^61 and 1/20! "equals" 1/21!.
Importing this module replaces that step, for every comparison math-verify makes (top level, tuples,
intervals, sets, relations), by ``exact_numbers_equal`` when neither side is written with a decimal:
rational values in exact arithmetic, irrational ones by sympy's adaptive evaluation with a relative
tolerance (``EXACT_DIGITS``). A number written with a decimal keeps the rounding rule of ``FLOAT_ROUNDING``.

The numeric settings are pinned in :mod:`stepkit.grading.settings` (recorded in manifests by
``checker_settings()``).
"""

from __future__ import annotations

import functools
import logging
import re

from math_verify import LatexExtractionConfig, parse, verify
from math_verify import grader as _mv_grader
from sympy import Add, Basic, Expr, Float, MatrixBase, Mul, Pow, Rational, S, UnevaluatedExpr, binomial, factorial
from sympy.core.evalf import PrecisionExhausted
from sympy.core.relational import Relational
from sympy.logic.boolalg import And

from stepkit.errors import ConfigError
from stepkit.grading.settings import EXACT_BITS, EXACT_DIGITS, FLOAT_ROUNDING, NUMERIC_PRECISION, STRICT
from stepkit.grading.values import BIG_INT_DIGITS, big_int_strings, quote

_LATEX_ONLY = [LatexExtractionConfig()]
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
# Math-mode delimiters: unescaped $ or $$, \( \) \[ \].
_MATH_DELIM = re.compile(r"(?<!\\)(?:\$\$?|\\[()\[\]])")
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_CURRENCY = re.compile(r"(?<!\\)\$(?=\s*[\d.])")
# A decimal, with the power of ten it is multiplied by: "2.5", "2.5 \times 10^{-20}", "2.5E-20".
_DECIMALS = re.compile(
    r"\d*\.(\d+)(?:\s*(?:\\times|\\cdot|\*|×)\s*10\s*\^\s*(?:\{\s*([+-]?\d+)\s*\}|([+-]?\d))|[eE]([+-]?\d+))?"
)
_DIGITS = re.compile(r"\d")
_DIGIT_RUN = re.compile(r"\d+")
# Unit text such as "\mbox{ inches}^2": its exponent is dropped by math-verify and is not a lost number
# (text with digits, "\text{ (or 20)}", is not a unit: losing it is losing a number).
_UNIT = re.compile(r"\\(?:text|mbox|mathrm)\s*\{[^{}\d]*\}(?:\^\{?\d+\}?)?")
# math-verify's own split of an equation chain (math_verify.parser.equation_split_regex).
_EQ_SPLIT = re.compile(r"(?<!\\|<|!|>)=")


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once per process that its timeouts are off; that is deliberate here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.grader", "math_verify.parser"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def wrap_answer(answer: str) -> str:
    r"""Wrap a bare answer as ``\boxed{answer}`` so math-verify parses all of it.

    Unwrapped, math-verify parses bare LaTeX only up to its last simple number: ``1 - \sqrt{2}`` becomes
    ``1`` and ``1331 and 1728`` becomes ``1728`` (case ``mv-unwrapped-gold-truncated``). Answers that
    already contain unescaped ``$`` or ``\boxed`` are returned unchanged. (The checker itself goes further,
    see ``whole_answer``.)
    """
    if _UNESCAPED_DOLLAR.search(answer) or "\\boxed" in answer:
        return answer
    return "\\boxed{" + answer + "}"


def _closing_brace(text: str, open_end: int) -> int:
    """Index of the brace closing the one that ends at ``open_end`` (-1 if unclosed)."""
    depth = 1
    for m in re.compile(r"(?<!\\)[{}]").finditer(text, open_end):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return m.start()
    return -1


def _balanced(text: str) -> bool:
    depth = 0
    for m in re.finditer(r"(?<!\\)[{}]", text):
        depth += 1 if m.group() == "{" else -1
        if depth < 0:
            return False
    return depth == 0


def whole_answer(answer: str) -> tuple[str, bool]:
    r"""The answer as one LaTeX expression for ``\boxed{...}``, and whether it mixed math and plain text.

    Outer wrappers that enclose the whole answer (``$...$``, ``$$...$$``, ``\(...\)``, ``\[...\]``,
    ``\boxed{...}``, ``\fbox{...}``) are removed, and a lone ``$`` before a number is a currency sign.
    Math delimiters left inside (``$1$ - \sqrt{2}``, ``\boxed{1} - \sqrt{2}``) mean the answer *mixed*
    delimited math with text outside it; math-verify would parse only the delimited piece, so they are
    removed and the whole text is returned (``1 - \sqrt{2}``) with ``mixed=True``.
    """
    s = answer.strip()
    while True:
        for opener, closer in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(s) >= len(opener) + len(closer) and s.startswith(opener) and s.endswith(closer):
                inner = s[len(opener) : len(s) - len(closer)]
                if not _MATH_DELIM.search(inner) and not inner.endswith("\\"):
                    s = inner.strip()
                    break
        else:
            m = _BOX_OPEN.match(s)
            if m and _closing_brace(s, m.end()) == len(s) - 1:
                s = s[m.end() : -1].strip()
                continue
            break
    if len(_UNESCAPED_DOLLAR.findall(s)) == 1 and _CURRENCY.search(s):
        s = _CURRENCY.sub("", s, count=1).strip()
    mixed = bool(_MATH_DELIM.search(s) or _BOX_OPEN.search(s))
    if mixed:
        s = " ".join(_BOX_OPEN.sub("{", _MATH_DELIM.sub(" ", s)).split())
    return s, mixed


def _is_relation(expr) -> bool:
    return isinstance(expr, Relational) or (isinstance(expr, And) and all(
        isinstance(a, Relational) for a in expr.args))


def _parse_whole(answer: str, role: str) -> tuple[list | None, str | None]:
    """Parse ``answer`` as one expression; returns (parsed, None) or (None, why it is unusable).

    ``role`` is "gold" or "prediction": a gold that mixes delimited math with plain text is unusable
    (it is ambiguous which part is meant); a prediction is compared as the whole text.
    """
    if answer is None or not str(answer).strip():
        return None, f"empty {role} answer"
    whole, mixed = whole_answer(str(answer))
    if mixed and role == "gold":
        return None, "mixes $...$/\\(...\\)/\\boxed{} math with text outside it: give it as plain LaTeX"
    if not whole:
        return None, f"empty {role} answer"
    if not _balanced(whole):
        return None, "has unbalanced braces"
    if max(map(len, _DIGIT_RUN.findall(whole)), default=0) > BIG_INT_DIGITS:
        return None, f"has a number of more than {BIG_INT_DIGITS:,} digits"
    parsed = parse("\\boxed{" + whole + "}", extraction_config=_LATEX_ONLY, parsing_timeout=None)
    if not parsed:
        return None, "math-verify cannot parse it"
    if not isinstance(parsed[0], (Basic, MatrixBase)):
        return None, "math-verify parses it only as text, not as math"
    matched = parsed[-1] if isinstance(parsed[-1], str) else str(parsed[0])
    lost = len(_DIGITS.findall(matched)) < len(_DIGITS.findall(_UNIT.sub("", whole)))
    chain = len(_EQ_SPLIT.split(matched)) > 2 and "," not in matched and ";" not in matched
    if lost or (chain and not _is_relation(parsed[0])):
        return None, f"math-verify parses only part of it ({quote(matched)})"
    return parsed, None


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> list:
    """Parse a gold answer; raise ConfigError when it is unusable (see ``gold_problem``)."""
    parsed, why = _parse_whole(gold, "gold")
    if why:
        raise ConfigError(f"gold answer {quote(gold)} {why}")
    return parsed


def gold_problem(gold: str) -> str | None:
    """One line saying why ``gold`` cannot be used as a reference answer, or None when it is fine.

    Unusable: empty; mixing delimited math with plain text (``$1$ - \\sqrt{2}``); unbalanced braces;
    unparseable, or parseable only as text; parsed from a strict part of itself (lost digits, or only the
    last part of an equation chain); holding an integer of more than ``BIG_INT_DIGITS`` digits (shorter
    ones parse whole, see ``stepkit.grading.values``). The gold is quoted shortened (``quote``), so the
    reason stays one short line however long the gold is. Never raises for a bad gold; in-process, no
    timeout.
    """
    try:
        with big_int_strings():
            _parse_gold(gold)
    except ConfigError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a parser crash on a gold is a problem of that gold
        return f"gold answer {quote(gold)}: math-verify failed: {type(e).__name__}: {quote(e)}"
    return None


def _decimals(text: str) -> int:
    """Largest number of decimal places of a decimal written in ``text`` (0 if none).

    ``m \\times 10^{e}``, ``m \\cdot 10^{e}`` and ``mEe`` count the places of ``m`` minus ``e``: the last
    digit of ``2.5 \\times 10^{-20}`` is at the 21st place. A negative count (``1.5 \\times 10^{3}``) is 0.
    """
    places = 0
    for m in _DECIMALS.finditer(text):
        exp = next((g for g in m.groups()[1:] if g is not None), "0")
        places = max(places, len(m.group(1)) - int(exp[:12]))
    return places


def _real_number(expr) -> bool:
    """A real constant (no symbols, no percent sign, not a set/relation/matrix)."""
    return isinstance(expr, Expr) and expr.is_number and expr.is_real is True and not expr.has(UnevaluatedExpr)


def _numbers_agree(gold: Expr, pred: Expr, decimals: int, numeric_precision: int) -> bool:
    """|pred - gold| <= max(0.5 * 10^-decimals, |gold| * 10^-(numeric_precision - 1)), in at least
    50-digit arithmetic (see FLOAT_ROUNDING). ``gold`` may hold symbols that cancel in ``gold - pred``
    (the two sides of relations); then the tolerance is the absolute term alone."""
    digits = min(max(50, decimals + 20), 1000)
    diff = abs((gold - pred).evalf(digits))
    scale = abs(gold.evalf(digits)) if gold.is_number else 0
    tol = max(Rational(1, 2) * Rational(10) ** -decimals, scale * Rational(10) ** -(numeric_precision - 1))
    return bool(diff <= tol)


def _exact_number(expr) -> bool:
    """A finite constant written without a decimal or a percent sign (not a set, relation or matrix)."""
    return (isinstance(expr, Expr) and expr.is_number and not expr.has(Float, UnevaluatedExpr)
            and not expr.has(S.Infinity, S.NegativeInfinity, S.ComplexInfinity, S.NaN))


def _rational_bits(expr) -> float:
    """An upper bound on the bits of the numerator and denominator of ``expr``'s exact value, when it is
    built from integers and fractions with sums, products, integer powers, factorials and binomials;
    infinity for anything else (radicals, constants, functions) or a value too large to bound."""
    if expr.is_Rational:
        return expr.p.bit_length() + expr.q.bit_length()
    if isinstance(expr, (Add, Mul)):
        return sum(_rational_bits(a) for a in expr.args) + len(expr.args)
    if isinstance(expr, Pow) and expr.exp.is_Integer and abs(expr.exp) <= EXACT_BITS:
        base = _rational_bits(expr.base)
        return base if base == float("inf") else abs(int(expr.exp)) * max(1, base)
    if isinstance(expr, (factorial, binomial)) and all(a.is_Integer and 0 <= a <= EXACT_BITS for a in expr.args):
        n = int(expr.args[0])
        return n * max(1, n.bit_length())
    return float("inf")


def exact_numbers_equal(a: Expr, b: Expr) -> bool | None:
    """Whether two exact numbers (no decimal, no percent; may be complex) are equal, or None when sympy
    cannot evaluate their difference (the caller falls back to math-verify).

    Method: the difference ``a - b`` in sympy. When it is rational and at most ``EXACT_BITS`` bits, it is
    computed exactly (``doit``) and compared with 0, so ``2^{100}`` differs from ``2^{100}+1`` and
    ``1/2^{60}`` from ``1/2^{61}``. Otherwise sympy's ``evalf`` with ``strict=True`` raises its working
    precision until the difference has 15 correct significant digits: a value found is nonzero, so the
    numbers differ however small it is (``e^{-40}`` vs ``e^{-41}``); a difference that stays
    indistinguishable from 0 at ``EXACT_DIGITS`` digits of its terms is taken as 0 (``\\sqrt{2}+\\sqrt{3}``
    vs ``\\sqrt{5+2\\sqrt{6}}``): a relative tolerance, used only where exact arithmetic is not available.
    Never raises.
    """
    try:
        diff = a - b
        if not _exact_number(diff):
            return None
        if _rational_bits(diff) <= EXACT_BITS:
            exact = diff.doit()
            if exact.is_Rational:
                return bool(exact == 0)
        value = diff.evalf(15, strict=True, maxn=EXACT_DIGITS)
    except PrecisionExhausted:
        return True
    except Exception:  # noqa: BLE001 - sympy could not evaluate it: leave the pair to math-verify
        return None
    re_part, im_part = value.as_real_imag()
    if re_part.is_Number and im_part.is_Number:
        return bool(re_part == 0 and im_part == 0)
    return None


_MATH_VERIFY_NUMERIC_EQ = _mv_grader.sympy_numeric_eq


def _exact_numeric_eq(a, b, float_rounding: int, numeric_precision: int) -> bool:
    """Stands in for ``math_verify.grader.sympy_numeric_eq`` (same arguments): exact numbers, and the
    differences of expressions that are exact numbers (``x = 1/2^{60}`` vs ``x = 1/2^{61}``), are compared
    by ``exact_numbers_equal``; a real-number difference involving a decimal inside a product or sum
    (``2.5 \\cdot 10^{-20}``), which math-verify would chop at ``numeric_precision`` digits, by the rounding
    rule of ``FLOAT_ROUNDING`` at ``float_rounding`` places. Everything else (a bare decimal, percentages,
    matrices, symbols that do not cancel) goes to math-verify unchanged."""
    if isinstance(a, Expr) and isinstance(b, Expr) and not (a.has(UnevaluatedExpr) or b.has(UnevaluatedExpr)):
        try:
            diff = a - b
        except Exception:  # noqa: BLE001 - not subtractable: math-verify decides
            diff = None
        if diff is not None and not (a.has(Float) or b.has(Float)):
            same = exact_numbers_equal(a, b) if _exact_number(diff) else None
            if same is not None:
                return same
        elif diff is not None and _real_number(diff) and not (a.is_Number or b.is_Number):
            try:
                return _numbers_agree(a, b, float_rounding, numeric_precision)
            except Exception:  # noqa: BLE001 - sympy could not evaluate it: math-verify decides
                pass
    return _MATH_VERIFY_NUMERIC_EQ(a, b, float_rounding, numeric_precision)


# math-verify calls sympy_numeric_eq by its module-global name for every element it compares, so this one
# assignment covers tuples, intervals, sets, matrices and relations as well as the top level.
_mv_grader.sympy_numeric_eq = _exact_numeric_eq


def verify_answer(
    gold: str,
    pred: str | None,
    float_rounding: int = FLOAT_ROUNDING,
    numeric_precision: int = NUMERIC_PRECISION,
) -> bool:
    """In-process check that an extracted answer ``pred`` is equivalent to ``gold`` (math-verify).

    Each side is parsed as one whole expression (``whole_answer``, LaTeX extraction only), with
    math-verify's signal timeouts disabled, so this is safe in any thread, but has no timeout: use
    ``AnswerChecker`` for untrusted model output. A prediction that math-verify parses only in part
    (digits lost, or only the last part of an equation chain kept) is False, never its part's value.
    Real numbers involving a decimal are compared by the rounding rule of FLOAT_ROUNDING; two exact
    numbers (no decimal) by ``exact_numbers_equal``; everything else by math-verify's ``verify`` with float
    rounding ``max(float_rounding, decimal places written)``, whose numeric step for exact numbers is
    ``exact_numbers_equal`` too (see the module docstring).

    Integers of up to ``BIG_INT_DIGITS`` digits are parsed and compared whole (``big_int_strings``).

    Returns:
        True when equivalent; False when not, or when ``pred`` is None or does not parse whole.
    Raises:
        ConfigError: the gold answer is unusable (see ``gold_problem``).
    """
    with big_int_strings():
        return _verify_answer(gold, pred, float_rounding, numeric_precision)


def _verify_answer(gold: str, pred: str | None, float_rounding: int, numeric_precision: int) -> bool:
    gold_parsed = _parse_gold(gold)
    if pred is None or not str(pred).strip():
        return False
    pred_parsed, _ = _parse_whole(pred, "prediction")
    if pred_parsed is None:
        return False
    decimals = max(float_rounding, _decimals(pred), _decimals(gold))
    g, p = gold_parsed[0], pred_parsed[0]
    if _real_number(g) and _real_number(p) and (g.has(Float) or p.has(Float)):
        return _numbers_agree(g, p, decimals, numeric_precision)
    if _exact_number(g) and _exact_number(p):
        same = exact_numbers_equal(g, p)
        if same is not None:
            return same
    return verify(
        gold_parsed,
        pred_parsed,
        float_rounding=decimals,
        numeric_precision=numeric_precision,
        strict=STRICT,
        timeout_seconds=None,
    )
