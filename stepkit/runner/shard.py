"""Running one planned shard: its chunks through the stage, row errors attributed and counted, each chunk
committed, the gather into ``<out>`` (and side outputs) with its manifest, the progress bar."""

from __future__ import annotations

import contextlib
import shutil
import signal
import time
from collections.abc import Callable

import pyarrow as pa

from stepkit import __version__
from stepkit.errors import InputError, Interrupted, RowError, StepkitError
from stepkit.matching import match_by_id
from stepkit.runner.options import RunOptions
from stepkit.runner.parts import (
    OutputLock,
    _commit_chunk,
    _ensure_parts,
    _intact_chunks,
    _log,
    _part,
    _parts_dir,
    _read_part,
    _uncommitted_chunks,
    _warn,
    _writing,
)
from stepkit.runner.plan import ShardPlan, ShardResult, _check_existing, _load_side_input
from stepkit.runner.window import default_window, run_chunks
from stepkit.schema import (
    error_reason,
    with_error_column,
)
from stepkit.shards import (
    manifest_path,
    read_manifest,
    resolve_path,
    rows_to_table,
    write_json,
    write_table,
)
from stepkit.stage import SideInput, Stage


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
            chunks that were in flight: one, or ``opts.chunks_in_flight`` for an asynchronous stage, by default
            :func:`~stepkit.runner.window.default_window`).
    """
    with contextlib.ExitStack() as locks:  # OUT and every side output: two runs never share a file
        for path in sorted({plan.output, *plan.side_outputs.values()}):
            locks.enter_context(OutputLock(path))
        try:
            load_seconds = _open_with_status(stage, open_stage, opts.progress, console)
            result = _explained_run_shard(stage, plan, opts, console, report or (lambda rows, tokens: None),
                                          load_seconds)
            result.load_seconds = load_seconds
            return result
        except BaseException:  # the executor closes only a stage whose first shard returned: the one opened here
            if open_stage is True:  # is closed here, with the lock still held (the engine's processes go first);
                stage.close()       # an executor's own opener (a callable) keeps the stage for its next shards
            raise


def _open_with_status(stage: Stage, open_stage: bool | Callable[[], None], progress: bool, console) -> float:
    """Open the stage as ``open_stage`` says, with a spinner naming what loads (``stage.loading()``) while
    it does when ``progress`` is on; return the seconds it took (0.0 when nothing was opened)."""
    if not open_stage:
        return 0.0
    t0 = time.time()
    what = stage.loading()
    with contextlib.ExitStack() as status:
        if progress and what:
            from stepkit.console import make_console

            status.enter_context((console or make_console(stderr=True)).status(f"{stage.name}: loading {what}"))
        open_stage() if callable(open_stage) else stage.open()
    return time.time() - t0


def _explained_run_shard(stage: Stage, plan: ShardPlan, opts: RunOptions, console, report,
                         load_seconds: float = 0.0) -> ShardResult:
    """:func:`_run_shard`; bad input found mid-run leaves no empty parts folder, and Ctrl-C/SIGTERM become
    :class:`Interrupted` with the line saying what was kept."""
    parts = _parts_dir(plan.output)
    try:
        return _run_shard(stage, plan, opts, console, report, load_seconds)
    except InputError:  # bad input found mid-run (damaged pages of a column planning does not read)
        if not any(parts.glob("part-*.parquet")):  # nothing committed: leave no parts folder behind
            shutil.rmtree(parts, ignore_errors=True)
        raise
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM through the CLI: the chunks in flight are lost
        signum = getattr(e, "signum", signal.SIGINT)
        kept = len(list(parts.glob("part-*.parquet")))
        with contextlib.suppress(StepkitError):
            _log(parts, event="interrupted", signal=signal.Signals(signum).name, committed=kept)
        raise Interrupted(signum, f"{plan.output}: stopped by {signal.Signals(signum).name}; {kept} committed "
                                  f"chunk(s) kept in {parts}: run the same command again to resume") from None


def _run_shard(stage: Stage, plan: ShardPlan, opts: RunOptions, console, report,
               load_seconds: float = 0.0) -> ShardResult:
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
        stage.start_shard(shard)
        progress = {"rows": done_rows}
        run_counts: dict[str, int] = {}  # this run's chunks of the shard, in commit order (Stage.refusal)

        def start(i: int, rows: list[dict]) -> list:
            _log(parts, event="chunk_start", chunk=i)
            for name, (side, table) in side_tables.items():
                col = side.on or side.key
                for r in rows:
                    r[f"_{name}"] = table.get(r.get(col))
            return [r.get("error") for r in rows]  # the input rows' errors, before the stage ran

        def finish(i: int, rows: list[dict], before: list, result: tuple) -> None:
            out_rows, counters, *side = result
            so_far = {k: run_counts.get(k, 0) + counters.get(k, 0) for k in {*run_counts, *counters}}
            if (refused := stage.refusal(so_far)) is not None:
                raise refused  # (this chunk and the ones after it are not committed)
            run_counts.update(so_far)
            counters = {k: v for k, v in counters.items() if not k.startswith("_")}
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
            progress["rows"] += len(rows)
            report(progress["rows"], stage.tokens_generated() - tokens0)

        # A stage on the asynchronous path keeps up to chunks_in_flight chunks running, committed in order.
        run_chunks(stage, _uncommitted_chunks(shard, bounds, parts, side_schemas, committed, resumed),
                   opts.chunks_in_flight or default_window(chunk_size), start, finish)
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
                "seconds_this_run": round(result.seconds, 2), "load_seconds": round(load_seconds, 2),
                "tokens_this_run": result.tokens,
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
            side_manifest = {**manifest, "side_output": name, "side_output_of": str(resolve_path(out)),
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

