"""``stepkit export``: labelled trajectories -> a dataset folder in the Hugging Face Hub layout.

Formats (``FORMATS``), each with explicit ``datasets`` features (never inferred from the rows):

* ``trl`` — TRL's stepwise supervision (``trl`` docs, "Dataset formats": ``prompt`` string,
  ``completions`` list of step strings, ``labels`` one per step). Hard labels are ``List(bool)``;
  ``--soft`` writes ``List(float32)`` from a value column. It is what TRL's ``PRMTrainer`` read (it exists
  up to trl 1.13.0, in ``trl.experimental.prm``; later releases have none) and what ``stepkit train-prm``
  reads. That trainer converts each label with ``int()`` (so 0.75 trains as 0, case
  ``trl-prm-soft-labels-truncated``): hard labels from a value
  column follow a recorded rule, ``value > --threshold`` (default 0: Math-Shepherd's hard estimate; a
  score column on a scale of its own (declared ``scale="score"`` in the shard, :mod:`stepkit.columns`)
  needs it given and is never soft), and the values are kept beside them as ``soft_labels``. One dataset never mixes hard and soft labels.
* ``math-shepherd`` — the released Math-Shepherd rows' layout (:mod:`stepkit.stages.export_text`): ``input``
  is the problem, a space, then ``Step k: <step> ки`` per step joined by ``\n``; ``label`` the same text
  with ``+`` / ``-`` in place of each tag; ``task`` ``GSM8K`` or ``MATH`` (from ``source``, else the
  shard's ingest input, else ``--task``), checked against what TRL's Math-Shepherd converter reads.
* ``processbench`` — ProcessBench's ``id``, ``generator``, ``problem``, ``steps``,
  ``final_answer_correct`` and ``label`` (0-based first error, ``-1`` none).
* ``messages`` — tool-calling conversations (rows of ``ingest messages``) in the OpenAI chat format with one
  label per assistant turn: ``messages``, ``labels``, ``turn_index``, ``outcome_correct``, ``reward``
  (:mod:`stepkit.stages.export_messages`); ``--soft`` as for ``trl``.
* ``pairs`` — DPO preference pairs (TRL's standard preference format: ``prompt``, ``chosen``,
  ``rejected`` strings) from an ``mcts-label --pairs-out`` shard: the prompt is the problem and the
  shared prefix steps, each followed by the step separator, ``chosen``/``rejected`` the two children's
  steps joined by it (so ``prompt + chosen`` is the solution text), with ``chosen_value``/``rejected_value``.

The step separator (``--step-separator``, else the rows' own when they agree, refused when they do not;
math-shepherd: ``\n``) joins every text format's steps, and is written into the manifest
(``step_separator``), each data file's Parquet metadata (``stepkit.export``) and the card: a trainer that
joins ``completions`` must use the same one. A step holding it is refused or rejoined
(``--separator-in-step``).

``--labels COL`` names the label column: step labels (list<bool>), step values (list<float>) or a
first-error index (int; labels are true before it and false from it on). A row whose labels are null
(or hold a null) is dropped and counted (``--on-null drop``) or is an error (``--on-null error``). The
number of labels equals the number of steps for every row, checked before anything is written.

Output: ``OUT/data/<split>-00000-of-0000N.parquet`` (``--split NAME``, or ``train`` and ``test`` with
``--test-size``, split by ``problem_id`` so no problem is in both), written to a temporary folder, loaded
back with ``datasets`` and checked (rows and features), then put in place; and
``OUT/stepkit.manifest.json`` (format, label rule, counts, features and the input shards' manifests:
the lineage ``stepkit publish`` writes into the dataset card).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from stepkit import __version__
from stepkit.errors import ConfigError, InputError, StepkitError
from stepkit.grading.verdicts import labels_from_first_error
from stepkit.options import Config, opt
from stepkit.shards import (
    Writing,
    file_sha256,
    iter_row_chunks,
    list_shards,
    open_parquet,
    read_manifest,
    remove_stale,
    write_json,
    write_table,
)
from stepkit.stages import export_text
from stepkit.stages.export_rows import SOFT_FORMATS, Converter, check_row, features_for, flagged, threshold

FORMATS = ("trl", "math-shepherd", "processbench", "messages", "pairs")
MANIFEST = "stepkit.manifest.json"


@dataclass(frozen=True)
class ExportConfig(Config):
    """``stepkit export`` options."""

    format: str = opt("trl", "Output format.", choices=FORMATS)
    labels: str | None = opt(None, "Label column: step labels (list<bool>), step values (list<float>) or a "
                                   "first-error index (int). Not used by --format pairs.", metavar="COL")
    soft: bool = opt(False, "trl, messages: write the values of a list<float> column as soft labels "
                            "(List(float32)).")
    threshold: float | None = opt(None, "Hard labels from a value column: value > X [default: 0, Math-Shepherd's "
                                        "hard estimate; judge_score / clue_score need X given].")
    on_null: str = opt("drop", "A row with null labels: drop it (counted) or stop with an error.",
                       choices=("drop", "error"))
    test_size: float | None = opt(None, "Problems in the test split: a share (0 < x < 1) or a count (>= 1).",
                                  min=0, min_open=True)
    split: str = opt("train", "The split's name when there is no --test-size.")
    seed: int = opt(0, "Seed of the --test-size split of problems.", min=0)
    rows_per_file: int = opt(100_000, "Rows per Parquet file.", min=1)
    task: str | None = opt(None, "math-shepherd: the task column [default: from each row's source or its ingest "
                                 "input].", choices=export_text.TASKS)
    step_separator: str | None = opt(None, "How steps are joined into text (\\n, \\n\\n, ...) [default: the rows' "
                                           "own when they agree; math-shepherd: \\n].", metavar="SEP")
    tokenizer: str | None = opt(None, "trl, processbench: count each row's tokens with this tokenizer (a folder, Hub "
                                      "id or smollm2-135m), as a step-label trainer does.", metavar="M")
    max_length: int | None = opt(None, "With --tokenizer: a trainer's token limit; the labels it would cut are "
                                       "counted (by value).", min=1, metavar="N")
    on_too_long: str = opt("keep", "A row over --max-length: keep it (counted), drop it (counted) or stop with an "
                                   "error.", choices=("keep", "drop", "error"))
    separator_in_step: str = opt("error", "A step that holds the separator: stop with an error, or rejoin it "
                                          "(the separator inside it replaced by a space).", choices=("error", "rejoin"))

    def __post_init__(self):
        super().__post_init__()
        if self.step_separator is not None:
            object.__setattr__(self, "step_separator", export_text.unescape(self.step_separator))
            export_text.check_separator_option(self.step_separator)
        if (self.max_length is not None or self.on_too_long != "keep") and self.tokenizer is None:
            raise ConfigError("--max-length and --on-too-long need --tokenizer M (the tokenizer the trainer uses)")
        if self.tokenizer is not None and self.format not in ("trl", "processbench"):
            raise ConfigError(f"--tokenizer is for --format trl or processbench (step labels), not {self.format}")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", self.split):
            raise ConfigError(f"--split {self.split!r}: a split name is letters, digits and _ (e.g. train)")
        if self.format == "pairs" and self.labels is not None:
            raise ConfigError("--format pairs takes its labels from the pairs shard: drop --labels")
        if self.format != "pairs" and self.labels is None:
            raise ConfigError(f"--format {self.format} needs --labels COL (e.g. mc_label, judge_label, mc_value)")
        if self.soft and self.format not in SOFT_FORMATS:
            raise ConfigError("--soft is for --format trl or messages (the other formats have hard labels)")
        # an option that does not apply is refused, never silently ignored (breaking run E17)
        if self.test_size is not None and self.split != "train":
            raise ConfigError(f"--split {self.split}: with --test-size the splits are train and test; give one or "
                              "the other")
        if self.task is not None and self.format != "math-shepherd":
            raise ConfigError(f"--task is for --format math-shepherd, not {self.format}")
        if self.threshold is not None and self.format == "pairs":
            raise ConfigError("--threshold makes hard labels from step values: --format pairs takes no labels")
        if self.test_size is not None and self.test_size >= 1 and self.test_size != int(self.test_size):
            raise ConfigError(f"--test-size {self.test_size}: a share below 1 or a whole number of problems")


def _test_problems(ids: list[str], cfg: ExportConfig) -> set[str]:
    """The problems of the test split: a seeded shuffle of the sorted distinct ids, first share/count."""
    if cfg.test_size is None:
        return set()
    uniq = sorted(set(ids))
    k = int(cfg.test_size) if cfg.test_size >= 1 else math.ceil(cfg.test_size * len(uniq))
    if k >= len(uniq):
        raise ConfigError(f"--test-size {cfg.test_size:g} takes {min(k, 10**9)}{'+' if k > 10**9 else ''} of "
                          f"{len(uniq)} problems: nothing left to train on")
    random.Random(cfg.seed).shuffle(uniq)
    return set(uniq[:k])


def _exported_keys(conv: Converter, shards: list[Path], key: str) -> list[str]:
    """The ``key`` (problem_id, else id) of every row the export writes: not flagged by filter, labels not
    null. Bad rows raise here as they would while writing; the converter's counts are left as they were.
    (``--on-too-long drop`` is not applied: a test split it empties is refused by the write.)"""
    counts, dropped = Counter(conv.counts), Counter(conv.dropped_keys)
    keys, seen = [], set()
    try:
        for p in shards:
            for first, rows in iter_row_chunks(p, 4096):
                for j, row in enumerate(rows):
                    check_row(row, p, first + j, conv.cfg.format, seen)
                    if not flagged(row) and conv.convert(row, p, first + j) is not None:
                        keys.append(row.get(key))
    finally:
        conv.counts, conv.dropped_keys = counts, dropped
    return keys


def _check_out(out: Path, inputs: list[Path], force: bool) -> None:
    resolved = {p.resolve() for p in inputs}
    if out.resolve() in resolved or any(p.is_relative_to(out.resolve()) for p in resolved):
        raise ConfigError(f"{out}: OUT would hold or replace an input shard; write the export somewhere else")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a folder (export writes a dataset folder)")
    if out.exists() and any(out.iterdir()):
        if not (out / MANIFEST).exists():
            raise ConfigError(f"{out}: folder exists and is not a stepkit export; give another OUT")
        if not force:
            raise ConfigError(f"{out}: holds an earlier export; use --force to replace it (a dataset never mixes "
                              "two exports)")


def export(in_path: str | os.PathLike, out: str | os.PathLike, cfg: ExportConfig, force: bool = False) -> dict[str, Any]:
    """Export the shard or folder ``in_path`` to the dataset folder ``out``; returns its manifest.

    Raises:
        InputError: a missing or mistyped column, labels that do not match the steps, null labels with
            ``--on-null error`` (naming file, row and column). Nothing is written then.
        ConfigError: OUT is an input, another kind of folder, or an earlier export of other inputs or
            options without ``force``. The same export of the same inputs returns the existing manifest
            with ``status: "up to date"``.
    """
    from stepkit.runner.parts import OutputLock

    out = Path(out).absolute()  # (a relative "." has no name to put a temporary folder beside)
    shards = list_shards(in_path)
    with OutputLock(out):  # two exports to one OUT at once: the second is refused, naming the first's pid
        return _export(in_path, shards, out, cfg, force)


def _export(in_path, shards: list[Path], out: Path, cfg: ExportConfig, force: bool) -> dict[str, Any]:
    remove_stale(out, "tmp")
    hashes = [file_sha256(p) for p in shards]
    config = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    old = read_export_manifest(out) if out.is_dir() else None
    if old and not force and old.get("config") == json.loads(json.dumps(config)) and \
            [i.get("sha256") for i in old.get("inputs", [])] == hashes and \
            all((out / f).is_file() for s in old.get("splits", {}).values() for f in s.get("files", [])):
        return {**old, "status": "up to date"}
    _check_out(out, shards, force)
    conv = Converter(cfg)
    for p in shards:
        conv.check_schema(open_parquet(p).schema_arrow, p)
    has_pid = [p for p in shards if "problem_id" in open_parquet(p).schema_arrow.names]
    key = "problem_id" if cfg.format == "pairs" or len(has_pid) == len(shards) else "id"
    if cfg.test_size is not None and has_pid and key == "id":  # a problem's rows would land in both splits
        missing = next(p for p in shards if p not in has_pid)
        raise InputError(missing, "has no problem_id column, which --test-size splits by (other shards have it)",
                         column="problem_id")
    ids, seps = [], Counter()
    for p in shards:
        has_sep = "step_separator" in open_parquet(p).schema_arrow.names
        for first, rows in iter_row_chunks(p, 65536, columns=[key, "step_separator"] if has_sep else [key]):
            for j, r in enumerate(rows):
                if r.get(key) is None and cfg.test_size is not None:
                    raise InputError(p, f"null {key}: --test-size splits by it", row=first + j, column=key)
                ids.append(r.get(key))
                seps[r.get("step_separator")] += 1
    if cfg.format == "messages":  # a conversation's steps are messages, never joined into text
        sep, sep_from = None, None
    elif cfg.format == "math-shepherd" and cfg.step_separator is None:  # the released rows' layout
        sep, sep_from = export_text.DEFAULT_SEPARATOR, "format"
    else:
        sep, sep_from = export_text.resolve_separator(cfg.step_separator, seps, cfg.format, in_path)
    conv.sep = sep
    # the test problems are drawn among the problems that have exported rows (breaking run E5: drawn among all,
    # a problem whose rows are all null-labelled or flagged could be the whole test split)
    test = _test_problems(_exported_keys(conv, shards, key) if cfg.test_size is not None else ids, cfg)
    tokens = None
    if cfg.tokenizer is not None:
        from stepkit.stages.export_tokens import TokenCounter

        tokens = TokenCounter(cfg.tokenizer, cfg.max_length, cfg.on_too_long)
    separator = {"value": sep, "from": sep_from,
                 "rows_joined_otherwise": sum(n for x, n in seps.items() if None not in (x, sep) and x != sep)}
    features = features_for(cfg, conv.kind)
    schema = features.arrow_schema
    schema = schema.with_metadata({**(schema.metadata or {}), b"stepkit.export": json.dumps(
        {"format": cfg.format, "step_separator": sep}).encode()})
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    guard = Writing("export", out, tmp, out)
    with guard:  # a full disk or a read-only folder: one line, OUT as it was
        shutil.rmtree(tmp, ignore_errors=True)
        splits = ("train", "test") if cfg.test_size is not None else (cfg.split,)
        buffers: dict[str, list[dict]] = {s: [] for s in splits}
        files: dict[str, list[Path]] = {s: [] for s in splits}
        counts = {"rows_in": 0, "rows_out": 0, "null_labels": 0, "filtered": 0, "steps": 0, "labels_true": 0,
                  "labels_false": 0}
        value_sum = 0.0
        seen_ids: set = set()

        def flush(split: str) -> None:
            path = tmp / "data" / f".{split}-{len(files[split]):05d}.parquet"
            guard.target = out / "data" / f"{split}-{len(files[split]):05d}.parquet"
            write_table(path, pa.Table.from_pylist(buffers[split], schema=schema))  # row groups capped by bytes
            guard.target = None
            files[split].append(path)
            buffers[split].clear()

        try:
            (tmp / "data").mkdir(parents=True)
            for p in shards:
                for first, rows in iter_row_chunks(p, 4096):
                    for j, row in enumerate(rows):
                        counts["rows_in"] += 1
                        check_row(row, p, first + j, cfg.format, seen_ids)
                        if flagged(row):
                            counts["filtered"] += 1
                            continue
                        rec = conv.convert(row, p, first + j)
                        if rec is None:
                            if cfg.on_null == "error":
                                raise InputError(p, "null labels (or outcome); use --on-null drop to leave such rows out",
                                                 row=first + j, column=cfg.labels or "chosen")
                            counts["null_labels"] += 1
                            continue
                        if tokens is not None:
                            prompt, steps = (rec["prompt"], rec["completions"]) if cfg.format == "trl" else \
                                (rec["problem"], rec["steps"])
                            labels = rec["labels"] if cfg.format == "trl" else labels_from_first_error(rec["label"],
                                                                                                       len(steps))
                            if not tokens.check(prompt, steps, labels, sep, p, first + j):
                                counts["too_long"] = counts.get("too_long", 0) + 1  # --on-too-long drop
                                continue
                        split = ("test" if row.get(key) in test else "train") if cfg.test_size is not None else cfg.split
                        buffers[split].append(rec)
                        counts["rows_out"] += 1
                        if row.get("mc_value_start") is not None:  # how often the labelling model solves the problem
                            counts["v0_rows"] = counts.get("v0_rows", 0) + 1
                            counts["v0_sum"] = round(counts.get("v0_sum", 0.0) + row["mc_value_start"], 6)
                        labels = rec.get("labels")
                        if cfg.format == "pairs" and None not in (rec["chosen_value"], rec["rejected_value"]) \
                                and rec["chosen_value"] <= rec["rejected_value"]:
                            counts["pairs_not_preferred"] = counts.get("pairs_not_preferred", 0) + 1
                        if cfg.format == "messages":
                            counts["messages"] = counts.get("messages", 0) + len(rec["messages"])
                            counts["tool_calls"] = counts.get("tool_calls", 0) + sum(
                                len(m["tool_calls"] or []) for m in rec["messages"])
                        if cfg.format in SOFT_FORMATS:
                            counts["steps"] += len(labels)
                            if cfg.soft:
                                value_sum += sum(labels)
                            else:
                                counts["labels_true"] += sum(labels)
                                counts["labels_false"] += len(labels) - sum(labels)
                        if len(buffers[split]) >= cfg.rows_per_file:
                            flush(split)
            for s in splits:
                if not buffers[s] and not files[s]:  # datasets cannot load a split with no rows
                    raise StepkitError(f"{in_path}: the {s} split would have no rows (input rows: {counts['rows_in']}, "
                                       f"null labels: {counts['null_labels']}, flagged by filter: "
                                       f"{counts['filtered']}"
                                       + (f", over --max-length: {counts['too_long']}" if counts.get("too_long") else "")
                                       + "); nothing written")
                if buffers[s]:
                    flush(s)
            data_files: dict[str, list[str]] = {}
            for s in splits:
                n = len(files[s])
                data_files[s] = []
                for i, f in enumerate(files[s]):
                    final = f.with_name(f"{s}-{i:05d}-of-{n:05d}.parquet")
                    f.rename(final)
                    data_files[s].append(f"data/{final.name}")
            guard.target = tmp / ".cache"  # (datasets' cache, loading the files back)
            split_rows = _verify(tmp, data_files, features)
            guard.target = None
            if cfg.soft and counts["steps"]:
                counts["mean_label"] = round(value_sum / counts["steps"], 6)
            if cfg.format == "messages":
                counts["message_fields_dropped"] = sum(conv.dropped_keys.values())
            manifest = {
                "stage": "export", "stepkit_version": __version__,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "config": config,
                "label_rule": _label_rule(cfg, conv.kind),
                "splits": {s: {"rows": split_rows[s], "files": data_files[s],
                               "sha256": {f: file_sha256(tmp / f) for f in data_files[s]}} for s in splits},
                "counts": {**counts, **conv.counts}, "features": features.to_dict(), "step_separator": separator,
                **({"token_lengths": tokens.report()} if tokens is not None else {}),
                **({"dropped_message_keys": dict(sorted(conv.dropped_keys.items()))} if cfg.format == "messages" else {}),
                "inputs": [{"path": str(p), "sha256": h, "manifest": read_manifest(p)} for p, h in zip(shards, hashes)],
            }
            guard.target = tmp / MANIFEST
            write_json(tmp / MANIFEST, manifest)
            guard.target = None
            _put_in_place(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return manifest


def _put_in_place(tmp: Path, out: Path) -> None:
    """Make the staged export ``tmp`` the folder ``out``. A new OUT appears at once (one rename); an existing
    one keeps its folder (it may be a shell's current folder) and has its contents swapped; a failed swap
    puts the earlier contents back, so OUT is the old export or the new one, never a mix."""
    if not out.exists():
        tmp.rename(out)
        return
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    old.mkdir()
    new, moved = [e.name for e in tmp.iterdir()], []
    try:
        for entry in list(out.iterdir()):
            entry.rename(old / entry.name)
            moved.append(entry.name)
        for name in new:
            (tmp / name).rename(out / name)
    except BaseException:
        for name in new:
            if (out / name).exists() and not (tmp / name).exists():
                (out / name).rename(tmp / name)
        for name in moved:
            (old / name).rename(out / name)
        old.rmdir()
        raise
    shutil.rmtree(old, ignore_errors=True)
    tmp.rmdir()


def _label_rule(cfg: ExportConfig, kind: str | None) -> str:
    """The rule that made the labels, in words, for the manifest and the dataset card."""
    if cfg.format == "pairs":
        return ("preference pairs: two children of one tree node, chosen = the child of higher value, by at least "
                "mcts-label's --pair-margin (mcts-label --pairs-out)")
    src = f"`{cfg.labels}`"
    if kind == "index":
        return f"hard labels from the first-error index {src}: true before it, false from it on"
    if kind == "bool":
        return f"hard labels as written in {src}"
    if cfg.soft:
        return f"soft labels: the step values of {src}, as float32"
    return f"hard labels: value > {threshold(cfg):g} of the step values {src} (kept as soft_labels)"


def _verify(folder: Path, data_files: dict[str, list[str]], features) -> dict[str, int]:
    """Load the files back with ``datasets`` and check each split's rows and features; returns the rows."""
    import datasets
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    expected = {s: sum(pq.ParquetFile(folder / f).metadata.num_rows for f in fs) for s, fs in data_files.items()}
    ds = datasets.load_dataset("parquet", data_files={s: [str(folder / f) for f in fs] for s, fs in data_files.items()},
                               cache_dir=str(folder / ".cache"))
    shutil.rmtree(folder / ".cache", ignore_errors=True)
    for s, n in expected.items():
        if ds[s].num_rows != n:
            raise StepkitError(f"{folder}: split {s} loads {ds[s].num_rows} rows, its files hold {n}")
        if ds[s].features != features:
            raise StepkitError(f"{folder}: split {s} loads with features {ds[s].features}, not {features}")
    return expected


def read_export_manifest(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The ``stepkit.manifest.json`` of an export folder, or None."""
    try:
        return json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
