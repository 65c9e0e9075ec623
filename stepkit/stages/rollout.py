"""``rollout``: sample N solutions per problem, split them into steps, extract and grade the answer.

Input: a problems shard (``problem_id``, ``source``, ``prompt``, ``reference_answer``). Output: one
trajectory row per sample (``docs/architecture.md``, "Records"), id ``<problem_id>:r<j>``, plus
``rollout_finish_reason`` (``stop``/``length``/``error``), ``rollout_prompt_tokens`` and
``rollout_completion_tokens``. A sample cut off by ``max_tokens`` is kept and marked
(``rollout_finish_reason = "length"``, ``outcome_correct`` null): it is not graded as wrong, and
``mc-label`` passes it through as ``ungraded``. So is a sample whose answer check timed out or crashed
the checker's worker (a pathological expression: counted as ``ungradable``). A sample with no step at all
keeps an ``error``.

The prompt is a :class:`RolloutPrompt`: optional system message, few-shot exemplars (real solved
problems, as earlier user/assistant turns) and the user message with an answer-format instruction; by
default it asks for one step per line and a final "The answer is N." line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from stepkit.columns import Column, fields
from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.errors import ConfigError, InputError, RowError, parse_failure
from stepkit.grading.answers import extract_final_answer
from stepkit.grading.steps import check_split, split_steps
from stepkit.options import Config, check_field, field_names, opt
from stepkit.per_row import check_golds, engine_error, sample_parsed
from stepkit.schema import PROBLEM_FIELDS, TRAJECTORY_FIELDS, check_values
from stepkit.shards import config_hash
from stepkit.stage import EngineStage

DEFAULT_INSTRUCTION = ("Solve the math problem step by step. Write one step per line, then a last line "
                       "'The answer is N.'")


@dataclass(frozen=True)
class RolloutPrompt:
    """How rollout prompts are built (hashed into the manifest).

    Attributes:
        instruction: answer-format instruction placed before the problem.
        system: optional system message.
        fewshot: exemplars, each ``{"problem": str, "steps": [str], "answer": str}``; rendered as
            earlier user/assistant turns, the assistant's steps one per line and "The answer is N.".
        split: how generated text is split into steps (see :func:`stepkit.grading.steps.split_steps`).
    """

    instruction: str = DEFAULT_INSTRUCTION
    system: str | None = None
    fewshot: tuple[dict, ...] = ()
    split: str = "newline"
    version: str = "rollout-v1"

    def user(self, problem: str) -> str:
        """The user message for ``problem``."""
        return f"{self.instruction}\n\nProblem: {problem}"

    def messages(self, problem: str) -> list[dict[str, str]]:
        """Chat messages: system (optional), few-shot turns, then the problem."""
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        for ex in self.fewshot:
            msgs.append({"role": "user", "content": self.user(ex["problem"])})
            msgs.append({"role": "assistant", "content": "\n".join(ex["steps"]) + f"\nThe answer is {ex['answer']}."})
        msgs.append({"role": "user", "content": self.user(problem)})
        return msgs

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fewshot": list(self.fewshot)}

    def hash(self) -> str:
        return config_hash(self.to_dict())


def fewshot_from_problems(path: str | Path, k: int) -> tuple[dict, ...]:
    """The first ``k`` problems of a problems shard that have gold steps, as few-shot exemplars.

    Use a shard disjoint from the problems being sampled (e.g. other GSM8K rows).

    Raises:
        ConfigError: fewer than ``k`` usable rows.
    """
    from stepkit.shards import read_rows

    out = []
    for r in read_rows(Path(path)):
        if r.get("reference_steps") and r.get("reference_answer"):
            out.append({"problem": r["prompt"], "steps": list(r["reference_steps"]), "answer": r["reference_answer"]})
        if len(out) == k:
            return tuple(out)
    raise ConfigError(f"{path}: only {len(out)} rows with reference_steps, --fewshot asks for {k}")


@dataclass(frozen=True)
class RolloutConfig(Config):
    """Options of ``rollout``; a recipe file may set any of them (and ``temperature``, ``top_p``,
    ``max_tokens``), a flag given on the command line wins over the recipe.

    The prompt fields enter the identity through the prompt's hash (:meth:`RolloutPrompt.hash`).

    Raises:
        ConfigError: samples < 1, ``fewshot`` without ``fewshot_file``, or an unknown split mode.
    """

    samples: int = opt(4, "N solutions per problem.", short="-n", min=1, max=4096)
    instruction: str = opt(DEFAULT_INSTRUCTION, "Answer-format instruction placed before the problem.",
                           identity=False)
    system: str | None = opt(None, "Optional system message.", flag="--system-prompt", identity=False)
    fewshot: int = opt(0, "Number of few-shot exemplars.", min=0, identity=False)
    fewshot_file: str | None = opt(None, "Problems shard (with reference_steps) to take the exemplars from; use "
                                   "problems disjoint from PROBLEMS.", identity=False)
    split: str = opt("newline", "How to split generated text into steps: newline, blank, step, auto, or a "
                     "separator regex.", identity=False)
    stop: tuple[str, ...] = opt((), "Stop string(s).", identity=False)  # in sampling

    def __post_init__(self):
        super().__post_init__()
        if self.fewshot and not self.fewshot_file:
            raise ConfigError("--fewshot needs --fewshot-file (or fewshot_file in the recipe)")
        check_split(self.split)

    def prompt(self) -> RolloutPrompt:
        """The prompt these options describe (reads the few-shot exemplars from ``fewshot_file``)."""
        return RolloutPrompt(instruction=self.instruction, system=self.system,
                             fewshot=fewshot_from_problems(self.fewshot_file, self.fewshot) if self.fewshot else (),
                             split=self.split)


RECIPE_SAMPLING_KEYS = ("temperature", "top_p", "max_tokens")


def load_recipe(path: str | Path) -> dict[str, Any]:
    """Read a YAML (or JSON) recipe: any field of :class:`RolloutConfig`, ``temperature``, ``top_p``,
    ``max_tokens``, and a free-text ``description``. Each value is checked as its flag would be.

    Raises:
        ConfigError: unreadable file, unknown keys, or a value of the wrong type or range (naming the
            file and the key).
    """
    import yaml

    known = set(field_names(RolloutConfig)) | set(RECIPE_SAMPLING_KEYS) | {"description"}
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read recipe ({str(e).splitlines()[0]})") from None
    except (ValueError, RecursionError) as e:  # an integer over Python's digit limit, nesting too deep
        raise ConfigError(f"{path}: cannot read recipe ({parse_failure(e)})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: a recipe is a mapping of options")
    unknown = set(doc) - known
    if unknown:
        raise ConfigError(f"{path}: unknown recipe keys {sorted(map(str, unknown))} (known: {sorted(known)})")
    if isinstance(doc.get("stop"), str):  # one stop string, not its characters
        doc["stop"] = [doc["stop"]]
    for key, value in doc.items():
        if key == "description":
            ok = isinstance(value, str)
        else:
            try:
                check_field(SamplingConfig if key in RECIPE_SAMPLING_KEYS else RolloutConfig, key, value)
                ok = True
            except ConfigError as e:
                raise ConfigError(f"{path}: recipe key {key!r} has {type(value).__name__} {value!r:.60}: {e}") from None
        if not ok:
            raise ConfigError(f"{path}: recipe key {key!r} has {type(value).__name__} {value!r:.60}, expected text")
    if "split" in doc:
        check_split(doc["split"], f"{path}: recipe key 'split'")
    if doc.get("fewshot_file"):  # relative to the recipe file
        p = Path(doc["fewshot_file"])
        doc["fewshot_file"] = str(p if p.is_absolute() else (Path(path).parent / p))
    return doc


COLUMNS = (
    Column("rollout_finish_reason", pa.string(), "stop, length (cut off by max_tokens: not graded) or error"),
    Column("rollout_prompt_tokens", pa.int32(), "tokens of the rendered prompt"),
    Column("rollout_completion_tokens", pa.int32(), "tokens generated"),
)
OUTPUT_SCHEMA = pa.schema(TRAJECTORY_FIELDS + [f for f in PROBLEM_FIELDS if f.name == "reference_steps"]
                          + fields(COLUMNS))


class RolloutStage(EngineStage):
    """The ``rollout`` stage.

    Args:
        cfg: the stage's options (:class:`RolloutConfig`).
        engine: the engine to sample with (built once, only if there is work).
        sampling: explicit sampling parameters.
        prompt: the prompt (default: ``cfg.prompt()``).
        checker_factory: builds the answer checker (default: the math-verify pool).
        generator: the ``generator`` column value (default: the engine's model name).
    """

    name = "rollout"
    required_columns = ("problem_id", "prompt", "reference_answer")
    default_chunk_size = 32
    columns = COLUMNS
    keep_on_error = frozenset(c.name for c in COLUMNS)  # an engine error's finish reason is "error"
    one_to_one = False

    def __init__(self, cfg: RolloutConfig, engine: EngineSpec, sampling: SamplingConfig,
                 prompt: RolloutPrompt | None = None, checker_factory=None, generator: str | None = None):
        super().__init__(cfg, engine, sampling, checker_factory)
        self.samples, self.prompt = cfg.samples, prompt or cfg.prompt()
        self.generator = generator or engine.model

    def config(self):
        return {**super().config(), "prompt_template": {"version": self.prompt.version, "hash": self.prompt.hash(),
                                                        "recipe": self.prompt.to_dict()}}

    def output_schema(self, input_schema):
        return OUTPUT_SCHEMA

    def check_schema(self, schema, path):
        if "steps" in schema.names:
            raise InputError(path, "has a 'steps' column, so it is a trajectory shard; rollout reads a problems "
                                   "shard (stepkit ingest gsm8k ...)")

    def validate(self, rows, path, first_row):
        if first_row == 0:
            self._seen = set()
        # One row per problem: a trajectory shard (problem_id repeated) would give duplicate ids.
        check_values(rows, path, first_row, ("problem_id", "prompt"), unique="problem_id", seen=self._seen)
        shots = {ex["problem"].strip() for ex in self.prompt.fewshot}
        for i, r in enumerate(rows):  # an exemplar's gold solution in the prompt of its own problem
            if (r.get("prompt") or "").strip() in shots:
                raise InputError(path, "this problem is also a few-shot exemplar (--fewshot-file must hold other "
                                       "problems)", row=first_row + i, column="prompt")

    asynchronous = True  # one request per problem on the engine's asynchronous path: the runner overlaps chunks

    async def aprocess(self, rows):
        """Sample ``samples`` solutions for each problem row (one request of ``samples`` per problem, all
        submitted at once on the engine's asynchronous path, so the next chunk's problems join the engine's
        batch while this chunk's longest solutions finish) and return one trajectory row per sample, plus
        counters (samples, truncated, no_final_answer, correct, ungradable)."""
        prompts = [self.engine.render_chat(self.prompt.messages(r["prompt"])) for r in rows]
        # one request of N samples per problem; every sample is a row (an error completion a row's error)
        import asyncio  # (imported where used: a command's --help loads no asyncio)
        got = await asyncio.gather(*(sample_parsed(self.engine, p, self.sampling, lambda c: c, self.name,
                                                   want=self.samples, stop_on_error=False) for p in prompts))
        results = [g.completions for g in got]
        count = getattr(self.engine, "count_tokens", None)
        # (graded from a worker thread: the event loop keeps the other chunks' requests going meanwhile)
        bad = await check_golds(self.checker, [r["reference_answer"] for r in rows if r.get("reference_answer")])
        out, pairs, graded = [], [], []
        counters = {"samples": 0, "truncated": 0, "no_final_answer": 0, "correct": 0, "ungradable": 0}
        for r, prompt, comps in zip(rows, prompts, results):
            n_prompt = count(prompt) if count else None
            for j, c in enumerate(comps):
                row = {"id": f"{r['problem_id']}:r{j}", "problem_id": r["problem_id"], "source": r.get("source"),
                       "prompt": r["prompt"], "reference_answer": r.get("reference_answer"),
                       "reference_steps": r.get("reference_steps"), "generator": self.generator,
                       "rollout_finish_reason": c.finish_reason, "rollout_prompt_tokens": n_prompt,
                       "rollout_completion_tokens": c.num_tokens, "error": None, "outcome_correct": None,
                       "final_answer": None}
                counters["samples"] += 1
                if c.finish_reason == "error":
                    row.update(steps=[], step_separator="\n", error=engine_error(self.name, c))
                    out.append(row)
                    continue
                steps, sep = split_steps(c.text, self.prompt.split)
                row.update(steps=steps, step_separator=sep, final_answer=extract_final_answer(c.text))
                if not steps:
                    row["error"] = RowError(self.name, "empty completion")
                elif c.truncated:
                    counters["truncated"] += 1  # kept and marked; not graded as wrong
                elif row["reference_answer"] is None:
                    pass  # nothing to grade against
                elif bad.get(row["reference_answer"]):
                    row["error"] = RowError(self.name, f"unusable reference_answer: {bad[row['reference_answer']]}")
                else:
                    if row["final_answer"] is None:
                        counters["no_final_answer"] += 1
                    pairs.append((row["reference_answer"], row["final_answer"]))
                    graded.append(row)
                out.append(row)
        for row, ok in zip(graded, await self.checker.agrade_many(pairs)):
            if ok is None:  # the check timed out or crashed its worker: ungraded, not wrong
                counters["ungradable"] += 1
                continue
            row["outcome_correct"] = bool(ok)
            counters["correct"] += bool(ok)
        return out, counters
