"""The runner every stage shares: chunks, committed part files, resume, atomic output, manifest.

Contract (``../shared/design.md``, "Runner contract"):

* ``IN`` is a Parquet file or a folder of shards; ``--rank R --world-size W`` takes ``sorted(shards)[R::W]``.
* Each shard is processed in chunks of ``chunk_size`` rows. A finished chunk is committed as
  ``<out>.parts/part-00007.parquet`` (temp file + rename) with its counters in ``part-00007.json``.
  A killed run, started again with the same command, skips committed chunks and redoes at most the
  chunk that was in flight.
* When every chunk is committed, ``<out>`` is written atomically with the manifest beside it
  (``<stem>.manifest.json``) and in its Parquet metadata, and the parts folder is removed.
* The configuration identity (stage, input hash, the stage's config, chunk size) is stored in the
  parts folder and the manifest; a rerun with a different identity refuses unless ``force``.
  A rerun of a finished shard with the same identity does nothing.
* Per-row failures go in the ``error`` column; the shard fails only above ``max_error_rate``.

A stage is an object with ``name``, ``required_columns``, ``config()``, ``output_schema(schema)``,
``validate(rows, path, first_row)``, ``open()``, ``process(rows) -> (rows, counters)``,
``provenance()`` and ``close()`` (see :class:`Stage`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from stepkit import __version__
from stepkit.errors import ConfigError, StepkitError
from stepkit.schema import check_columns, check_steps, check_values, error_reason
from stepkit.shards import (config_hash, file_sha256, iter_row_chunks, list_shards, manifest_path,
                            open_parquet, output_path, read_manifest, rows_to_table, select_shards,
                            write_json, write_table)


class Stage:
    """Base class for a stage: pure logic over rows and an engine; I/O lives in the runner."""

    name = "stage"
    required_columns: tuple[str, ...] = ()
    default_chunk_size = 16
    one_to_one = True  # False for stages that emit several rows per input row (rollout)

    def config(self) -> dict[str, Any]:
        """Everything that changes the output, computable without loading a model."""
        return {}

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        """The explicit schema of the output rows (input columns plus the stage's own)."""
        return input_schema

    def check_schema(self, schema: pa.Schema, path: Path) -> None:
        """Raise :class:`stepkit.errors.InputError` when the input is the wrong kind of shard."""

    def validate(self, rows: list[dict], path: Path, first_row: int) -> None:
        """Raise :class:`stepkit.errors.InputError` for bad input rows (before any generation).

        ``rows`` hold the required columns, plus ``error`` when the shard has one (rows that already
        failed upstream pass through unlabelled and need not be valid)."""

    def open(self) -> None:
        """Load models; called once, only if some chunk has work to do."""

    def process(self, rows: list[dict]) -> tuple[list[dict], dict[str, int]]:
        """Return the output rows (same order and count) and this chunk's counters."""
        raise NotImplementedError

    def provenance(self) -> dict[str, Any]:
        """Extra manifest fields known after loading (engine and library versions)."""
        return {}

    def tokens_generated(self) -> int:
        """Tokens generated so far by this stage's engine (for the progress bar and summary)."""
        return 0

    def close(self) -> None:
        """Release what :meth:`open` loaded."""


class EngineStage(Stage):
    """A stage that samples with an engine and grades with an answer checker, both built lazily by
    ``open()`` from ``self.engine_factory`` and ``self.checker_factory`` (set by the subclass)."""

    engine = None
    checker = None
    checker_factory = None  # a stage that grades no answers (judge) leaves it unset

    def open(self) -> None:
        self.engine = self.engine_factory()
        self.checker = self.checker_factory() if self.checker_factory else None

    def close(self) -> None:
        for x in (self.checker, self.engine):
            if x is not None:
                x.close()

    def provenance(self) -> dict[str, Any]:
        return {"engine": self.engine.describe() if self.engine else None}

    def tokens_generated(self) -> int:
        return self.engine.stats.generated_tokens if self.engine else 0


class LabelerStage(EngineStage):
    """An engine stage that labels the steps of trajectory rows (mc-label, judge): each row needs a
    unique non-empty ``id``, a ``prompt`` and non-empty ``steps``; rows that failed upstream are skipped."""

    def validate(self, rows, path, first_row):
        if first_row == 0:
            self._seen_ids = set()
        check_values(rows, path, first_row, ("id", "prompt"), unique="id", seen=self._seen_ids)
        check_steps(rows, path, first_row)


@dataclass
class ShardResult:
    """What happened to one shard."""

    input: Path
    output: Path
    status: str  # "done", "up to date"
    rows: int = 0
    errors: int = 0
    chunks: int = 0
    resumed_chunks: int = 0
    seconds: float = 0.0
    tokens: int = 0
    counters: dict[str, int] = field(default_factory=dict)


def _identity(stage: Stage, input_hash: str, chunk_size: int) -> dict[str, Any]:
    cfg = stage.config()
    return {"stage": stage.name, "input_sha256": input_hash, "config": cfg, "chunk_size": chunk_size,
            "config_hash": config_hash([stage.name, input_hash, cfg, chunk_size])}


def _describe_change(old: dict, new: dict) -> str:
    if old.get("input_sha256") != new.get("input_sha256"):
        return "the input file changed"
    if old.get("chunk_size") != new.get("chunk_size"):
        return f"chunk size {old.get('chunk_size')} -> {new.get('chunk_size')}"
    a, b = old.get("config", {}), new.get("config", {})
    diffs = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return "changed: " + ", ".join(f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in diffs[:3]) if diffs else "configuration changed"


def run_stage(stage: Stage, in_path: str | os.PathLike, out_path: str | os.PathLike, *,
              chunk_size: int | None = None, force: bool = False, rank: int = 0, world_size: int = 1,
              max_error_rate: float = 0.05, progress: bool = True, console=None) -> list[ShardResult]:
    """Run ``stage`` over the shards of ``in_path`` (this rank's share) into ``out_path``.

    Returns one :class:`ShardResult` per shard handled by this rank.

    Raises:
        InputError: unreadable input, missing column, bad rows (before any generation).
        ConfigError: the configuration differs from a finished or partial run and ``force`` is off.
        StepkitError: the error rate of a shard exceeds ``max_error_rate`` (its parts are kept, so a
            rerun with a higher threshold finishes without generating again).
    """
    in_path, out_path = Path(in_path), Path(out_path)
    chunk_size = chunk_size or stage.default_chunk_size
    if in_path.is_dir() and out_path.suffix == ".parquet":
        raise ConfigError(f"{out_path}: IN {in_path} is a folder of shards, so OUT must be a folder too")
    if out_path.resolve() == in_path.resolve():
        raise ConfigError(f"{out_path}: OUT is the same as IN; write the output somewhere else")
    shards = select_shards(list_shards(in_path), rank, world_size)
    plans = []
    # Validate everything first: a bad row in the last shard must fail before any generation.
    for shard in shards:
        pf = open_parquet(shard)
        schema = pf.schema_arrow
        check_columns(schema, stage.required_columns, shard)
        stage.check_schema(schema, shard)
        columns = list(stage.required_columns) + (["error"] if "error" in schema.names else [])
        for first, rows in iter_row_chunks(shard, 1024, columns=columns or None):
            stage.validate(rows, shard, first)
        out = output_path(shard, in_path, out_path)
        _check_writable(out, shard)
        plans.append((shard, out, schema, pf.metadata.num_rows))

    results = []
    opened = False
    try:
        for shard, out, schema, n_rows in plans:
            ident = _identity(stage, file_sha256(shard), chunk_size)
            if out.exists() and not force:
                done = read_manifest(out)
                if done is None:
                    raise ConfigError(f"{out}: exists but has no readable stepkit manifest; use --force to replace it")
                if done.get("identity", {}).get("config_hash") == ident["config_hash"]:
                    results.append(ShardResult(shard, out, "up to date", rows=done.get("counts", {}).get("rows", 0)))
                    continue
                old = {**done.get("identity", {}), "config": done.get("config", {})}
                raise ConfigError(f"{out}: exists from a different configuration "
                                  f"({_describe_change(old, ident)}); use --force to redo it")
            if not opened:
                stage.open()
                opened = True
            with _OutputLock(out):
                results.append(_run_shard(stage, shard, out, schema, n_rows, ident, chunk_size, force,
                                          max_error_rate, progress, console, rank, world_size))
    finally:
        if opened:
            stage.close()
    return results


def _check_writable(out: Path, shard: Path) -> None:
    """Fail before any model is loaded when ``out`` cannot be written or would overwrite the input."""
    if out.resolve() == shard.resolve():
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
    """An exclusive lock on one output, so two runs never write the same OUT at once."""

    def __init__(self, out: Path):
        self.path = out.with_name(f".{out.name}.lock")

    def __enter__(self):
        import fcntl

        try:
            self.f = open(self.path, "w")
        except OSError as e:
            raise ConfigError(f"{self.path.parent}: cannot write there ({e.strerror or e})") from None
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.f.close()
            raise ConfigError(f"{self.path.name[1:-5]}: another stepkit run is writing this output "
                              f"(lock {self.path}); wait for it or stop it") from None
        self.f.write(str(os.getpid()))
        self.f.flush()
        return self

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)
        self.f.close()


def _parts_dir(out: Path) -> Path:
    return out.with_name(out.name + ".parts")


def _log(parts: Path, **event) -> None:
    with open(parts / "log.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "pid": os.getpid(), **event}) + "\n")


def _run_shard(stage, shard, out, in_schema, n_rows, ident, chunk_size, force, max_error_rate,
               progress, console, rank, world_size) -> ShardResult:
    parts = _parts_dir(out)
    run_file = parts / "run.json"
    if force:  # start over: discard partial and finished output of any configuration
        shutil.rmtree(parts, ignore_errors=True)
        out.unlink(missing_ok=True)
        manifest_path(out).unlink(missing_ok=True)
    elif parts.exists():
        old = json.loads(run_file.read_text()) if run_file.exists() else {}
        if old.get("config_hash") != ident["config_hash"]:
            raise ConfigError(f"{parts}: partial run from a different configuration "
                              f"({_describe_change(old, ident)}); use --force to discard it")
    parts.mkdir(parents=True, exist_ok=True)
    write_json(run_file, ident)

    out_schema = stage.output_schema(in_schema)
    n_chunks = (n_rows + chunk_size - 1) // chunk_size
    committed = {i for i in range(n_chunks) if (parts / f"part-{i:05d}.parquet").exists()}
    result = ShardResult(shard, out, "done", chunks=n_chunks, resumed_chunks=len(committed))
    _log(parts, event="start", committed=sorted(committed), chunks=n_chunks)

    t0 = time.time()
    tokens0 = stage.tokens_generated()
    with _Progress(progress, console, f"{stage.name} {shard.name}", n_rows) as bar:
        bar.advance(sum(min(chunk_size, n_rows - i * chunk_size) for i in committed), 0)
        for first, rows in iter_row_chunks(shard, chunk_size):
            i = first // chunk_size
            if i in committed:
                continue
            _log(parts, event="chunk_start", chunk=i)
            out_rows, counters = stage.process(rows)
            if stage.one_to_one and len(out_rows) != len(rows):
                raise StepkitError(f"{stage.name}: internal error, chunk {i} returned {len(out_rows)} rows for {len(rows)}")
            own = f"{stage.name}:"
            counters = {**counters, "errors": sum(1 for r in out_rows if (r.get("error") or "").startswith(own)),
                        "upstream_errors": sum(1 for r in out_rows if r.get("error") and not r["error"].startswith(own))}
            # Counters first, rows last: a part's .parquet existing is what marks the chunk committed.
            write_json(parts / f"part-{i:05d}.json", {"rows": len(out_rows), "counters": counters})
            write_table(parts / f"part-{i:05d}.parquet", rows_to_table(out_rows, out_schema))
            _log(parts, event="chunk_commit", chunk=i, rows=len(out_rows))
            bar.advance(len(rows), stage.tokens_generated() - tokens0)
    result.seconds = time.time() - t0
    result.tokens = stage.tokens_generated() - tokens0

    # Totals over all parts, including those committed by an earlier (killed) run.
    totals: dict[str, int] = {}
    reasons: dict[str, int] = {}
    tables = []
    for i in range(n_chunks):
        meta = json.loads((parts / f"part-{i:05d}.json").read_text())
        for k, v in meta["counters"].items():
            totals[k] = totals.get(k, 0) + v
        t = open_parquet(parts / f"part-{i:05d}.parquet").read()
        tables.append(t)
        for err in t.column("error").to_pylist() if "error" in t.column_names else []:
            if err:
                reasons[error_reason(err)] = reasons.get(error_reason(err), 0) + 1
    table = pa.concat_tables(tables) if tables else rows_to_table([], out_schema)
    result.rows, result.errors, result.counters = table.num_rows, totals.get("errors", 0), totals
    if result.rows and result.errors / result.rows > max_error_rate:
        raise StepkitError(f"{shard}: {result.errors} of {result.rows} rows failed "
                           f"({', '.join(f'{k}: {v}' for k, v in reasons.items())}), above --max-error-rate "
                           f"{max_error_rate}; committed parts kept in {parts}")
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
                "rank": rank, "world_size": world_size},
    }
    write_table(out, table, metadata=manifest)
    write_json(manifest_path(out), manifest)
    shutil.rmtree(parts)
    return result


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
