"""``prm-label``: every step of a trajectory scored by a trained process reward model (PRM).

Kinds (``--kind``; read from the model's ``config.json`` when not given):

* ``token-classification`` — a ``*ForTokenClassification`` model, such as ``stepkit train-prm`` writes. The row
  is laid out as it was trained (:func:`stepkit.stepwise.encode`: prompt, then each step, each followed by the
  separator, tokenised piece by piece; separator and BOS from the folder's ``stepkit-prm.json``, else ``"\\n"``
  and none) and the score of step i is the softmax probability of the "correct" class at the last token of
  ``step_i + separator``. Served by vLLM's pooling runner (:mod:`stepkit.engines.vllm_pooling`).
* ``qwen-prm`` — a PRM with a two-class reward head read at a special step tag (Qwen2.5-Math-PRM's layout,
  ``Qwen2ForProcessRewardModel``, Qwen's "The Lessons of Developing Process Reward Models in Mathematical
  Reasoning"): the chat template over the system prompt ``Please reason step by step, and put your final answer
  within \\boxed{}.``, the problem, and the assistant turn ``step_0<extra_0>step_1<extra_0>...``; the score of
  step i is ``softmax(logits)[1]`` at its tag. Through vLLM's pooling runner where vLLM supports the
  architecture.
* ``math-shepherd`` — a causal LM trained to write ``+`` or ``-`` after a step tag (Math-Shepherd, Wang et al.
  2024): the text ``problem + " Step 1: " + step_0 + " ки" + "\\n" + "Step 2: " + step_1 + " ки" ...`` (the released
  rows' layout, ``export --format math-shepherd``'s ``input`` with its default ``\\n``), and the score of step i is ``P(+) / (P(+) + P(-))`` of the token after its tag
  (the official reading compares the two logits at the tag). Read through the engine's scoring call
  (:meth:`stepkit.engines.base.Engine.score`) as a forced continuation: the text up to the tag followed by
  ``+``, and by ``-``, each one token (checked), two texts per step sharing their prefix.

Columns (list columns have one entry per step):

* ``prm_score`` (list<float32>): the probability that the step is correct;
* ``prm_label`` (list<bool>): ``prm_score >= threshold``;
* ``prm_first_error`` (int32): the first step whose score is below the threshold, -1 if none (ProcessBench's
  convention; no outcome fallback: a PRM is read without the gold answer);
* ``prm_tokens`` (int32): tokens of the row's texts read by the model;
* ``prm_status``: ``ok`` (a row that cannot be read, e.g. longer than the context, gets an ``error``).

Threshold: ``--threshold`` (default 0.5), or ``--calibrate SHARD``: the threshold that maximises ProcessBench F1
on another prm-label output of the same model and kind with gold first errors (recorded in the manifest).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from stepkit.columns import Column
from stepkit.engines.base import EngineSpec, SamplingConfig, ScoreRequest
from stepkit.errors import ConfigError, InputError, RowError
from stepkit.metrics import processbench_f1
from stepkit.options import Config, opt
from stepkit.stage import LabelerStage
from stepkit.stages.export_text import numbered
from stepkit.stepwise import encode_text

KINDS = ("token-classification", "qwen-prm", "math-shepherd")
POOLING_KINDS = ("token-classification", "qwen-prm")
DEFAULT_TAG = {"qwen-prm": "<extra_0>", "math-shepherd": " ки"}
QWEN_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
TEMPLATE_VERSION = 2  # the text layouts above; a change of layout bumps it (it is in the identity)
# 2: math-shepherd's step lines drop a step's own leading 'Step N:' marker of any N (export_text.numbered)

COLUMNS = (
    Column("prm_score", pa.list_(pa.float32()), "the PRM's probability that the step is correct", per_step=True,
           role="value", scale="unit", status="prm_status"),
    Column("prm_label", pa.list_(pa.bool_()), "prm_score >= the threshold", per_step=True, role="label",
           status="prm_status"),
    Column("prm_first_error", pa.int32(), "the first step whose prm_score is below the threshold, -1 if none",
           role="first_error", status="prm_status"),
    Column("prm_tokens", pa.int32(), "tokens of the row's texts read by the model"),
    Column("prm_status", pa.string(), "ok", role="status", values=("ok",)),
)
_EMPTY = {c.name: None for c in COLUMNS}


@dataclass(frozen=True)
class PRMLabelConfig(Config):
    """Options of ``prm-label``.

    Raises:
        ConfigError: ``--threshold`` with ``--calibrate``; ``--calibrate-col`` without ``--calibrate``; a tag
            option with a kind that has none.
    """

    kind: str | None = opt(None, "token-classification, qwen-prm or math-shepherd [default: from the model's "
                           "config.json].", choices=KINDS)
    threshold: float | None = opt(None, "First error: the first step whose prm_score is below this [default 0.5].",
                                  min=0, max=1)
    calibrate: str | None = opt(None, "A prm-label output (same model and kind) with gold first errors: pick the "
                                "threshold that maximises ProcessBench F1 on it.", identity=False)
    calibrate_col: str = opt("reference_first_error", "--calibrate: the gold first-error column.", identity=False)
    step_tag: str | None = opt(None, "qwen-prm / math-shepherd: the step tag [default <extra_0> / ' ки'].")
    good_token: str = opt("+", "math-shepherd: the text after the tag that means a correct step.")
    bad_token: str = opt("-", "math-shepherd: the text after the tag that means a wrong step.")
    step_separator: str | None = opt(None, "token-classification: the separator [default: the model's "
                                     "stepkit-prm.json, else a newline].")

    def __post_init__(self):
        super().__post_init__()
        if self.threshold is not None and self.calibrate:
            raise ConfigError("give --threshold or --calibrate, not both")
        if not self.calibrate and self.calibrate_col != "reference_first_error":
            raise ConfigError("--calibrate-col is for --calibrate")
        if self.step_tag is not None and not self.step_tag.strip():  # ('' read as "the default", silently)
            raise ConfigError(f"--step-tag {self.step_tag!r}: a step tag is text the model reads after each step")
        if self.step_separator is not None:  # typed in a shell: \n is a newline, as export and train-prm read it
            from stepkit.stages import export_text

            object.__setattr__(self, "step_separator", export_text.unescape(self.step_separator))
            export_text.check_separator_option(self.step_separator)


def kind_of(config: dict, model: str) -> str:
    """The PRM kind a model's ``config.json`` (as a dict) names, by its architecture.

    Raises:
        ConfigError: an architecture prm-label cannot read (one line naming what it reads).
    """
    archs = config.get("architectures") or []
    for a in archs:
        if a == "Qwen2ForProcessRewardModel":
            return "qwen-prm"
        if a.endswith("ForTokenClassification"):
            return "token-classification"
        if a.endswith("ForCausalLM"):
            return "math-shepherd"
    raise ConfigError(f"--model {model}: {', '.join(archs) or 'no architecture in its config.json'} is no PRM "
                      f"prm-label reads: it reads *ForTokenClassification models (stepkit train-prm's), "
                      f"Qwen2ForProcessRewardModel (Qwen2.5-Math-PRM, its <extra_0> step tag) and causal LMs "
                      f"read at a Math-Shepherd step tag (*ForCausalLM)")


def first_error(scores: list[float], threshold: float) -> int:
    """The first step whose score is below ``threshold``, -1 if none."""
    return next((i for i, s in enumerate(scores) if s < threshold), -1)


def calibrate_threshold(rows: list[dict], gold_col: str) -> dict[str, Any]:
    """The threshold maximising ProcessBench F1 of :func:`first_error` on rows with ``prm_score`` and a gold first
    error: candidates are the midpoints of consecutive distinct scores (and one beyond each end); of the best the
    middle one is taken. Returns ``{"threshold", "f1", "acc_erroneous", "acc_correct", "rows"}``.

    Raises:
        ConfigError: no usable row, or rows of one kind only (no F1).
    """
    usable = [r for r in rows if r.get("prm_status") == "ok" and r.get(gold_col) is not None and r.get("prm_score")]
    if not usable:
        raise ConfigError(f"--calibrate: no row with prm_status ok, prm_score and a {gold_col}")
    values = sorted({float(v) for r in usable for v in r["prm_score"]})
    cands = [values[0] - 1e-3] + [(a + b) / 2 for a, b in zip(values, values[1:])] + [values[-1] + 1e-3]
    if len(cands) > 4000:
        cands = [cands[round(k * (len(cands) - 1) / 3999)] for k in range(4000)]
    gold = [int(r[gold_col]) for r in usable]
    scored = []
    for t in cands:
        f = processbench_f1(gold, [first_error(r["prm_score"], t) for r in usable])
        scored.append((f["f1"] if f["f1"] is not None else -1.0, t, f))
    best = max(s[0] for s in scored)
    if best < 0:
        raise ConfigError(f"--calibrate: ProcessBench F1 needs rows with an error and rows without one ({gold_col})")
    ties = [s for s in scored if s[0] == best]
    _, t, f = ties[len(ties) // 2]
    return {"threshold": min(max(t, 0.0), 1.0), "f1": f["f1"], "acc_erroneous": f["acc_erroneous"],
            "acc_correct": f["acc_correct"], "rows": len(usable)}


class PRMLabelStage(LabelerStage):
    """The ``prm-label`` stage (see the module docstring for the kinds and columns).

    Args:
        cfg: its options.
        engine: the engine (``--model`` is the PRM); token-classification and qwen-prm build the vllm engine on
            vLLM's pooling runner from it, math-shepherd the engine itself (any engine that scores text).
        sampling: unused (nothing is sampled; kept for the engine-stage contract: the seed).
        model_config: the model's ``config.json`` and ``stepkit-prm.json`` as dicts (tests with a scripted engine
            give them; default: read from the model's folder).

    Raises:
        ConfigError: an unsupported model, a kind the engine cannot serve, a bad ``--calibrate`` shard.
    """

    name = "prm-label"
    required_columns = ("id", "prompt", "steps")
    default_chunk_size = 64
    columns = COLUMNS
    grades_answers = False
    tokens_kind = "scored"

    def __init__(self, cfg: PRMLabelConfig, engine: EngineSpec, sampling: SamplingConfig | None = None,
                 model_config: tuple[dict, dict | None] | None = None):
        super().__init__(cfg, engine, sampling or SamplingConfig(temperature=0, max_tokens=1, seed=engine.seed))
        config, prm = model_config if model_config is not None else self._read_model(engine)
        self.prm_file = prm or {}
        if cfg.kind is None and config is None:
            raise ConfigError(f"--model {engine.model}: give --kind ({', '.join(KINDS)}): the {engine.name} engine "
                              f"has no model config to read it from")
        self.kind = cfg.kind or kind_of(config, engine.model)
        if config is not None and cfg.kind is not None and kind_of(config, engine.model) != cfg.kind:
            raise ConfigError(f"--kind {cfg.kind}: --model {engine.model} is a {kind_of(config, engine.model)} model "
                              f"({', '.join(config.get('architectures') or [])})")
        if self.kind in POOLING_KINDS and engine.factory is None and engine.name != "vllm":
            raise ConfigError(f"--kind {self.kind} is read by vLLM's pooling runner: use --engine vllm")
        if self.kind == "token-classification" and cfg.step_tag is not None:
            raise ConfigError("--step-tag is for --kind qwen-prm or math-shepherd")
        if self.kind != "token-classification" and cfg.step_separator is not None:
            raise ConfigError("--step-separator is for --kind token-classification (the others use their tag)")
        self.tag = cfg.step_tag or DEFAULT_TAG.get(self.kind)
        self.separator = (cfg.step_separator if cfg.step_separator is not None else
                          self.prm_file.get("step_separator", "\n"))
        self.bos_id = self.prm_file.get("bos_token_id")
        label2id = (config or {}).get("label2id") or {}
        self.correct = int(self.prm_file.get("correct_label", label2id.get("correct", 1)))
        self.calibration = self._calibrate(cfg) if cfg.calibrate else None
        self.threshold = (self.calibration["threshold"] if self.calibration else
                          cfg.threshold if cfg.threshold is not None else 0.5)

    @staticmethod
    def _read_model(engine: EngineSpec) -> tuple[dict | None, dict | None]:
        if engine.factory is not None or engine.name != "vllm":
            return None, None
        from stepkit.models import resolve_model

        folder = Path(resolve_model(engine.model))
        try:
            config = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"--model {engine.model}: cannot read {folder / 'config.json'} ({e})") from None
        from stepkit.stages.train_prm import read_prm_file

        return config, read_prm_file(folder)

    def _layout(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"kind": self.kind, "template_version": TEMPLATE_VERSION}
        if self.kind == "token-classification":
            doc.update(step_separator=self.separator, bos_token_id=self.bos_id, correct_label=self.correct,
                       layout=self.prm_file.get("layout", "stepwise-v1"))
        else:
            doc["step_tag"] = self.tag
        if self.kind == "math-shepherd":
            doc.update(good_token=self.cfg.good_token, bad_token=self.cfg.bad_token, joiner="\n")
        if self.kind == "qwen-prm":
            doc["system"] = QWEN_SYSTEM
        return doc

    def _calibrate(self, cfg: PRMLabelConfig) -> dict[str, Any]:
        from stepkit.shards import file_sha256, read_manifest, read_rows, resolve_path

        p = resolve_path(cfg.calibrate)
        manifest = read_manifest(p) or {}
        if manifest.get("stage") != "prm-label":
            raise InputError(p, "not a prm-label output (its manifest is missing or of another stage)")
        theirs = manifest.get("config") or {}

        def strip(d):  # scoring samples nothing: the seed changes no value
            return {k: v for k, v in d.items() if k != "seed"} if isinstance(d, dict) else d

        for key, want in (("layout", self._layout()), ("engine", self.engine_spec.identity())):
            if strip(theirs.get(key)) != strip(want):
                raise InputError(p, f"labelled with another {key} ({theirs.get(key)!r}; this run: {want!r}): "
                                    "calibrate on a shard labelled like this run")
        rows = read_rows(p, columns=["prm_score", "prm_status", cfg.calibrate_col])
        return {**calibrate_threshold(rows, cfg.calibrate_col), "shard": str(p), "sha256": file_sha256(p),
                "column": cfg.calibrate_col}

    # -- runner interface -------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        doc = {**super().config(), "layout": self._layout(), "threshold": self.threshold}
        for k in ("sampling", "kind", "step_tag", "good_token", "bad_token", "step_separator"):
            doc.pop(k, None)  # nothing is sampled; the rest is in the layout
        if self.calibration:
            doc["calibration"] = {"sha256": self.calibration["sha256"], "column": self.calibration["column"]}
        return doc

    def open(self) -> None:
        if self.kind in POOLING_KINDS:
            spec = self.engine_spec
            if spec.factory is not None:
                self.engine = spec.factory()
            else:
                from stepkit.engines.vllm_pooling import VLLMPoolingEngine

                self.engine = VLLMPoolingEngine(spec.model, seed=spec.seed, **spec.options)
        else:
            super().open()
        self._check_tags()

    def _check_tags(self) -> None:
        """The tag (qwen-prm) is one token; the good/bad tokens (math-shepherd) are one token each after the tag."""
        if self.kind == "qwen-prm":
            ids, _ = self.engine.tokenize_offsets(self.tag)
            if len(ids) != 1:
                raise ConfigError(f"--step-tag {self.tag!r} is {len(ids)} tokens in this model's tokenizer; a "
                                  f"qwen-prm tag is one special token")
            self.tag_id = ids[0]
        elif self.kind == "math-shepherd":
            for flag, tok in (("--good-token", self.cfg.good_token), ("--bad-token", self.cfg.bad_token)):
                _, offsets = self.engine.tokenize_offsets("x" + self.tag + tok)
                starts = [a for a, _ in offsets]
                if len(self.tag) + 1 not in starts or offsets[-1][0] != len(self.tag) + 1:
                    raise ConfigError(f"{flag} {tok!r}: not one token after the step tag {self.tag!r} in this "
                                      f"model's tokenizer (it merges with the tag or splits)")

    def provenance(self) -> dict[str, Any]:
        doc = {"engine": self.engine.describe() if self.engine else None, "layout": self._layout(),
               "threshold": self.threshold}
        if self.calibration:
            doc["calibration"] = self.calibration
        return doc

    def tokens_generated(self) -> int:
        return self.engine.stats.scored_tokens if self.engine else 0

    # -- the method ---------------------------------------------------------------------------------
    def process(self, rows: list[dict]) -> tuple[list[dict], dict[str, int]]:
        """Score one chunk in one engine call. Counters: ``texts`` (texts read), ``scored_tokens``."""
        counters = {"texts": 0, "scored_tokens": 0}
        out = [{**row, **_EMPTY} for row in rows]
        todo = [r for r in out if not r.get("error")]
        read = self._math_shepherd if self.kind == "math-shepherd" else self._pooled
        for r, got in zip(todo, read(todo, counters)):
            if isinstance(got, str):
                r["error"] = RowError(self.name, got)
                continue
            scores, tokens = got
            counters["scored_tokens"] += tokens
            fe = first_error(scores, self.threshold)
            r.update(prm_score=scores, prm_label=[s >= self.threshold for s in scores], prm_first_error=fe,
                     prm_tokens=tokens, prm_status="ok")
        return out, counters

    def _ids(self, text: str) -> list[int]:
        return self.engine.tokenize_offsets(text)[0]

    def _pooled(self, rows: list[dict], counters: dict[str, int]) -> list:
        """token-classification and qwen-prm: one text per row, class logits at each step's position."""
        texts, positions = [], []
        for r in rows:
            if self.kind == "token-classification":
                enc = encode_text(self._ids, r["prompt"], r["steps"], self.separator, bos_id=self.bos_id)
                texts.append(enc.input_ids)
                positions.append(enc.positions)
            else:
                if any(self.tag in s for s in r["steps"]):
                    texts.append(None)
                    positions.append(f"a step contains the step tag {self.tag!r}")
                    continue
                chat = self.engine.render_chat([{"role": "system", "content": QWEN_SYSTEM},
                                                {"role": "user", "content": r["prompt"]}])
                ids = self._ids(chat + self.tag.join(r["steps"]) + self.tag)
                pos = [j for j, t in enumerate(ids) if t == self.tag_id]
                texts.append(ids)
                positions.append(pos if len(pos) == len(r["steps"]) else
                                 f"{len(pos)} step tags for {len(r['steps'])} steps (the tag is in the prompt?)")
        send = [k for k, p in enumerate(positions) if not isinstance(p, str)]
        logits = self.engine.classify_tokens([texts[k] for k in send]) if send else []
        counters["texts"] += len(send)
        got: list[Any] = list(positions)
        for k, lg in zip(send, logits):
            if isinstance(lg, str):
                got[k] = f"engine: {lg}"
                continue
            got[k] = ([_softmax(lg[j])[self.correct] for j in positions[k]], len(texts[k]))
        return got

    def _math_shepherd(self, rows: list[dict], counters: dict[str, int]) -> list:
        """Two forced continuations per step (good, bad), all of a chunk in one scoring call."""
        requests, plan = [], []
        for r in rows:
            if any(self.tag in s for s in r["steps"]):
                plan.append(f"a step contains the step tag {self.tag!r}")
                continue
            plan.append(len(requests))
            text = r["prompt"].strip() + " "  # the released rows' layout, as export --format math-shepherd writes it
            for k, step in enumerate(r["steps"]):
                text += ("\n" if k else "") + numbered(k + 1, step) + self.tag
                for tok in (self.cfg.good_token, self.cfg.bad_token):
                    requests.append(ScoreRequest(text + tok, ((len(text), len(text) + len(tok)),)))
        # longest texts first: the shorter prefixes of a row then read them from the prefix cache
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i].text))
        scored: list[Any] = [None] * len(requests)
        for i, s in zip(order, self.engine.score([requests[i] for i in order]) if requests else []):
            scored[i] = s
        counters["texts"] += len(requests)
        got: list[Any] = []
        for r, first in zip(rows, plan):
            if isinstance(first, str):
                got.append(first)
                continue
            mine = scored[first:first + 2 * len(r["steps"])]
            failed = next((s.error for s in mine if s.error), None)
            if failed:
                got.append(f"engine: {failed}")
                continue
            scores = [_sigmoid(g.sums[0] - b.sums[0]) for g, b in zip(mine[::2], mine[1::2])]
            got.append((scores, sum(len(s.token_ids) for s in mine)))
        return got


def _softmax(xs: list[float]) -> list[float]:
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    s = sum(e)
    return [x / s for x in e]


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))
