"""The runner every stage shares: planning, chunks, committed part files, resume, atomic output, manifest.

Contract (``docs/architecture.md``, "The runner contract"):

* ``IN`` is a Parquet file or a folder of shards; ``--rank R --world-size W`` takes ``sorted(shards)[R::W]``.
* :func:`plan_run` does everything that needs no model, for every shard, before any model is loaded:
  columns (every stepkit column the shard has must be of its type), rows, side inputs, writability, and the
  identity check against finished or partial output.
  An :class:`Executor` then runs the planned shards (:class:`LocalExecutor` here, one after another in
  this process); each shard runs through :func:`run_shard`, whatever the executor.
* Each shard is processed in chunks of ``chunk_size`` rows. A finished chunk is committed as
  ``<out>.parts/part-00007.parquet`` (temp file + rename) with its counters in ``part-00007.json`` and
  its side-output rows in ``<name>-00007.parquet``, written first: the main part's ``.parquet`` existing
  is what marks the chunk committed. The counters file records the sha256 of the rows part and of each
  side table. A killed run, started again with the same command, skips committed chunks whose files match
  their checksums and redoes at most the chunk that was in flight; a damaged chunk (truncated, bit-flipped,
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
:class:`Stage`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from stepkit import __version__
from stepkit.errors import ConfigError, InputError, Interrupted, RowError, StepkitError, one_line
from stepkit.matching import match_by_id
from stepkit.options import Config, flag_of, opt
from stepkit.schema import (
    check_column_types,
    check_columns,
    check_error_column,
    error_reason,
    with_error_column,
)
from stepkit.shards import (
    config_diff,
    config_hash,
    file_sha256,
    iter_row_chunks,
    iter_row_ranges,
    list_shards,
    manifest_path,
    open_parquet,
    output_path,
    read_manifest,
    resolve_path,
    rows_to_table,
    select_shards,
    write_json,
    write_table,
)
from stepkit.stage import SideInput, Stage


@dataclass(frozen=True)
class RunOptions(Config):
    """How the runner runs a stage (none of these change the rows, except ``chunk_size``, which is part
    of the identity because it fixes which rows share an engine call)."""

    chunk_size: int | None = opt(None, "Rows per committed chunk (resume granularity).", min=1)
    force: bool = opt(False, "Redo the output even if it exists from another configuration.")
    rank: int = opt(0, "This machine's index: takes sorted(shards)[rank::world_size]; auto: from "
                       "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT or RANK/WORLD_SIZE.", min=0, words=("auto",),
                    metavar="R|auto")
    world_size: int | None = opt(None, "How many machines split the folder of shards (default 1; with --rank "
                                       "auto, from the environment).", min=1)
    max_error_rate: float = opt(0.05, "Fail a shard when more than this share of rows has an error.", min=0, max=1)
    progress: bool = opt(True, "Show a progress bar.", flag="--progress/--no-progress")

    def __post_init__(self):
        super().__post_init__()
        if self.rank == "auto":
            rank, world = rank_from_environment(os.environ)
            if self.world_size is not None and self.world_size != world:
                raise ConfigError(f"--rank auto: the environment says {world} ranks, but --world-size is "
                                  f"{self.world_size}; leave --world-size out or make them agree")
            object.__setattr__(self, "rank", rank)
            object.__setattr__(self, "world_size", world)
        elif self.world_size is None:
            object.__setattr__(self, "world_size", 1)
        if self.rank >= self.world_size:
            raise ConfigError(f"need 0 <= rank < world-size, got --rank {self.rank} --world-size {self.world_size}")


def _env_int(env, name: str) -> int:
    value = env[name].strip()
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"--rank auto: {name}={one_line(value)!r:.40} is not an integer") from None


def rank_from_environment(env) -> tuple[int, int]:
    """``(rank, world_size)`` for ``--rank auto``, from a Slurm array job or a torchrun-style launcher.

    Slurm (``sbatch --array``): ``SLURM_ARRAY_TASK_ID`` and ``SLURM_ARRAY_TASK_COUNT``; when Slurm also sets
    ``SLURM_ARRAY_TASK_MIN`` / ``SLURM_ARRAY_TASK_STEP`` (an array such as ``1-8`` or ``0-15:2``), the rank
    is ``(ID - MIN) / STEP``, and the array must be one evenly stepped range (``--array=1,4,7`` is
    refused: it cannot be told apart from a range with gaps). torchrun / ``torch.distributed`` launchers:
    ``RANK`` and ``WORLD_SIZE``. When both are set they must agree.

    Args:
        env: the environment (``os.environ``).

    Raises:
        ConfigError: one line when neither pair is set, half of a pair is, a value is not an integer, or the
            values are inconsistent (rank outside ``0..count-1``, an uneven array, Slurm and torchrun differ).
    """
    found = {}
    slurm = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT")
    torch = ("RANK", "WORLD_SIZE")
    for pair in (slurm, torch):
        have = [n for n in pair if env.get(n, "").strip()]
        if len(have) == 1:
            missing = next(n for n in pair if n not in have)
            raise ConfigError(f"--rank auto: {have[0]} is set but {missing} is not")
        if have:
            found[pair] = (_env_int(env, pair[0]), _env_int(env, pair[1]))
    if not found:
        raise ConfigError("--rank auto: neither SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT (a Slurm array job) nor "
                          "RANK/WORLD_SIZE (torchrun) is set; give --rank R --world-size W")
    if slurm in found:
        task, count = found[slurm]
        if env.get("SLURM_ARRAY_TASK_MIN", "").strip():
            low = _env_int(env, "SLURM_ARRAY_TASK_MIN")
            step = _env_int(env, "SLURM_ARRAY_TASK_STEP") if env.get("SLURM_ARRAY_TASK_STEP", "").strip() else 1
            high = _env_int(env, "SLURM_ARRAY_TASK_MAX") if env.get("SLURM_ARRAY_TASK_MAX", "").strip() else None
            if step < 1 or (task - low) % step or (high is not None and (high - low) // step + 1 != count):
                raise ConfigError(f"--rank auto: the Slurm array (SLURM_ARRAY_TASK_MIN {low}, MAX {high}, STEP "
                                  f"{step}, COUNT {count}) is not one evenly stepped range of {count} tasks, so task "
                                  f"{task} has no rank; use --array=0-{count - 1} or give --rank R --world-size W")
            task = (task - low) // step
        found[slurm] = (task, count)
    if len(set(found.values())) > 1:
        (r1, w1), (r2, w2) = found[slurm], found[torch]
        raise ConfigError(f"--rank auto: Slurm says rank {r1} of {w1} (SLURM_ARRAY_TASK_ID/COUNT) but RANK/WORLD_SIZE "
                          f"say {r2} of {w2}; unset one of them or give --rank R --world-size W")
    pair, (rank, world) = next(iter(found.items()))  # (both agree when both are set)
    names = f"{pair[0]}/{pair[1]}"
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"--rank auto: {names} give rank {rank} of {world}; need 0 <= rank < world size >= 1")
    return rank, world


EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class ExecutorOptions(Config):
    """Where the planned shards run (none of these change the rows): ``local`` runs them one after another in
    this process (:class:`LocalExecutor`); ``ray`` runs them on a pool of Ray actors, each holding the opened
    stage (:class:`stepkit.ray_executor.RayExecutor`), with the Ray options below.

    Raises:
        ConfigError: a Ray option given with ``executor="local"`` (it would be silently unused).
    """

    executor: str = opt("local", "Where shards run: local (one after another, here) or ray (on Ray actors that "
                                 "each open the stage once).", choices=EXECUTORS)
    ray_address: str | None = opt(None, "Ray cluster to join: auto (RAY_ADDRESS or the cluster `ray start` made "
                                        "here) or HOST:PORT; default: start a local Ray instance.", metavar="ADDRESS")
    cpus_per_shard: float = opt(1.0, "CPUs Ray reserves for each actor (one shard at a time).", min=0, min_open=True)
    gpus_per_shard: float = opt(0.0, "GPUs Ray reserves for each actor (one shard at a time); its engine is "
                                     "built on them (--tensor-parallel-size at most this).", min=0)
    shard_retries: int = opt(3, "Times a shard is given to a new actor after its actor's process or machine "
                                "died (the rerun resumes from the shard's committed chunks).", min=0)

    def __post_init__(self):
        super().__post_init__()
        if self.executor == "local":
            for f in dataclasses.fields(self):
                if f.name != "executor" and getattr(self, f.name) != f.default:
                    raise ConfigError(f"{flag_of(f)} is an option of --executor ray; this run uses --executor local")


def make_executor(opts: ExecutorOptions) -> Executor:
    """The executor ``opts`` names (Ray is imported only when a Ray executor runs).

    Raises:
        ConfigError: see :class:`ExecutorOptions`.
    """
    if opts.executor == "local":
        return LocalExecutor()
    from stepkit.ray_executor import RayExecutor

    return RayExecutor(address=opts.ray_address, cpus_per_shard=opts.cpus_per_shard,
                       gpus_per_shard=opts.gpus_per_shard, max_retries=opts.shard_retries)


@dataclass
class ShardPlan:
    """One shard's work, decided by :func:`plan_run` before any model loads.

    ``status`` is ``"todo"`` or ``"up to date"``; ``side_outputs`` maps each side output's name to its
    path for this shard; ``side_inputs`` to the side shards it joins."""

    input: Path
    output: Path
    schema: pa.Schema
    rows: int
    identity: dict[str, Any]
    status: str = "todo"
    side_outputs: dict[str, Path] = field(default_factory=dict)
    side_inputs: dict[str, list[Path]] = field(default_factory=dict)
    done_rows: int = 0
    chunks: list[tuple[int, int]] = field(default_factory=list)  # [start, end) rows of each chunk


@dataclass
class ShardResult:
    """What happened to one shard: ``status`` is ``"done"``, ``"up to date"`` or ``"failed"`` (a distributed
    executor reports a shard that failed, and the one-line reason in ``error``, while the others finish)."""

    input: Path
    output: Path
    status: str  # "done", "up to date", "failed"
    rows: int = 0
    errors: int = 0
    chunks: int = 0
    resumed_chunks: int = 0
    seconds: float = 0.0
    tokens: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    error: str | None = None


def _identity(stage: Stage, input_hash: str, chunk_size: int, side_hashes: dict[str, list[str]],
              side_outputs: list[str]) -> dict[str, Any]:
    cfg = stage.config()
    key = [stage.name, input_hash, cfg, chunk_size]
    if side_hashes or side_outputs:  # (absent for a stage with neither: older manifests keep their hash)
        key += [side_hashes, sorted(side_outputs)]
    ident = {"stage": stage.name, "input_sha256": input_hash, "config": cfg, "chunk_size": chunk_size,
             "config_hash": config_hash(key)}
    if side_hashes:
        ident["side_inputs_sha256"] = side_hashes
    if side_outputs:
        ident["side_outputs"] = sorted(side_outputs)
    return ident


def _describe_change(old: dict, new: dict) -> str:
    if old.get("input_sha256") != new.get("input_sha256"):
        return "the input file changed"
    if old.get("side_inputs_sha256") != new.get("side_inputs_sha256"):
        return "a side input changed"
    if old.get("side_outputs") != new.get("side_outputs"):
        return f"side outputs {old.get('side_outputs') or []} -> {new.get('side_outputs') or []}"
    if old.get("chunk_size") != new.get("chunk_size"):
        return f"chunk size {old.get('chunk_size')} -> {new.get('chunk_size')}"
    diffs = config_diff(old.get("config", {}), new.get("config", {}))
    return "changed: " + ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in diffs[:3]) if diffs else "configuration changed"


@dataclass
class RunSetup:
    """What planning checks and loads once for all shards (:func:`prepare_run`); :func:`plan_shard` plans one
    shard with it (a distributed executor sends it to its workers, which plan their own shards)."""

    in_path: Path
    out_path: Path
    chunk_size: int
    shards: list[Path]  # this rank's share of IN
    sides_in: dict[str, tuple[SideInput, tuple[list[Path], dict[Any, dict]]]]  # name -> (side, (paths, rows by key))
    side_hashes: dict[str, list[str]]
    read_only: set[Path]  # the side inputs' files, never written


def plan_run(stage: Stage, in_path: str | os.PathLike, out_path: str | os.PathLike, opts: RunOptions) -> list[ShardPlan]:
    """Check everything that needs no model and decide each shard's work (this rank's share of IN):
    :func:`prepare_run`, then :func:`plan_shard` for each shard.

    Raises:
        InputError: unreadable input, missing column, bad rows, a side input without a row for a key.
        ConfigError: OUT is IN or not writable, or some shard's finished or partial output is from
            another configuration and ``opts.force`` is off. Nothing has been written then.
    """
    setup = prepare_run(stage, in_path, out_path, opts)
    plans = [plan_shard(stage, setup, shard, opts) for shard in setup.shards]
    stage.planned()
    return plans


def prepare_run(stage: Stage, in_path: str | os.PathLike, out_path: str | os.PathLike, opts: RunOptions) -> RunSetup:
    """The checks of a run as a whole (IN and OUT, side inputs loaded and checked) and this rank's shards.

    Raises:
        InputError: IN has no shards or cannot be read; a side input is bad.
        ConfigError: OUT is IN, or a folder IN has a file OUT.
    """
    in_path, out_path = Path(in_path), Path(out_path)
    chunk_size = opts.chunk_size or stage.default_chunk_size
    if in_path.is_dir() and out_path.suffix == ".parquet":
        raise ConfigError(f"{out_path}: IN {in_path} is a folder of shards, so OUT must be a folder too")
    if resolve_path(out_path) == resolve_path(in_path):
        raise ConfigError(f"{out_path}: OUT is the same as IN; write the output somewhere else")
    sides_in = {name: (side, _load_side_input(name, side)) for name, side in stage.side_inputs().items()}
    side_hashes = {name: [file_sha256(p) for p in paths] for name, (side, (paths, _)) in sides_in.items()}
    read_only = {resolve_path(p) for _, (paths, _) in sides_in.values() for p in paths}
    shards = select_shards(list_shards(in_path), opts.rank, opts.world_size)
    return RunSetup(in_path, out_path, chunk_size, shards, sides_in, side_hashes, read_only)


def plan_shard(stage: Stage, setup: RunSetup, shard: Path, opts: RunOptions, read_rows: bool = True) -> ShardPlan:
    """One shard's plan: its columns and rows checked (``stage.validate``, side-input joins, contiguous
    groups), its outputs, identity and status.

    ``read_rows=False`` reads no row and no schema (``schema`` is None, ``chunks`` empty, ``rows`` from the
    footer when it can be read, else 0): just enough to tell a shard that is up to date, or whose output is
    from another configuration, before the shard is planned in full where it runs.

    Raises:
        InputError: unreadable shard, missing column, bad rows, a row without its side-input row.
        ConfigError: an output not writable or overwriting another file; the shard's finished or partial
            output is from another configuration and ``opts.force`` is off.
    """
    in_path, out_path, chunk_size, sides_in = setup.in_path, setup.out_path, setup.chunk_size, setup.sides_in
    read_only, sides_out = setup.read_only, stage.side_outputs()
    schema, chunks = None, []
    if read_rows:
        pf = open_parquet(shard)
        n_rows, schema = pf.metadata.num_rows, pf.schema_arrow
        check_columns(schema, stage.required_columns, shard)
        check_error_column(schema, shard)
        check_column_types(schema, shard)  # (a stage reads other stages' columns without declaring them)
        stage.check_schema(schema, shard)
        join_cols = [side.on or side.key for side, _ in sides_in.values()]
        extra = [c for c in (*stage.optional_columns, "error") if c in schema.names]
        columns = list(dict.fromkeys(list(stage.required_columns) + join_cols + extra))
        for col in join_cols + ([stage.group_by] if stage.group_by else []):
            check_columns(schema, (col,), shard)
        groups = _GroupChunks(shard, chunk_size, stage.group_by)
        for first, rows in iter_row_chunks(shard, 1024, columns=columns or None):
            stage.validate(rows, shard, first)
            for name, (side, (_, table)) in sides_in.items():
                _check_joined(rows, first, shard, name, side, table)
        if stage.group_by:
            for first, rows in iter_row_chunks(shard, 1024, columns=[stage.group_by]):
                groups.feed(rows, first)
        chunks = groups.chunks(n_rows)
    else:
        try:
            n_rows = open_parquet(shard).metadata.num_rows
        except InputError:  # (reported by the full plan, where the shard runs)
            n_rows = 0
    out = output_path(shard, in_path, out_path)
    if resolve_path(out) in read_only:
        raise ConfigError(f"{out}: OUT is a side input of this run; write the output somewhere else")
    _check_writable(out, shard)
    side_paths = {}
    own_files = {resolve_path(manifest_path(out)), resolve_path(_parts_dir(out))}
    for name, side in sides_out.items():
        p = output_path(shard, in_path, Path(side.path))
        taken = {resolve_path(out), resolve_path(shard), *read_only, *(resolve_path(q) for q in side_paths.values())}
        if resolve_path(p) in taken:
            raise ConfigError(f"{p}: the {name} output would overwrite IN, OUT, a side input or another "
                              "output; give it its own path")
        if own_files & {resolve_path(p), resolve_path(manifest_path(p)), *resolve_path(p).parents}:
            raise ConfigError(f"{p}: the {name} output would go into OUT's own files (its manifest or parts "
                              "folder); give it its own path")
        _check_writable(p, shard)
        side_paths[name] = p
    ident = _identity(stage, file_sha256(shard), chunk_size, setup.side_hashes, list(sides_out))
    plan = ShardPlan(shard, out, schema, n_rows, ident, side_outputs=side_paths,
                     side_inputs={n: paths for n, (_, (paths, _)) in sides_in.items()}, chunks=chunks)
    _check_existing(plan, opts.force)
    return plan


def _check_existing(plan: ShardPlan, force: bool) -> None:
    """Mark ``plan`` up to date, or refuse when its output or parts come from another configuration."""
    if force:
        return
    out, ident = plan.output, plan.identity
    if out.exists():
        done = read_manifest(out)
        if done is None:
            raise ConfigError(f"{out}: exists but has no readable stepkit manifest; use --force to replace it")
        if done.get("identity", {}).get("config_hash") == ident["config_hash"]:
            for name, p in plan.side_outputs.items():
                side = read_manifest(p) if p.exists() else None
                if side is None or side.get("side_output_of") != str(out) or \
                        side.get("identity", {}).get("config_hash") != ident["config_hash"]:
                    raise ConfigError(f"{out}: is finished, but its {name} output {p} is "
                                      f"{'missing' if not p.exists() else 'not the one this run wrote'}; "
                                      "use --force to redo the shard")
            plan.status, plan.done_rows = "up to date", done.get("counts", {}).get("rows", 0)
            shutil.rmtree(_parts_dir(out), ignore_errors=True)  # left by a kill after OUT was written
            return
        old = {**done.get("identity", {}), "config": done.get("config", {})}
        raise ConfigError(f"{out}: exists from a different configuration "
                          f"({_describe_change(old, ident)}); use --force to redo it")
    for name, p in plan.side_outputs.items():  # a side output never replaces a file it did not write
        side = read_manifest(p) if p.exists() else None
        if p.exists() and (side is None or side.get("side_output_of") != str(out)):
            raise ConfigError(f"{p}: exists and is not the {name} output of {out}; use --force to replace it, "
                              "or give the side output another path")
    run_file = _parts_dir(out) / "run.json"
    if _parts_dir(out).exists():
        try:
            old = json.loads(run_file.read_text()) if run_file.exists() else {}
        except (OSError, ValueError):
            old = {}
        if not old.get("config_hash"):  # no (readable) run.json: its parts' configuration is unknown
            if any(_parts_dir(out).glob("*.parquet")):
                raise ConfigError(f"{_parts_dir(out)}: partial run without a readable run.json, so the configuration "
                                  "of its parts is unknown; use --force to discard it")
            return  # nothing committed (e.g. a kill right after the folder was made): start afresh in it
        if old.get("config_hash") != ident["config_hash"]:
            raise ConfigError(f"{_parts_dir(out)}: partial run from a different configuration "
                              f"({_describe_change(old, ident)}); use --force to discard it")


class _GroupChunks:
    """Chunk boundaries: ``chunk_size`` rows each, extended so a run of equal ``group_by`` values (one
    problem's rows) is never split. Groups must be contiguous: a value that comes back later is bad input."""

    def __init__(self, shard: Path, chunk_size: int, group_by: str | None):
        self.shard, self.size, self.col = shard, chunk_size, group_by
        self.starts: list[int] = [0]  # first row of each group
        self.seen: set = set()
        self.last = object()

    def feed(self, rows: list[dict], first: int) -> None:
        for i, r in enumerate(rows):
            v = r[self.col]
            if v != self.last:
                if v in self.seen:
                    raise InputError(self.shard, f"rows of {self.col} {v!r} are not contiguous (a stage that "
                                                 f"works per {self.col} needs them together: sort the shard by "
                                                 f"it, e.g. pq.write_table(pq.read_table(IN).sort_by("
                                                 f"'{self.col}'), SORTED))", row=first + i, column=self.col)
                self.seen.add(v)
                if first + i:
                    self.starts.append(first + i)
                self.last = v

    def chunks(self, n_rows: int) -> list[tuple[int, int]]:
        if not self.col:
            return [(a, min(a + self.size, n_rows)) for a in range(0, n_rows, self.size)]
        out, start = [], 0
        for g in self.starts[1:] + [n_rows]:
            if g - start >= self.size:
                out.append((start, g))
                start = g
        if start < n_rows:
            out.append((start, n_rows))
        return out


def _load_side_input(name: str, side: SideInput) -> tuple[list[Path], dict[Any, dict]]:
    """All rows of a side input, by key (InputError on a missing key column or a repeated key)."""
    paths = list_shards(side.path)
    table: dict[Any, dict] = {}
    for p in paths:
        names = open_parquet(p).schema_arrow.names
        check_columns(open_parquet(p).schema_arrow, (side.key, *(side.columns or ())), p)
        extra = [c for c in side.optional if c in names]
        cols = list(dict.fromkeys([side.key, *side.columns, *extra])) if side.columns else None
        for first, rows in iter_row_chunks(p, 1024, columns=cols):
            for r in rows:
                for c in side.optional:
                    r.setdefault(c, None)
            if side.check is not None:
                side.check(rows, p, first)
            for i, r in enumerate(rows):
                k = r[side.key]
                if isinstance(k, (list, dict)):
                    raise InputError(p, f"the {name} input's key must be a scalar, got {type(k).__name__}",
                                     row=first + i, column=side.key)
                if k is None:
                    raise InputError(p, f"null key in the {name} input", row=first + i, column=side.key)
                if k in table:
                    raise InputError(p, f"duplicate value {k!r} in the {name} input", row=first + i, column=side.key)
                table[k] = r
    return paths, table


def _check_joined(rows, first, shard, name, side: SideInput, table) -> None:
    col = side.on or side.key
    for i, r in enumerate(rows):
        if not r.get("error") and r.get(col) not in table:
            raise InputError(shard, f"no row with {side.key} {r.get(col)!r} in the {name} input {side.path}",
                             row=first + i, column=col)


class Executor:
    """Runs planned shards. :class:`LocalExecutor` runs them here, one after another; a distributed
    executor (:class:`stepkit.ray_executor.RayExecutor`) runs them on Ray actors that each keep the stage
    open for their shards, through the same :func:`run_shard`. :func:`make_executor` builds the one :class:`ExecutorOptions` names."""

    def run(self, stage: Stage, plans: list[ShardPlan], opts: RunOptions, console=None) -> list[ShardResult]:
        """Run ``plans`` (from :func:`plan_run`) and return one :class:`ShardResult` per plan, in plan order."""
        raise NotImplementedError

    def plan_and_run(self, stage: Stage, in_path: str | os.PathLike, out_path: str | os.PathLike, opts: RunOptions,
                     console=None) -> list[ShardResult]:
        """:func:`plan_run`, then :meth:`run` (a distributed executor plans each shard where it runs it)."""
        return self.run(stage, plan_run(stage, in_path, out_path, opts), opts, console)


class LocalExecutor(Executor):
    """Every shard in this process: the stage (its model) is opened once, if any shard has work."""

    def run(self, stage, plans, opts, console=None):
        results = []
        opened = False
        try:
            for plan in plans:
                if plan.status == "up to date":
                    results.append(ShardResult(plan.input, plan.output, "up to date", rows=plan.done_rows))
                    continue
                results.append(run_shard(stage, plan, opts, console, open_stage=not opened))
                opened = True
        finally:
            if opened:
                stage.close()
        return results


def run_stage(stage: Stage, in_path: str | os.PathLike, out_path: str | os.PathLike, *,
              chunk_size: int | None = None, force: bool = False, rank: int | str = 0, world_size: int | None = None,
              max_error_rate: float = 0.05, progress: bool = True, console=None,
              executor: Executor | None = None) -> list[ShardResult]:
    """Run ``stage`` over the shards of ``in_path`` (this rank's share; ``rank="auto"``: from the
    environment, :func:`rank_from_environment`) into ``out_path``: :func:`plan_run`, then ``executor``
    (default :class:`LocalExecutor`), through :meth:`Executor.plan_and_run`.

    Returns one :class:`ShardResult` per shard handled by this rank, in shard order. With the
    :class:`~stepkit.ray_executor.RayExecutor`, a shard that fails while planned on its actor (bad input)
    or running is one of them (status ``failed``, its one-line ``error``) and the other shards finish.

    Raises:
        InputError: unreadable input, missing column, bad rows (before any generation; with the Ray
            executor only for what the driver checks: IN, side inputs).
        ConfigError: the configuration differs from a finished or partial run and ``force`` is off.
        StepkitError: the error rate of a shard exceeds ``max_error_rate`` (its parts are kept, so a
            rerun with a higher threshold finishes without generating again); with the local executor.
    """
    opts = RunOptions(chunk_size=chunk_size, force=force, rank=rank, world_size=world_size,
                      max_error_rate=max_error_rate, progress=progress)
    return (executor or LocalExecutor()).plan_and_run(stage, in_path, out_path, opts, console)


def _check_writable(out: Path, shard: Path) -> None:
    """Fail before any model is loaded when ``out`` cannot be written or would overwrite the input."""
    if resolve_path(out) == resolve_path(shard):
        raise ConfigError(f"{out}: OUT is the same file as IN; write the output somewhere else")
    if out.is_dir():
        raise ConfigError(f"{out}: is a folder, expected a .parquet file path")
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{out}: cannot create its folder ({e.strerror or e})") from None
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"{out}: folder {parent} is not writable")
    probe = parent / f".{out.name}.probe-{os.getpid()}"
    try:  # root passes os.access everywhere; /sys and /proc still refuse files
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"{out}: cannot write in {parent} ({e.strerror or e})") from None


class _OutputLock:
    """An exclusive lock on one output, so two runs never write the same OUT at once.

    The lock file holds the holder's pid. It is opened without truncating, so a run that is refused
    leaves the holder's pid in place (and names it)."""

    def __init__(self, out: Path):
        self.path = out.with_name(f".{out.name}.lock")

    def __enter__(self):
        import fcntl

        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise ConfigError(f"{self.path.parent}: cannot write there ({e.strerror or e})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip()
                os.close(fd)
                raise ConfigError(f"{self.path.name[1:-5]}: another stepkit run is writing this output ("
                                  f"{f'pid {holder}, ' if holder else ''}lock {self.path}); wait for it or stop it"
                                  ) from None
            try:  # the holder may have removed the file between our open and our lock: lock the one there
                st, now = os.fstat(fd), os.stat(self.path)
                if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        return self

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)
        os.close(self.fd)


def _warn(message: str) -> None:
    """One ``warning: ...`` line on stderr (a fault the run recovers from, e.g. a damaged part redone)."""
    print(f"warning: {one_line(message)}", file=sys.stderr, flush=True)


def _os_reason(e: OSError) -> str:
    """``No space left on device`` for an OSError from Python or pyarrow (whose ``strerror`` may be unset)."""
    if e.errno:
        return os.strerror(e.errno)
    return (str(e).splitlines() or [type(e).__name__])[0]


@contextlib.contextmanager
def _writing(path: Path, parts: Path):
    """Turn an OSError while ``path`` is written (a full disk, a quota, a read-only folder) into one
    :class:`StepkitError` line naming the file; what was committed before stays in ``parts``."""
    try:
        yield
    except OSError as e:
        raise StepkitError(f"{path}: cannot write it ({_os_reason(e)}); the chunks committed so far are kept in "
                           f"{parts}: free some space and run the same command again to resume") from None


def _parts_dir(out: Path) -> Path:
    return out.with_name(out.name + ".parts")


def _log(parts: Path, **event) -> None:
    with _writing(parts / "log.jsonl", parts):
        parts.mkdir(parents=True, exist_ok=True)  # a user may have deleted it mid-run
        with open(parts / "log.jsonl", "a") as f:
            f.write(json.dumps({"time": time.time(), "pid": os.getpid(), **event}) + "\n")


def _part(parts: Path, i: int, kind: str = "part", suffix: str = "parquet") -> Path:
    return parts / f"{kind}-{i:05d}.{suffix}"


def _ensure_parts(parts: Path, ident: dict[str, Any]) -> None:
    """The parts folder with its ``run.json`` (the identity), created again if it was deleted mid-run."""
    if not (parts / "run.json").exists():
        with _writing(parts / "run.json", parts):
            parts.mkdir(parents=True, exist_ok=True)
            write_json(parts / "run.json", ident)


def _chunk_damage(parts: Path, i: int, side_names) -> str | None:
    """Why chunk ``i`` cannot be reused: ``"missing"`` when it was never committed (no rows part), else
    what is wrong with its committed files (a counters file or side table missing or unreadable, no
    checksum recorded, a file whose sha256 is not the one recorded at commit: truncated, bit-flipped or
    replaced since); None when the chunk is committed and intact.

    The checksums are the ``sha256`` map of ``part-NNNNN.json`` (``part`` for the rows, one per side
    table), written before the rows part appears, so a chunk is reused only byte for byte as committed."""
    main = _part(parts, i)
    if not main.exists():
        return "missing"
    try:
        meta = json.loads(_part(parts, i, suffix="json").read_text())
    except FileNotFoundError:
        return f"its counters file {_part(parts, i, suffix='json').name} is missing"
    except (OSError, ValueError):
        return f"its counters file {_part(parts, i, suffix='json').name} is unreadable"
    sums = meta.get("sha256") if isinstance(meta, dict) else None
    if not isinstance(sums, dict):
        return "no checksum was recorded with it (committed by an older stepkit)"
    for key, path in (("part", main), *((name, _part(parts, i, name)) for name in side_names)):
        try:
            actual = file_sha256(path)
        except FileNotFoundError:
            return f"its file {path.name} is missing"
        except OSError as e:
            return f"its file {path.name} is unreadable ({e.strerror or e})"
        if sums.get(key) != actual:
            return f"{path.name} does not match the sha256 recorded when it was committed (changed since)"
    return None


def _intact_chunks(parts: Path, n_chunks: int, side_names, warn) -> set[int]:
    """The chunks committed and intact (:func:`_chunk_damage`). A damaged chunk is reported with one
    ``warn`` line, logged, and its rows part removed, so it is redone and never reused."""
    intact = set()
    for i in range(n_chunks):
        why = _chunk_damage(parts, i, side_names)
        if why is None:
            intact.add(i)
        elif why != "missing":
            warn(f"{_part(parts, i)}: committed chunk {i} is damaged ({why}); it is redone")
            _log(parts, event="damaged", chunk=i, reason=why)
            _part(parts, i).unlink(missing_ok=True)
    return intact


def _uncommitted_chunks(shard: Path, bounds: list[tuple[int, int]], parts: Path, side_names, committed: set[int],
                        resumed: set[int], warn=None):
    """``(i, rows)`` of each chunk not in ``committed``; then again for any chunk whose committed parts
    disappeared or were damaged during the pass (``OUT.parts`` or OUT's folder deleted mid-run), which are
    so redone. Chunks redone leave ``resumed``. A third pass is refused: something keeps deleting the parts."""
    todo = set(range(len(bounds))) - committed
    for attempt in range(3):
        if not todo:
            return
        if attempt == 2:
            raise StepkitError(f"{parts}: committed parts of chunks {sorted(todo)[:5]} disappeared twice during "
                               "this run; is something deleting this folder? Run the command again when it stops")
        if attempt:
            _log(parts, event="redo", chunks=sorted(todo))
            resumed -= todo
        for i, rows in enumerate(iter_row_ranges(shard, bounds)):
            if i in todo:
                yield i, rows
        todo = set(range(len(bounds))) - _intact_chunks(parts, len(bounds), side_names, warn or _warn)


def _read_part(path: Path):
    """A committed part for the final gather: its rows (``.parquet``) or counters (``.json``); one clear
    line when it disappeared since it was checked."""
    try:
        return json.loads(path.read_text()) if path.suffix == ".json" else open_parquet(path).read()
    except (FileNotFoundError, InputError):
        if path.exists():
            raise
        raise StepkitError(f"{path}: a committed part disappeared while the shard was gathered; run the same "
                           "command again (committed chunks are kept, missing ones redone)") from None


def _blank_error_rows(stage: Stage, out_rows: list[dict]) -> None:
    """Null the stage's own declared columns (:attr:`Stage.columns`, but :attr:`Stage.keep_on_error`) on
    every row with an ``error``: a row the stage could not label, or one that failed upstream, carries
    none of its labels, whatever the stage left in them."""
    own = [c.name for c in stage.columns if c.name not in stage.keep_on_error]
    for r in out_rows:
        if r.get("error"):
            for name in own:
                r[name] = None


def _attribute_errors(stage: Stage, before: list, out_rows: list[dict]) -> tuple[int, int, dict[str, int]]:
    """Count each :class:`RowError` as this stage's: ``(own errors, upstream errors, own errors by reason)``.

    ``before`` holds the input rows' ``error`` values, taken before :meth:`Stage.process` ran.

    Raises:
        StepkitError: a plain string in ``error`` that no input row had (an internal error: stage
            errors must be ``RowError`` so they are counted).
    """
    own = upstream = 0
    reasons: dict[str, int] = {}
    known = set(before) - {None}
    for k, r in enumerate(out_rows):
        err = r.get("error")
        if isinstance(err, RowError):
            r["error"] = str(err)
            own += 1
            reasons[error_reason(r["error"])] = reasons.get(error_reason(r["error"]), 0) + 1
        elif err:
            upstream += 1
            if (before[k] if stage.one_to_one else (err if err in known else None)) != err:
                raise StepkitError(f"{stage.name}: internal error, row {k} got a plain-string error; "
                                   "a stage marks its errors with RowError")
    return own, upstream, reasons


def run_shard(stage: Stage, plan: ShardPlan, opts: RunOptions, console=None,
              open_stage: bool | Callable[[], None] = False, report=None) -> ShardResult:
    """Run one planned shard to its finished output (resuming from committed parts), under a lock.

    The stage must be open, or ``open_stage`` opens it once the lock is held (so a second run of the
    same OUT is refused before it loads a model): ``True`` calls ``stage.open()``; a callable is called
    instead (an executor that keeps one stage open for many shards opens it on the first only). A stage
    opened here (``True``) is closed again if the shard fails, before the lock is released (the caller
    closes it after a shard that returned). ``report(rows, tokens)``, when given, is called with the
    shard's rows done so far (committed chunks included) and the tokens of this run, once the committed
    chunks are counted and after each commit (a distributed executor's progress view).

    Raises:
        ConfigError: another run holds the lock on OUT or a side output.
        InputError: bad input found while a chunk is read (a parts folder with nothing committed is removed).
        StepkitError: the shard's error rate exceeds ``max_error_rate`` (committed parts are kept), its
            parts keep disappearing, or a part or OUT cannot be written (a full disk; one line naming the file).
        Interrupted: Ctrl-C or SIGTERM; the stage is closed (its engine's processes shut down) when it was
            opened here, the lock is released and committed chunks are kept (a rerun redoes at most the
            chunk that was in flight).
    """
    with contextlib.ExitStack() as locks:  # OUT and every side output: two runs never share a file
        for path in sorted({plan.output, *plan.side_outputs.values()}):
            locks.enter_context(_OutputLock(path))
        try:
            if callable(open_stage):
                open_stage()
            elif open_stage:
                stage.open()
            return _explained_run_shard(stage, plan, opts, console, report or (lambda rows, tokens: None))
        except BaseException:  # the executor closes only a stage whose first shard returned: the one opened here
            if open_stage is True:  # is closed here, with the lock still held (the engine's processes go first);
                stage.close()       # an executor's own opener (a callable) keeps the stage for its next shards
            raise


def _explained_run_shard(stage: Stage, plan: ShardPlan, opts: RunOptions, console, report) -> ShardResult:
    """:func:`_run_shard`; bad input found mid-run leaves no empty parts folder, and Ctrl-C/SIGTERM become
    :class:`Interrupted` with the line saying what was kept."""
    parts = _parts_dir(plan.output)
    try:
        return _run_shard(stage, plan, opts, console, report)
    except InputError:  # bad input found mid-run (damaged pages of a column planning does not read)
        if not any(parts.glob("part-*.parquet")):  # nothing committed: leave no parts folder behind
            shutil.rmtree(parts, ignore_errors=True)
        raise
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM through the CLI: the chunk in flight is lost
        signum = getattr(e, "signum", signal.SIGINT)
        kept = len(list(parts.glob("part-*.parquet")))
        with contextlib.suppress(StepkitError):
            _log(parts, event="interrupted", signal=signal.Signals(signum).name, committed=kept)
        raise Interrupted(signum, f"{plan.output}: stopped by {signal.Signals(signum).name}; {kept} committed "
                                  f"chunk(s) kept in {parts}: run the same command again to resume") from None


def _commit_chunk(parts: Path, i: int, main: pa.Table, tables: dict[str, pa.Table], meta: dict[str, Any]) -> None:
    """Commit chunk ``i``: side tables first, then the counters file with every file's sha256, then the
    rows part, renamed into place last (its existence is what marks the chunk committed).

    Raises:
        StepkitError: a file cannot be written (a full disk); one line naming it. Earlier chunks are intact.
    """
    sums = {}
    for name, table in tables.items():
        path = _part(parts, i, name)
        with _writing(path, parts):
            write_table(path, table)
        sums[name] = file_sha256(path)
    final = _part(parts, i)
    staged = parts / f".{final.name}.staged-{os.getpid()}"
    with _writing(final, parts):
        try:
            write_table(staged, main)
            sums["part"] = file_sha256(staged)
            write_json(_part(parts, i, suffix="json"), {**meta, "sha256": sums})
            os.replace(staged, final)
        except BaseException:
            staged.unlink(missing_ok=True)
            raise


def _run_shard(stage: Stage, plan: ShardPlan, opts: RunOptions, console, report) -> ShardResult:
    shard, out, ident = plan.input, plan.output, plan.identity
    chunk_size, n_rows = ident["chunk_size"], plan.rows
    parts = _parts_dir(out)
    if opts.force:  # start over: discard partial output of any configuration; a finished OUT (and its
        shutil.rmtree(parts, ignore_errors=True)  # side outputs) stays until the new one replaces it atomically
    else:  # the plan was checked before the model loaded; check again under the lock
        _check_existing(plan, False)
        if plan.status == "up to date":  # another run finished it meanwhile
            return ShardResult(shard, out, "up to date", rows=plan.done_rows)
    _ensure_parts(parts, ident)

    out_schema = with_error_column(stage.output_schema(plan.schema))  # every stage's output has `error`
    side_schemas = {name: out_schema if s.schema is None else s.schema for name, s in stage.side_outputs().items()}
    side_tables = _load_side_tables(stage, plan)
    bounds = plan.chunks  # decided by plan_run (whole group_by runs per chunk)
    n_chunks = len(bounds)
    committed = _intact_chunks(parts, n_chunks, side_schemas, _warn)  # damaged parts are redone, never reused
    resumed = set(committed)  # committed by an earlier run and not redone in this one
    result = ShardResult(shard, out, "done", chunks=n_chunks, resumed_chunks=len(committed))
    _log(parts, event="start", committed=sorted(committed), chunks=n_chunks)

    t0 = time.time()
    tokens0 = stage.tokens_generated()
    with _Progress(opts.progress, console, f"{stage.name} {shard.name}", n_rows) as bar:
        done_rows = sum(bounds[i][1] - bounds[i][0] for i in committed)
        bar.advance(done_rows, 0)
        report(done_rows, 0)
        for i, rows in _uncommitted_chunks(shard, bounds, parts, side_schemas, committed, resumed):
            _log(parts, event="chunk_start", chunk=i)
            for name, (side, table) in side_tables.items():
                col = side.on or side.key
                for r in rows:
                    r[f"_{name}"] = table.get(r.get(col))
            before = [r.get("error") for r in rows]
            out_rows, counters, *side = stage.process(rows)
            side_rows = side[0] if side else {}
            if stage.one_to_one and len(out_rows) != len(rows):
                raise StepkitError(f"{stage.name}: internal error, chunk {i} returned {len(out_rows)} rows for {len(rows)}")
            if stage.one_to_one:
                out_rows = _in_input_order(stage, i, rows, out_rows)
            unknown = set(side_rows) - set(side_schemas)
            if unknown:
                raise StepkitError(f"{stage.name}: internal error, rows for undeclared side output(s) {sorted(unknown)}")
            _blank_error_rows(stage, out_rows)
            own, upstream, own_reasons = _attribute_errors(stage, before, out_rows)
            counters = {**counters, "errors": own, "upstream_errors": upstream}
            tables = {name: _stage_table(stage, side_rows.get(name, []), schema, f"its {name} output")
                      for name, schema in side_schemas.items()}
            main = _stage_table(stage, out_rows, out_schema, "its output")
            # Side tables and counters first, rows last: the main part's .parquet marks the chunk committed.
            _ensure_parts(parts, ident)  # (deleted meanwhile? then run.json comes back with the part)
            _commit_chunk(parts, i, main, tables, {"rows": len(out_rows), "counters": counters,
                                                   "error_reasons": own_reasons})
            _log(parts, event="chunk_commit", chunk=i, rows=len(out_rows))
            bar.advance(len(rows), stage.tokens_generated() - tokens0)
            done_rows += len(rows)
            report(done_rows, stage.tokens_generated() - tokens0)
    result.seconds, result.resumed_chunks = time.time() - t0, len(resumed)
    result.tokens = stage.tokens_generated() - tokens0

    # Totals over all parts, including those committed by an earlier (killed) run.
    totals: dict[str, int] = {}
    reasons: dict[str, int] = {}  # this stage's errors only; upstream ones are counted in upstream_errors
    tables = []
    for i in range(n_chunks):
        meta = _read_part(_part(parts, i, suffix="json"))
        for k, v in meta["counters"].items():
            totals[k] = totals.get(k, 0) + v
        for k, v in meta.get("error_reasons", {}).items():
            reasons[k] = reasons.get(k, 0) + v
        tables.append(_read_part(_part(parts, i)))
    table = pa.concat_tables(tables) if tables else rows_to_table([], out_schema)
    result.rows, result.errors, result.counters = table.num_rows, totals.get("errors", 0), totals
    if result.rows and result.errors / result.rows > opts.max_error_rate:
        raise StepkitError(f"{shard}: {result.errors} of {result.rows} rows failed "
                           f"({', '.join(f'{k}: {v}' for k, v in reasons.items())}), above --max-error-rate "
                           f"{opts.max_error_rate}; committed parts kept in {parts}")
    manifest = {
        "stage": stage.name,
        "stepkit_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "identity": {k: v for k, v in ident.items() if k != "config"},
        "config": ident["config"],
        "provenance": stage.provenance(),
        "input": {"path": str(shard), "sha256": ident["input_sha256"], "rows": n_rows,
                  "manifest": read_manifest(shard)},
        "output": {"path": str(out), "rows": result.rows},
        "counts": {"rows": result.rows, **totals, "error_reasons": reasons},
        "run": {"chunk_size": chunk_size, "chunks": n_chunks, "resumed_chunks": result.resumed_chunks,
                "chunks_this_run": n_chunks - result.resumed_chunks,
                "seconds_this_run": round(result.seconds, 2), "tokens_this_run": result.tokens,
                "rank": opts.rank, "world_size": opts.world_size},
    }
    if plan.side_inputs:
        manifest["side_inputs"] = {name: [str(p) for p in paths] for name, paths in plan.side_inputs.items()}
    if side_schemas:  # side outputs first: OUT appearing is what marks the shard finished
        manifest["side_outputs"] = {}
        for name, schema in side_schemas.items():
            parts_of = [_read_part(_part(parts, i, name)) for i in range(n_chunks)]
            side_table = pa.concat_tables(parts_of) if parts_of else rows_to_table([], schema)
            path = plan.side_outputs[name]
            side_manifest = {**manifest, "side_output": name, "side_output_of": str(out),
                             "output": {"path": str(path), "rows": side_table.num_rows}}
            with _writing(path, parts):
                write_json(manifest_path(path), side_manifest)
                write_table(path, side_table, metadata=side_manifest)
            manifest["side_outputs"][name] = {"path": str(path), "rows": side_table.num_rows}
    # The manifest beside OUT first, OUT last: OUT appearing (atomically) is what marks the shard finished,
    # and a kill between the two leaves the parts to finish from.
    with _writing(out, parts):
        write_json(manifest_path(out), manifest)
        write_table(out, table, metadata=manifest)
    shutil.rmtree(parts, ignore_errors=True)
    return result


def _in_input_order(stage: Stage, chunk: int, rows: list[dict], out_rows: list[dict]) -> list[dict]:
    """A one-to-one stage's output rows matched to its input rows by ``id``, never by position (a stage that
    gathers results as they finish may return them in another order). Rows without unique ids keep the
    stage's order.

    Raises:
        StepkitError: an output row whose id is missing, unknown or repeated (an internal error)."""
    ids = [r.get("id") for r in rows]
    if None in ids or len(set(ids)) != len(ids):
        return out_rows
    return match_by_id(ids, out_rows, lambda r: r.get("id"), f"{stage.name}: internal error, chunk {chunk}: output row")


def _stage_table(stage: Stage, rows: list[dict], schema: pa.Schema, what: str) -> pa.Table:
    """Rows the stage produced as a table; a value that does not fit is the stage's bug, not bad input."""
    try:
        return rows_to_table(rows, schema)
    except InputError as e:
        raise StepkitError(f"{stage.name}: internal error, {what} does not fit its schema "
                           f"({str(e).removeprefix('<rows>: ')})") from None


def _load_side_tables(stage: Stage, plan: ShardPlan) -> dict[str, tuple[SideInput, dict]]:
    sides = stage.side_inputs()
    return {name: (side, _load_side_input(name, side)[1]) for name, side in sides.items()}


class _Progress:
    """A rich progress bar with rows, generated tokens and tokens/s (silent when disabled)."""

    def __init__(self, enabled, console, label, total):
        self.enabled, self.console, self.label, self.total = enabled, console, label, total
        self.t0 = time.time()

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TextColumn("rows"), TextColumn("{task.fields[tok]}"), TimeElapsedColumn(),
                              console=self.console, transient=False)
            self.p.__enter__()
            self.task = self.p.add_task(self.label, total=self.total, tok="")
        return self

    def advance(self, rows, tokens):
        if self.enabled:
            dt = max(time.time() - self.t0, 1e-6)
            self.p.update(self.task, advance=rows, tok=f"{tokens} tok, {tokens / dt:.0f} tok/s" if tokens else "")

    def __exit__(self, *exc):
        if self.enabled:
            self.p.__exit__(*exc)
