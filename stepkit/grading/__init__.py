"""Answer extraction, answer equivalence and the answer checker, step splitting, judge verdicts (see
design.md, "Answer checking").

Importing this package (or any of its modules but :mod:`stepkit.grading.equivalence`) loads no sympy or
math-verify: the names below are imported from their modules when first asked for (PEP 562).

* :mod:`~stepkit.grading.answers`: final-answer extraction; :mod:`~stepkit.grading.steps`: step splitting;
* :mod:`~stepkit.grading.settings`: the checker's pinned numeric settings (``checker_settings``);
* :mod:`~stepkit.grading.equivalence`: math-verify equivalence (``verify_answer``), in-process;
* :mod:`~stepkit.grading.verify`: the answer checker's process pool (``AnswerChecker``, ``grade_text``).
"""

from __future__ import annotations

import importlib

_HOMES = {
    "extract_final_answer": "answers",
    "extract_gsm8k_reference": "answers",
    "strip_calculator_annotations": "answers",
    "join_steps": "steps",
    "parse_tagged_steps": "steps",
    "render_prefix": "steps",
    "shepherd_labels_to_bool": "steps",
    "split_joined": "steps",
    "split_steps": "steps",
    "checker_settings": "settings",
    "verify_answer": "equivalence",
    "AnswerChecker": "verify",
    "grade_text": "verify",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"stepkit.grading.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
