"""``ingest``: turn source files into problem or trajectory shards with the explicit schemas.

The formats are registered classes (:data:`FORMATS`, one :class:`~stepkit.stages.ingest_formats.IngestFormat`
subclass per format, documented in :mod:`stepkit.stages.ingest_formats` and, for ``messages``,
:mod:`stepkit.stages.ingest_messages`); each declares the options it accepts, the schema it writes and how
it reads its rows. This module holds the options (:class:`IngestOptions`), the refusal of an option that
does not apply to the format (:func:`option_conflicts`, from the formats' declarations) and :func:`ingest`.

Reading (:mod:`stepkit.stages.ingest_read`): FILE (and each answers file) is read once, as a stream of
lines (JSON Lines) or whole (ProcessBench JSON, Parquet), and the sha256 in the manifest is of exactly the
bytes read, so a pipe (``<(zcat x.gz)``, a named FIFO) works. Gold answers written on a marker line
(``#### N``, ``A: N``) are read whole, never with the length bound meant for model output
(:mod:`stepkit.stages.ingest_gold`).

Bad input is one :class:`~stepkit.errors.InputError` naming the file, the row (0-based: the line of a JSON
Lines file, the element of a JSON list, the row of a Parquet file) and the column: invalid UTF-8 (with its
byte offset), JSON that ``json`` refuses (bad syntax, an integer of more than 4,300 digits, nesting deeper
than the recursion limit), a lone UTF-16 surrogate, a column that a ``--*-col`` option names and the file
lacks, an empty or repeated id, a blank prompt. An error about the file's layout names the format the file
looks like when it is another one (:func:`sniff_format`). So a shard that ingest writes is one every later
stage reads. ingest never writes over its input, an answers file, or a file it did not write itself
(:mod:`stepkit.stages.ingest_output`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from stepkit import __version__
from stepkit.errors import ConfigError, InputError
from stepkit.grading.steps import check_split
from stepkit.options import Config, flag_of, opt
from stepkit.shards import write_shard
from stepkit.stages.ingest_formats import (
    TRAJ_SCHEMA_WITH_REFS,
    Gsm8k,
    Gsm8kSolutions,
    IngestFormat,
    Jsonl,
    Parquet,
    ProcessBench,
)
from stepkit.stages.ingest_gold import first_error_status, ratings_to_labels
from stepkit.stages.ingest_messages import Messages
from stepkit.stages.ingest_output import check_output, check_rows
from stepkit.stages.ingest_read import HEAD_BYTES, FormatError, Source

__all__ = ["FORMATS", "TRAJ_SCHEMA_WITH_REFS", "IngestOptions", "first_error_status", "ingest", "option_conflicts",
           "ratings_to_labels", "sniff_format"]

FORMATS: dict[str, type[IngestFormat]] = {
    f.name: f for f in (Gsm8k, Gsm8kSolutions, ProcessBench, Jsonl, Parquet, Messages)}
"""The formats of ``stepkit ingest`` by name, in the order the CLI lists them: a new format is one entry."""
OPTION_NEEDS = {"seed": "sample", "neutral_as": "labels_col"}
"""Options that act only together with another one."""


@dataclass(frozen=True)
class IngestOptions(Config):
    """Options of ``stepkit ingest`` (column names refer to the source file for jsonl/parquet).

    Raises:
        ConfigError: a value out of range, an unknown split mode, a missing ``--answers`` file or a
            generator given twice.
    """

    limit: int | None = opt(None, "Take at most N records.", min=1)
    skip: int = opt(0, "Skip the first N records (to cut a file into shards).", min=0)
    sample: int | None = opt(None, "Take a random sample of N records (seeded by --seed, file order kept), "
                             "after --skip/--limit.", min=1)
    seed: int = opt(0, "Seed of --sample.")
    generators: tuple[str, ...] = opt((), "gsm8k-solutions: generator(s) to take (default: all four).",
                                      flag="--generator")
    split: str = opt("auto", "jsonl/parquet string steps: newline, blank, step (Step k:), auto, or a separator regex.")
    id_col: str | None = opt(None, "jsonl/parquet, messages: row id column (default: <file>-<index>; messages: id, "
                              "else <problem id>-<trial>).")
    prompt_col: str = opt("prompt", "jsonl/parquet: the problem column.")
    steps_col: str = opt("steps", "jsonl/parquet: a list of steps, or a string to split.")
    answer_col: str | None = opt(None, "jsonl/parquet: the solution's final answer (default: extracted from the "
                                 "steps).")
    reference_col: str | None = opt(None, "jsonl/parquet: gold answer column (needed to grade outcomes).")
    problem_id_col: str | None = opt(None, "jsonl/parquet, messages: problem id column (default: the row id; "
                                      "messages: task_id when present).")
    labels_col: str | None = opt(None, "jsonl/parquet: per-step human labels or ratings (-1/0/1, bool, +/-).")
    neutral_as: str = opt("positive", "With --labels-col: how a neutral 0 rating maps (PRM800K paper: positive; "
                          "TRL's converter: negative).", choices=("positive", "negative"))
    first_error_col: str | None = opt(None, "jsonl/parquet: human first-error index column (-1 = no error).")
    answers: tuple[str, ...] = opt((), "processbench: GSM8K/MATH-500 jsonl files to recover gold answers from.",
                                   file=True)
    messages_col: str | None = opt(None, "messages: the conversation key (default: messages, else traj).")
    outcome_col: str = opt("reward", "messages: the outcome key (a number or bool; dots reach into objects).")
    gold_col: str = opt("info.task.actions", "messages: the gold tool calls key (a list of {name, kwargs|arguments}; "
                        "absent: none).")
    success_threshold: float = opt(1.0, "messages: outcome_correct is reward >= this.")

    def __post_init__(self):
        super().__post_init__()
        check_split(self.split)
        twice = sorted({g for g in self.generators if self.generators.count(g) > 1})
        if twice:  # the rows of a generator would come out twice, with the same ids
            raise ConfigError(f"--generator {twice[0]} is given twice")


def option_conflicts(fmt: str, opts: IngestOptions, names) -> list[str]:
    """Why the options ``names`` (field names of :class:`IngestOptions`) cannot be given for format ``fmt``
    (a name in :data:`FORMATS`): one message per option that the format does not accept (its ``options``
    declaration) or that acts only with another option that is not set (``--seed`` without ``--sample``).
    Empty when every one applies."""
    flags = {f.name: flag_of(f) for f in dataclasses.fields(IngestOptions)}
    out = []
    for name in names:
        if not FORMATS[fmt].accepts(name):
            formats = [f.name for f in FORMATS.values() if f.accepts(name)]
            out.append(f"{flags[name]} applies only to format{'s' if len(formats) > 1 else ''} "
                       f"{', '.join(formats)}, not {fmt}")
        elif name in OPTION_NEEDS and getattr(opts, OPTION_NEEDS[name]) in (None, ()):
            out.append(f"{flags[name]} has no effect without {flags[OPTION_NEEDS[name]]}")
    return out


def sniff_format(head: bytes) -> str | None:
    """The format the first bytes of a file look like: ``parquet`` (its magic number), ``messages`` (JSON
    records with a ``messages`` or ``traj`` conversation and no ``steps``), ``processbench`` (another JSON
    list), ``gsm8k`` / ``gsm8k-solutions`` (JSON Lines with their keys), ``jsonl`` (other JSON Lines), or
    None."""
    if head.startswith(b"PAR1"):
        return "parquet"
    text = head.decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
    conversation = re.search(r'"(?:traj|messages)"\s*:\s*\[', text) and not re.search(r'"steps"\s*:', text)
    if text.startswith("["):
        return "messages" if conversation else "processbench"  # (breaking run E19: a τ-bench file)
    if not text.startswith("{"):
        return None
    try:
        keys = set(json.loads(text.split("\n", 1)[0]))
    except (ValueError, RecursionError, TypeError):
        return "messages" if conversation else "jsonl"
    if keys & {"messages", "traj"} and "steps" not in keys:
        return "messages"
    if {"question", "ground_truth"} <= keys:
        return "gsm8k-solutions"
    if {"question", "answer"} <= keys:
        return "gsm8k"
    return "jsonl"


def _with_hint(e: InputError, fmt: str, head: bytes, path: Path | None = None) -> InputError:
    """``e`` with the format the file looks like, when that is another one than ``fmt``. A read that
    failed early kept only the first bytes; a regular ``path`` is read further for the guess (a pipe
    cannot be read again)."""
    if path is not None and len(head) < HEAD_BYTES and path.is_file():
        with contextlib.suppress(OSError), path.open("rb") as f:
            head = f.read(HEAD_BYTES)
    guess = sniff_format(head)
    if guess is None or guess == fmt:
        return e
    how = FORMATS[guess].hint
    return InputError(e.path, f"{e.detail}; the file looks like {guess} input (stepkit ingest {guess} FILE OUT{how})",
                      row=e.row, column=e.column)


def ingest(fmt: str, path: str | Path, out: str | Path, opts: IngestOptions, checker, checker_settings: dict) -> dict:
    """Read ``path`` in format ``fmt`` and write the shard ``out`` with its manifest.

    Returns the manifest. Raises :class:`InputError` on bad input (naming file, row and column) or an OUT
    that would write over an input or a file ingest did not write, and :class:`ConfigError` for an option
    that does not apply to ``fmt`` (:func:`option_conflicts`); nothing is written then.
    """
    path, out = Path(path), Path(out)
    if fmt not in FORMATS:
        raise InputError(path, f"unknown format {fmt!r} (choose {', '.join(FORMATS)})")
    changed = [f.name for f in dataclasses.fields(opts) if getattr(opts, f.name) != f.default]
    conflicts = option_conflicts(fmt, opts, changed)
    if conflicts:
        raise ConfigError(conflicts[0])
    if not path.exists():
        raise InputError(path, "no such file")
    check_output(path, out, opts.answers)
    if out.suffix != ".parquet":
        raise InputError(out, "OUT must be a .parquet file path")
    src = Source(path)
    reader = FORMATS[fmt](src, opts, checker)
    try:
        rows = reader.rows()
    except FormatError as e:
        raise (_with_hint(e, fmt, bytes(src.head), path) if e.path == path else e) from None
    schema = reader.schema
    if not rows:
        raise InputError(path, "no records to ingest" + (" after --skip" if opts.skip else ""))
    check_rows(rows, schema, path)
    source_rows = [r.pop("_row") for r in rows]
    opt_doc = {k: v for k, v in vars(opts).items() if v not in (None, (), {}, "")}
    source = {"path": str(path), "sha256": src.sha256}
    if reader.answer_files:
        source["answers"] = reader.answer_files
    manifest = {"stage": "ingest", "stepkit_version": __version__,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "config": {"format": fmt, "options": opt_doc, "grader": checker_settings},
                "input": source, "counts": {"rows": len(rows), **reader.counts}}
    try:
        write_shard(out, rows, schema, manifest, source=path)
    except InputError as e:  # a value that does not fit its column: name the source row, not the output row
        if e.path != path or e.row is None:
            raise
        raise InputError(path, e.detail, row=source_rows[e.row], column=e.column) from None
    except OSError as e:
        raise InputError(out, f"cannot write ({e.strerror or e})") from None
    return manifest
