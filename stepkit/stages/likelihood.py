"""``likelihood-label``: step rewards from log-probabilities, by one prefill per text and no sampling.

Methods:

* ``answer-gain`` (default; "Likelihood-Based Reward Designs for General LLM Reasoning", IGPO's information
  gain, P2S, "Aligning Language Models Using Follow-up Likelihood as Reward Signal"): the value of a prefix
  is the summed log-probability (nats) of the reference answer after it, in a versioned answer scaffold
  (:class:`stepkit.prompts.AnswerScaffold`: ``chat(problem) + steps[:i] + "The answer is" + " <gold>."``; the
  closing ``.`` is scored too). A step's reward is how much it raises that value.
* ``answer-gain --target gold-action``, agent conversations (``ingest messages``; IGPO, "Information Gain-based
  Policy Optimization", the gain of a turn in the log-probability of the ground truth): the answer is the
  task's last state-changing gold tool call (``reference_actions``, :data:`stepkit.grading.actions.READ_ONLY_TOOLS`
  says which change nothing; none: the last gold call) rendered as a turn renders it, in the scaffold
  ``stepkit/prompts/likelihood-agent.yaml``; the prefix after turn i holds the turns and observations up to
  and including turn i's observation (what the turn obtained).
* ``implicit-prm`` ("Free Process Rewards without Process Labels", Yuan et al. 2024; PRIME): the reward of
  step i is ``beta * sum over its tokens of (log pi(t) - log pi_ref(t))`` for a policy ``pi`` (``--model``)
  and its reference ``pi_ref`` (``--reference-model``), and ``q_i`` its running sum (ImplicitPRM's
  evaluation rule). The two models are scored one after the other, never loaded at once (each chunk scores
  with the model still loaded first, then swaps), and must tokenise every text alike (checked).

Token positions come from one tokenisation of each whole text with character offsets
(:meth:`stepkit.engines.base.Engine.score`), never from the token count of a prefix.

Columns (list columns have one entry per step):

* ``lh_value`` (list<float32>, answer-gain): value after ``steps[:i+1]``; ``lh_value_start`` (float32): after
  the bare problem; ``lh_gain`` (list<float32>): ``lh_value[i] - lh_value[i-1]`` (``lh_value_start`` before
  step 0);
* ``lh_reward`` (list<float32>, implicit-prm): beta times step i's summed log-ratio; ``lh_q`` (list<float32>):
  its running sum;
* ``lh_first_error`` (int32): ProcessBench convention, from :func:`first_error`; ``lh_label`` (list<bool>):
  True before it, False from it on;
* ``lh_answer_tokens`` (int32): tokens of the scored answer; ``lh_scored_tokens`` (int32): tokens of the
  row's scored texts (M + 1 texts of up to its length; the offline vllm engine reads their shared prefixes
  from its prefix cache, the row's full text being scored first, so the prefill work is mostly its tail);
* ``lh_status``: ``ok``; ``no_answer`` (answer-gain on a row without ``reference_answer``: passed through);
  null on rows with an error.

First error (:func:`first_error`, threshold ``--threshold`` in nats, or picked by ``--calibrate``): the first
step whose signal (``lh_gain``; ``lh_q`` for implicit-prm) is below the threshold; when no step is and the
row's outcome is incorrect (``outcome_correct`` false), the step with the lowest gain (lowest
``lh_reward``); else -1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from stepkit.columns import Column
from stepkit.engines.base import EngineSpec, SamplingConfig, ScoreRequest
from stepkit.errors import ConfigError, InputError, RowError
from stepkit.grading.verdicts import labels_from_first_error
from stepkit.metrics import processbench_f1
from stepkit.options import Config, opt
from stepkit.prompts import AnswerScaffold, load_answer_scaffold
from stepkit.schema import CONVERSATION_STEP_COLUMNS
from stepkit.stage import LabelerStage

METHODS = ("answer-gain", "implicit-prm")
TARGETS = ("answer", "gold-action")
DEFAULT_THRESHOLD = {"answer-gain": -7.5, "implicit-prm": 0.0}
"""nats. answer-gain's default is the threshold calibrated on the tuning half of ProcessBench gsm8k with the
bundled model (-7.54, rounded; ``bench/likelihood_processbench.py``): the 135M model's gains are noisy, so
almost no step falls below it and an incorrect row's error is its lowest-gain step. Recalibrate for another
model with ``--calibrate``."""

_NATS = pa.list_(pa.float32())
COLUMNS = (
    Column("lh_value", _NATS, "answer-gain: log-probability (nats) of the answer after steps[:i+1]", per_step=True,
           role="value", scale="nats", status="lh_status"),
    Column("lh_value_start", pa.float32(), "answer-gain: log-probability (nats) of the answer after the bare problem"),
    Column("lh_gain", _NATS, "answer-gain: lh_value[i] - lh_value[i-1] (nats)", per_step=True, role="value",
           scale="nats", status="lh_status"),
    Column("lh_reward", _NATS, "implicit-prm: beta times the step's summed log-ratio (nats)", per_step=True,
           role="value", scale="nats", status="lh_status"),
    Column("lh_q", _NATS, "implicit-prm: running sum of lh_reward (nats)", per_step=True, role="value", scale="nats",
           status="lh_status"),
    Column("lh_first_error", pa.int32(), "first step whose signal is below the threshold (see first_error), -1 if "
           "none", role="first_error", status="lh_status"),
    Column("lh_label", pa.list_(pa.bool_()), "True before lh_first_error, False from it on", per_step=True,
           role="label", status="lh_status"),
    Column("lh_answer_tokens", pa.int32(), "tokens of the scored answer"),
    Column("lh_scored_tokens", pa.int32(), "tokens of the row's scored texts"),
    Column("lh_status", pa.string(), "ok; no_answer: no reference answer to score (no labels)", role="status",
           values=("ok", "no_answer"), no_labels=("no_answer",)),
)
_EMPTY = {c.name: None for c in COLUMNS}
_SIGNAL = {"answer-gain": ("lh_gain", "lh_gain"), "implicit-prm": ("lh_q", "lh_reward")}
"""method -> (column compared with the threshold, column whose minimum is the fallback first error)."""


@dataclass(frozen=True)
class LikelihoodConfig(Config):
    """Options of ``likelihood-label``.

    Raises:
        ConfigError: implicit-prm without ``--reference-model`` (or answer-gain with one or with ``--beta``),
            ``--threshold`` together with ``--calibrate``, ``--calibrate-col`` without ``--calibrate``.
    """

    method: str = opt("answer-gain", "answer-gain: log-prob of the reference answer after each prefix, and its "
                      "gain per step; implicit-prm: beta x log-ratio of --model and --reference-model per step.",
                      choices=METHODS)
    threshold: float | None = opt(None, "First error: the first step whose gain (implicit-prm: q) is below this, "
                                  "in nats [default: -7.5 answer-gain (calibrated for the bundled model), 0.0 implicit-prm].")
    reference_model: str | None = opt(None, "--method implicit-prm: the reference model (same engine and "
                                      "tokenizer as --model; loaded after it, never at once).")
    beta: float = opt(1.0, "--method implicit-prm: the reward scale beta.", min=0, min_open=True)
    template: str | None = opt(None, "Answer scaffold (YAML: version, user, answer_prefix, answer) "
                               "[default: stepkit/prompts/likelihood-answer.yaml].", identity=False)  # hashed
    calibrate: str | None = opt(None, "A likelihood-label output with gold first errors: pick the threshold "
                                "that maximises ProcessBench F1 on it (recorded in the manifest).",
                                identity=False)  # enters the identity as its threshold and hash
    calibrate_col: str = opt("reference_first_error", "--calibrate: the gold first-error column.", identity=False)
    target: str = opt("answer", "answer-gain: answer (reference_answer) or gold-action (agent conversations from "
                      "`ingest messages`: the last state-changing gold tool call; scaffold likelihood-agent).",
                      choices=TARGETS)

    def __post_init__(self):
        super().__post_init__()
        if self.method == "implicit-prm" and not self.reference_model:
            raise ConfigError("--method implicit-prm needs --reference-model")
        if self.method != "implicit-prm" and self.reference_model:
            raise ConfigError("--reference-model is for --method implicit-prm")
        if self.threshold is not None and self.calibrate:
            raise ConfigError("give --threshold or --calibrate, not both")
        if self.method != "implicit-prm" and self.beta != 1.0:
            raise ConfigError("--beta is for --method implicit-prm")
        if not self.calibrate and self.calibrate_col != "reference_first_error":
            raise ConfigError("--calibrate-col is for --calibrate")
        if self.target != "answer" and self.method != "answer-gain":
            raise ConfigError("--target gold-action is for --method answer-gain")


def gold_action_answer(actions: list[str] | None) -> str | None:
    """The answer of ``--target gold-action``: the last state-changing gold call (else the last gold call)
    of a row's ``reference_actions``, rendered as a turn renders a call (``{"name", "arguments"}``, the
    canonical key order); None when the row has no gold action.

    Raises:
        ValueError: an action that is not canonical ``{"arguments", "name"}`` JSON.
    """
    import json

    from stepkit.grading.actions import read_only

    calls = [json.loads(a) for a in actions or []]
    if any(not isinstance(c, dict) or "name" not in c or "arguments" not in c for c in calls):
        raise ValueError("reference_actions entries are {\"arguments\": ..., \"name\": ...} JSON")
    changing = [c for c in calls if not read_only(c["name"])]
    last = (changing or calls or [None])[-1]
    if last is None:
        return None
    return json.dumps({"name": last["name"], "arguments": last["arguments"]}, ensure_ascii=False)


def first_error(signal: list[float], fallback: list[float], outcome_correct: bool | None, threshold: float) -> int:
    """The first-error rule of ``likelihood-label``.

    Args:
        signal: per step, the value compared with ``threshold`` (``lh_gain`` or ``lh_q``), nats.
        fallback: per step, the value whose minimum names the error of an incorrect row with no step below
            the threshold (``lh_gain`` or ``lh_reward``).
        outcome_correct: the row's graded outcome (only ``False`` triggers the fallback).
        threshold: nats.

    Returns:
        The 0-based first error, or -1 (ProcessBench convention). Ties of the fallback go to the earlier step.
    """
    for i, s in enumerate(signal):
        if s < threshold:
            return i
    if outcome_correct is False and fallback:
        return min(range(len(fallback)), key=lambda i: (fallback[i], i))
    return -1


def calibrate_threshold(rows: list[dict], method: str, gold_col: str) -> dict[str, Any]:
    """The threshold that maximises ProcessBench F1 of :func:`first_error` on labelled rows.

    Candidates are the midpoints between consecutive distinct signal values, plus one below the smallest and
    one above the largest; among the candidates with the best F1 the middle one (by value) is taken.

    Args:
        rows: likelihood-label output rows with ``lh_status == "ok"`` and a gold first error in ``gold_col``.
        method: ``answer-gain`` or ``implicit-prm`` (which columns are the signal and the fallback).
        gold_col: the gold first-error column (ProcessBench convention).

    Returns:
        ``{"threshold", "f1", "acc_erroneous", "acc_correct", "rows", "candidates"}``.

    Raises:
        ConfigError: no usable row, or rows of one kind only (all with an error, or none: no F1).
    """
    sig_col, fb_col = _SIGNAL[method]
    usable = [r for r in rows if r.get("lh_status") == "ok" and r.get(gold_col) is not None and r.get(sig_col)]
    if not usable:
        raise ConfigError(f"--calibrate: no row with lh_status ok, {sig_col} and a {gold_col}")
    values = sorted({float(v) for r in usable for v in r[sig_col]})
    cands = [values[0] - 1.0] + [(a + b) / 2 for a, b in zip(values, values[1:])] + [values[-1] + 1.0]
    if len(cands) > 4000:  # quantiles keep it quick on large shards
        cands = [cands[round(k * (len(cands) - 1) / 3999)] for k in range(4000)]
    gold = [int(r[gold_col]) for r in usable]
    scored = []
    for t in cands:
        pred = [first_error(r[sig_col], r[fb_col], r.get("outcome_correct"), t) for r in usable]
        f = processbench_f1(gold, pred)
        scored.append((f["f1"] if f["f1"] is not None else -1.0, t, f))
    best = max(s[0] for s in scored)
    if best < 0:
        raise ConfigError(f"--calibrate: ProcessBench F1 needs rows with an error and rows without one "
                          f"({gold_col}); these {len(usable)} rows have only one kind")
    ties = [s for s in scored if s[0] == best]
    _, t, f = ties[len(ties) // 2]
    return {"threshold": t, "f1": f["f1"], "acc_erroneous": f["acc_erroneous"], "acc_correct": f["acc_correct"],
            "rows": len(usable), "candidates": len(cands)}


def _read_calibration(path: str, cfg: "LikelihoodConfig", identity: dict[str, Any]) -> dict[str, Any]:
    """Read ``--calibrate``'s shard, check it was labelled the same way, and calibrate on it."""
    from stepkit.shards import file_sha256, open_parquet, read_manifest, read_rows, resolve_path

    p = resolve_path(path)
    schema = open_parquet(p).schema_arrow
    sig_col, fb_col = _SIGNAL[cfg.method]
    for col in ("steps", sig_col, fb_col, "lh_status", cfg.calibrate_col):
        if col not in schema.names:
            hint = " (run likelihood-label on it first)" if col.startswith("lh_") else ""
            raise InputError(p, f"missing column{hint}", column=col)
    manifest = read_manifest(p) or {}
    theirs = (manifest.get("config") or {}) if manifest.get("stage") == "likelihood-label" else None
    if theirs is None:
        raise InputError(p, "not a likelihood-label output (its manifest is missing or of another stage)")
    def unseeded(doc):  # scoring samples nothing: the seed does not change a value
        return {k: v for k, v in doc.items() if k != "seed"} if isinstance(doc, dict) else doc

    for key in ("method", "engine", "answer_scaffold", "beta", "reference_model"):
        if key in identity and unseeded(theirs.get(key)) != unseeded(identity[key]):
            raise InputError(p, f"labelled with another {key} ({theirs.get(key)!r}; this run: {identity[key]!r}): "
                             f"calibrate on a shard labelled like this run")
    for col, want in ((sig_col, "list<float>"), (fb_col, "list<float>"), (cfg.calibrate_col, "int")):
        t = schema.field(col).type
        ok = pa.types.is_integer(t) if want == "int" else (
            (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_floating(t.value_type))
        if not ok:
            raise InputError(p, f"expected {want}, found {t}", column=col)
    rows = read_rows(p, ["id", "steps", sig_col, fb_col, "lh_status", "outcome_correct", cfg.calibrate_col])
    for i, r in enumerate(rows):
        if r.get("lh_status") != "ok":
            continue
        n = len(r.get("steps") or [])
        for col in (sig_col, fb_col):
            values = r.get(col)
            if values is None or len(values) != n or any(v is None or not math.isfinite(v) for v in values):
                raise InputError(p, f"a row with lh_status ok needs {n} finite values", row=i, column=col)
        gold = r.get(cfg.calibrate_col)
        if gold is not None and not -1 <= gold < n:
            raise InputError(p, f"first error {gold} outside -1..{n - 1}", row=i, column=cfg.calibrate_col)
    result = calibrate_threshold(rows, cfg.method, cfg.calibrate_col)
    return {**result, "shard": str(p), "sha256": file_sha256(p), "column": cfg.calibrate_col}


def check_model(spec: EngineSpec, flag: str) -> None:
    """Refuse a model the engine cannot have, before any model loads: a scripted name that does not exist,
    a scripted name with another engine, or (vllm) neither a registry name nor a model folder.

    Raises:
        ConfigError: naming ``flag``.
    """
    if spec.factory is not None:
        return
    if spec.model.startswith("scripted") != (spec.name == "scripted"):
        raise ConfigError(f"{flag} {spec.model}: the scripted stand-ins go with --engine scripted, and only they")
    if spec.name == "scripted":
        from stepkit.engines.scripted import ScriptedEngine

        ScriptedEngine.from_spec(spec.model)
    elif spec.name == "vllm":
        from stepkit.models import REGISTRY, check_folder

        if spec.model not in REGISTRY:
            check_folder(spec.model, flag, tokenizer=True)


def _same_model(a: EngineSpec, b: EngineSpec) -> bool:
    """Whether two engine specs name one model: the same name, or (vllm) the same folder once resolved."""
    if a.factory is not None or b.factory is not None or a.name != b.name:
        return False
    if a.model == b.model:
        return True
    if a.name == "vllm":
        from pathlib import Path

        from stepkit.models import REGISTRY, model_dir

        def where(m: str) -> Path:
            return (model_dir(m) if m in REGISTRY else Path(m).expanduser()).resolve()

        return where(a.model) == where(b.model)
    return False


class LikelihoodStage(LabelerStage):
    """The ``likelihood-label`` stage (see the module docstring for the methods and columns).

    Args:
        cfg: its options (:class:`LikelihoodConfig`).
        engine: the scoring engine (``--model``: the policy for implicit-prm).
        sampling: unused by scoring (kept for the engine-stage contract: seed and provenance).
        scaffold: the answer scaffold; default ``cfg.template``'s file, else the built-in one.
        reference: the reference model's engine for implicit-prm (default: ``engine`` with
            ``cfg.reference_model`` as its model, which must be another model than ``engine``'s: one model
            against itself gives every step a reward of exactly 0).

    Raises:
        ConfigError: an unreadable scaffold; ``--reference-model`` naming the policy model itself; InputError: a
            bad ``--calibrate`` shard.
    """

    name = "likelihood-label"
    required_columns = ("id", "prompt", "steps", "step_separator", "reference_answer", "outcome_correct")
    optional_columns = CONVERSATION_STEP_COLUMNS  # checked against the steps (gold-action prefixes hold them)
    default_chunk_size = 64
    columns = COLUMNS
    grades_answers = False
    tokens_kind = "scored"  # prompt tokens prefilled, nothing is generated

    def __init__(self, cfg: LikelihoodConfig, engine: EngineSpec, sampling: SamplingConfig,
                 scaffold: AnswerScaffold | None = None, reference: EngineSpec | None = None):
        super().__init__(cfg, engine, sampling)
        agent = cfg.target == "gold-action"
        self.scaffold = scaffold or load_answer_scaffold(cfg.template or ("likelihood-agent" if agent else None))
        if agent:
            self.required_columns = tuple(c for c in self.required_columns if c != "reference_answer") + (
                "reference_actions", "step_observations")
        self.reference_spec = None
        if cfg.method == "implicit-prm":
            self.reference_spec = reference or EngineSpec(engine.name, cfg.reference_model, engine.seed,
                                                          dict(engine.options))
            check_model(self.reference_spec, "--reference-model")
            if reference is None and _same_model(engine, self.reference_spec):
                raise ConfigError(f"--reference-model {cfg.reference_model} is the policy model itself: implicit-prm's "
                                  "reward is the log-ratio of two models, so every step would get exactly 0; give "
                                  "the policy's base model (the one it was trained from) as --reference-model")
            self.default_chunk_size = 1024  # each chunk swaps the two models once
            self.required_columns = tuple(c for c in self.required_columns if c != "reference_answer")
        self.calibration = _read_calibration(cfg.calibrate, cfg, self._method_identity()) if cfg.calibrate else None
        self.threshold = (self.calibration["threshold"] if self.calibration else
                          cfg.threshold if cfg.threshold is not None else DEFAULT_THRESHOLD[cfg.method])
        self._loaded: dict[str, Any] = {}  # implicit-prm: the one engine loaded now ("policy" or "reference")
        self._described: dict[str, Any] = {}
        self._scored_before = 0  # prompt tokens scored by engines closed since (implicit-prm swaps them)

    # -- runner interface -------------------------------------------------------------------------
    def _method_identity(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"method": self.cfg.method, "engine": self.engine_spec.identity(),
                               "answer_scaffold": {"version": self.scaffold.version, "hash": self.scaffold.hash()}}
        if self.reference_spec is not None:
            doc.update(beta=self.cfg.beta, reference_model=self.reference_spec.identity())
        if self.cfg.target != "answer":
            doc["target"] = self.cfg.target
        return doc

    def config(self) -> dict[str, Any]:
        doc = {**super().config(), **self._method_identity(), "threshold": self.threshold}
        doc.pop("sampling", None)  # nothing is sampled
        if self.reference_spec is None:
            doc.pop("beta", None)  # implicit-prm's
        if self.calibration:
            doc["calibration"] = {"sha256": self.calibration["sha256"], "column": self.calibration["column"]}
        return doc

    def validate(self, rows, path, first_row):
        super().validate(rows, path, first_row)
        for k, r in enumerate(rows):
            if not r.get("error") and not isinstance(r.get("step_separator"), str):
                raise InputError(path, "expected a string (how the steps are joined)", row=first_row + k,
                                 column="step_separator")

    def open(self) -> None:
        if self.reference_spec is None:
            super().open()

    def close(self) -> None:
        super().close()
        for engine in self._loaded.values():
            engine.close()
        self._loaded.clear()

    def provenance(self) -> dict[str, Any]:
        doc = {"engine": self.engine.describe() if self.engine else None,
               "answer_scaffold": {"version": self.scaffold.version, "hash": self.scaffold.hash(),
                                   "system": self.scaffold.system, "user": self.scaffold.user,
                                   "answer_prefix": self.scaffold.answer_prefix, "answer": self.scaffold.answer},
               "threshold": self.threshold,
               "note": "prompt-log-prob requests skip vLLM's prefix cache by default; the offline vllm engine "
                       "reads it and keeps the positions after the cached prefix (--engine openai: no cache)"}
        if self.calibration:
            doc["calibration"] = self.calibration
        if self.reference_spec is not None:
            for key, which, spec in (("engine", "policy", self.engine_spec), ("reference_engine", "reference",
                                                                              self.reference_spec)):
                doc[key] = self._described.get(which) or {
                    **spec.identity(), "note": "not loaded in this run: every chunk was resumed"}
        return doc

    def tokens_generated(self) -> int:
        """Prompt tokens scored so far (both models' for implicit-prm)."""
        engines = [self.engine] if self.engine else list(self._loaded.values())
        return self._scored_before + sum(e.stats.scored_tokens for e in engines)

    # -- the method ---------------------------------------------------------------------------------
    def process(self, rows: list[dict]) -> tuple[list[dict], dict[str, int]]:
        """Label one chunk: every text of every row goes to the engine in one ``score`` call (two for
        implicit-prm, one per model). Returns the rows with ``lh_*`` columns and the chunk's counters
        (``texts``, ``scored_tokens``: tokens of the texts scored, ``cached_tokens``: of them read from the
        engine's prefix cache, ``no_answer``)."""
        counters = {"texts": 0, "scored_tokens": 0, "cached_tokens": 0, "no_answer": 0}
        out = [{**row, **_EMPTY} for row in rows]
        todo = [r for r in out if not r.get("error")]
        if self.cfg.method == "answer-gain":
            self._answer_gain(todo, counters)
        else:
            self._implicit_prm(todo, counters)
        for r in todo:
            if r.get("error"):
                r.update(_EMPTY)
        return out, counters

    def _answer_gain(self, rows: list[dict], counters: dict[str, int]) -> None:
        engine = self.engine
        plan = []  # (row, first request index)
        requests: list[ScoreRequest] = []
        agent = self.cfg.target == "gold-action"
        for r in rows:
            if agent:
                try:
                    answer = gold_action_answer(r.get("reference_actions"))
                except ValueError as e:
                    r["error"] = RowError(self.name, str(e))
                    continue
            else:
                answer = r.get("reference_answer")
            if answer is None or not str(answer).strip():
                r["lh_status"] = "no_answer"
                counters["no_answer"] += 1
                continue
            chat = self.scaffold.chat(engine, r["prompt"])
            plan.append((r, len(requests)))
            for i in range(len(r["steps"]) + 1):
                text, span = self.scaffold.answer_text(chat, r["steps"], r["step_separator"], i, str(answer).strip(),
                                                       r.get("step_observations") if agent else None)
                requests.append(ScoreRequest(text, (span,)))
        # The text after all the steps first: every shorter prefix of the row then reads it from the prefix
        # cache (engines that have one), so a row costs about one full prefill plus a tail per step.
        ends = {first + len(r["steps"]) for r, first in plan}
        order = sorted(range(len(requests)), key=lambda k: k not in ends)
        split = len(ends)
        cached_before = engine.stats.extra.get("scored_cached_tokens", 0)
        got = engine.score([requests[k] for k in order[:split]]) + engine.score([requests[k] for k in order[split:]])
        scores: list = [None] * len(requests)
        for k, s in zip(order, got):
            scores[k] = s
        counters["texts"] += len(requests)
        counters["cached_tokens"] += engine.stats.extra.get("scored_cached_tokens", 0) - cached_before
        for r, first in plan:
            got = scores[first:first + len(r["steps"]) + 1]
            failed = next((s.error for s in got if s.error), None)
            if failed:
                r["error"] = RowError(self.name, f"engine: {failed}")
                continue
            values = [s.sums[0] for s in got]
            gains = [b - a for a, b in zip(values, values[1:])]
            scored = sum(len(s.token_ids) for s in got)
            counters["scored_tokens"] += scored
            fe = first_error(gains, gains, r.get("outcome_correct"), self.threshold)
            r.update(lh_value_start=values[0], lh_value=values[1:], lh_gain=gains, lh_first_error=fe,
                     lh_label=labels_from_first_error(fe, len(r["steps"])),
                     lh_answer_tokens=len(got[0].span_tokens[0]), lh_scored_tokens=scored, lh_status="ok")

    def _implicit_prm(self, rows: list[dict], counters: dict[str, int]) -> None:
        requests = []
        for r in rows:  # steps are non-empty (checked in validate)
            chat = self.scaffold.chat(self._render_engine(), r["prompt"])
            text, spans, pos = chat, [], len(chat)
            for k, step in enumerate(r["steps"]):
                if k:
                    text += r["step_separator"]
                    pos += len(r["step_separator"])
                spans.append((pos, pos + len(step)))
                text += step
                pos += len(step)
            requests.append((r, ScoreRequest(text, tuple(spans))))
        rows = [r for r, _ in requests]
        scores = {}
        order = sorted(("policy", "reference"), key=lambda k: k not in self._loaded)  # the loaded one first
        for which in order:
            engine = self._engine(which)
            scores[which] = engine.score([q for _, q in requests])
        counters["texts"] += 2 * len(requests)
        for k, r in enumerate(rows):
            pol, ref = scores["policy"][k], scores["reference"][k]
            failed = pol.error or ref.error
            if failed:
                r["error"] = RowError(self.name, f"engine: {failed}")
                continue
            if pol.token_ids != ref.token_ids:
                raise ConfigError(f"--model {self.engine_spec.model} and --reference-model {self.reference_spec.model} "
                                  f"tokenise row {r['id']!r} differently: implicit-prm needs one tokenizer")
            rewards = [self.cfg.beta * (a - b) for a, b in zip(pol.sums, ref.sums)]
            q = [math.fsum(rewards[:i + 1]) for i in range(len(rewards))]
            scored = len(pol.token_ids) + len(ref.token_ids)
            counters["scored_tokens"] += scored
            fe = first_error(q, rewards, r.get("outcome_correct"), self.threshold)
            r.update(lh_reward=rewards, lh_q=q, lh_first_error=fe, lh_label=labels_from_first_error(fe, len(r["steps"])),
                     lh_scored_tokens=scored, lh_status="ok")

    def _render_engine(self):
        """An engine for rendering the chat prompt (any loaded one: the two share a tokenizer)."""
        if not self._loaded:
            self._engine("policy")
        return next(iter(self._loaded.values()))

    def _engine(self, which: str):
        """The ``policy`` or ``reference`` engine, loaded after the other is closed (never both at once)."""
        if which not in self._loaded:
            for other in list(self._loaded):
                closing = self._loaded.pop(other)
                self._scored_before += closing.stats.scored_tokens
                closing.close()
            spec = self.engine_spec if which == "policy" else self.reference_spec
            self._loaded[which] = spec.build()
            self._described = {**self._described, which: self._loaded[which].describe()}
        return self._loaded[which]
