"""The parts folder of a run, ``<out>.parts``: the output lock, committed chunks (a part file, its
counters and their checksums), damage checks and atomic writes. The only module that writes there."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from stepkit.errors import ConfigError, InputError, StepkitError, one_line
from stepkit.shards import (
    file_sha256,
    iter_row_ranges,
    open_parquet,
    os_reason,
    write_json,
    write_table,
)


class OutputLock:
    """An exclusive lock on one output, so two runs never write the same OUT at once.

    The lock file holds the holder's pid. It is opened without truncating, so a run that is refused
    leaves the holder's pid in place (and names it)."""

    def __init__(self, out: Path):
        self.out, self.path = Path(out), Path(out).with_name(f".{Path(out).name}.lock")

    def __enter__(self):
        import fcntl

        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise ConfigError(f"{self.out}: cannot write in {self.path.parent} ({os_reason(e)})") from None
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


@contextlib.contextmanager
def _writing(path: Path, parts: Path):
    """Turn an OSError while ``path`` is written (a full disk, a quota, a read-only folder) into one
    :class:`StepkitError` line naming the file; what was committed before stays in ``parts``."""
    try:
        yield
    except OSError as e:
        raise StepkitError(f"{path}: cannot write it ({os_reason(e)}); the chunks committed so far are kept in "
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
    so redone. Chunks redone leave ``resumed``. A third pass is refused: something keeps deleting the parts.
    A None ends each pass (a barrier): the caller finishes (commits) every chunk it holds before asking for
    more, since the next pass is planned from the parts committed by then."""
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
        yield None
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

