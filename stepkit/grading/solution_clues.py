r"""Clues from a LaTeX reference solution (MATH-500's ``solution``) for ``clue recover --from-reference``.

Moved from :mod:`stepkit.grading.claims` (its 600-line bound): it reads the reference's chains with the
claim reader of ``check-steps`` (:func:`stepkit.grading.claims.extract`'s relations) and keeps their numeric
results. Pure string work, no sympy.
"""

from __future__ import annotations

import re

from stepkit.grading.claims import _MATH, _relations, to_expression


def solution_clues(solution: str, answer: str | None = None) -> list:
    r"""Clues (:class:`stepkit.grading.clues.Clue`) from a LaTeX reference solution (MATH-500's ``solution``):
    the intermediate results it establishes, in order: the last side of every chain in math mode that is a
    number (``r = \sqrt{0^2 + 3^2} = 3`` gives 3; ``\frac{4}{7}``; ``2\sqrt{3}``), once each, then the
    reference answer (appended unless the last result is it, as :func:`stepkit.grading.clues.reference_clues`).

    A rational result is written as an integer or ``a/b`` (so ``clue score`` compares it by value), any other
    as its LaTeX; ``text`` is the solution's line around it (at most 200 characters). A clue depends on
    nothing (MATH-500 does not say which results a result uses).

    Returns:
        A list, empty when the solution states no numeric result and no answer is given.
    """
    from stepkit.grading.clues import Clue, number_value

    clues: list = []
    seen: set = set()
    for m in _MATH.finditer(solution):
        body = next(g for g in (m.group(1), m.group(2), m.group(3), m.group(4), m.group(6)) if g is not None)
        rels = _relations(body, None)[0]
        for k, rel in enumerate(rels):
            if k + 1 < len(rels) and rels[k + 1].link == "later":
                continue  # not the chain's result
            if rel.op != "=" or rel.rhs is None or re.search(r"[A-Za-z]", re.sub(r"sqrt|pi|factorial|binomial", "",
                                                                                  rel.rhs)):
                continue
            value = _rational(rel.rhs)
            if value is not None:
                text_value = str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
            else:
                text_value = rel.text.split(" = ")[-1].strip().rstrip(".,")
            if not re.search(r"\d", text_value) or text_value in seen:
                continue
            seen.add(text_value)
            line_start = solution.rfind("\n", 0, m.start()) + 1
            line_end = solution.find("\n", m.end())
            line = " ".join(solution[line_start:line_end if line_end >= 0 else None].split())
            clues.append(Clue(line[:200], text_value))
    if answer is not None and str(answer).strip():
        ans = str(answer).strip()
        last = clues[-1].value if clues else None
        same = last is not None and (number_value(last) if number_value(last) is not None else None) is not None and \
            number_value(last) == _rational(to_expression(ans))
        if not same and last != ans:
            clues.append(Clue(f"The answer is {ans}", ans, (len(clues) - 1,) if clues else ()))
    return clues


def _rational(expr: str | None):
    """The exact value of a plain expression of numbers (``((14)/(3))``), or None."""
    from stepkit.grading.clues import evaluate

    return evaluate(expr.replace("**", "^")) if expr else None
