r"""Rules of :mod:`stepkit.grading.stepcheck` on sympy expressions: numbers, congruences, inequalities rewritten,
terms moved with their sign kept (the third round of claim kinds of ``stepkit check-steps``).

Every function takes the ``sympy`` module as ``sp`` (imported by the caller on first use: importing this module
loads no sympy) and returns True (held), False (failed) or None (not decided), or a value as documented.
"""

from __future__ import annotations


def _number(sp, x) -> complex | None:
    try:
        v = complex(sp.N(x, 40))
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None
    return v if v == v and abs(v) != float("inf") else None


def _congruent(sp, a, b, m) -> bool | None:
    """Whether the integers ``a`` and ``b`` are congruent modulo the integer ``m`` (None: any of them is not an
    integer, has a symbol or ``m`` is 0: ``3^{-1} \\equiv 4`` is an inverse, not the rational 1/3)."""
    if m is None or not all(getattr(v, "is_Integer", False) for v in (a, b, m)) or m == 0:
        return None
    return (a - b) % m == 0


def _residues(sp, d, m: int) -> frozenset | None:
    """The residues ``k`` modulo ``m`` with ``d(k) = 0 (mod m)`` (``d`` a polynomial in one symbol with integer
    coefficients, ``2 <= m <= 5000``), or None."""
    (x,) = d.free_symbols
    try:
        coeffs = [int(c) for c in sp.Poly(d, x, domain="ZZ").all_coeffs()]
    except (sp.PolynomialError, sp.CoercionFailed, sp.GeneratorsNeeded, ValueError, TypeError):
        return None
    roots = []
    for k in range(m):
        v = 0
        for c in coeffs:
            v = (v * k + c) % m
        if v == 0:
            roots.append(k)
    return frozenset(roots)


def _congruence_follows(sp, a, b, m, memo: dict) -> bool | None:
    """A congruence ``a = b (mod m)`` in one symbol against the latest one before it in the same symbol and
    modulus (inside a case: of the same case): held when both have the same residues, failed when they share
    none (``2n = 1 (mod 3)`` after ``2n = -10 (mod 3)``), else None; it is remembered either way. The same
    left side with a reduced residue before it (``n = 1`` or ``n = 2 (mod 3)``) is a list of cases: None."""
    d = sp.expand(a - b)
    if m is None or not m.is_Integer or not 2 <= int(m) <= 5000 or len(d.free_symbols) != 1:
        return None
    now = _residues(sp, d, int(m))
    if now is None:
        return None
    where = memo.get("case", (0, 0))
    same = [c for c in memo.setdefault("congruences", []) if c[0] == d.free_symbols and c[1] == int(m) and
            (not where[1] or c[2] == where)]
    memo["congruences"].append((d.free_symbols, int(m), where, now, a, b))
    if not same or not same[-1][3]:
        return None
    if same[-1][4] == a and same[-1][5].is_Integer and 0 <= same[-1][5] < m:
        return None
    before = same[-1][3]
    return True if now == before else False if not now & before else None


def _inequality_follows(sp, op: str, a, b, memo: dict) -> bool | None:
    """An inequality with symbols against the latest one before it in the same step and case with the same
    symbols: written ``g >= 0`` (``g`` the larger side minus the smaller), when the symbol terms of ``g`` are a
    positive multiple ``c`` of the earlier one's, it is held when its constant is at least ``c`` times the
    earlier constant (a rearrangement or a weaker bound: ``2n >= 12``, then ``n >= 6``) and failed when it is
    less (a bound the earlier one does not give: ``1 >= ab + ac + bc``, then ``ab + ac + bc <= \\frac{1}{2}``);
    else None. The same left side as the earlier one (``x > 0``, ``x > 2``: a list of cases) and a linear
    inequality in one symbol (``m - 4 < 0`` and ``m + 8 < 0``: the bounds of an interval) are None."""
    g = sp.expand(a - b if op in (">", ">=") else b - a)
    where = memo.get("case", (0, 0))
    same = [c for c in memo.setdefault("inequalities", []) if c[1] == where and c[0].free_symbols == g.free_symbols]
    memo["inequalities"].append((g, where, a))
    if not same or same[-1][2] == a or not g.free_symbols:
        return None
    if len(g.free_symbols) == 1 and sp.Poly(g, *g.free_symbols).total_degree() <= 1 if g.is_polynomial() else False:
        return None  # (m - 4 < 0 and m + 8 < 0: bounds of an interval, listed, not derived)
    old = same[-1][0]
    cn, co = _constant_part(sp, g), _constant_part(sp, old)
    c = _proportional(sp, sp.expand(g - cn), sp.expand(old - co))
    if c is None:
        return _reversed(sp, g, old)
    if not c.is_positive or not (cn - c * co).is_number:
        return None
    diff = _number(sp, cn - c * co)
    if diff is None or abs(diff.imag) > 1e-12:
        return None
    return diff.real >= -1e-12


def _constant_part(sp, e):
    """The terms of the expanded ``e`` without a free symbol (``x^2 + 4x - 5`` -> -5; radicals kept)."""
    return sp.Add(*[t for t in sp.Add.make_args(e) if not t.free_symbols])


def _proportional(sp, dn, do):
    """The number ``c`` with ``dn = c * do`` (both expanded), or None when there is none."""
    if do == 0 or dn == 0:
        return None
    c = sp.cancel(dn / do)
    return c if c.is_number and c != 0 else None


def _sign_slip(sp, dn, do) -> bool:
    """Whether the polynomials ``dn`` and ``do`` (rational coefficients) have the same monomials, at least
    three, one of degree 2 or more, with coefficients in the ratio ``c`` for most and ``-c`` for the rest: a
    term moved across with its sign kept (``0 = (k^2 - 4)a + 3k^2`` after ``4a = k^2 a - 3k^2``)."""
    gens = sorted(dn.free_symbols | do.free_symbols, key=lambda v: v.name)
    try:
        tn, to = dict(sp.Poly(dn, *gens, domain="QQ").terms()), dict(sp.Poly(do, *gens, domain="QQ").terms())
    except (sp.PolynomialError, sp.CoercionFailed, sp.GeneratorsNeeded, ValueError, TypeError):
        return False
    if set(tn) != set(to) or len(tn) < 3 or max(sum(k) for k in tn) < 2:
        return False
    ratios = [tn[k] / to[k] for k in tn]
    kept = sum(q == ratios[0] for q in ratios)
    flipped = sum(q == -ratios[0] for q in ratios)
    return kept + flipped == len(ratios) and 0 < min(kept, flipped) < max(kept, flipped)


# The fourth round (tuned on the even half of ProcessBench math): claims that use a condition, parts of an
# expression, orderings of non-real numbers.

def _by_condition(sp, d, conditions: list) -> bool:
    """Whether ``d`` (a side minus the other) vanishes modulo one of ``conditions`` (``(lhs, rhs)`` pairs, the
    latest 20; polynomial ones only): a link that puts in a condition the solution or the problem wrote
    (``\\omega^4 + \\omega^2 = \\omega + \\omega^2`` after ``\\omega^3 = 1``) uses it, it is no identity and no
    error."""
    try:
        num = sp.numer(sp.together(sp.expand(d)))
    except (TypeError, ValueError, RecursionError):
        return False
    for lhs, rhs in conditions[-20:]:
        try:
            c = sp.numer(sp.together(sp.expand(lhs - rhs)))
            if not c.free_symbols or not c.free_symbols <= num.free_symbols:
                continue
            gens = sorted(num.free_symbols | c.free_symbols, key=lambda v: v.name)
            _, rem = sp.reduced(num, [c], *gens)
        except (sp.PolynomialError, sp.CoercionFailed, sp.GeneratorsNeeded, ValueError, TypeError, RecursionError,
                ZeroDivisionError):
            continue
        if sp.expand(rem) == 0:
            return True
    return False


def _part_of(sp, a, b) -> bool:
    """Whether ``b`` is the value of some of the terms of the sum ``a`` (at most 6 terms, a proper part): a
    step that works on one part of the expression before it (``= 21a^5 - 7a^4`` after ``7a^3(3a^2 - a) - 8a(2a
    - 4)``, 'distribute \\(7a^3\\) to the first parentheses') writes a part, not a claim about the whole."""
    terms = sp.Add.make_args(a)
    if not 2 <= len(terms) <= 6:
        return False
    for mask in range(1, 2 ** len(terms) - 1):
        part = sp.Add(*[t for k, t in enumerate(terms) if mask >> k & 1])
        try:
            if sp.expand(part - b) == 0:
                return True
        except (TypeError, ValueError, RecursionError):
            continue
    return False


def _reversed(sp, g, old) -> bool | None:
    """False when ``g = c * old`` with ``c`` an expression (at most 12 operations) negative at 20 random real
    points where both are real (no absolute value, floor or ceiling in it): an inequality multiplied or divided by a positive quantity with its direction
    reversed (``a + b \\ge 2\\sqrt{ab}``, then ``\\frac{a + b}{ab + 1} \\le \\frac{2\\sqrt{ab}}{ab + 1}``); else None."""
    import random

    try:
        ratio = sp.cancel(sp.together(g / old))
    except (TypeError, ValueError, RecursionError, ZeroDivisionError, sp.PolynomialError):
        return None
    if not ratio.free_symbols or sp.count_ops(ratio) > 12 or ratio.has(sp.Abs, sp.floor, sp.ceiling):
        return None  # (|x| + 1 > 7 and |x + 1| \\le 7: conditions listed, a piecewise ratio of any sign)
    rng, signs = random.Random(0), []
    symbols = sorted(ratio.free_symbols | old.free_symbols, key=lambda v: v.name)
    for _ in range(60):
        point = {v: sp.Rational(rng.randint(-97, 97), rng.randint(1, 13)) for v in symbols}
        try:
            vo, vr = _number(sp, old.subs(point)), _number(sp, ratio.subs(point))
        except (TypeError, ValueError, ZeroDivisionError, RecursionError):
            continue
        if vo is None or vr is None or abs(vo.imag) > 1e-12 or abs(vr.imag) > 1e-12 or abs(vo) < 1e-12:
            continue
        signs.append(vr.real < 0)
        if len(signs) == 20:
            return False if all(signs) else None
    return None


def _non_real(sp, e) -> bool:
    """Whether ``e`` is a number with an imaginary part (``\\sqrt{-7}``): no ordering holds for it."""
    if e.free_symbols:
        return False
    v = _number(sp, e)
    return v is not None and abs(v.imag) > 1e-9 * max(1.0, abs(v))


def _apply(sp, e, funcs: dict | None):
    """``e`` with every application of a one-letter function the solution or the problem defined put in
    (``f(2) + f(3)`` after ``f(x) = 3x + 2``); None when ``e`` is None or an application of a function not
    defined (``P(1)``, ``p(1 - p)`` read as an application) or of several arguments remains."""
    if e is None or not e.has(sp.core.function.AppliedUndef):
        return e
    for _ in range(4):  # (f(f(2)): the inner application first)
        apps = e.atoms(sp.core.function.AppliedUndef)
        if not apps:
            return e
        known = {ap: funcs[ap.func.__name__][1].subs(funcs[ap.func.__name__][0], ap.args[0]) for ap in apps
                 if funcs and ap.func.__name__ in funcs and len(ap.args) == 1 and
                 not ap.args[0].has(sp.core.function.AppliedUndef)}
        if not known:
            return None
        e = e.xreplace(known)
    return None
