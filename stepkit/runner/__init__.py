"""The runner every stage shares: planning, chunks, committed part files, resume, atomic output, manifest.

Contract (``docs/architecture.md``, "The runner contract"):

* ``IN`` is a Parquet file or a folder of shards; ``--rank R --world-size W`` takes ``sorted(shards)[R::W]``.
* :func:`~stepkit.runner.plan.plan_run` does everything that needs no model, for every shard, before any model is loaded:
  columns (every stepkit column the shard has must be of its type), rows, side inputs, writability, and the
  identity check against finished or partial output.
  An :class:`Executor` then runs the planned shards (:class:`LocalExecutor` here, one after another in
  this process); each shard runs through :func:`run_shard`, whatever the executor.
* Each shard is processed in chunks of ``chunk_size`` rows. A finished chunk is committed as
  ``<out>.parts/part-00007.parquet`` (temp file + rename) with its counters in ``part-00007.json`` and
  its side-output rows in ``<name>-00007.parquet``, written first: the main part's ``.parquet`` existing
  is what marks the chunk committed. The counters file records the sha256 of the rows part and of each
  side table. A killed run, started again with the same command, skips committed chunks whose files match
  their checksums and redoes at most the chunks that were in flight (one, or ``chunks_in_flight`` for a stage
  on the asynchronous path, :mod:`stepkit.runner.window`; chunks commit in order); a damaged chunk (truncated, bit-flipped,
  replaced, a file missing) is redone with one warning line, never reused. Parts deleted during a run are
  redone in that run. A failed write (a full disk) is one :class:`StepkitError` line naming the file; Ctrl-C
  and SIGTERM (:class:`~stepkit.errors.Interrupted`) release the lock and keep the committed chunks.
* When every chunk is committed, the side outputs and then ``<out>`` are written atomically, each with a
  manifest beside it (``<stem>.manifest.json``) and in its Parquet metadata, and the parts folder is
  removed.
* The configuration identity (stage, input hash, side-input hashes, the stage's config, chunk size) is
  stored in the parts folder and the manifest; a rerun with a different identity refuses unless
  ``force``. A rerun of a finished shard with the same identity does nothing.
* Per-row failures go in the ``error`` column (every output has it, added when the input has none);
  the shard fails only above ``max_error_rate``. A stage
  marks its own failures with :class:`~stepkit.errors.RowError`; a plain-string error is an earlier
  stage's, passed through, and never counts here.

A stage is an object with ``name``, ``required_columns``, ``config()``, ``output_schema(schema)``,
``validate(rows, path, first_row)``, ``open()``, ``process(rows) -> (rows, counters[, side_rows])``,
``provenance()`` and ``close()``, and optionally ``side_outputs()`` and ``side_inputs()`` (see
:class:`stepkit.stage.Stage`).

The package is cut by job, each module importing only those above it in this list:

* :mod:`stepkit.runner.options`: ``RunOptions``, ``ExecutorOptions``, ``--rank auto`` from the environment.
* :mod:`stepkit.runner.parts`: the parts folder: the output lock, committed chunks and their checksums,
  damage checks, atomic writes of a part.
* :mod:`stepkit.runner.plan`: planning a run and each shard (identity, side inputs, writability, what is
  up to date); ``ShardPlan`` and ``ShardResult``.
* :mod:`stepkit.runner.shard`: running one planned shard: chunks through the stage, row errors, commits,
  the gather into ``<out>`` and its manifest, progress.
* :mod:`stepkit.runner.executor`: the ``Executor`` interface; :mod:`stepkit.runner.local`: the local
  executor, ``make_executor`` and ``run_stage``; :mod:`stepkit.runner.ray_executor`: Ray actors (Ray is
  imported only there, only when it runs).
"""

from stepkit.runner.executor import Executor
from stepkit.runner.local import LocalExecutor, make_executor, run_stage
from stepkit.runner.options import EXECUTORS, ExecutorOptions, RunOptions, rank_from_environment
from stepkit.runner.parts import OutputLock
from stepkit.runner.plan import RunSetup, ShardPlan, ShardResult, plan_run, plan_shard, prepare_run
from stepkit.runner.shard import run_shard

__all__ = [
    "EXECUTORS", "Executor", "ExecutorOptions", "LocalExecutor", "OutputLock", "RunOptions", "RunSetup",
    "ShardPlan", "ShardResult", "make_executor", "plan_run", "plan_shard", "prepare_run", "rank_from_environment",
    "run_shard", "run_stage",
]
