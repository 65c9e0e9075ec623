"""``stepkit train-prm``: a step-level process reward model from a stepwise-supervision dataset.

The trainer TRL had for this (``PRMTrainer``, ``trl.experimental.prm``, last released in TRL 1.13.0) was
removed with the stepwise-supervision dataset type in TRL PR #7133; this command is its replacement, on
transformers' own ``Trainer``.

Input: a dataset with ``prompt`` (string), ``completions`` (list of step strings) and ``labels`` (one per
step): a ``stepkit export --format trl`` folder (its ``stepkit.manifest.json`` is the lineage), any dataset
saved on disk (``save_to_disk``, or a folder / file of Parquet or JSON Lines data), or a Hub dataset of that
layout (``trl-lib/math_shepherd``, ``trl-lib/prm800k``; needs the network). ``List(bool)`` labels are hard,
``List(float)`` labels are soft values in [0, 1].

Model: ``AutoModelForTokenClassification`` with two classes (0 = the step is wrong, 1 = it is correct) on the
base model (``--base-model``: a bundled model's name or a local folder). Each example is laid out by
:func:`stepkit.stepwise.encode`: the label of step i on the last token of ``step_i + separator``, ``-100``
elsewhere; truncation keeps whole steps from the start and counts the labels it drops. Loss: hard labels by
cross-entropy over the two classes (the model's own token-classification loss); soft labels by binary
cross-entropy of the value against ``sigmoid(z)``, ``z = logit_1 - logit_0`` (the two-class softmax's
probability of "correct", so the same head is read the same way whichever labels trained it). On hard labels
the two losses are equal. ``--train-on-last-step-only`` trains the last step's label alone (outcome supervision,
the ORM baseline of Math-Shepherd and "Lessons of Developing PRMs").

Output folder OUT: the model (``from_pretrained`` loads it; bf16 safetensors), its tokenizer, ``README.md``
(the model card: dataset, lineage, settings, truncation counts, training figures), ``lineage.json`` (the
export's manifest with local paths reduced to file names, as ``stepkit publish`` uploads it) and, written last,
``stepkit-prm.json`` (what ``stepkit prm-label`` reads: the layout, separator, BOS token, label index). Checkpoints go
to ``OUT/checkpoints/`` every ``--save-steps``; a rerun of the same command resumes from the latest one; a
different configuration is refused unless ``--force``.

Threads: ``--threads N`` sets ``torch.set_num_threads(N)`` for the run (the previous value is restored after it,
so an in-process caller keeps its own). The default, ``auto``, is half the cores this process may use, at least
one: on a CPU shared with other work, torch's own default (every core) oversubscribes it, and on this 2-core
machine two torch threads were 5-14x slower than one while the other core was busy (one thread, fp32: about
8 s per optimizer step at batch 4, 192 tokens). Give every core (``--threads 2`` there) only when the machine
is otherwise idle. The thread count does not enter the identity: a rerun with another count resumes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepkit import __version__
from stepkit.errors import ConfigError, InputError, StepkitError
from stepkit.options import Config, identity, opt
from stepkit.stepwise import IGNORE, encode_text

PRM_FILE = "stepkit-prm.json"
"""The file prm-label reads; written last, so its presence marks a finished model folder."""
LAYOUT = "stepwise-v1"  # stepkit.stepwise.encode's layout (prompt + sep, then step + sep each)
CORRECT = 1  # the class index of "the step is correct"
ID2LABEL = {0: "wrong", 1: "correct"}


@dataclass(frozen=True)
class TrainPRMConfig(Config):
    """``stepkit train-prm`` options.

    Raises:
        ConfigError: no ``--base-model``; ``--eval-split`` equal to ``--split``.
    """

    base_model: str | None = opt(None, "Base model: a bundled model's name (smollm2-135m) or a local model folder.")
    max_length: int = opt(1024, "Tokens per example; whole steps beyond it are cut and their labels counted.",
                          min=8)
    step_separator: str | None = opt(None, "Put after the prompt and after every step; the label sits on its last "
                                     "token (\\n, \\n\\n, ... as typed in a shell) [default: the separator a stepkit "
                                     "export records, else \\n].", metavar="SEP")
    train_on_last_step_only: bool = opt(False, "Train the last step's label only (outcome supervision, the ORM "
                                        "baseline).")
    epochs: float = opt(1.0, "Passes over the training rows (--max-steps wins when given).", min=0, min_open=True)
    max_steps: int | None = opt(None, "Optimizer steps in all (default: from --epochs).", min=1)
    learning_rate: float = opt(1e-5, "Peak learning rate (AdamW, linear decay).", min=0, min_open=True)
    batch_size: int = opt(8, "Examples per optimizer step.", min=1)
    split: str = opt("train", "The training split.")
    eval_split: str | None = opt(None, "A split to report the loss on after training (e.g. test, from export "
                                 "--test-size).")
    limit: int | None = opt(None, "Train on the first N rows of the split only.", min=1)
    seed: int = opt(0, "Seed (head initialisation, shuffling).", min=0)
    save_steps: int = opt(500, "Write a checkpoint every N steps (OUT/checkpoints; a rerun resumes from the last).",
                          min=1, identity=False)
    keep_checkpoints: bool = opt(False, "Keep OUT/checkpoints after training.", identity=False)
    threads: int = opt("auto", "CPU threads torch computes with (torch.set_num_threads). auto: half the cores "
                       "this process may use, at least 1 (every core oversubscribes a CPU shared with other work).",
                       min=1, words=("auto",), identity=False, metavar="N|auto")

    def __post_init__(self):
        super().__post_init__()
        if not self.base_model:
            raise ConfigError("--base-model is required (smollm2-135m or a local model folder)")
        if self.eval_split is not None and self.eval_split == self.split:
            raise ConfigError(f"--eval-split {self.eval_split} is the training split")
        if self.step_separator is not None:  # typed in a shell: \n is a newline, as export reads it
            from stepkit.stages import export_text

            object.__setattr__(self, "step_separator", export_text.unescape(self.step_separator))
            export_text.check_separator_option(self.step_separator)


def resolve_threads(threads: int | str) -> int:
    """The torch thread count for ``--threads``: N itself, or for ``auto`` half the cores in this process's
    CPU set (``os.sched_getaffinity``; ``os.cpu_count()`` where that is missing), at least 1."""
    if threads != "auto":
        return int(threads)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // 2)


@contextlib.contextmanager
def torch_threads(threads: int | str):
    """Run the block with ``torch.set_num_threads(resolve_threads(threads))``, restoring the previous count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(resolve_threads(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------------------------- data

@dataclass
class StepwiseData:
    """A stepwise-supervision dataset as loaded: ``splits[name] = rows`` (dicts with prompt, completions,
    labels), ``soft`` (float labels), ``where`` (how it was found), ``manifest`` (a stepkit export's manifest,
    or None), ``fingerprint`` (sha256 of its data files, or the datasets fingerprint)."""

    splits: dict[str, list[dict]]
    soft: bool
    where: str
    manifest: dict | None
    fingerprint: str


def _load(source: str):
    """``(DatasetDict, where)`` for a folder, a data file or a Hub name (ConfigError when none loads)."""
    import datasets

    datasets.disable_progress_bars()
    p = Path(source).expanduser()
    try:
        if p.is_dir() and ((p / "dataset_dict.json").is_file() or (p / "dataset_info.json").is_file()):
            ds = datasets.load_from_disk(str(p))
            return (ds if isinstance(ds, datasets.DatasetDict) else datasets.DatasetDict(train=ds)), "saved dataset"
        if p.is_dir():
            return datasets.load_dataset(str(p)), "dataset folder"
        if p.is_file():
            kind = "parquet" if p.suffix == ".parquet" else "json" if p.suffix in (".json", ".jsonl") else None
            if kind is None:
                raise ConfigError(f"{source}: a data file is .parquet, .json or .jsonl")
            return datasets.load_dataset(kind, data_files=str(p)), f"{kind} file"
        if source.count("/") == 1 and not source.startswith((".", "/", "~")):
            return datasets.load_dataset(source), "Hub dataset"
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many kinds; one line names the source
        raise ConfigError(f"{source}: cannot load it as a dataset ({type(e).__name__}: {str(e).splitlines()[0]})") \
            from None
    raise ConfigError(f"{source}: no such folder or file (a Hub dataset is owner/name)")


def _fingerprint(source: str, ds) -> str:
    import hashlib

    from stepkit.shards import file_sha256

    p = Path(source).expanduser()
    files = sorted(f for f in (p.rglob("*") if p.is_dir() else [p]) if f.is_file() and f.suffix in
                   (".parquet", ".arrow", ".json", ".jsonl")) if p.exists() else []
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relative_to(p) if p.is_dir() else f.name}:{file_sha256(f)}\n".encode())
    if not files:
        h.update(json.dumps({k: v._fingerprint for k, v in ds.items()}, sort_keys=True).encode())
    return h.hexdigest()


def load_stepwise(source: str, splits: list[str], limit: int | None = None) -> StepwiseData:
    """Load and check a stepwise-supervision dataset (see the module docstring for what is accepted).

    Args:
        source: a folder, a data file or a Hub name.
        splits: the splits to read (the first is the training split).
        limit: keep the first N rows of the training split.

    Raises:
        ConfigError: the source does not load, or a split is missing.
        InputError: a missing column, labels of a type other than List(bool)/List(float), a row with no step,
            a blank step, or labels whose count differs from the steps' or outside [0, 1] (naming the split,
            the row and the column).
    """
    from stepkit.stages.export import read_export_manifest

    ds, where = _load(source)
    for s in splits:
        if s not in ds:
            raise ConfigError(f"{source}: no split {s!r} (it has {', '.join(ds) or 'none'})")
    soft = None
    out: dict[str, list[dict]] = {}
    for s in splits:
        d = ds[s]
        name = f"{source} (split {s})"
        for col in ("prompt", "completions", "labels"):
            if col not in d.column_names:
                raise InputError(name, f"missing column: a stepwise-supervision dataset has prompt, completions "
                                       f"and labels (has: {', '.join(d.column_names)})", column=col)
        dtype = getattr(getattr(d.features["labels"], "feature", None), "dtype", None)
        if dtype not in ("bool", "float32", "float64", "float16", "int64", "int32", "int8"):
            raise InputError(name, f"labels are {d.features['labels']}: a list of bools (hard) or floats (soft)",
                             column="labels")
        kind = dtype.startswith("float")
        if soft is not None and kind != soft:
            raise InputError(name, "this split's labels are of another kind (hard/soft) than the training split's",
                             column="labels")
        soft = kind
        rows = d.select_columns(["prompt", "completions", "labels"])
        if s == splits[0] and limit is not None:
            rows = rows.select(range(min(limit, len(rows))))
        out[s] = rows = rows.to_list()
        for i, r in enumerate(rows):
            if not isinstance(r["prompt"], str) or not r["prompt"].strip():
                raise InputError(name, "null or blank prompt", row=i, column="prompt")
            if not r["completions"]:
                raise InputError(name, "null or empty completions (a row needs at least one step)", row=i,
                                 column="completions")
            for k, step in enumerate(r["completions"]):
                if not isinstance(step, str) or not step.strip():
                    raise InputError(name, f"step {k} is null or blank", row=i, column="completions")
            if r["labels"] is None or len(r["labels"]) != len(r["completions"]):
                n = "null" if r["labels"] is None else len(r["labels"])
                raise InputError(name, f"{n} labels for {len(r['completions'])} steps", row=i, column="labels")
            for k, v in enumerate(r["labels"]):
                if v is None or not (0.0 <= float(v) <= 1.0):
                    raise InputError(name, f"label {k} is {v!r}: labels are booleans or values in [0, 1]", row=i,
                                     column="labels")
    p = Path(source).expanduser()
    manifest = read_export_manifest(p) if p.is_dir() else None
    return StepwiseData(out, bool(soft), where, manifest, _fingerprint(source, ds))


def encode_rows(rows: list[dict], tokenize, cfg: TrainPRMConfig, bos_id: int | None, is_eval: bool = False):
    """The training examples of ``rows`` and their counts.

    Returns:
        ``(examples, counts)``: examples are ``{"input_ids", "labels"}`` (only those with a trained label);
        counts: ``rows``, ``steps``, ``labels`` (labels that would be trained), ``labels_trained``,
        ``labels_dropped`` (cut by ``--max-length``), ``steps_cut``, ``rows_cut`` (rows that lost a step),
        ``rows_without_label`` (skipped: nothing left to train), ``tokens``.
    """
    examples, c = [], dict.fromkeys(("rows", "steps", "labels", "labels_trained", "labels_dropped", "steps_cut",
                                     "rows_cut", "rows_without_label", "tokens"), 0)
    last_only = cfg.train_on_last_step_only and not is_eval
    for r in rows:
        labels = [float(v) for v in r["labels"]]
        enc = encode_text(tokenize, r["prompt"], r["completions"], cfg.step_separator, labels,
                          max_length=cfg.max_length, last_step_only=last_only, bos_id=bos_id)
        n = len(r["completions"])
        trained = 1 if last_only else n
        c["rows"] += 1
        c["steps"] += n
        c["labels"] += trained
        c["labels_dropped"] += enc.dropped_labels
        c["labels_trained"] += trained - enc.dropped_labels
        c["steps_cut"] += n - enc.kept_steps
        c["rows_cut"] += enc.kept_steps < n
        if trained == enc.dropped_labels:
            c["rows_without_label"] += 1
            continue
        c["tokens"] += len(enc.input_ids)
        examples.append({"input_ids": enc.input_ids, "labels": enc.labels})
    return examples, c


# ------------------------------------------------------------------------------------------- training

class _Collator:
    """Right-pads ``input_ids`` (``pad_id``) and ``labels`` (-100) to the batch's longest example; labels are
    long integers for hard labels (cross-entropy) and floats for soft ones."""

    def __init__(self, pad_id: int, soft: bool):
        self.pad_id, self.soft = pad_id, soft

    def __call__(self, batch: list[dict]) -> dict:
        import torch

        n = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), n), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), n), dtype=torch.long)
        labels = torch.full((len(batch), n), IGNORE, dtype=torch.float32 if self.soft else torch.long)
        for k, b in enumerate(batch):
            m = len(b["input_ids"])
            ids[k, :m] = torch.tensor(b["input_ids"])
            mask[k, :m] = 1
            labels[k, :m] = torch.tensor(b["labels"], dtype=labels.dtype)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def soft_loss(logits, labels):
    """Binary cross-entropy of soft labels against ``sigmoid(logits[..., 1] - logits[..., 0])``, averaged over
    the positions whose label is not -100. ``logits``: (batch, tokens, 2); ``labels``: (batch, tokens) floats."""
    import torch.nn.functional as F

    mask = labels != IGNORE
    z = (logits[..., CORRECT] - logits[..., 1 - CORRECT]).float()
    return F.binary_cross_entropy_with_logits(z[mask], labels[mask].float())


def _trainer_class(soft: bool):
    from transformers import Trainer

    if not soft:
        return Trainer

    class SoftLabelTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs.pop("labels")
            out = model(**inputs)
            loss = soft_loss(out.logits, labels)
            return (loss, out) if return_outputs else loss

    return SoftLabelTrainer


def _progress_callback(show: bool, losses: list):
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        """A tqdm bar over optimizer steps with the last logged loss; keeps every logged loss."""

        bar = None

        def on_train_begin(self, args, state, control, **kw):
            if show:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="train-prm", unit="step")

        def on_step_end(self, args, state, control, **kw):
            if self.bar is not None:
                self.bar.update(state.global_step - self.bar.n)
            if state.global_step >= state.max_steps:  # the finished model is saved as bf16 instead (no optimizer)
                control.should_save = False

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append((state.global_step, float(logs["loss"])))
                if self.bar is not None:
                    self.bar.set_postfix(loss=f"{logs['loss']:.4f}")

        def on_train_end(self, args, state, control, **kw):
            if self.bar is not None:
                self.bar.close()

    return Progress()


def _check_out(out: Path, ident: dict, force: bool, dataset: str) -> str:
    """``fresh``, ``resume`` or ``done`` for OUT, refusing another configuration's folder unless ``force``
    (then it is set aside by :func:`_set_aside`, restored if the new run fails), and always refusing OUT
    that is, holds or lies in DATASET, or a folder that is no train-prm folder (breaking run: ``--force``
    deleted the dataset it was to train on, and any folder given as OUT, before training)."""
    src, dst = Path(dataset).resolve(), out.resolve()
    if src == dst or src in dst.parents or dst in src.parents:
        raise StepkitError(f"{out}: OUT is, holds or lies in the dataset {dataset}; write the model somewhere else")
    marker, settings = out / PRM_FILE, out / "checkpoints" / "settings.json"
    for f, what in ((marker, "a trained model"), (settings, "an unfinished training run")):
        if f.is_file():
            try:
                theirs = json.loads(f.read_text()).get("identity")
            except (OSError, ValueError):
                theirs = None
            if theirs == ident:
                return "done" if f == marker else "resume"
            if not force:
                raise StepkitError(f"{out}: holds {what} of another configuration (dataset or options); "
                                   f"use --force to replace it")
            return "replace"
    if out.exists() and any(out.iterdir()):
        raise StepkitError(f"{out}: exists and is not a train-prm folder (nothing was changed); give a new or "
                           "empty folder")
    return "fresh"


def _with_separator(cfg: TrainPRMConfig, data: StepwiseData, log) -> TrainPRMConfig:
    """``cfg`` with its step separator resolved: ``--step-separator``, else the one a stepkit export records
    (its steps were joined and checked with it), else a newline. A given one that is not the export's is said in
    one line (breaking run: a ``\\n\\n`` export trained with ``\\n`` silently, steps holding it)."""
    import dataclasses

    recorded = ((data.manifest or {}).get("step_separator") or {}).get("value")
    sep = cfg.step_separator if cfg.step_separator is not None else recorded if recorded is not None else "\n"
    if cfg.step_separator is not None and recorded is not None and cfg.step_separator != recorded:
        log(f"train-prm: warning: --step-separator {cfg.step_separator!r} is not the separator the export records "
            f"({recorded!r}); its steps were checked against that one, and may hold this one")
    return dataclasses.replace(cfg, step_separator=sep)


@contextlib.contextmanager
def _set_aside(out: Path, replace: bool):
    """With ``replace``, move OUT aside while the new model trains: removed when the run succeeds, put back
    when it fails or is interrupted, so a failed ``--force`` run loses nothing."""
    if not replace:
        yield
        return
    aside = out.with_name(f".{out.name}.replaced-{os.getpid()}")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(out, aside)
    try:
        yield
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        os.replace(aside, out)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def train_prm(dataset: str, out: str | Path, cfg: TrainPRMConfig, force: bool = False, progress: bool = True,
              log=print) -> dict[str, Any]:
    """Train a token-classification PRM on ``dataset`` into ``out`` (see the module docstring).

    Returns:
        The ``stepkit-prm.json`` document (``status`` ``trained`` or ``up to date``), with the counts of
        :func:`encode_rows` (``counts``, ``eval_counts``), ``train`` (steps, seconds, losses) and ``eval_loss``.

    Raises:
        ConfigError / InputError: see :class:`TrainPRMConfig` and :func:`load_stepwise`; StepkitError: OUT holds
        another configuration's model or run.
    """
    from stepkit.models import resolve_model

    out = Path(out)
    base = resolve_model(cfg.base_model, option="--base-model", tokenizer=True)  # (the tokenizer is read from it)
    data = load_stepwise(dataset, [cfg.split] + ([cfg.eval_split] if cfg.eval_split else []), cfg.limit)
    cfg = _with_separator(cfg, data, log)
    ident = {"config": identity(cfg), "dataset": data.fingerprint, "layout": LAYOUT}
    from stepkit.runner.parts import OutputLock

    # two runs into one OUT at once: the second is refused, naming the first's pid (breaking run: both trained,
    # and OUT held one run's weights beside the other's stepkit-prm.json and card)
    out.absolute().parent.mkdir(parents=True, exist_ok=True)  # (save_pretrained makes missing folders too)
    with OutputLock(out.absolute()):
        state = _check_out(out, ident, force, dataset)
        if state == "done":
            return {**json.loads((out / PRM_FILE).read_text()), "status": "up to date"}
        with _set_aside(out, state == "replace"), torch_threads(cfg.threads):
            return _train(dataset, data, out, cfg, base, ident, state, progress, log)


def _train(dataset: str, data, out: Path, cfg: TrainPRMConfig, base, ident: dict, state: str, progress: bool,
           log) -> dict[str, Any]:
    """The training run of :func:`train_prm` once OUT is known to be fresh, to resume, or set aside."""

    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer, PrinterCallback, TrainingArguments
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(base)
    probe = tok("a").input_ids
    bos_id = tok.bos_token_id if tok.bos_token_id is not None and probe and probe[0] == tok.bos_token_id else None

    def tokenize(text: str) -> list[int]:
        return tok(text, add_special_tokens=False).input_ids

    train_rows, counts = encode_rows(data.splits[cfg.split], tokenize, cfg, bos_id)
    eval_rows, eval_counts = (encode_rows(data.splits[cfg.eval_split], tokenize, cfg, bos_id, is_eval=True)
                              if cfg.eval_split else ([], None))
    if not train_rows:
        raise StepkitError(f"{dataset}: no training example keeps a label within --max-length {cfg.max_length} "
                           f"({counts['labels_dropped']} labels dropped)")
    if counts["labels_dropped"]:
        log(f"train-prm: --max-length {cfg.max_length} cut {counts['steps_cut']} step(s) of {counts['rows_cut']} "
            f"row(s): {counts['labels_dropped']} of {counts['labels']} labels dropped"
            + (f", {counts['rows_without_label']} row(s) left with none" if counts["rows_without_label"] else ""))
    ckpt = out / "checkpoints"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "settings.json").write_text(json.dumps({"identity": ident}, indent=2, sort_keys=True) + "\n")
    torch.manual_seed(cfg.seed)
    model = AutoModelForTokenClassification.from_pretrained(
        base, num_labels=2, id2label=ID2LABEL, label2id={v: k for k, v in ID2LABEL.items()}, dtype=torch.float32)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id if tok.eos_token_id is not None else 0
    model.config.pad_token_id = pad
    args = TrainingArguments(
        output_dir=str(ckpt), per_device_train_batch_size=cfg.batch_size, per_device_eval_batch_size=cfg.batch_size,
        num_train_epochs=cfg.epochs, max_steps=cfg.max_steps or -1, learning_rate=cfg.learning_rate, seed=cfg.seed,
        data_seed=cfg.seed, logging_steps=1, save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=2,
        report_to="none", disable_tqdm=True, remove_unused_columns=False, dataloader_num_workers=0,
        dataloader_pin_memory=False, use_cpu=not torch.cuda.is_available(), eval_strategy="no")
    losses: list[tuple[int, float]] = []
    trainer = _trainer_class(data.soft)(model=model, args=args, train_dataset=train_rows,
                                        eval_dataset=eval_rows or None, data_collator=_Collator(pad, data.soft),
                                        callbacks=[_progress_callback(progress, losses)])
    trainer.remove_callback(PrinterCallback)
    resume = None
    if state == "resume":
        done = sorted(ckpt.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
        resume = str(done[-1]) if done else None
        if resume:
            log(f"train-prm: resuming from {resume}")
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=resume)
    seconds = time.perf_counter() - t0
    eval_loss = trainer.evaluate()["eval_loss"] if eval_rows else None
    model = trainer.model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    doc = {"kind": "token-classification", "layout": LAYOUT, "step_separator": cfg.step_separator,
           "bos_token_id": bos_id, "correct_label": CORRECT, "labels": "soft" if data.soft else "hard",
           "loss": "binary cross-entropy on sigmoid(logit_1 - logit_0)" if data.soft else "cross-entropy, 2 classes",
           "train_on_last_step_only": cfg.train_on_last_step_only, "max_length": cfg.max_length,
           "base_model": cfg.base_model, "dataset": {"source": dataset, "loaded_as": data.where,
                                                     "sha256": data.fingerprint, "split": cfg.split,
                                                     "eval_split": cfg.eval_split},
           "counts": counts, "eval_counts": eval_counts,
           "train": {"steps": int(result.global_step), "seconds": round(seconds, 1), "resumed_from": resume,
                     "threads": torch.get_num_threads(),
                     "first_loss": losses[0][1] if losses else None, "last_loss": losses[-1][1] if losses else None,
                     "train_loss": float(result.training_loss) if not math.isnan(result.training_loss) else None},
           "eval_loss": eval_loss, "identity": ident, "stepkit_version": __version__, "settings": identity(cfg)}
    from stepkit.stages.dataset_card import public_lineage
    from stepkit.stages.prm_card import model_card

    if data.manifest is not None:
        (out / "lineage.json").write_text(json.dumps(public_lineage(data.manifest), indent=2, sort_keys=True) + "\n")
    (out / "README.md").write_text(model_card(doc, data.manifest))
    if not cfg.keep_checkpoints:
        shutil.rmtree(ckpt, ignore_errors=True)
    (out / PRM_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return {**doc, "status": "trained"}


def read_prm_file(model_dir: str | Path) -> dict | None:
    """The ``stepkit-prm.json`` of a model folder written by train-prm, or None (another model)."""
    f = Path(model_dir) / PRM_FILE
    if not f.is_file():
        return None
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{f}: unreadable ({e})") from None
