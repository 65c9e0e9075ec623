"""The answer checker's numeric settings, pinned in one place and recorded in every run manifest.

This module is light (no sympy, no math-verify): a stage's identity (``checker_settings()``) is known
without loading the checker. :mod:`stepkit.grading.equivalence` compares answers with these settings;
:mod:`stepkit.grading.verify` runs those comparisons in a process pool.
"""

from __future__ import annotations

from importlib.metadata import version

# Floats are compared at d = max(FLOAT_ROUNDING, decimals written in the prediction, decimals written in
# a decimal gold) places: the prediction counts when it equals the gold rounded to d places,
# |pred - gold| <= 0.5 * 10^-d. So 1/3 matches 0.333333 (d = 6), 0.33 does not, and 0.0000001 vs
# 0.0000002 compares at 7 places and is False (case mv-float-rounding-false-positive). The comparison is
# never finer than NUMERIC_PRECISION significant digits (relative tolerance 10^-(NUMERIC_PRECISION - 1)),
# the precision of a float64 printed by a program: 2/3 matches 0.6666666666666666 and sqrt(2) matches
# 1.4142135623730951 although neither is the correctly rounded 16-place decimal.
FLOAT_ROUNDING = 6
# Significant digits for numeric comparison (math-verify's default; also the float64 floor above).
NUMERIC_PRECISION = 15
# Exact numbers: a rational difference of at most EXACT_BITS bits (numerator and denominator) is computed
# exactly; any other (irrational, or rational too large to compute) is zero when sympy's adaptive
# evaluation cannot tell it from 0 with EXACT_DIGITS significant digits of its terms (a relative tolerance).
EXACT_BITS = 10_000_000
EXACT_DIGITS = 100
# math-verify strict mode: variables matter (x+1 != y+1) and sets are not equal to tuples.
STRICT = True

FLOAT_ROUNDING_RULE = (
    "a real-number pair with a decimal is equal when |pred - gold| <= max(0.5 * 10^-d, |gold| * "
    "10^-(numeric_precision - 1)), d = max(float_rounding, decimal places written in pred or gold, where "
    "m \\times 10^{-k} and mE-k are written to the places of m plus k); inside tuples/sets/intervals "
    "math-verify rounds a bare decimal and its partner to d places, and a decimal in a product or sum "
    "(2.5 \\cdot 10^{-20}, 0.5\\pi) follows the real-number rule"
)
EXACT_RULE = (
    "two numbers without a decimal (integers, fractions, powers, factorials, radicals, constants, their "
    "products) are equal only when their difference is 0: exactly when it is rational (at most "
    f"{EXACT_BITS} bits), else when sympy cannot tell it from 0 at {EXACT_DIGITS} significant digits of its "
    "terms; never by rounding or chopping both to fixed decimal places"
)
WHOLE_RULE = (
    "each answer is parsed as one expression, \\boxed{answer} with outer $...$/\\(...\\)/\\[...\\]/\\boxed{} "
    "removed (LaTeX extraction only); a prediction with inner math delimiters is compared as the whole text "
    "without them, a gold with them is a ConfigError; an answer whose parse lost digits or kept only the "
    "last part of an equation chain is False (prediction) or a ConfigError (gold)"
)


def checker_settings(
    float_rounding: int = FLOAT_ROUNDING, numeric_precision: int = NUMERIC_PRECISION
) -> dict:
    """The answer checker's settings, for run manifests (includes math-verify's version, read from the
    installed package's metadata: math-verify itself is not imported)."""
    return {
        "checker": "math-verify",
        "math_verify_version": version("math-verify"),
        "float_rounding": float_rounding,
        "float_rounding_rule": FLOAT_ROUNDING_RULE,
        "numeric_precision": numeric_precision,
        "exact_rule": EXACT_RULE,
        "strict": STRICT,
        "wrap": r"\boxed{...} unless the answer already has $...$ or \boxed",
        "whole_answer_rule": WHOLE_RULE,
    }
