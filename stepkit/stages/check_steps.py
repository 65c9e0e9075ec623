r"""``stepkit check-steps``: model-free step labels from checking each step's own mathematics with sympy.

Method: GroundedPRM's fidelity-aware verification ("GroundedPRM: Tree-Guided and Fidelity-Aware Process
Reward Modeling", 2025): a step is checked by a math tool, not by a model's opinion; the arithmetic check
of ``clue score`` (``a op b = c`` on GSM8K) generalised to what MATH solutions write. No model, no reference
solution, no sampling: a false claim is found whatever the solution's final answer, so the stage finds
errors that no outcome-based label can (a wrong step followed by a correct answer).

Per step, the claims it makes are read from LaTeX and plain text (:mod:`stepkit.grading.claims`:
equalities and chains, inequalities, approximations, evaluations, divisions with remainder, values that
solve an equation the step wrote, simplifications and substitutions into earlier steps' definitions) and
each is checked (:mod:`stepkit.grading.stepcheck`: exact rationals, symbolic identity by expansion and at
random points, ``--timeout`` per claim). A claim the checker cannot read or decide is *not parsed*; it is
never an error.

The combination rule (``check_first_error``, 0-based, -1 none), exactly, in this order:

1. ``claim``: the first step with a failed claim (``check_first_failed``), when there is one;
2. ``clue``: else, on a row with ``clue score`` columns (``clue_status`` ok), ``clue_first_error``;
3. ``outcome``: else, when the row's ``outcome_correct`` is False (an error somewhere, no claim found it):
   step ``--incorrect-step`` (default 1, the second step: ProcessBench's solutions open with a restatement,
   and on the tuning half of ProcessBench math the first error of 20 of the 51 incorrect solutions is step 1,
   against 7 at step 0 and none at the last step; -1 names the last step);
4. ``none``: else -1.

This is the order the issue proposed (the first failed claim, else the clue first error, else none), with the
outcome fallback ProcessBench's outcome+random-step floor also uses; ``--incorrect-step`` was chosen on
the tuning half of ProcessBench math only (``bench/check_steps_processbench.py``). ``check_first_error_source``
says which part gave each row's value.

Columns (per step, one entry per step): ``check_claims`` (claims decided: held + failed), ``check_held``,
``check_failed``, ``check_not_parsed`` (int32 counts), ``check_failures`` (the failed claims as written),
``check_score`` (held / decided, in [0, 1]; null for a step with no decided claim), ``check_label`` (no
failed claim). Per row: ``check_first_failed`` (the failed-claim signal alone: the first step with a failed
claim, -1 none), ``check_first_error`` (the combined prediction above), ``check_first_error_source``
(``claim``, ``clue``, ``outcome``, ``none``) and ``check_status``: ``failed`` (some claim failed), ``held``
(claims were decided and all held), ``nothing_checkable`` (no claim could be decided: the step labels say
nothing, and the status says so: it is the no-labels value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from stepkit.columns import Column
from stepkit.options import Config, opt
from stepkit.stage import Stage, TrajectoryRows

STATUSES = ("failed", "held", "nothing_checkable")
SOURCES = ("claim", "clue", "outcome", "none")
RULE = ("first failed claim (check_first_failed), else clue_first_error when clue_status is ok, else step "
        "--incorrect-step when outcome_correct is False, else -1")

COLUMNS = (
    Column("check_claims", pa.list_(pa.int32()), "per step: claims decided (held + failed)", per_step=True),
    Column("check_held", pa.list_(pa.int32()), "per step: claims that hold", per_step=True),
    Column("check_failed", pa.list_(pa.int32()), "per step: claims that are false", per_step=True),
    Column("check_not_parsed", pa.list_(pa.int32()), "per step: claims not read or not decidable (never errors)",
           per_step=True),
    Column("check_failures", pa.list_(pa.list_(pa.string())), "per step: the false claims as written",
           per_step=True),
    Column("check_score", pa.list_(pa.float32()), "per step: share of its decided claims that hold (null: none "
           "decided)", per_step=True, role="value", scale="score", range=(0.0, 1.0), status="check_status"),
    Column("check_label", pa.list_(pa.bool_()), "per step: no false claim", per_step=True, role="label",
           status="check_status"),
    Column("check_first_failed", pa.int32(), "the first step with a false claim, -1 none (claims alone)",
           role="first_error", status="check_status"),
    Column("check_first_error", pa.int32(), "the first error by the combination rule (claim, clue, outcome), "
           "-1 none", role="first_error"),
    Column("check_first_error_source", pa.string(), "which part of the rule gave check_first_error: claim, "
           "clue, outcome, none"),
    Column("check_status", pa.string(), "failed; held: all decided claims hold; nothing_checkable: none decided",
           role="status", values=STATUSES, no_labels=("nothing_checkable",)),
)
_EMPTY = {c.name: None for c in COLUMNS}


@dataclass(frozen=True)
class CheckStepsConfig(Config):
    """Options of ``stepkit check-steps``."""

    timeout: float = opt(2.0, "Seconds per claim (a claim over it is not parsed).", min=0, identity=False)
    incorrect_step: int = opt(1, "When outcome_correct is False and no claim failed (and no clue first error): "
                              "the 0-based step to name (clipped to the last step; -1: the last step).", min=-1)
    use_clues: bool = opt(True, "Take clue_first_error (clue score's columns, when the row has them) where no "
                          "claim failed.", flag="--use-clues/--no-use-clues")
    seed: int = opt(0, "Seed of the random points of identity checks.")


def combine(first_failed: int, n_steps: int, outcome_correct: bool | None, clue: int | None,
            cfg: CheckStepsConfig) -> tuple[int, str]:
    """``(check_first_error, source)`` by the rule of the module docstring.

    Args:
        first_failed: the first step with a failed claim, -1 none.
        n_steps: the row's step count.
        outcome_correct: the row's graded outcome (None: ungraded).
        clue: ``clue_first_error`` of a row whose ``clue_status`` is ok, else None.
        cfg: the stage's options.
    """
    if first_failed >= 0:
        return first_failed, "claim"
    if clue is not None and cfg.use_clues:
        return clue, "clue"
    if outcome_correct is False:
        return (n_steps - 1 if cfg.incorrect_step < 0 else min(cfg.incorrect_step, n_steps - 1)), "outcome"
    return -1, "none"


class CheckStepsStage(TrajectoryRows, Stage):
    """``stepkit check-steps`` (see the module docstring). No model; sympy loads in :meth:`open`."""

    name = "check-steps"
    required_columns = ("id", "prompt", "steps")
    optional_columns = ("outcome_correct", "clue_first_error", "clue_status")
    default_chunk_size = 32
    columns = COLUMNS

    def __init__(self, cfg: CheckStepsConfig):
        self.cfg = cfg

    def config(self) -> dict[str, Any]:
        from stepkit.grading import stepcheck

        return {**super().config(), "rule": RULE, "points": stepcheck.POINTS, "solved_equations": stepcheck.SOLVED,
                "linear_equations": stepcheck.LINEAR, "across_steps": stepcheck.ACROSS, "definitions": stepcheck.SCOPE,
                "substitute_conditions": stepcheck.SUBSTITUTE_CONDITIONS, "formulas": stepcheck.FORMULAS,
                "formula_reach": stepcheck.FORMULA_REACH, "sign_slips": stepcheck.SIGN_SLIPS,
                "inequalities": stepcheck.INEQUALITIES, "case_scope": stepcheck.CASE_SCOPE}

    def open(self):
        from stepkit.grading import stepcheck

        self._check = stepcheck.check_solution

    def process(self, rows):
        """Check every row of one chunk. Counters: rows_checked, claims_held, claims_failed, claims_not_parsed,
        and per status and per source of the first error."""
        counters: dict[str, int] = {"rows_checked": 0, "claims_held": 0, "claims_failed": 0, "claims_not_parsed": 0}
        out = []
        for r in rows:
            r = {**r, **_EMPTY}
            out.append(r)
            if r.get("error"):
                continue
            checks = self._check(r["steps"], timeout=self.cfg.timeout, seed=self.cfg.seed, problem=r.get("prompt"))
            first = next((s for s, c in enumerate(checks) if c.failed), -1)
            decided = sum(c.checked for c in checks)
            status = "failed" if first >= 0 else "held" if decided else "nothing_checkable"
            clue = r.get("clue_first_error") if r.get("clue_status") == "ok" else None
            pred, source = combine(first, len(r["steps"]), r.get("outcome_correct"), clue, self.cfg)
            r.update(check_claims=[c.checked for c in checks], check_held=[c.held for c in checks],
                     check_failed=[c.failed for c in checks], check_not_parsed=[c.not_parsed for c in checks],
                     check_failures=[c.failures for c in checks],
                     check_score=[c.held / c.checked if c.checked else None for c in checks],
                     check_label=[not c.failed for c in checks], check_first_failed=first,
                     check_first_error=pred, check_first_error_source=source, check_status=status)
            counters["rows_checked"] += 1
            counters["claims_held"] += sum(c.held for c in checks)
            counters["claims_failed"] += sum(c.failed for c in checks)
            counters["claims_not_parsed"] += sum(c.not_parsed for c in checks)
            counters[f"status_{status}"] = counters.get(f"status_{status}", 0) + 1
            counters[f"first_error_from_{source}"] = counters.get(f"first_error_from_{source}", 0) + 1
        return out, counters
