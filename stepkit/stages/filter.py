"""``stepkit filter``: drop or cut labelled trajectories by rules, the way PRM papers curate their data.

Rules run in the order given, each on the rows the earlier ones kept. A rule either **drops** a row
(it goes to ``--dropped`` with ``filter_reason``, or stays flagged with ``--flag-only``: nothing is lost)
or **cuts** its steps (keeps a prefix). Rules (``RULES`` below; ``COL`` names a column of IN):

A rule that reads labels or values (consensus, truncate/keep-correct, prof, min/max-value) drops a row as
``unlabelled`` when the status column the shard declares for ``COL`` says the row has none
(:mod:`stepkit.columns`: ``mc_status = no_signal`` marks ``mc_value``'s zeros as placeholders), and reads a
first-error index outside the row's steps as bad input, never as "no error". ``status:`` values are read as
the column's type (``status:mc_value_start=0.0`` is the float 0).

* ``consensus:A,B`` — keep rows whose first errors agree (Zhang et al. 2025, "The Lessons of Developing
  Process Reward Models in Mathematical Reasoning": keep samples where MC estimation and an LLM judge
  agree). ``A``/``B`` are first-error columns (int, ``-1`` = no error) or step-label columns
  (list<bool>, read as the first false step). A null on either side drops the row as ``unlabelled``.
* ``prof:COL`` — PROF (Ye et al. 2025, "Beyond Correctness: Harmonizing Process and Outcome Rewards
  through RL Training"; amazon-science/PROF-GRPO). Per ``problem_id``, each row's consistency score is
  the mean over its valid steps of ``2 * (v - m) * (2 * outcome - 1)``, ``v`` its value in ``COL``
  (list<float> or list<bool>), ``m`` the mean of all valid step values of the problem's rows, minus
  ``--step-penalty`` when the row has fewer than ``--min-steps`` or more than ``--max-steps`` steps.
  ``--remove N`` rows per problem go (never its last scored row), lowest score first, split between
  correct and incorrect rows so that the counts left are as equal as possible (the larger side loses one
  first; on equal sides the lower score goes). A row with no outcome or no valid value is ``unlabelled``.
* ``min-value:COL>=X`` / ``min-value:COL>X`` and ``max-value:COL<=X`` / ``max-value:COL<X`` — keep rows
  whose value (a number, or the minimum / maximum of a per-step list, nulls ignored) passes.
* ``status:COL=V[,V...]`` keeps rows whose ``COL`` is one of the values; ``status:COL!=V[,V...]`` drops
  them (``status:mc_status!=no_signal``).
* ``dedupe`` — drops a row whose prompt and steps equal an earlier kept row's.
* ``steps:MIN-MAX`` (``MIN-`` or ``-MAX`` for one bound) — keep rows with that many steps.
* ``no-error`` — drops rows that carry an upstream ``error``.
* ``truncate-after-first-error:COL`` — cut each row after its first error (PURE; Qwen's "Lessons":
  labels after the first error are ambiguous); ``-1`` keeps every step; a null first error drops the
  row as ``unlabelled``. Without this rule steps are kept whole: the card records which was used
  (case ``truncate-after-first-error``).
* ``keep-correct-steps:COL`` — keep only the steps before the first error (WebSTAR-style step filtering
  for imitation data); a row whose first step is wrong has none left and is dropped (``no-correct-steps``).

When steps are cut, every per-step column (declared ``per_step`` in the shard's column metadata,
:mod:`stepkit.columns`, and ``--step-column``)
is cut the same way; per-step columns must have one entry per step, which is checked on the input
(``InputError`` naming file, row and column) and again before writing. Scalar columns (first-error
indices, outcomes) describe the row as it was labelled and are not rewritten: after
``keep-correct-steps`` a first-error column equals the new step count.

**Conversations** (rows of ``ingest messages``, with ``step_observations`` and ``step_messages``): a step
is an assistant turn, and a cut keeps whole turns, each with its observation, so the cut row's
conversation (:func:`stepkit.conversations.row_messages`) is the original one up to a turn boundary and
every tool result in it answers a call of a kept turn. ``truncate-after-first-error`` keeps the wrong turn
and what came back from it; ``keep-correct-steps`` ends with the last correct turn's observation (the
context the wrong turn was written in). No rule drops a middle turn, which would leave tool results that
answer calls no longer there. To train on every correct turn, later ones included, with its full context
(WebSTAR, He et al. 2025: step-level filtering keeps each correct step as a training target), do not cut:
``export --format messages --labels COL`` writes the whole conversation with one label per assistant turn,
and the trainer masks the loss of the turns labelled false.

Columns (:data:`COLUMNS`): ``filter_reason`` (null: kept; else ``unlabelled``,
``consensus``, ``prof``, ``min-value``, ``max-value``, ``status``, ``dedupe``, ``steps``, ``error``,
``no-correct-steps``), ``filter_rule`` (the rule as written), ``filter_steps_before``,
``filter_kept_steps`` and ``filter_cut_by``. A row that arrives flagged (from an earlier ``--flag-only``
run) counts as dropped with its reason. Every rule but two decides each row on its own, so the
shard is read and written in chunks of :data:`STREAM_ROWS` rows (memory bounded by a chunk, whatever the
shard's size); with ``dedupe`` or ``prof`` a shard is one chunk.

**Across the shards of a folder**: ``dedupe`` and ``prof`` act on the whole input, not shard by shard (breaking
run E6: a row duplicated in two shards survived; a problem whose rows span shards lost ``--remove N`` rows in
each). While planning, every row of every shard is read once, keeping only what the rules read (the prompt and
each step as a 16-byte digest, the rule columns), and the rule chain is run over all of them in shard order;
each shard is then written with those rules' decisions for its rows (the first of equal rows is the first in
shard order). With ``--world-size W`` the whole input is this rank's shards.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from stepkit.columns import Column, read_meanings
from stepkit.errors import ConfigError, InputError, StepkitError
from stepkit.options import Config, opt
from stepkit.schema import check_kept_steps
from stepkit.stage import SideOutput, Stage
from stepkit.stages.filter_rules import KEEP, RULE_SYNTAX, Dedupe, FirstErrorRule, Prof, Status, parse_rule

GLOBAL_RULES = (Dedupe, Prof)  # their decision for a row depends on other rows: made over the whole input
STREAM_ROWS = 4096  # rows per chunk when no rule needs the whole shard (int; the tests make it smaller)

COLUMNS = (  # why a row is (or would be) dropped, and what cutting did to its steps
    Column("filter_reason", pa.string(), "why the row is dropped (null: kept)"),
    Column("filter_rule", pa.string(), "the rule, as written, that dropped the row"),
    Column("filter_steps_before", pa.int32(), "steps the row had before any filter cut them"),
    Column("filter_kept_steps", pa.int32(), "steps the cutting rules keep (with --flag-only: would keep)"),
    Column("filter_cut_by", pa.string(), "the rule that cut the steps (null: not cut)"),
)

@dataclass(frozen=True)
class FilterConfig(Config):
    """``stepkit filter`` options (see the module docstring for the rules)."""

    rule: tuple[str, ...] = opt((), f"A rule, repeatable, applied in order: {RULE_SYNTAX}.", metavar="RULE")
    dropped: str | None = opt(None, "Write the dropped rows here (a .parquet file, or a folder for a folder IN).",
                              identity=False)
    flag_only: bool = opt(False, "Keep every row and every step; set filter_reason / filter_kept_steps instead.")
    remove: int | None = opt(None, "prof: rows removed per problem_id.", min=1)
    min_steps: int = opt(1, "prof: fewer steps than this are penalised.", min=1)
    max_steps: int | None = opt(None, "prof: more steps than this are penalised.", min=1)
    step_penalty: float = opt(1.0, "prof: subtracted from the consistency score outside --min/--max-steps.", min=0)
    step_column: tuple[str, ...] = opt((), "A per-step list column of your own, cut with the steps (repeatable).",
                                       metavar="COL")

    def __post_init__(self):
        super().__post_init__()
        if not self.rule:
            raise ConfigError("give at least one --rule")
        if self.flag_only == (self.dropped is not None):
            raise ConfigError("give --dropped FILE (where dropped rows go) or --flag-only (keep and flag them), "
                              "so no row is lost" if not self.flag_only else
                              "--flag-only keeps every row: --dropped has nothing to hold")
        rules = [parse_rule(r) for r in self.rule]
        if any(isinstance(r, Prof) for r in rules) and self.remove is None:
            raise ConfigError("prof needs --remove N (rows to remove per problem_id)")
        if self.max_steps is not None and self.max_steps < self.min_steps:
            raise ConfigError(f"--max-steps {self.max_steps} is below --min-steps {self.min_steps}")


class FilterStage(Stage):
    """Apply ``cfg.rule`` to each shard, in chunks of :data:`STREAM_ROWS` rows (one chunk per shard when
    ``dedupe`` or ``prof`` is among the rules); dropped rows are a side output."""

    name = "filter"
    one_to_one = False
    default_chunk_size = 1 << 40  # the whole shard: dedupe and prof need every row (else STREAM_ROWS, below)
    columns = COLUMNS
    keep_on_error = frozenset(c.name for c in COLUMNS)  # bookkeeping, not labels: kept on every row

    def __init__(self, cfg: FilterConfig):
        self.cfg = cfg
        self.rules = [parse_rule(r) for r in cfg.rule]
        if not any(isinstance(r, (Dedupe, Prof)) for r in self.rules):  # each row decided on its own
            self.default_chunk_size = STREAM_ROWS
        self.required_columns = ("prompt", "steps")  # each rule checks its own columns (naming the rule)
        self.status_cols = {r.columns[0] for r in self.rules if isinstance(r, Status)}  # observed while planning
        # first-error columns are range-checked while planning (an index past the steps is no "no error")
        self.status_cols |= {c for r in self.rules if isinstance(r, FirstErrorRule) for c in r.columns}
        self.per_step = set(cfg.step_column)  # grows with every planned shard's per-step columns (check_schema)
        self._global = [k for k, r in enumerate(self.rules) if isinstance(r, GLOBAL_RULES)]
        self._views: dict[str, list[dict]] = {}  # shard -> its rows as the rules read them (planning)
        self._decided: dict[int, dict[tuple[str, int], tuple]] | None = None  # rule -> (shard, row) -> decision
        self._shard: str | None = None
        self._set_optional_columns()

    def _set_optional_columns(self) -> None:
        read = {c for r in self.rules for c in (*r.columns, *r.status_columns())} if self._global else set()
        self.optional_columns = tuple(sorted(self.per_step | self.status_cols | read
                                             | {"filter_reason", "filter_kept_steps", "filter_steps_before"}))

    def __getstate__(self):
        return {**self.__dict__, "_views": {}}  # (planning's digests are not needed where the rows are written)

    def side_outputs(self):
        return {"dropped": SideOutput(Path(self.cfg.dropped), None)} if self.cfg.dropped else {}

    def check_schema(self, schema, path):
        # Per-step columns are what the shard declares (a column of one name means the same in every shard
        # of a run, so the union over planned shards is what process() cuts).
        self.per_step |= set(read_meanings(schema, path).per_step())
        self._set_optional_columns()
        for c in self.cfg.step_column:
            if c not in schema.names:
                raise InputError(path, f"missing --step-column (has: {', '.join(schema.names)})", column=c)
            t = schema.field(c).type
            if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
                raise InputError(path, f"--step-column must be a list column, found {t}", column=c)
        for rule in self.rules:
            rule.check_schema(schema, path)
        self._set_optional_columns()  # (the status columns the rules read are known now)

    def planned(self):
        """A status rule whose value no input row of the run has is refused before anything is written; with
        ``dedupe`` or ``prof`` and more than one shard, the rules are run over every row of every shard (in
        shard order) and their decisions kept for :meth:`process`."""
        for rule in self.rules:
            if isinstance(rule, Status):
                rule.check_seen()
        if len(self._views) > 1:
            where = [(shard, j) for shard, views in self._views.items() for j in range(len(views))]
            self._decided = {k: {} for k in self._global}
            self._run_rules([v for views in self._views.values() for v in views], where, record=self._decided)
        self._views = {}

    def start_shard(self, shard):
        self._shard = str(shard)

    def validate(self, rows, path, first_row):
        """Every per-step column of a row has one entry per step (null cells are allowed), and the steps
        an earlier ``--flag-only`` run would keep (``filter_kept_steps``) are 1..M; status rules note which
        values the input holds, over every shard of the run."""
        for rule in self.rules:
            if isinstance(rule, Status):
                rule.observe(rows)
        if self._global:  # what the rules read, the texts as digests (equal texts, equal digests)
            self._views.setdefault(str(path), []).extend(
                {**r, "prompt": _digest(r.get("prompt")), "steps": [_digest(x) for x in r["steps"] or []]}
                for r in rows)
        for i, r in enumerate(rows):
            if not r.get("steps"):
                raise InputError(path, "null or empty steps", row=first_row + i, column="steps")
            n = len(r["steps"])
            check_kept_steps(r, n, path, first_row + i)
            # a first-error index names a step of the row as it was labelled (after keep-correct-steps cut
            # it, the index equals the new step count); outside that it is bad input, never "no error"
            labelled_steps = max(n, r.get("filter_steps_before") or n)
            for c in {c for rule in self.rules if isinstance(rule, FirstErrorRule) for c in rule.columns}:
                k = r.get(c)
                if isinstance(k, int) and not isinstance(k, bool) and not -1 <= k < labelled_steps:
                    raise InputError(path, f"first-error index {k} outside -1..{labelled_steps - 1}",
                                     row=first_row + i, column=c)
            for c in r:
                v = r[c]
                if c != "steps" and c in self.per_step and v is not None \
                        and n is not None and len(v) != n:
                    raise InputError(path, f"per-step column has {len(v)} entries for {n} steps",
                                     row=first_row + i, column=c)

    def _step_columns(self, rows: list[dict]) -> list[str]:
        present = dict.fromkeys(c for r in ([rows[0]] if rows else []) + rows[-1:] for c in r)
        return [c for c in present if c in self.per_step]

    def _run_rules(self, rows: list[dict], where: list[tuple[str, int]] | None = None,
                   record: dict | None = None) -> tuple[list[dict], list, list]:
        """The rule chain over ``rows``: each row's view (its steps as cut), drop reason and cutting rule.

        ``where`` is each row's (shard, row index). With ``record`` (planning, every row of the input) the
        decisions of ``dedupe`` / ``prof`` are stored in it by ``where``; without it, those rules take the
        decisions planning stored (:attr:`_decided`) when there are any for these rows."""
        cfg = self.cfg
        step_cols = self._step_columns(rows)

        def cut(row: dict, n: int) -> dict:
            return {**row, **{c: row[c][:n] for c in step_cols if row.get(c) is not None}}

        # steps as cut so far, starting from the cuts an earlier --flag-only run left pending
        views = [cut(r, r["filter_kept_steps"]) if (r.get("filter_kept_steps") or len(r["steps"])) < len(r["steps"])
                 else dict(r) for r in rows]
        reason: list[tuple[str, str] | None] = [None] * len(rows)
        cut_by: list[str | None] = [r.get("filter_cut_by") if len(views[i]["steps"]) < len(r["steps"]) else None
                                    for i, r in enumerate(rows)]
        for i, r in enumerate(rows):
            if r.get("filter_reason"):  # flagged by an earlier --flag-only run
                reason[i] = (r["filter_reason"], r.get("filter_rule") or "")
        for k, rule in enumerate(self.rules):
            alive = [i for i in range(len(rows)) if reason[i] is None]
            if record is None and where is not None and k in self._global:
                decided = [self._decided[k].get(where[i], KEEP) for i in alive]
            else:
                decided = rule.decide([views[i] for i in alive], cfg)
                if record is not None and k in record:
                    record[k].update((where[i], d) for i, d in zip(alive, decided) if d is not KEEP)
            for i, d in zip(alive, decided):
                if d is KEEP:
                    continue
                if d[0] == "drop":
                    reason[i] = (d[1], rule.text)
                elif d[1] < len(views[i]["steps"]):
                    views[i], cut_by[i] = cut(views[i], d[1]), rule.text
        return views, reason, cut_by

    def process(self, rows):
        cfg = self.cfg
        step_cols = self._step_columns(rows)
        where = None
        if self._decided is not None and self._shard is not None:  # (one chunk: the whole shard)
            where = [(self._shard, j) for j in range(len(rows))]
        views, reason, cut_by = self._run_rules(rows, where)
        counters: dict[str, int] = {"rows_in": len(rows), "steps_in": sum(len(r["steps"]) for r in rows)}
        kept, dropped = [], []
        for i, r in enumerate(rows):
            before = r.get("filter_steps_before")
            meta = {"filter_reason": reason[i][0] if reason[i] else None,
                    "filter_rule": reason[i][1] if reason[i] else None,
                    "filter_steps_before": before if before is not None else len(r["steps"]),
                    "filter_kept_steps": len(views[i]["steps"]),
                    "filter_cut_by": cut_by[i] or r.get("filter_cut_by")}  # an earlier filter's cut is kept
            if reason[i] is None:
                out = {**(r if cfg.flag_only else views[i]), **meta}
                _check_lengths(out, step_cols)
                kept.append(out)
                # this run's own cuts: a cut an earlier --flag-only run counted (pending) is applied, not
                # counted again (breaking run E14: the card counted it in both filters)
                pending = min(r.get("filter_kept_steps") or len(r["steps"]), len(r["steps"]))
                own = pending - len(views[i]["steps"])
                _count(counters, "rows_cut", 1 if own > 0 else 0)
                _count(counters, "steps_cut", own)
            else:
                (kept if cfg.flag_only else dropped).append({**r, **meta})
                _count(counters, f"dropped_{reason[i][0]}", 1)
                _count(counters, f"steps_dropped_{reason[i][0]}", len(r["steps"]))
        final = [views[i] for i in range(len(rows)) if reason[i] is None]
        counters["rows_kept"] = len(final)
        counters["rows_dropped"] = len(rows) - len(final)
        counters["steps_kept"] = sum(len(r["steps"]) for r in final)
        labels = [c for c in step_cols if c.endswith(("_label", "_labels"))]
        _balance(counters, rows, "in", labels)
        _balance(counters, final, "kept", labels)
        return kept, counters, ({"dropped": dropped} if cfg.dropped else {})


def _digest(text: str | None) -> bytes | None:
    return None if text is None else hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _check_lengths(row: dict, step_cols: list[str]) -> None:
    """The write-time check: every per-step column of an output row has one entry per step."""
    n = len(row["steps"])
    for c in step_cols:
        if row.get(c) is not None and len(row[c]) != n:
            raise StepkitError(f"filter: internal error, row {row.get('id')!r}: per-step column {c!r} has "
                               f"{len(row[c])} entries for {n} steps")


def _count(counters: dict, key: str, n: int) -> None:
    counters[key] = counters.get(key, 0) + n


def _balance(counters: dict, rows: list[dict], when: str, label_columns: list[str]) -> None:
    """Label balance: correct/incorrect outcomes, and true/false steps of each per-step label column."""
    _count(counters, f"outcome_correct_{when}", sum(1 for r in rows if r.get("outcome_correct") is True))
    _count(counters, f"outcome_incorrect_{when}", sum(1 for r in rows if r.get("outcome_correct") is False))
    for c in label_columns:
        _count(counters, f"{c}_true_{when}", sum(1 for r in rows for x in (r.get(c) or []) if x is True))
        _count(counters, f"{c}_false_{when}", sum(1 for r in rows for x in (r.get(c) or []) if x is False))
