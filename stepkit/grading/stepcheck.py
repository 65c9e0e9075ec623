r"""Check the claims each step of a solution makes (:mod:`stepkit.grading.claims`) with sympy.

The engine of ``stepkit check-steps``. Importing this module loads no sympy: :func:`check_solution` imports it
on its first call, so only the stage that runs it pays for it (``import stepkit.grading.stepcheck`` stays
light, as every grading module but :mod:`stepkit.grading.equivalence`).

A claim ends in one of three outcomes:

* ``held``: true. Numbers are compared in exact rational arithmetic (sympy ``Rational``; radicals and ``pi``
  by evaluation to 40 digits, a difference below ``1e-25`` relative being zero); a right side written with
  ``d`` decimals may be the exact value rounded there (``\frac{1}{3} \approx 0.33``, ``= 0.333``). A relation
  with free symbols is an identity when ``expand(lhs - rhs)`` is 0 or, failing that, when it is zero at
  ``POINTS`` random rational points (seeded, so reruns agree);
* ``failed``: false: a numeric relation that does not hold, an identity that a random point refutes, a
  division with a wrong quotient or remainder, a value named by a step (``x = 3``) that does not satisfy the
  equation the same step wrote just before it (a solved equation);
* ``not parsed``: the checker could not decide: a side outside the vocabulary, an equation with a variable
  no earlier step defined (``2x + 3 = 7`` states a condition, not a claim), a free symbol the
  random points cannot evaluate, a claim that ran over its time (``timeout`` seconds). Never an error.

Context: a first link ``v = <number>`` (``a = -6``, ``n = 107``) defines ``v`` for the later links of every
later chain of the solution (a substitution: ``A = \pi r^2 = 9\pi`` after ``r = 3``), until a step defines
``v`` again; one inside a case (``Second, if \gcd(y, 6) = 2``) only for the rest of that case. A value a step names is checked against the equations in ``v`` the same step wrote before it:
it must solve one of them (a case split ``x - 8 = \pm 12`` gives two). Which links are claims about symbols (must be
identities) and which are conditions:

* a ``later`` or ``continued`` link (``= t^2 - t - 2`` after ``(t+1)(t-2)``) is a simplification: it must be
  an identity, after putting in the definitions; when it is none and its sides have other symbols (a chain
  of conditions ``a + b = b + c``, an evaluation at values no step defined ``\pi r^2 = \pi 3^2``), it is
  not parsed;
* a ``first`` link with free symbols is a condition (no definition is put in: ``x + y + z = 2`` after
  ``x = 3`` is a new equation, not a claim about 3): held when it is an identity;
  else it is compared with the earlier conditions in the same symbols (:func:`_follows`: held when a
  rearrangement of one; failed when, in one variable with rational polynomial sides, it shares no root with
  any, or when it has the latest one's symbol terms with another constant, a term moved wrongly, or the
  same monomials, three or more and one of degree 2 or more, with some terms' signs flipped, a term moved
  across with its sign kept, :func:`_sign_slip`; inside a case, ``if``/``suppose``/``for n = 4``, only the
  case's own conditions count); else not parsed. It is remembered, so that a value the step then names
  (``y = \frac{4}{7}``) is checked against it.
* ``f(x) = <body>`` defines a one-letter function (also from the problem text); ``f(2) = ..`` evaluates it.
  A name restated in a later step with another symbolic value (``c = 2d``, then ``c = \frac{1}{2}d``) must
  be an identity (not inside a case; ``x``, ``y``, ``z`` exempt). A name with a formula (``x = (120 -
  k^2)^2``, outside a case) given a number once every symbol of the formula got a value after it (``If k =
  9, then x = 961``) must be the formula's value there (:func:`_formula`).
* congruences (:mod:`stepkit.grading.claim_forms`): numeric ones exactly (integers only: ``3^{-1}`` is an
  inverse, not parsed); one in one symbol is compared with the latest before it in the same symbol and
  modulus by their residues (:func:`_congruence_follows`: held when the same, failed when they share none,
  ``2n \equiv -10 \implies 2n \equiv 1 \pmod 3``; a list of residues, ``n \equiv 1`` or ``n \equiv 2``, is
  no derivation). ``gcd``/``lcm`` evaluate on integers only.
* fourth round (:mod:`stepkit.grading.stepcheck_rules`): a defined function is put in wherever it is applied;
  an ordering of a non-real number fails; an inequality that is the one before it times a negative expression
  fails (:func:`_reversed`). Not failed: a later link that holds given the step's or the problem's conditions
  (:func:`_by_condition`), a continued span that is a part of the expression before it (:func:`_part_of`), a
  claim the step retracts after it (``Oops``), a name given in degrees inside a trigonometric function.
"""

from __future__ import annotations

import random
import re
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from stepkit.grading.claims import Arithmetic, Relation, Remainder, extract
from stepkit.grading.stepcheck_rules import (
    _apply,
    _by_condition,
    _congruence_follows,
    _congruent,
    _constant_part,
    _inequality_follows,
    _non_real,
    _number,
    _part_of,
    _proportional,
    _sign_slip,
)

POINTS = 3
SOLVED = True  # check a named value against the equation its step wrote before it
SUBSTITUTE_CONDITIONS = False  # put definitions into a first link with symbols (else it is a new condition)
ACROSS = True  # compare a linear equation with the previous step's too (else only within a step)
LINEAR = True  # a linear equation in one variable must keep the root of the one before it
RESTATE_EXEMPT = ("x", "y", "z")  # names a solution reuses for new curves (y = 2x + 3, then y = -x + 1)
INEQUALITIES = True  # an inequality rewritten in the same step must give no stronger bound than the one before
SIGN_SLIPS = True  # a rearranged polynomial equation with some terms' signs flipped is false
FORMULAS = True  # a value named for a name with a formula is checked against it at the values given after it
FORMULA_REACH = 3  # ... given at most this many claims before the value
CASE_SCOPE = True  # a value given inside a case (if, suppose, for n = 4) is a definition in that case only
RETRACT = True  # a failed claim before the step retracts it (Oops, I made a mistake) is not counted
_RETRACTION = re.compile(r"\b(?:oops|I made (?:a|an) (?:mistake|error)|(?:this|that) (?:is|was) (?:incorrect|wrong)|"
                         r"let me (?:correct|re-?check|re-?calculate))", re.I)
_TRIG_EXPR = re.compile(r"(?:sin|cos|tan|sec|csc|cot)\(")
SCOPE = "solution"  # where a definition holds: "solution" (later steps too), "step" (its own step), "none"
_TINY = 1e-25


class ClaimTimeout(Exception):
    """A claim ran over its time budget."""


@dataclass
class StepCheck:
    """The checked claims of one step.

    Attributes:
        held, failed, not_parsed: claim counts.
        failures: the failed claims as written (for inspection), in order.
    """

    held: int = 0
    failed: int = 0
    not_parsed: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def checked(self) -> int:
        """Claims decided (held + failed)."""
        return self.held + self.failed


@contextmanager
def _time_limit(seconds: float):
    """Raise :class:`ClaimTimeout` after ``seconds`` of wall time (SIGALRM in the main thread; in another
    thread no limit can interrupt sympy, and the expression-size guards of :func:`claims.to_expression`
    are the bound)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise ClaimTimeout()

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class _Sympy:
    """sympy, imported on first use, with the parser's closed namespace."""

    def __init__(self):
        import sympy
        from sympy.parsing.sympy_parser import parse_expr

        self.sp, self.parse_expr = sympy, parse_expr
        self.names = {"abs": sympy.Abs, "sqrt": sympy.sqrt, "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan,
                      "sec": sympy.sec, "csc": sympy.csc, "cot": sympy.cot, "log": sympy.log,
                      "exp": sympy.exp, "binomial": sympy.binomial, "factorial": sympy.factorial,
                      "floor": sympy.floor, "ceiling": sympy.ceiling, "pi": sympy.pi, "Integer": sympy.Integer,
                      "Rational": sympy.Rational, "Symbol": sympy.Symbol, "Function": sympy.Function, "Float": sympy.Float,
                      "gcd": self._integers(sympy, sympy.igcd), "lcm": self._integers(sympy, sympy.ilcm)}

    @staticmethod
    def _integers(sympy, f):
        """``f`` (igcd, ilcm) of two or more integers; anything else raises TypeError (the side is not parsed)."""
        def g(*args):
            if len(args) < 2 or not all(getattr(a, "is_Integer", False) for a in args):
                raise TypeError("gcd/lcm of integers only")
            out = args[0]
            for a in args[1:]:
                out = f(out, a)
            return sympy.Integer(out)
        return g

    def parse(self, expr: str | None):
        """The sympy expression of a plain expression from :func:`claims.to_expression`, None if it fails."""
        if expr is None:
            return None
        try:
            out = self.parse_expr(expr, global_dict=dict(self.names), local_dict={}, evaluate=True)
        except (SyntaxError, TypeError, ValueError, ZeroDivisionError, AttributeError, TokenError_, RecursionError,
                OverflowError, MemoryError, NameError):
            return None
        if not isinstance(out, self.sp.Expr) or out.has(self.sp.zoo, self.sp.nan, self.sp.oo, -self.sp.oo):
            return None
        return out


try:  # tokenize's error, raised by parse_expr on unbalanced parentheses
    from tokenize import TokenError as TokenError_
except ImportError:  # pragma: no cover
    TokenError_ = SyntaxError

_SYMPY: _Sympy | None = None


def _sympy() -> _Sympy:
    global _SYMPY
    if _SYMPY is None:
        _SYMPY = _Sympy()
    return _SYMPY


def _numeric(sp, op: str, a, b, decimals: int, whole: bool = False, rough: bool = False) -> bool | None:
    """Whether the numeric relation ``a op b`` holds (None: it cannot be evaluated); ``whole``: an integer
    quotient may be rounded down; ``rough``: rounded inputs, within 1%."""
    x, y = _number(sp, a), _number(sp, b)
    if x is None or y is None:
        return None
    scale = max(1.0, abs(x), abs(y))
    diff = abs(x - y)
    equal = diff <= _TINY * scale or (whole and abs(x.imag) < 1e-12 and 0 <= x.real - y.real < 1) or \
        (rough and diff <= 0.01 * max(abs(x), abs(y)))
    rounded = decimals and diff <= 0.5 * 10 ** -decimals * (1 + 1e-9)
    if op == "=":
        return bool(equal or rounded)
    if op == "~":  # approximately: the written rounding, or within 1% (a loose approximation is no error)
        return bool(equal or rounded or diff <= 0.01 * scale)
    if op == "!=":
        return not equal
    if abs(x.imag) > 1e-12 or abs(y.imag) > 1e-12:
        return None
    x, y = x.real, y.real
    return {"<": x < y and not equal, "<=": x < y or equal, ">": x > y and not equal, ">=": x > y or equal}[op]


def _identity(sp, a, b, rng: random.Random) -> bool | None:
    """Whether ``a == b`` for every value of their symbols: expand, then random rational points; None when
    no point evaluates."""
    d = a - b
    try:
        if sp.expand(d) == 0:
            return True
    except (TypeError, ValueError, RecursionError):
        pass
    symbols = sorted(d.free_symbols, key=lambda s: s.name)
    if not symbols:  # the symbols cancel (x^2 + 2x + 1 = x^2 + 2x + 2): the difference is a number
        return _numeric(sp, "=", d, sp.Integer(0), 0)
    tried = 0
    for _ in range(POINTS * 3):
        point = {s: sp.Rational(rng.randint(-97, 97), rng.randint(1, 13)) for s in symbols}
        try:
            x, y = _number(sp, a.subs(point)), _number(sp, b.subs(point))
        except (TypeError, ValueError, ZeroDivisionError, RecursionError):
            continue
        if x is None or y is None:
            continue
        tried += 1
        if abs(x - y) > 1e-9 * max(1.0, abs(x), abs(y)):
            return False
        if tried >= POINTS:
            return True
    return None


def _identity_or_imaginary(sp, a, b, rng):
    """:func:`_identity`, and when it fails for a relation with a symbol ``i``, again with ``i`` the imaginary
    unit (``10i(a - bi) = 10ai + 10b``): held when either reading is an identity."""
    same = _identity(sp, a, b, rng)
    i = sp.Symbol("i")
    if same is False and i in (a.free_symbols | b.free_symbols):
        other = _identity(sp, a.subs(i, sp.I), b.subs(i, sp.I), rng)
        return other if other is not None else same
    return same


def check_solution(steps: list[str], timeout: float = 2.0, seed: int = 0, problem: str | None = None) -> list[StepCheck]:
    """Check every claim of every step of one solution, in order (definitions carry forward).

    Args:
        steps: the solution's steps (text).
        timeout: seconds per claim (main thread only; 0: none).
        seed: for the random points of identity checks.
        problem: the problem's text, or None: the one-letter functions it defines (``f(x) = 3x + 2``) are
            known to every step (nothing else of it is read: its equations are conditions, not claims).

    Returns:
        One :class:`StepCheck` per step.
    """
    S = _sympy()
    rng = random.Random(seed)
    defs: dict = {}
    symbolic: dict = {}  # the latest symbolic value of each name (R = 225000 + 4000n - 50n^2)
    memo: dict = {"tick": 0, "formula": {}, "at": {}}  # formulas (x = (120 - k^2)^2) and when each name got a value
    funcs: dict = {}  # one-letter functions the solution defined: name -> (variable, body)
    for it in extract(problem)[0] if problem else []:
        try:
            with _time_limit(timeout):
                if isinstance(it, Relation) and it.call is not None:
                    _call(S, it, funcs, rng)
                elif isinstance(it, Relation) and it.op == "=" and it.lhs and it.rhs:  # (xyz = 2, \omega^3 = 1)
                    a, b = S.parse(it.lhs), S.parse(it.rhs)
                    memo.setdefault("given", []).extend([(a, b)] if a is not None and b is not None else [])
        except (ClaimTimeout, TypeError, ValueError, ZeroDivisionError, RecursionError, OverflowError, AttributeError):
            pass
    problem_funcs = dict(funcs)
    last_equation: list = []  # the solution's conditions, oldest first: (condition, step, case within the step)
    case_defs: dict = {}  # the names given a value inside a case: name -> (step, case)
    out = []
    previous = None
    for step in steps:
        res = StepCheck()
        items, previous = extract(step, previous)
        if SCOPE != "solution":
            defs, funcs, symbolic = {}, dict(problem_funcs), {}
            memo = {"tick": memo["tick"], "formula": {}, "at": {}}
        conditions = []  # this step's equations, which a value it names may solve
        cases = [m.start() for m in _CASE.finditer(step)]  # where a case opens (if, suppose, for n = 4, ...)
        retracted = max([m.start() for m in _RETRACTION.finditer(step)], default=-1) if RETRACT else -1
        if not ACROSS:
            last_equation.clear()
        for it in items:
            if isinstance(it, (Arithmetic, Remainder)):
                _count(res, it.holds, it.text)
                continue
            case = sum(c < it.at for c in cases) if isinstance(it, Relation) else 0
            # inside a case, a condition follows only from the conditions of the same case
            history = [c for c, s, k in last_equation if not case or (s == len(out) and k == case)]
            before = len(conditions)
            where = (len(out), case)
            for k in [k for k, w in case_defs.items() if w != where] if CASE_SCOPE else ():
                defs.pop(k, None)  # a value given inside a case holds in that case only
                del case_defs[k]
            snapshot = dict(defs)
            try:
                with _time_limit(timeout):
                    memo["tick"] += 1
                    memo["case"] = where
                    verdict = _relation(S, it, defs, conditions, rng, history, funcs, None if case else symbolic,
                                        len(out), memo)
            except ClaimTimeout:
                verdict = None
            except (TypeError, ValueError, ZeroDivisionError, RecursionError, OverflowError, AttributeError):
                verdict = None
            last_equation += [(c, len(out), case) for c in conditions[before:]]
            if case:
                case_defs.update({k: where for k, v in defs.items() if snapshot.get(k) is not v})
            if verdict == "skip":
                continue
            _count(res, None if verdict is False and it.at < retracted else verdict, it.text)
        out.append(res)
    return out


def _count(res: StepCheck, verdict, text: str) -> None:
    if verdict is True:
        res.held += 1
    elif verdict is False:
        res.failed += 1
        res.failures.append(text)
    else:
        res.not_parsed += 1


def _rational_poly(sp, e, x):
    """The numerator of ``e`` (one free symbol ``x``) as a polynomial over the rationals of degree 1..12, or
    None (radicals in the coefficients, a symbol under a root, too high a degree)."""
    num = sp.numer(sp.together(e))
    try:
        p = sp.Poly(sp.expand(num), x, domain="QQ")
    except (sp.PolynomialError, sp.CoercionFailed, sp.GeneratorsNeeded, ValueError, TypeError):
        return None
    return p if 1 <= p.degree() <= 12 else None


_CASE = re.compile(r"\b(?:if|case|cases|suppose|assume|assuming|when|either|otherwise|alternatively|try|trying)\b|"
                   r"\bfor\s+(?:\\\(|\$)[^$)]*(?:=|\\equiv)", re.I)


def _follows(sp, new, history: list) -> bool | None:
    r"""Whether the condition ``new`` (``(lhs, rhs)``) is a consequence of the conditions the solution wrote
    before it in the same free symbols (``history``, oldest first), as far as can be decided; None otherwise.

    * held: ``lhs - rhs`` is a constant multiple of an earlier condition's (a rearrangement:
      ``x^2 - 3x = 1`` after ``x^2 = 3x + 1``);
    * failed, in one variable with rational polynomial sides: ``new`` shares no root (over the complex
      numbers) with any earlier condition in that variable (``(x - 1)(x - 3) = 0`` after ``x^2 - 3x = 1``;
      a factor set to zero shares its roots with the product, a squared equation keeps its roots);
    * failed, otherwise (several variables, radicals): the latest such condition and ``new`` have the same
      terms with symbols up to a factor but other constants (a term moved across with a wrong sign or sum:
      ``2\sqrt{..} = 16 - 12x^2 + 32x + 7`` after ``12x^2 - 32x - 7 + 2\sqrt{..} = 9``).

    Never failed (a case analysis, not a derivation: each case is a new condition): when ``case`` (the step
    says ``if``, ``case``, ``suppose``, ``for \(n = 4\)``...), or when a side of ``new`` is an earlier such
    condition's side as written (``x - 4 = 11`` after ``x - 4 = 1``; ``ab = 7`` after ``ab = 5``).
    """
    dn = sp.expand(new[0] - new[1])
    free = dn.free_symbols
    relevant = [(a, b) for a, b in history if (a - b).free_symbols == free]
    same = [sp.expand(a - b) for a, b in relevant]
    if not free or not same:
        return None
    if any(_proportional(sp, dn, do) is not None for do in same):
        return True
    if not LINEAR or any((new[0] == a and a.free_symbols) or (new[1] == b and b.free_symbols)
                                                     for a, b in relevant):
        return None
    if len(free) == 1:
        (x,) = free
        pn = _rational_poly(sp, dn, x)
        olds = [p for p in (_rational_poly(sp, do, x) for do in same) if p is not None]
        if pn is not None and olds:
            if any(sp.gcd(pn, po).degree() > 0 for po in olds):
                return None
            if len(olds) == len(same):
                return False
    do = same[-1]
    cn, co = _constant_part(sp, dn), _constant_part(sp, do)
    c = _proportional(sp, sp.expand(dn - cn), sp.expand(do - co))
    if c is None:
        return False if SIGN_SLIPS and _sign_slip(sp, dn, do) else None
    return _numeric(sp, "=", cn, c * co, 0)


def _call(S: _Sympy, r: Relation, funcs: dict, rng: random.Random):
    """A first link ``f(arg) = rhs``: a definition (``arg`` one variable that ``rhs`` uses; kept in ``funcs``,
    "skip"), else an evaluation of an earlier definition: held / failed when the definition with ``arg`` put
    in equals ``rhs`` (numerically, or as an identity in the symbols both sides share: ``p(1) = 12a^2 + ..``),
    None (not parsed) when ``f`` is not defined or the sides are a condition (``f(1) = 5`` for
    ``f(x) = ax + b``)."""
    sp = S.sp
    name, arg_text = r.call
    arg, b = _apply(sp, S.parse(arg_text), funcs), _apply(sp, S.parse(r.rhs), funcs)
    if arg is None or b is None:
        return None
    if arg.is_Symbol:
        if arg in b.free_symbols:
            funcs[name] = (arg, b)
            return "skip"
        return None  # f(x) = 0: a condition on x
    if name not in funcs:
        return None
    var, body = funcs[name]
    value = body.subs(var, arg)
    if not (value.free_symbols | b.free_symbols):
        return _numeric(sp, "=", value, b, r.decimals)
    if not b.free_symbols or not value.free_symbols <= b.free_symbols:
        return None  # a condition on the definition's parameters
    return _identity_or_imaginary(sp, value, b, rng)


def _formula(sp, r: Relation, value, defs: dict, memo: dict) -> bool | None:
    """A value named for a name with a formula (``x = (120 - k^2)^2``, outside a case) when every symbol of the
    formula got its value after the formula was written, in this step and at most ``FORMULA_REACH`` claims
    before this one (``If k = 9, then x = 961``): whether the formula at those values gives it (None: no such formula, or it
    does not evaluate to a number)."""
    formula = memo["formula"].get(r.name)  # (None: the name's latest formula was written inside a case)
    if formula is None or not formula[0].free_symbols:
        return None
    body, written = formula
    step = memo["case"][0]
    if not all(written < memo["at"].get(s, (-1, -1))[0] >= memo["tick"] - FORMULA_REACH and memo["at"][s][1] == step
               and s in defs for s in body.free_symbols):
        return None  # (values given long before the claim belong to something else: a = 1, b = 6 of a quadratic)
    v = body.subs(defs)
    rough = r.rounded_input or bool(re.search(r"\d\.\d", r.text.partition(" = ")[2]))  # (y = \frac{199.1}{2})
    return None if v.free_symbols else _numeric(sp, "=", v, value, r.decimals, rough=rough)


def _points(S: _Sympy, r: Relation, defs: dict):
    """Two tuples of numbers (a midpoint ``(\\frac{5+7}{2}, \\frac{3+4}{2}) = (6, \\frac{7}{2})``), compared
    entry by entry; None when a side is a tuple of anything else or their lengths differ; ``"no tuple"``
    when a side is no tuple (the relation is read as usual)."""
    sides = []
    for expr in (r.lhs, r.rhs):
        try:
            out = S.parse_expr(expr, global_dict=dict(S.names), local_dict={}, evaluate=True)
        except (SyntaxError, TypeError, ValueError, ZeroDivisionError, AttributeError, TokenError_, RecursionError,
                OverflowError, MemoryError):
            return None
        if not isinstance(out, (tuple, S.sp.Tuple)):
            return "no tuple"  # (\\gcd(41^2, 41 \\cdot 43): the commas of a function's arguments)
        if not all(isinstance(v, S.sp.Expr) for v in out):
            return None
        sides.append([v.subs(defs) for v in out])
    if len(sides[0]) != len(sides[1]) or any(v.free_symbols for side in sides for v in side):
        return None
    verdicts = [_numeric(S.sp, "=", x, y, 0, rough=r.rounded_input) for x, y in zip(*sides)]
    return None if None in verdicts else all(verdicts)


def _both_signs(S: _Sympy, r: Relation, defs: dict, rng: random.Random) -> bool | None:
    """A relation with ``\\pm`` on both sides (``\\frac{53 \\pm \\sqrt{169}}{8} = \\frac{53 \\pm 13}{8}``): each
    reading, ``+`` and ``-``, numerically (or as an identity, for a later link); failed when one is false, held
    when both hold, else None."""
    verdicts = []
    for lhs, rhs in ((r.lhs, r.rhs), r.minus):
        a, b = S.parse(lhs), S.parse(rhs)
        if a is None or b is None:
            return None
        a, b = a.subs(defs), b.subs(defs)
        if not (a.free_symbols | b.free_symbols):
            verdicts.append(_numeric(S.sp, r.op, a, b, r.decimals, r.whole, r.rounded_input))
        elif r.op == "=" and r.link != "first" and a.free_symbols == b.free_symbols:
            verdicts.append(_identity(S.sp, a, b, rng))
        else:
            return None
    return False if False in verdicts else True if all(verdicts) else None


def _relation(S: _Sympy, r: Relation, defs: dict, conditions: list, rng: random.Random, history: list,
              funcs: dict | None = None, symbolic: dict | None = None, step: int = 0, memo: dict | None = None):
    """True / False / None (not parsed) / "skip" (a definition, not a claim) for one relation; a condition
    updates ``conditions`` (this step's) and ``last_equation`` (the solution's latest); ``memo``: the
    formulas of :func:`_formula`."""
    sp = S.sp
    if r.alt is not None:  # a percent: in hundredths, else with the sign dropped (failed when both fail)
        args = (defs, conditions, rng, history, funcs, symbolic, step, memo)
        first = _relation(S, replace(r, alt=None), *args)
        return first if first is not False else _relation(S, replace(r, lhs=r.alt[0], rhs=r.alt[1], alt=None), *args)
    if r.call is not None:
        return _call(S, r, funcs if funcs is not None else {}, rng)
    if r.minus is not None:
        return _both_signs(S, r, defs, rng)
    if r.op == "=" and r.lhs and r.rhs and "," in r.lhs + r.rhs:
        points = _points(S, r, defs)
        if points != "no tuple":
            return points
    a, b = (_apply(sp, S.parse(x), funcs) for x in (r.lhs, r.rhs))
    if b is None or (a is None and r.name is None):
        return None
    in_degrees = memo.setdefault("degrees", set()) if memo is not None else set()
    if in_degrees and _TRIG_EXPR.search(f"{r.lhs} {r.rhs}") and any(re.search(
            rf"(?<![\w.]){re.escape(v.name)}(?![\w.])(?!\*\(\(pi\)/\(180\)\))", f"{r.lhs} {r.rhs}") for v in in_degrees):
        return None  # (\theta = 45^\circ, then \cos \theta: not cos(45); \cos n^\circ is read in degrees)
    if r.name is not None and r.op == "=":
        if re.search(r"\\circ|°", r.text.partition(" = ")[2]):
            in_degrees.add(sp.Symbol(r.name))
        value = b.subs(defs) if b.free_symbols else b
        if b.free_symbols and memo is not None:  # a formula as written (y = \frac{1}{5}x + \frac{13}{5})
            memo["formula"][r.name] = (b, memo["tick"]) if symbolic is not None else None
        if value.free_symbols:  # a symbolic definition (R = (300 - 5n)(750 + 10n)): no claim, unless it restates
            if symbolic is None or r.name in RESTATE_EXEMPT:  # one (R = 225000 + 4000n - 50n^2 after it)
                return "skip"
            before, where = symbolic.get(r.name, (None, step))
            symbolic[r.name] = (value, step)
            if before is None or where == step or before.free_symbols != value.free_symbols:
                return "skip"  # (two values in one step: the roots of an equation, w = .. and w = ..)
            return _identity_or_imaginary(sp, before, value, rng)
        if SCOPE != "none":
            defs[sp.Symbol(r.name)] = value
        name = sp.Symbol(r.name)
        formula = _formula(sp, r, value, defs, memo) if FORMULAS and memo is not None and not b.free_symbols else None
        if memo is not None:
            memo["at"][name] = (memo["tick"], memo["case"][0])
        if formula is not None:
            return formula
        verdicts = []
        if r.decimals or not SOLVED or re.search(r"\d\.\d", r.text.partition(" = ")[2]):
            return "skip"  # a rounded value satisfies its equation only roughly: not checked
        for lhs, rhs in conditions:  # the equations this step solved for the value it now names
            if (lhs - rhs).free_symbols == {name}:
                v = _numeric(sp, "=", lhs.subs(name, value), rhs.subs(name, value), 0)
                if v is not None:
                    verdicts.append(v)
        if verdicts:  # a case split (x - 8 = 12 or x - 8 = -12): the value solves one of them
            return any(verdicts)
        return "skip"
    if a is None:
        return None
    if r.op == "≡":
        a2, b2, m = a.subs(defs), b.subs(defs), S.parse(r.modulus)
        if a2.free_symbols | b2.free_symbols:
            return _congruence_follows(sp, a2, b2, m, memo) if memo is not None else None
        return _congruent(sp, a2, b2, m)
    if r.link == "first" and (a.free_symbols | b.free_symbols) and not SUBSTITUTE_CONDITIONS:  # a condition
        a2, b2 = a, b
    else:
        a2, b2 = a.subs(defs), b.subs(defs)
    free = a2.free_symbols | b2.free_symbols
    if r.op in ("<", "<=", ">", ">=") and (_non_real(sp, a2) or _non_real(sp, b2)):
        return False  # (x > \sqrt{-7}: no ordering of non-real numbers)
    if not free:
        verdict = _numeric(sp, r.op, a2, b2, r.decimals, r.whole, r.rounded_input)
        if verdict is False and r.link == "continued" and _part_of(sp, a2, b2):
            return None
        if verdict is False and (a2.has(sp.log) or b2.has(sp.log)):  # \log without a base: ln or log10
            ten = lambda x: sp.log(x) / sp.log(10)  # noqa: E731
            verdict = _numeric(sp, r.op, a2.replace(sp.log, ten), b2.replace(sp.log, ten), r.decimals, r.whole,
                               r.rounded_input)
        return verdict
    if r.op != "=":
        if r.op in ("<", "<=", ">", ">=") and r.link == "first" and INEQUALITIES and memo is not None:
            return _inequality_follows(sp, r.op, a2, b2, memo)
        return None
    same = _identity_or_imaginary(sp, a2, b2, rng)
    if same is False and r.link != "first" and ((r.link == "continued" and _part_of(sp, a2, b2)) or _by_condition(
            sp, a2 - b2, [c for c in conditions if c[1] != a2] + (memo or {}).get("given", []))):
        return None  # a part of the expression before it, or a condition put in
    if same or r.link != "first":  # a simplification keeps its variables; an evaluation at unknown values
        return same if same or a2.free_symbols == b2.free_symbols else None  # is not decided
    verdict = _follows(sp, (a2, b2), history)
    conditions.append((a2, b2))
    return verdict
