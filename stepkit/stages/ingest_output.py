"""What ``ingest`` may write: an OUT that overwrites no input and no foreign file, and rows every later stage
reads (ids present and unique, prompts not blank)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa

from stepkit.errors import InputError
from stepkit.shards import manifest_path, resolve_path


def _same_file(a: Path, b: Path) -> bool:
    if resolve_path(a) == resolve_path(b):  # (a symlink loop is one InputError)
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _written_by(out: Path) -> str | None:
    """The stage named in the stepkit manifest of the Parquet file ``out`` (its own metadata), else None."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(out).metadata or {}
        doc = json.loads(meta[b"stepkit"]) if b"stepkit" in meta else None
    except (OSError, ValueError, pa.ArrowException):
        return None
    return doc.get("stage") if isinstance(doc, dict) else None


def check_output(path: Path, out: Path, answers: tuple[str, ...] = ()) -> None:
    """Refuse an OUT that would write over the input, an answers file or a file ingest did not write.

    OUT and its manifest (``<stem>.manifest.json``) must not be the input or an answers file (by path or
    hard link); an existing OUT must be a shard ``ingest`` wrote (ingest rewrites its own output, never
    another stage's shard or a foreign file), an existing manifest path a stepkit manifest, and OUT must not
    lie in a stage's ``.parts`` folder.

    Raises:
        InputError: naming the file that would be overwritten.
    """
    mp = manifest_path(out)
    for what, p in [("the input", path), *(("an --answers file", Path(a)) for a in answers)]:
        if _same_file(p, out):
            raise InputError(out, f"OUT is the same file as {what}; write the shard somewhere else")
        if _same_file(p, mp):
            aka = "" if resolve_path(p) == resolve_path(mp) else f" ({p})"
            raise InputError(mp, f"is {what}{aka}, and it is where OUT {out} writes its manifest; give OUT another name")
    if out.parent.name.endswith(".parts") and len(out.parent.name) > len(".parts"):
        raise InputError(out, f"is inside the parts folder of {out.parent.with_name(out.parent.name[:-6])}; "
                              "write the shard somewhere else")
    if out.is_dir():
        raise InputError(out, "is a folder; OUT must be a .parquet file path")
    if mp.is_dir():  # OUT would be replaced and its manifest left stale
        raise InputError(mp, f"is a folder, and it is where OUT {out} writes its manifest; give OUT another name")
    if out.exists():
        stage = _written_by(out)
        if stage != "ingest":
            who = "it has no stepkit manifest" if stage is None else f"it is a {stage} shard"
            raise InputError(out, f"exists and was not written by ingest ({who}); ingest replaces only its own "
                                  "output: remove it or choose another OUT")
    elif mp.exists():
        try:
            doc = json.loads(mp.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict) or "stage" not in doc:
            raise InputError(mp, f"exists and is not a stepkit manifest, and it is where OUT {out} writes its "
                                 "manifest; give OUT another name")


def check_rows(rows: list[dict], schema: pa.Schema, path: Path) -> None:
    """The shard's own checks, whatever the format: ids (or problem ids of a problems shard) present and
    unique, prompts and problem ids not blank; an error names the source row (``row["_row"]``).

    Raises:
        InputError: naming ``path`` (the input) and the source row.
    """
    key = "id" if "id" in schema.names else "problem_id"
    seen: dict[str, int] = {}
    for r in rows:
        for col in ("id", "problem_id", "prompt"):
            if col in schema.names and (not isinstance(r.get(col), str) or not r[col].strip()):
                raise InputError(path, f"would give the row an empty {col}", row=r["_row"])
        if r[key] in seen:
            raise InputError(path, f"would give the {key} {r[key]!r} of row {seen[r[key]]} again", row=r["_row"])
        seen[r[key]] = r["_row"]
