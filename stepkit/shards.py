"""Reading and writing Parquet shards: explicit schemas, batched reads, atomic writes, manifests.

* Reads go through ``ParquetFile.iter_batches`` so a large shard never becomes one chunked array
  (case ``parquet-nested-string-chunked-read``).
* Writes use one explicit schema and cap each row group by bytes (``ROW_GROUP_BYTES``), then appear
  atomically: written to ``<name>.tmp-<pid>`` and renamed.
* Every finished shard has a manifest beside it, ``<stem>.manifest.json``, also stored in the Parquet
  file's key-value metadata under ``b"stepkit"``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from stepkit.errors import ConfigError, InputError, StepkitError, parse_failure

ROW_GROUP_BYTES = 64 * 1024 * 1024
"""Upper bound on the uncompressed bytes of one row group (a row group holds at least one row)."""


def resolve_path(path: str | os.PathLike) -> Path:
    """``Path(path).resolve()``, with a symlink loop as one clear :class:`InputError` (pathlib raises
    ``RuntimeError`` or ``OSError`` for it)."""
    p = Path(path)
    try:
        return p.resolve()
    except (RuntimeError, OSError) as e:
        if isinstance(e, OSError) and e.errno not in (errno.ELOOP, None):
            raise InputError(p, f"cannot be resolved ({e.strerror or e})") from None
        raise InputError(p, "is a symlink loop (a link that points back to itself)") from None


_WARNED_UNFINISHED: set[Path] = set()


def unfinished_runs(folder: Path) -> list[Path]:
    """The ``*.parquet.parts`` folders in ``folder`` whose shard is not there: runs that have not finished
    (a killed or crashed rank), whose rows are missing from the folder."""
    return sorted(x for x in folder.glob("*.parquet.parts") if x.is_dir() and not x.with_suffix("").is_file())


def list_shards(path: str | os.PathLike) -> list[Path]:
    """The Parquet files named by ``path``: the file itself, or the sorted ``*.parquet`` of a folder.

    A folder that also holds an unfinished run (:func:`unfinished_runs`) gets one ``warning:`` line on stderr
    naming it, once per process: its rows are not in the folder yet, so whatever reads it sees part of the data.

    Raises:
        InputError: the path does not exist (or is a symlink loop or a broken link), a folder holds
            no ``.parquet`` file, or it is an unfinished run's parts folder.
    """
    p = Path(path)
    if p.is_dir() and p.name.endswith(".parquet.parts") and (p / "run.json").is_file():
        # (breaking run D6: its committed chunks were read as if they were a finished shard)
        raise InputError(p, f"is the parts folder of a run of {p.name[:-len('.parts')]} that has not finished: "
                            "its committed chunks are part of the rows; rerun the stopped command first")
    if p.is_dir():
        shards = sorted(x for x in p.glob("*.parquet") if x.is_file())
        unfinished = unfinished_runs(p)
        if not shards:
            raise InputError(p, "folder holds no .parquet shards" + (
                f" (only the unfinished run {unfinished[0].name}: finish it first)" if unfinished else ""))
        if unfinished and resolve_path(p) not in _WARNED_UNFINISHED:
            _WARNED_UNFINISHED.add(resolve_path(p))
            names = ", ".join(x.name for x in unfinished[:3]) + (f", … ({len(unfinished)})" if len(unfinished) > 3 else "")
            print(f"warning: {p}: {len(unfinished)} run(s) not finished ({names}); their rows are not in the "
                  f"folder, so only {len(shards)} finished shard(s) are read: rerun the stopped command first",
                  file=sys.stderr)
        return shards
    if not p.exists():
        if p.is_symlink():
            resolve_path(p)  # a loop raises here
            raise InputError(p, f"is a broken symlink (to {os.readlink(p)}, which does not exist)")
        raise InputError(p, "no such file or folder")
    return [p]


def select_shards(shards: list[Path], rank: int, world_size: int) -> list[Path]:
    """``sorted(shards)[rank::world_size]``: N machines split a folder with no coordinator."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"need 0 <= rank < world-size, got --rank {rank} --world-size {world_size}")
    return sorted(shards)[rank::world_size]


def output_path(shard: Path, in_path: Path, out: Path) -> Path:
    """Where the output of ``shard`` goes. A folder input maps to ``out/<shard name>``; a file input
    maps to ``out`` itself when it ends in ``.parquet``, else to ``out/<shard name>``."""
    if Path(in_path).is_dir() or Path(out).suffix != ".parquet":
        return Path(out) / shard.name
    return Path(out)


def manifest_path(shard: Path) -> Path:
    """``x/traj.parquet`` -> ``x/traj.manifest.json``."""
    return shard.with_name(shard.stem + ".manifest.json")


def open_parquet(path: Path) -> pq.ParquetFile:
    """Open a Parquet file, turning any read failure into one clear :class:`InputError`."""
    try:
        return pq.ParquetFile(path)
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except (pa.ArrowException, OSError, ValueError) as e:  # (a damaged footer: column names not UTF-8, ...)
        raise InputError(path, f"not a readable Parquet file ({parse_failure(e)})") from None


def iter_row_chunks(path: Path, chunk_size: int, columns: list[str] | None = None
                    ) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Yield ``(first_row_index, rows)`` with exactly ``chunk_size`` rows per chunk (the last may be
    shorter), reading record batches so memory stays bounded by a chunk."""
    pf = open_parquet(path)
    buf: list[dict[str, Any]] = []
    start = 0
    batches = pf.iter_batches(batch_size=max(1, min(chunk_size, 1024)), columns=columns)
    while True:
        try:
            batch = next(batches)
            buf.extend(batch.to_pylist())
        except StopIteration:
            break
        except (pa.ArrowException, OSError, ValueError) as e:  # corrupt data pages behind an intact footer,
            raise InputError(path, f"cannot read rows after row {start + len(buf)} "  # text that is not UTF-8
                                   f"({parse_failure(e)})") from None
        while len(buf) >= chunk_size:
            yield start, buf[:chunk_size]
            buf = buf[chunk_size:]
            start += chunk_size
    if buf:
        yield start, buf


def iter_record_batches(path: Path, batch_size: int, columns: list[str] | None = None
                        ) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Yield ``(first_row_index, batch)``: the file's record batches of at most ``batch_size`` rows, only
    ``columns`` (None: all), for code that computes on Arrow data without converting every row.

    Raises:
        InputError: the file or a data page cannot be read, naming the file and the row after which."""
    pf = open_parquet(path)
    start = 0
    batches = pf.iter_batches(batch_size=max(1, batch_size), columns=columns)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError, ValueError) as e:
            raise InputError(path, f"cannot read rows after row {start} ({parse_failure(e)})") from None
        yield start, batch
        start += batch.num_rows


def iter_row_ranges(path: Path, bounds: list[tuple[int, int]], columns: list[str] | None = None
                    ) -> Iterator[list[dict[str, Any]]]:
    """Yield the rows of each ``[start, end)`` range of ``bounds`` (consecutive, covering the file),
    reading record batches so memory stays bounded by a range."""
    ranges = iter(bounds)
    current = next(ranges, None)
    buf: list[dict[str, Any]] = []
    pos = 0  # file row index of buf[0]
    for _, rows in iter_row_chunks(path, 1024, columns):
        buf.extend(rows)
        while current is not None and pos + len(buf) >= current[1]:
            take = current[1] - pos
            yield buf[:take]
            buf, pos = buf[take:], current[1]
            current = next(ranges, None)
    if current is not None and buf:
        yield buf


def read_rows(path: Path, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """All rows of one shard as dicts (for small shards, stats and tests)."""
    return [r for _, rows in iter_row_chunks(path, 4096, columns) for r in rows]


def read_manifest(shard: Path) -> dict[str, Any] | None:
    """The manifest of a finished shard: the ``<stem>.manifest.json`` beside it, else the copy in the
    Parquet file's key-value metadata; None if it has neither or they cannot be read."""
    mp = manifest_path(shard)
    try:
        doc = json.loads(mp.read_text())
    except (OSError, ValueError):
        doc = None
        try:
            meta = pq.read_schema(shard).metadata or {}
            doc = json.loads(meta[b"stepkit"]) if b"stepkit" in meta else None
        except (OSError, ValueError, pa.ArrowException):
            pass
    return doc if isinstance(doc, dict) else None


def _row_groups(table: pa.Table, max_bytes: int) -> Iterator[pa.Table]:
    n = table.num_rows
    if n == 0:  # no row group at all: a 0-row group is refused by some readers (datasets' batch size)
        return
    per_row = max(1, table.nbytes // n)
    step = max(1, max_bytes // per_row)
    start = 0
    while start < n:
        piece = table.slice(start, step)
        # Rows can be uneven: halve until the piece fits (one row always goes through).
        while piece.num_rows > 1 and piece.nbytes > max_bytes:
            piece = piece.slice(0, piece.num_rows // 2)
        yield piece
        start += piece.num_rows


def write_table(path: Path, table: pa.Table, metadata: dict[str, Any] | None = None,
                row_group_bytes: int = ROW_GROUP_BYTES) -> None:
    """Write ``table`` to ``path`` atomically, row groups capped at ``row_group_bytes``.

    ``metadata`` is stored as JSON under the key ``stepkit`` of the file's key-value metadata.

    Raises:
        OSError: the file cannot be written (a full disk: ``ENOSPC``); the temporary file is removed and
            ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = table.schema
    if metadata is not None:
        schema = schema.with_metadata({**(schema.metadata or {}), b"stepkit": json.dumps(metadata).encode()})
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with pq.ParquetWriter(tmp, schema) as w:
            for piece in _row_groups(table.replace_schema_metadata(schema.metadata), row_group_bytes):
                w.write_table(piece)
        os.replace(tmp, path)
    except BaseException:  # a full disk or a signal mid-write: leave no half-written temp file behind
        tmp.unlink(missing_ok=True)
        raise


WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO})
"""The errno of an OSError that means "this file cannot be written here": a full disk, a quota, a read-only
or forbidden folder, a file too big, an I/O error."""


def os_reason(e: OSError) -> str:
    """``No space left on device`` for an OSError from Python or pyarrow (whose ``strerror`` may be unset)."""
    if e.errno:
        return os.strerror(e.errno)
    return (str(e).splitlines() or [type(e).__name__])[0]


def write_error_in(e: BaseException) -> OSError | None:
    """The write failure (an OSError with an errno of :data:`WRITE_ERRNOS`) that ``e`` is or was raised
    from, following ``__cause__`` / ``__context__``: ``datasets`` wraps a full disk in its cache in a
    ``DatasetGenerationError``, which must not be read as bad data. None when there is none."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in WRITE_ERRNOS:
            return e
        e = e.__cause__ or e.__context__
    return None


class Writing(contextlib.AbstractContextManager):
    """A block that writes files: an OSError in it (a full disk, a quota, a read-only folder; also one that
    a library wrapped, :func:`write_error_in`) becomes one :class:`StepkitError` line
    ``STAGE: cannot write PATH: REASON``, e.g. ``export: cannot write ds/data/train-00000.parquet: No space left
    on device``.

    PATH is the file the error names, else ``target`` (the file the block says it is writing), else
    ``fallback``. A path inside the staging folder ``temp`` is shown at its place in ``final`` (what the user
    named), its temporary name (``.x.tmp-<pid>``) as the file's own name. The caller removes what it staged
    (this only words the failure)."""

    def __init__(self, stage: str, fallback: Path, temp: Path | None = None, final: Path | None = None):
        self.stage, self.fallback, self.temp, self.final = stage, Path(fallback), temp, final
        self.target: Path | None = None

    def shown(self, path: str | os.PathLike) -> Path:
        """``path`` as the user knows it: inside ``final`` rather than the staging folder, without the
        temporary name's dot and ``.tmp-<pid>``."""
        p = Path(path)
        if self.temp is not None and self.final is not None and p.is_relative_to(self.temp):
            p = self.final / p.relative_to(self.temp)
        name = re.sub(r"^\.(.+)\.tmp-\d+$", r"\1", p.name)
        return p.with_name(name) if name else p

    def __exit__(self, typ, e, tb):
        if e is None or isinstance(e, StepkitError) or not isinstance(e, Exception):
            return None
        oe = e if isinstance(e, OSError) else write_error_in(e)
        if oe is None:
            return None
        where = oe.filename if isinstance(oe.filename, (str, os.PathLike)) and str(oe.filename) else None
        path = self.shown(where or self.target or self.fallback)
        raise StepkitError(f"{self.stage}: cannot write {path}: {os_reason(oe)}") from None


def rows_to_table(rows: list[dict[str, Any]], schema: pa.Schema, path: Path | str = "<rows>") -> pa.Table:
    """Build a table with the explicit ``schema`` (never inferred); unknown keys are dropped.

    Raises:
        InputError: a value does not fit its column's type, naming ``path``, the row and the column.
    """
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        for field in schema:
            for i, row in enumerate(rows):
                try:
                    pa.array([row.get(field.name)], type=field.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                    raise InputError(path, f"{row.get(field.name)!r:.60} does not fit type {field.type}",
                                     row=i, column=field.name) from None
        raise InputError(path, f"cannot build the table ({str(e).splitlines()[0]})") from None


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write JSON atomically (temp file + rename).

    Raises:
        OSError: the file cannot be written; the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_shard(path: Path, rows: list[dict[str, Any]], schema: pa.Schema, manifest: dict[str, Any],
                source: Path | str = "<rows>") -> None:
    """Write a complete shard and its manifest (used by stages that need no chunked resume, e.g. ingest).

    ``source`` names the input file in errors about values that do not fit the schema."""
    table = rows_to_table(rows, schema, source)
    manifest = {**manifest, "output": {"path": str(path), "rows": table.num_rows}}
    write_table(path, table, metadata=manifest)
    write_json(manifest_path(path), manifest)


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes (the input hash recorded in manifests)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def config_hash(doc: Any) -> str:
    """Short stable hash of a JSON-able document (configuration identity, prompt-template hash)."""
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_diff(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """The leaves that differ between two config documents, as ``(dotted key, old, new)``."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in config_diff(a.get(k), b.get(k), f"{path}.{k}" if path else k)]
    return [] if a == b else [(path, a, b)]


def run_settings(manifest: dict[str, Any]) -> dict[str, Any]:
    """The settings a shard was made with, by stage down its lineage (its own stage, then its input's
    manifest, ...): each runner stage's config, chunk size, side outputs and side-input hashes.

    Facts that differ per shard by design (input hash, paths, counts, timings, rank) are left out, and
    so are stages without a runner identity (ingest: one shard per source file or slice). A stage that
    occurs twice in the lineage is keyed ``stage#2``."""
    doc: dict[str, Any] = {}
    m, depth = manifest, 0
    while isinstance(m, dict) and depth < 100:
        ident = m.get("identity")
        if isinstance(ident, dict) and "config_hash" in ident:
            stage = str(m.get("stage"))
            key = stage if stage not in doc else f"{stage}#{sum(k.split('#')[0] == stage for k in doc) + 1}"
            doc[key] = {"config": m.get("config"), "chunk_size": ident.get("chunk_size"),
                        **{k: ident[k] for k in ("side_outputs", "side_inputs_sha256") if k in ident}}
        m, depth = (m.get("input") or {}).get("manifest"), depth + 1
    return doc


def mixed_configuration(shards: list[Path]) -> str | None:
    """None when the shards of a folder were all made with the same settings (:func:`run_settings`),
    else one line naming two shards that differ and the first setting where they do.

    Every shard's ``identity.config_hash`` differs (it covers the shard's own input hash), so the
    settings are compared, not the hashes. Shards without a runner manifest are not compared."""
    first: tuple[Path, dict] | None = None
    for p in shards:
        doc = run_settings(read_manifest(p) or {})
        if not doc:
            continue
        if first is None:
            first = (p, doc)
            continue
        diffs = config_diff(first[1], doc)
        if diffs:
            key, a, b = diffs[0]
            more = f"; {len(diffs) - 1} more setting(s) differ" if len(diffs) > 1 else ""
            return (f"{first[0].name} and {p.name} were made with different settings ({key}: {a!r:.60} vs "
                    f"{b!r:.60}{more}), so figures over this folder mix configurations")
    return None


def remove_stale(path: Path, kind: str) -> None:
    """Remove the ``.<name>.<kind>-<pid>`` temporary folders beside ``path`` that a killed run left (their
    pid is gone); ``export`` stages a dataset folder in one, ``publish`` its upload."""
    name = re.sub(r"([*?\[])", r"[\1]", path.name)  # glob-escaped
    for p in path.parent.glob(f".{name}.{kind}-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                shutil.rmtree(p, ignore_errors=True)
            except PermissionError:
                pass
