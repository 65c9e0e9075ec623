"""Answer extraction, math-verify answer checking, and step splitting (see design.md, "Answer checking")."""

from stepkit.grading.answers import extract_final_answer, extract_gsm8k_reference, strip_calculator_annotations
from stepkit.grading.steps import (
    join_steps,
    parse_tagged_steps,
    render_prefix,
    shepherd_labels_to_bool,
    split_joined,
    split_steps,
)
from stepkit.grading.verify import AnswerChecker, checker_settings, grade_text, verify_answer

__all__ = [
    "AnswerChecker",
    "checker_settings",
    "extract_final_answer",
    "extract_gsm8k_reference",
    "grade_text",
    "join_steps",
    "parse_tagged_steps",
    "render_prefix",
    "shepherd_labels_to_bool",
    "split_joined",
    "split_steps",
    "strip_calculator_annotations",
    "verify_answer",
]
