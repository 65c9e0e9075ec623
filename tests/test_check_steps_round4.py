r"""check-steps, the fourth round of claim kinds (angles in degrees, Greek letters, defined functions put in,
orderings of non-real numbers, reversed inequalities) and of false failures removed (a condition put in, a part
of the expression before, a retracted claim), each on real ProcessBench math / MATH-500 steps found on the
tuning (even sha256-parity) half: the wrong step (the human first error) fails, a true chain holds, and what
cannot be decided is not parsed, never failed."""

from __future__ import annotations

import json

import pytest

from stepkit.grading.claims import to_expression
from stepkit.grading.stepcheck import check_solution
from tests import test_check_steps_forms as forms
from tests.conftest import DATA

pb, math500 = forms.pb, forms.math500  # the real ProcessBench math / MATH-500 rows: the same fixtures, written once


def test_degrees_inside_a_trigonometric_function_are_radians(pb):
    r"""math-22 step 2 (the human first error): 'Therefore, \(\cos 208^\circ = \cos (180^\circ - 208^\circ)\), which
    simplifies to: \[ \cos 208^\circ = \cos (-28^\circ) \]' fails twice (cos 208° = -cos 28°); math-466 step 2 (the
    human first error): '\(\cos 330^\circ = -\cos (360^\circ - 30^\circ)\)' fails; math-509 step 2: '\tan 45^\circ
    = 1' and '\tan 315^\circ = -\tan 45^\circ = -1' hold. Without a trigonometric function a degree sign is
    dropped; a degree sign on a group inside one (\csc (2^3)^\circ) is not read."""
    (c,) = check_solution([pb["math-22"]["steps"][2]])
    assert c.failures == ["\\cos 208^\\circ = \\cos (180^\\circ - 208^\\circ)", "\\cos 208^\\circ = \\cos (-28^\\circ)"]
    (c,) = check_solution([pb["math-466"]["steps"][2]])
    assert c.failures == ["\\cos 330^\\circ = -\\cos (360^\\circ - 30^\\circ)"]
    (c,) = check_solution([pb["math-509"]["steps"][2]])
    assert (c.held, c.failed) == (3, 0)
    assert to_expression("180^\\circ - 2\\cdot 40^\\circ") == "180-2*40"
    assert to_expression("\\cot 45^{\\circ}") == "cot((45*((pi)/(180))))"
    assert to_expression("\\csc (2^3)^\\circ") is None and to_expression("\\sin 30") is None


def test_a_name_given_in_degrees_is_not_put_into_a_trigonometric_function(pb):
    r"""math-367 step 1: 'substitute \(\theta = 45^\circ\) ... \(\cos(-\theta) = \cos(\theta)\)': \theta holds 45
    degrees, so \cos \theta is not cos(45 radians): not parsed, never failed; math-22 step 4 writes the sign,
    '\(n = 28^\circ\) ... \(\cos n^\circ = \cos 568^\circ\) is \(n = 28\)': read in degrees, and 28 does not solve
    it (cos 28° = -cos 568°): failed."""
    c = check_solution(pb["math-367"]["steps"][:2])[1]
    assert c.failed == 0 and c.not_parsed >= 2
    c = check_solution(pb["math-22"]["steps"][:5])[4]
    assert c.failures == ["n = 28"]


def test_greek_letters_are_variables_and_a_condition_put_in_is_no_failure(pb, math500):
    r"""MATH-500 #60 (a reference solution): '\(\alpha^3 = 3 \alpha^2 - 4 \alpha + 1.\) Then \[\alpha^4 = 3 \alpha^3 -
    4 \alpha^2 + \alpha = 3 (3 \alpha^2 - 4 \alpha + 1) - 4 \alpha^2 + \alpha = ...\]': the links that put in the
    condition are no identities, and no failures (the condition divides them); #215 the same with x^2 = x + 1.
    math-210 step 1 (the human first error): '\(\omega^4 + \frac{1}{\omega^4} = 1\)' shares no root with step 0's
    '\(\omega + \frac{1}{\omega} = 1\)': failed."""
    assert to_expression("2\\alpha\\beta") == "2*\u03b1*\u03b2"
    for k in (60, 215):
        (c,) = check_solution([math500[k]["solution"]], problem=math500[k]["problem"])
        assert c.failed == 0 and c.held >= 3, (k, c)
    c = check_solution(pb["math-210"]["steps"][:2], problem=pb["math-210"]["problem"])[1]
    assert c.failures == ["\\omega^4 + \\frac{1}{\\omega^4} = 1"]


def test_no_ordering_of_a_non_real_number(pb):
    r"""math-721 step 4 (the human first error, then the correct answer): '$$x^2 > -7$$ $$x > \sqrt{-7}$$' : x >
    \sqrt{-7} fails (\sqrt{-7} is not real); 'x > i\sqrt{7}' (i a letter) is not parsed."""
    (c,) = check_solution([pb["math-721"]["steps"][4]])
    assert c.failures == ["x > \\sqrt{-7}"]


def test_an_inequality_with_its_direction_reversed_fails(pb):
    r"""math-575 step 3 (the human first error, then the correct answer): '\(a + b \ge 2\sqrt{ab}\). Now substitute
    back into the original expression: \(\frac{a + b}{ab + 1} \le \frac{2\sqrt{ab}}{ab + 1}\)' fails (divided by
    ab + 1 > 0, the direction is kept); the same with \ge is not failed; math-371 step 0 lists '\[|x| + 1 > 7\]
    \[|x + 1| \leq 7\]' (conditions, an absolute value in the ratio): not failed."""
    (c,) = check_solution([pb["math-575"]["steps"][3]])
    assert c.failures == ["\\frac{a + b}{ab + 1} <= \\frac{2\\sqrt{ab}}{ab + 1}"]
    (c,) = check_solution([pb["math-575"]["steps"][3].replace("\\le \\frac{2", "\\ge \\frac{2")])
    assert c.failed == 0
    (c,) = check_solution([pb["math-371"]["steps"][0]])
    assert c.failed == 0


def test_a_function_defined_before_is_put_in_anywhere(pb):
    r"""math-745 (a correct solution; the problem: 'Let $f(x) = x + 2$ and $g(x) = 1/f(x)$') step 3: '\[ g(-1) =
    \frac{1}{f(-1)} = \frac{1}{1} = 1 \]': f is put in inside a side (and inside g's definition): all hold; the
    same step with f(-1) read as 3 fails; an application of a function no step defined (math-455 step 1:
    '\[ P(-1) = 1, \]' after P(x) = (x - a)(x - b)(x - c), a condition on a, b, c) is not parsed, never failed."""
    row = pb["math-745"]
    (c,) = check_solution([row["steps"][3]], problem=row["problem"])
    assert (c.held, c.failed) == (3, 0)
    (c,) = check_solution([row["steps"][3].replace("\\frac{1}{1} = 1", "\\frac{1}{3} = 1")], problem=row["problem"])
    assert c.failures == ["\\frac{1}{f(-1)} = \\frac{1}{3}", "\\frac{1}{3} = 1"]
    (c,) = check_solution([pb["math-455"]["steps"][1]])
    assert c.failed == 0 and c.not_parsed >= 3


def test_a_part_of_the_expression_before_and_a_retracted_claim_are_no_failures(pb):
    r"""math-776 (a correct solution) step 1: 'First, distribute \(7a^3\) to both terms inside the first set of
    parentheses: \[ = 21a^5 - 7a^4 \]' continues step 0's '\[ 7a^3(3a^2 - a) - 8a(2a - 4) \]' with a part of it:
    not failed; math-786 (a correct solution) step 2 writes '\[= x^4 - 2x^2 + 1 - (x^2 - 1)^2\]', then 'Oops! This
    simplification led us astray': the retracted claim is not counted."""
    c = check_solution(pb["math-776"]["steps"][:2])[1]
    assert c.failed == 0 and c.not_parsed == 1
    (c,) = check_solution([pb["math-786"]["steps"][2]])
    assert c.failed == 0 and c.held >= 5
    (c,) = check_solution([pb["math-786"]["steps"][2].replace("Oops! This simplification led us astray", "So")])
    assert c.failed == 1


@pytest.fixture(scope="module")
def pb_gsm8k() -> dict:
    with open(DATA / "processbench" / "gsm8k.json") as f:
        return {r["id"]: r for r in json.load(f)}


def test_percent_and_currency_signs(pb, pb_gsm8k):
    r"""math-856 (a correct solution) step 3: '\[ \left( \frac{\frac{A}{4}}{\frac{5A}{4}} \right) \times 100\% = ...
    = \frac{1}{5} \times 100\% = 20\%' holds (a percent in hundredths, or with the sign dropped); gsm8k-81 step 5:
    '\[50\% + 40\% + 12\% = 102\%\]' holds and, read as 92\%, fails (both readings false); gsm8k-115 step 2:
    '\[ 10 \times \$0.80 = \$8.00 \]' holds (a currency sign is a unit) and, read as \$8.80, fails."""
    (c,) = check_solution([pb["math-856"]["steps"][3]])
    assert c.failed == 0 and c.held >= 3
    step = pb_gsm8k["gsm8k-81"]["steps"][5]
    assert check_solution([step])[0].held == 1
    assert check_solution([step.replace("= 102\\%", "= 92\\%")])[0].failures == ["50\\% + 40\\% + 12\\% = 92\\%"]
    step = pb_gsm8k["gsm8k-115"]["steps"][2]
    assert (check_solution([step])[0].held, check_solution([step.replace("\\$8.00", "\\$8.80")])[0].failed) == (1, 1)
