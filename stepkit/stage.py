"""The stage contract: what a stage is, apart from how the runner runs it.

A stage (``docs/architecture.md``, "The stage contract") is pure logic over rows and an engine. It
declares its config, the columns it reads, the columns it writes and their meaning, and ``process(rows)``;
reading, chunking, resume, manifests and progress are the runner's (:mod:`stepkit.runner`). The model is
datatrove's ``PipelineStep``: a small contract that any executor (local, Ray) can run.

* :class:`Stage`: a stage with no model (``filter``).
* :class:`EngineStage`: a stage that samples with an engine and may grade answers.
* :class:`LabelerStage`: an engine stage that labels the steps of trajectory rows.
* :class:`SideInput` / :class:`SideOutput`: other shards a stage joins, extra tables it writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from stepkit.aio import run_sync
from stepkit.columns import Column, fields
from stepkit.options import Config, identity
from stepkit.schema import check_steps, check_values, extend_schema


@dataclass(frozen=True)
class SideOutput:
    """An extra table a stage writes per shard (mcts-label's tree, filter's dropped rows).

    Attributes:
        path: where the user asked for it (a ``.parquet`` file, or a folder), mapped per shard as OUT is
            (a folder IN writes ``path/<shard name>``).
        schema: its explicit schema; None for the stage's output schema of the shard (filter's
            dropped rows have the columns of the rows it keeps).
    """

    path: Path
    schema: pa.Schema | None


@dataclass(frozen=True)
class SideInput:
    """Another shard (file or folder) a stage reads beside IN, joined to IN's rows by a key column.

    Every row of IN that has no upstream error must find its key here: a missing one is bad input,
    reported before any model loads. The joined row is handed to the stage as ``row["_<name>"]``
    (a dict of the side row's columns; underscore keys are never written as columns).

    Attributes:
        path: the side shard or folder of shards.
        key: the key column in the side input (unique there).
        on: the key column in IN's rows (default: ``key``).
        columns: the side columns to read (default: all); each must exist in every side shard.
        optional: more side columns, read when a side shard has them (absent: None in the joined row).
        check: ``check(rows, path, first_row)`` raises :class:`InputError` for a bad side row (the stage's
            own rules for what it joins, e.g. clue lists of one length), called as the side input is read.
    """

    path: Path
    key: str = "id"
    on: str | None = None
    columns: tuple[str, ...] | None = None
    check: Any = None
    optional: tuple[str, ...] = ()


class Stage:
    """Base class for a stage: pure logic over rows and an engine; I/O lives in the runner.

    A stage declares its options as a :class:`~stepkit.options.Config` dataclass kept in ``self.cfg``;
    the default :meth:`config` is that config's identity, so an option is written once.
    """

    name = "stage"
    required_columns: tuple[str, ...] = ()
    default_chunk_size = 16
    one_to_one = True  # False for stages that emit several rows per input row (rollout)
    group_by: str | None = None  # a column whose runs of equal values are never split across chunks
    optional_columns: tuple[str, ...] = ()  # also handed to validate() when the shard has them
    cfg: Config | None = None
    columns: tuple[Column, ...] = ()
    """The columns this stage writes, with their meaning (:class:`stepkit.columns.Column`); the default
    :meth:`output_schema` adds them to the input's, their meaning in the field metadata."""
    keep_on_error: frozenset[str] = frozenset()
    """Own columns the runner keeps on a row with an ``error``; every other declared column is nulled there
    (a row this stage could not label, or one that failed upstream, carries none of its labels)."""

    def config(self) -> dict[str, Any]:
        """Everything that changes the output, computable without loading a model."""
        return identity(self.cfg) if self.cfg is not None else {}

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        """The explicit schema of the output rows (input columns plus the stage's own). The runner adds
        the ``error`` column when it is missing (:func:`stepkit.schema.with_error_column`), so a row error
        is never dropped, whatever shard the input came from."""
        return extend_schema(input_schema, fields(self.columns))

    def side_outputs(self) -> dict[str, SideOutput]:
        """Extra tables this stage writes per shard, by name (rows come from :meth:`process`)."""
        return {}

    def side_inputs(self) -> dict[str, SideInput]:
        """Other shards this stage joins to its input rows, by name."""
        return {}

    def check_schema(self, schema: pa.Schema, path: Path) -> None:
        """Raise :class:`stepkit.errors.InputError` when the input is the wrong kind of shard."""

    def validate(self, rows: list[dict], path: Path, first_row: int) -> None:
        """Raise :class:`stepkit.errors.InputError` for bad input rows (before any generation).

        ``rows`` hold the required columns, plus ``error`` when the shard has one (rows that already
        failed upstream pass through unlabelled and need not be valid)."""

    def planned(self) -> None:
        """Called once every shard of the run was validated, before anything is written: raise
        :class:`ConfigError` or :class:`InputError` for a fault only the whole input shows (``filter``'s
        status rule naming a value no row has)."""

    def open(self) -> None:
        """Load models; called once, only if some chunk has work to do."""

    def start_shard(self, shard: Path) -> None:
        """Called before the chunks of the input shard ``shard`` go to :meth:`process` (``filter``'s rules
        that act across the whole input look up this shard's rows in what :meth:`planned` decided)."""

    asynchronous = False
    """True for a stage on the engine's asynchronous path: its :meth:`aprocess` submits its requests with
    ``await engine.agenerate`` (one coroutine per row or problem), so the runner keeps up to
    ``--chunks-in-flight`` chunks running at once on one event loop, the next chunk's requests starting
    while the previous chunk's last ones finish; chunks still commit in order. Such a stage must keep no
    per-chunk state on ``self`` (several chunks run at once) and its rows must not depend on the order in
    which answers come."""

    def process(self, rows: list[dict]) -> tuple:
        """Return ``(rows, counters)`` or ``(rows, counters, side_rows)``.

        ``rows``: the output rows (for a one-to-one stage, same order and count); a row this stage
        cannot label keeps ``error = RowError(self.name, "why")``. ``counters``: this chunk's ``{name: int}``.
        ``side_rows``: ``{side output name: [row, ...]}`` for the tables of :meth:`side_outputs`.
        Default, for a stage that writes :meth:`aprocess` (an :attr:`asynchronous` one, or one whose model-free
        modes await nothing, as clue's): that coroutine on an event loop of its own (:func:`~stepkit.aio.run_sync`,
        which also works from a thread that runs a loop). The one place stages go from sync to async.
        """
        if self.asynchronous or type(self).aprocess is not Stage.aprocess:
            return run_sync(self.aprocess(rows))
        raise NotImplementedError

    async def aprocess(self, rows: list[dict]) -> tuple:
        """:meth:`process` as a coroutine (what the runner awaits for an :attr:`asynchronous` stage, several
        chunks at once); the same return value. Default: :meth:`process` (nothing awaited), for a stage that
        is not asynchronous (an asynchronous one must write this)."""
        if self.asynchronous:
            raise NotImplementedError(f"{self.name}: an asynchronous stage writes aprocess")
        return self.process(rows)

    def refusal(self, counters: dict[str, int]) -> Exception | None:
        """A whole-run check made as each chunk is about to commit: ``counters`` sums the counters of this
        run's chunks of the shard committed so far and this chunk's, in commit order (so several chunks in
        flight see what one chunk at a time would); a returned error (a StepkitError: one line) stops the
        run before this chunk commits, the chunks committed before it kept. Counters whose names start with
        ``_`` are this check's bookkeeping: summed and handed here, never committed, shown or written to the
        manifest. Default: none."""
        return None

    def provenance(self) -> dict[str, Any]:
        """Extra manifest fields known after loading (engine and library versions)."""
        return {}

    tokens_kind = "generated"
    """What :meth:`tokens_generated` counts, as the summary table names it (``scored``: prompt tokens
    prefilled by a stage that only scores text)."""

    def tokens_generated(self) -> int:
        """Tokens generated so far by this stage's engine (for the progress bar and summary)."""
        return 0

    def close(self) -> None:
        """Release what :meth:`open` loaded."""

    def run_warnings(self, counters: dict[str, int]) -> list[str]:
        """One-line warnings about a whole run, from its counters summed over the run's shards (the CLI
        prints each once, after the summary, as ``warning: ...``); default none."""
        return []

    def loading(self) -> str | None:
        """What :meth:`open` loads, for the spinner shown meanwhile (``"the vllm engine (smollm2-135m)"``);
        None: nothing worth a spinner."""
        return None


class EngineStage(Stage):
    """A stage that samples with an engine and (when ``grades_answers``) grades answers with the answer
    checker, both built by :meth:`open`.

    Args:
        cfg: the stage's options.
        engine: which engine (an :class:`~stepkit.engines.base.EngineSpec`; nothing loads until ``open``).
        sampling: explicit sampling parameters.
        checker_factory: builds the answer checker (default
            :class:`stepkit.grading.verify.AnswerChecker`); tests pass one already running.
    """

    grades_answers = True
    engine = None
    checker = None

    def __init__(self, cfg: Config, engine, sampling, checker_factory=None):
        self.cfg, self.engine_spec, self.sampling = cfg, engine, sampling
        self.checker_factory = checker_factory

    def config(self) -> dict[str, Any]:
        doc = {"engine": self.engine_spec.identity(), **super().config(), "sampling": self.sampling.to_dict()}
        if self.grades_answers:
            from stepkit.grading.verify import checker_settings

            doc["grader"] = checker_settings()
        return doc

    def open(self) -> None:
        self.engine = self.engine_spec.build()
        if self.grades_answers:
            from stepkit.grading.verify import AnswerChecker

            self.checker = (self.checker_factory or AnswerChecker)()

    def close(self) -> None:
        for x in (self.checker, self.engine):
            if x is not None:
                x.close()

    def loading(self) -> str | None:
        spec = self.engine_spec  # None: a stage run with no model (clue recover --from-reference)
        return f"the {spec.name} engine ({spec.model})" if spec is not None else None

    def provenance(self) -> dict[str, Any]:
        return {"engine": self.engine.describe() if self.engine else None}

    def tokens_generated(self) -> int:
        return self.engine.stats.generated_tokens if self.engine else 0


class TrajectoryRows:
    """Mixin of a stage that labels the steps of trajectory rows: each row needs a unique non-empty ``id``,
    a ``prompt`` and non-empty ``steps``; rows that failed upstream are skipped."""

    def validate(self, rows, path, first_row):
        if first_row == 0:
            self._seen_ids = set()
        check_values(rows, path, first_row, ("id", "prompt"), unique="id", seen=self._seen_ids)
        check_steps(rows, path, first_row)

    def __getstate__(self):
        """Pickled (sent to a Ray actor) without planning's set of the last shard's ids."""
        return {k: v for k, v in self.__dict__.items() if k != "_seen_ids"}


class LabelerStage(TrajectoryRows, EngineStage):
    """An engine stage that labels the steps of trajectory rows (mc-label, judge; :class:`TrajectoryRows`)."""
