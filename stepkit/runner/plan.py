"""Planning: what a run will do before any model loads. :func:`prepare_run` once per run (shards, side
inputs), :func:`plan_shard` per shard (columns, rows, writability, identity against finished or partial
output); :class:`ShardPlan` is what an executor gets, :class:`ShardResult` what it returns."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from stepkit.errors import ConfigError, InputError
from stepkit.runner.options import RunOptions
from stepkit.runner.parts import _parts_dir
from stepkit.schema import (
    check_column_types,
    check_columns,
    check_error_column,
)
from stepkit.shards import (
    config_diff,
    config_hash,
    file_sha256,
    iter_row_chunks,
    list_shards,
    manifest_path,
    open_parquet,
    output_path,
    read_manifest,
    resolve_path,
    select_shards,
)
from stepkit.stage import SideInput, Stage


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
    seconds: float = 0.0  # labelling: from the first chunk to the last commit (the model load apart)
    load_seconds: float = 0.0  # opening the stage (loading its model) for this shard; 0 when already open
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
        ConfigError: OUT is IN, or a folder IN has a file OUT (or a file side output).
    """
    in_path, out_path = Path(in_path), Path(out_path)
    chunk_size = opts.chunk_size or stage.default_chunk_size
    if in_path.is_dir() and out_path.suffix == ".parquet":
        raise ConfigError(f"{out_path}: IN {in_path} is a folder of shards, so OUT must be a folder too")
    for name, side in stage.side_outputs().items():  # (breaking run E20: it became a folder named *.parquet)
        if in_path.is_dir() and Path(side.path).suffix == ".parquet":
            raise ConfigError(f"{side.path}: IN {in_path} is a folder of shards, so the {name} output must be "
                              "a folder too")
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


def _side_output_of(side_manifest: dict, out: Path) -> bool:
    """Whether a side output's manifest says it belongs to ``out``: the path it records (absolute since
    it is written resolved; a relative one, from older runs, is read against the working folder) is
    ``out``'s, however either was typed (breaking run E9: the same command from another folder or with
    absolute paths was refused as if the side output were another run's)."""
    recorded = side_manifest.get("side_output_of")
    return recorded is not None and resolve_path(recorded) == resolve_path(out)


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
                if side is None or not _side_output_of(side, out) or \
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
        if p.exists() and (side is None or not _side_output_of(side, out)):
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

