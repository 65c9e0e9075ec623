"""``mcts-label``: OmegaPRM's tree search over step prefixes, rollout trees and step preference pairs.

Method (Luo et al. 2024, *Improve Mathematical Reasoning in Language Models by Automated Process
Supervision*, "OmegaPRM"; node values from descendant outcomes as in TreePS-RAG / PORTool; sibling
preference pairs as in MCTS-DPO). Per problem:

* A **state** is the problem plus a step prefix (a node of the tree, ``node_id`` ``<problem_id>/n<k>``,
  ``n0`` the root). A **rollout** is a completion from a state to a final answer, split into steps with
  ``--split`` and graded against ``reference_answer``; one cut off by ``max_tokens`` is *truncated*:
  counted, excluded from values, never a candidate; one that stops at once with no text is *empty*
  (:attr:`stepkit.engines.base.Completion.empty`, ``rollout``'s "empty completion"): the same, counted
  apart (``mcts_empty``), and a run where more than half of the sampled rollouts are empty is refused with
  one line (:func:`stepkit.per_row.empty_refusal`: the chat template closes the assistant turn, or the
  model ends its turn at the prefix). ``mcts_distinct`` counts the distinct texts among a node's own
  sampled, non-empty rollouts; the manifest counts them (``compared_prefixes``,
  ``distinct_continuations``, ``repeated_continuations``) and a run whose distinct share is below
  :data:`stepkit.per_row.MIN_DISTINCT_SHARE` gets one warning (as ``mc-label``'s). ``MC(s) = successes / graded`` over the state's own
  rollouts (K = ``--continuations`` sampled ones; the root also owns the problem's seed rows when IN is
  a trajectories shard).
* The root gets K rollouts. A problem whose root MC is 1 or 0 is recorded as ``all_correct`` /
  ``all_wrong`` and not searched; with no graded root rollout it is ``no_signal``. ``--filter-rollouts
  N`` first samples N extra root rollouts and skips the problem when they are all correct or all wrong
  (the paper's question filter; they count against the budget, not in MC).
* The **candidate pool** holds the incorrect graded rollouts ``(s, r)`` of states with ``0 < MC(s) < 1``.
  Each **selection** takes ``argmax Q(s, r) + U(s)`` with ``Q = alpha^(1 - MC(s)) * beta^(len(r) / L)``
  (``len(r)`` in generated tokens, ``L`` = ``--length-scale``) and
  ``U(s) = c_puct * sqrt(sum_s' N(s')) / (1 + N(s))``, computed with the current visit counts; the pair
  leaves the pool for good and ``N(s)`` grows by one.
* The selected rollout's steps are **binary-searched** for the first error (no recovery assumed, as in
  ``mc-label --mode binary``): each probe is the state ``s + r[:j]``, estimated with exactly K rollouts
  unless that prefix is already a node; ``MC > 0`` moves right, ``MC = 0`` left. Every probed prefix is
  a node; new states' incorrect rollouts join the pool.
* The search stops after ``--search-limit`` selections, when the pool is empty, or when the next K
  rollouts would exceed ``--rollout-budget`` continuations for the problem (checked before every probe,
  so the budget is never exceeded).
* ``--parallel-selections B`` (default 1, the paper's order) lets one problem's search work on B
  selections at once, each the best pair with the visit counts of that moment (a probe another
  selection is estimating is awaited, never estimated twice; budget and limit hold as before).
* A node's value is its own MC (``--value own``) or the mean outcome of every graded rollout whose steps
  pass through its prefix (``--value subtree``: its own rollouts, its descendants', and any rollout from
  an ancestor that continued through it).

Outputs (``docs/architecture.md``, "Records"; the tree's parent of a node is the deepest node whose
prefix is a proper prefix of its own):

* OUT: one trajectory row per distinct complete rollout in the tree (seed rows keep their id and
  columns; new ones get ``<problem_id>:m<j>``), with per-step lists ``mcts_value``, ``mcts_rollouts``,
  ``mcts_successes``, ``mcts_visits``, ``mcts_label`` (value > 0), ``mcts_node_id`` (null where the prefix
  ending at that step is not a node; the last step's value is the graded outcome, as in ``mc-label``),
  and per row ``mcts_first_error`` (the first step of value 0 where the tree pins it down: the prefix
  before it is a node of value > 0; -1 for a correct path with no zero; null when the search did not
  reach the path or the problem was not searched) and ``mcts_status`` (``ok``, ``all_correct``, ``all_wrong``,
  ``no_signal``, ``ungraded`` for a truncated seed).
* ``--tree-out``: one row per node (:data:`NODE_SCHEMA`).
* ``--pairs-out``: two children of one node whose values differ by at least ``--pair-margin``:
  ``prefix_steps`` (the node's), ``chosen`` / ``rejected`` (the steps from it to each child), values and
  counts (:data:`PAIR_SCHEMA`).

Scheduling: every problem of a chunk searches in its own coroutine and awaits the engine's
asynchronous path (:meth:`stepkit.engines.base.Engine.agenerate`), so the engine batches all searches'
requests and none waits for another's slowest continuation; a binary-search probe is decided by its
first correct rollout (:class:`stepkit.stages.mcts_tree.Tree`: the next probe goes out while the others
finish; the tree is recorded in the order probes were sent, so it is the same); the runner keeps several chunks in flight
(``--chunks-in-flight``), so the next chunk's searches start while a chunk's slowest ones finish. A
problem's rows are never split across chunks (``group_by``), so its tree is committed whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from stepkit.columns import Column, fields
from stepkit.engines.base import EngineSpec, Request, SamplingConfig
from stepkit.errors import ConfigError, InputError, RowError
from stepkit.grading.answers import extract_final_answer
from stepkit.grading.steps import check_split, split_steps
from stepkit.options import Config, opt
from stepkit.per_row import ContinuationTally, check_answers, check_golds, distinct_warning, empty_refusal
from stepkit.prompts import CONTINUATION, PromptTemplate, render_continuation
from stepkit.schema import (
    PROBLEM_FIELDS,
    TRAJECTORY_FIELDS,
    check_columns,
    check_values,
    extend_schema,
)
from stepkit.stage import EngineStage, SideOutput
from stepkit.stages.mcts_tree import Node, Rollout, Tree

VALUES = ("own", "subtree")

COLUMNS = (  # per step: the node whose prefix ends at that step (null: not a node)
    Column("mcts_value", pa.list_(pa.float32()), "the node's value (own or subtree estimate, --value); the last "
           "step's the graded outcome", per_step=True, role="value", scale="unit", status="mcts_status"),
    Column("mcts_rollouts", pa.list_(pa.int32()), "continuations run from the node", per_step=True),
    Column("mcts_successes", pa.list_(pa.int32()), "of them, correct", per_step=True),
    Column("mcts_empty", pa.list_(pa.int32()), "of them, sampled ones that stopped at once with no text (out of "
           "the value's denominator)", per_step=True),
    Column("mcts_distinct", pa.list_(pa.int32()), "distinct texts among the node's sampled non-empty rollouts",
           per_step=True),
    Column("mcts_visits", pa.list_(pa.int32()), "times the search selected the node", per_step=True),
    Column("mcts_label", pa.list_(pa.bool_()), "value > 0", per_step=True, role="label", status="mcts_status"),
    Column("mcts_node_id", pa.list_(pa.string()), "the node whose prefix ends at the step (null: none)",
           per_step=True),
    Column("mcts_first_error", pa.int32(), "first step of value 0 where the tree pins it down, -1 for a correct "
           "path with no zero, null where the search did not reach", role="first_error", status="mcts_status"),
    Column("mcts_status", pa.string(), "ok, all_correct, all_wrong; no_signal, ungraded (no labels)", role="status",
           values=("ok", "all_correct", "all_wrong", "no_signal", "ungraded"), no_labels=("no_signal", "ungraded")),
)

NODE_SCHEMA = pa.schema([  # --tree-out: one row per node (state)
    pa.field("problem_id", pa.string()),
    pa.field("node_id", pa.string()),
    pa.field("parent_id", pa.string()),
    pa.field("depth", pa.int32()),  # steps in the node's prefix
    pa.field("step", pa.string()),  # the prefix's last step (null at the root)
    pa.field("edge_steps", pa.list_(pa.string())),  # the steps from the parent's prefix to this one
    pa.field("visits", pa.int32()),
    pa.field("rollouts", pa.int32()),
    pa.field("successes", pa.int32()),
    pa.field("truncated", pa.int32()),
    pa.field("empty", pa.int32()),  # sampled rollouts with no text (out of the value's denominator)
    pa.field("distinct", pa.int32()),  # distinct texts among the sampled non-empty rollouts
    pa.field("value_own", pa.float32()),
    pa.field("value_subtree", pa.float32()),
])

PAIR_SCHEMA = pa.schema([  # --pairs-out: step preference pairs (two children of one node)
    pa.field("problem_id", pa.string()),
    pa.field("prompt", pa.string()),
    pa.field("node_id", pa.string()),
    pa.field("prefix_steps", pa.list_(pa.string())),
    pa.field("chosen", pa.list_(pa.string())),
    pa.field("rejected", pa.list_(pa.string())),
    pa.field("chosen_node_id", pa.string()),
    pa.field("rejected_node_id", pa.string()),
    pa.field("chosen_value", pa.float32()),
    pa.field("rejected_value", pa.float32()),
    pa.field("chosen_rollouts", pa.int32()),
    pa.field("chosen_successes", pa.int32()),
    pa.field("rejected_rollouts", pa.int32()),
    pa.field("rejected_successes", pa.int32()),
    pa.field("step_separator", pa.string()),  # how the steps join into text (the tree's): export writes pairs with it
])
_EMPTY = {c.name: None for c in COLUMNS}


@dataclass(frozen=True)
class MCTSConfig(Config):
    """Options of ``mcts-label``; defaults are the paper's.

    Raises:
        ConfigError: a value out of range, or a budget smaller than the root's rollouts.
    """

    continuations: int = opt(8, "K: rollouts per new state (the paper's 8).", short="-k", min=1, max=4096)
    search_limit: int = opt(100, "Selections per problem (the paper's 100).", min=0, max=1_000_000)
    rollout_budget: int | None = opt(None, "Continuations per problem, never exceeded (checked before every "
                                     "probe) [default: no limit].", min=1)
    c_puct: float = opt(0.125, "Exploration weight of U(s).", min=0)
    alpha: float = opt(0.5, "Q's base for 1 - MC(s).", min=0, max=1, min_open=True)
    beta: float = opt(0.9, "Q's base for the rollout length.", min=0, max=1, min_open=True)
    length_scale: float = opt(500, "L: rollout length (tokens) that costs one factor of beta.", min=0, min_open=True)
    filter_rollouts: int = opt(0, "Question filter: skip a problem whose first N root rollouts are all correct "
                               "or all wrong (0: off).", min=0, max=4096)
    value: str = opt("own", "Node value: own (its K rollouts) or subtree (every graded rollout through it).",
                     choices=VALUES)
    parallel_selections: int = opt(1, "Selections a problem's search works on at once (1: the paper's one at "
                                   "a time; more keeps the engine fuller on few problems).", min=1, max=64)
    pair_margin: float = opt(0.5, "Smallest value difference of a preference pair.", min=0, max=1)
    split: str = opt("newline", "How rollouts are split into steps: newline, blank, step, auto, or a regex.")
    tree_out: str | None = opt(None, "Also write the tree, one row per node, here.", identity=False)
    pairs_out: str | None = opt(None, "Also write step preference pairs here.", identity=False)
    stop: tuple[str, ...] = opt((), "Extra stop string(s) for rollouts.", identity=False)  # in sampling

    def __post_init__(self):
        super().__post_init__()
        check_split(self.split)
        for name in ("tree_out", "pairs_out"):
            if getattr(self, name) == "":
                raise ConfigError(f"--{name.replace('_', '-')} needs a path")
        if self.rollout_budget is not None and self.rollout_budget < self.continuations + self.filter_rollouts:
            raise ConfigError(f"--rollout-budget {self.rollout_budget} leaves no room for the root's "
                              f"{self.filter_rollouts + self.continuations} rollouts")


class MCTSLabelStage(EngineStage):
    """The ``mcts-label`` stage (see the module docstring for the method).

    Args:
        cfg: the stage's options (:class:`MCTSConfig`).
        engine: the policy that rolls out from states (built once, only if there is work).
        sampling: explicit sampling parameters (the CLI adds the default stop strings).
        checker_factory: builds the answer checker (default: the math-verify pool).
        template: the continuation prompt template (as ``mc-label``'s).
        generator: the ``generator`` of new rollout rows (default: the engine's model name).
    """

    name = "mcts-label"
    required_columns = ("problem_id", "prompt", "reference_answer")
    optional_columns = ("id", "steps")  # a trajectories shard's seeds
    _trajectories = False
    default_chunk_size = 8
    columns = COLUMNS
    one_to_one = False
    group_by = "problem_id"

    def __init__(self, cfg: MCTSConfig, engine: EngineSpec, sampling: SamplingConfig, checker_factory=None,
                 template: PromptTemplate = CONTINUATION, generator: str | None = None):
        super().__init__(cfg, engine, sampling, checker_factory)
        self.template, self.generator = template, generator or engine.model

    def refusal(self, counters: dict[str, int]):
        """The empty refusal (:func:`~stepkit.per_row.empty_refusal`) over this run's sampled rollouts up to
        the chunk about to commit: more than half of them empty stops the run before that chunk commits."""
        return empty_refusal(self.name, counters.get("empty", 0), counters.get("_sampled", 0))

    def run_warnings(self, counters: dict[str, int]) -> list[str]:
        """The distinct-share warning of a run (:func:`~stepkit.per_row.distinct_warning`), if any."""
        w = distinct_warning(self.name, counters, self.sampling.temperature)
        return [w] if w else []

    def config(self) -> dict[str, Any]:
        return {**super().config(), "prompt_template": {"version": self.template.version, "hash": self.template.hash()}}

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        base = input_schema if "steps" in input_schema.names else pa.schema(
            TRAJECTORY_FIELDS + [f for f in PROBLEM_FIELDS if f.name == "reference_steps"])
        return extend_schema(base, fields(COLUMNS))

    def side_outputs(self) -> dict[str, SideOutput]:
        outs = {}
        if self.cfg.tree_out:
            outs["tree"] = SideOutput(Path(self.cfg.tree_out), NODE_SCHEMA)
        if self.cfg.pairs_out:
            outs["pairs"] = SideOutput(Path(self.cfg.pairs_out), PAIR_SCHEMA)
        return outs

    def check_schema(self, schema, path):
        self._trajectories = "steps" in schema.names
        if self._trajectories:  # seeds: they need an id and a graded outcome to join the root
            check_columns(schema, ("id", "steps", "outcome_correct"), path)

    def validate(self, rows, path, first_row):
        if first_row == 0:
            self._seen_ids, self._gold = set(), {}
        # a problems shard has one row per problem; a trajectories shard unique row ids
        check_values(rows, path, first_row, ("problem_id", "prompt"),
                     unique="id" if self._trajectories else "problem_id", seen=self._seen_ids)
        for i, r in enumerate(rows):
            pid, gold = r.get("problem_id"), r.get("reference_answer")
            if self._gold.setdefault(pid, gold) != gold:
                raise InputError(path, f"problem {pid!r} has two reference answers ({self._gold[pid]!r:.40} and "
                                       f"{gold!r:.40})", row=first_row + i, column="reference_answer")
        for i, r in enumerate(rows):
            if "steps" in r and not r.get("error") and not r.get("steps"):
                raise InputError(path, "steps is null or empty", row=first_row + i, column="steps")

    # -- the method ---------------------------------------------------------------------------------

    asynchronous = True  # every problem's search awaits the engine: the runner overlaps chunks

    async def aprocess(self, rows: list[dict]):
        """Search every problem of the chunk concurrently; return its trajectory rows, counters and the
        tree / pair rows (``process`` runs it on an event loop of its own).

        The empty refusal is :meth:`refusal`, as each chunk commits.
        """
        groups: dict[str, list[dict]] = {}
        for r in rows:
            groups.setdefault(r["problem_id"], []).append(r)
        golds = {g[0].get("reference_answer") for g in groups.values() if g[0].get("reference_answer")}
        bad = await check_golds(self.checker, sorted(golds)) if golds else {}
        results = await self._search_all(list(groups.values()), bad)
        counters = {"problems": len(groups), "continuations": 0, "filter_continuations": 0, "selections": 0,
                    "nodes": 0, "pairs": 0, "budget_stops": 0, "truncated": 0, "empty": 0,
                    **dict.fromkeys(ContinuationTally.NAMES, 0),
                    **{f"problems_{s}": 0 for s in ("ok", "all_correct", "all_wrong", "no_signal", "error")},
                    "_sampled": 0}  # (the rollouts the trees recorded: the empty refusal's total)
        out, tree_rows, pair_rows = [], [], []
        for group, (tree, status, error) in zip(groups.values(), results):
            counters["continuations"] += tree.continuations if tree else 0
            counters["empty"] += tree.empty if tree else 0
            counters["_sampled"] += tree.sampled if tree else 0
            counters[f"problems_{status or 'error'}"] += 1
            if error is not None:
                out += self._error_rows(group, error)
                continue
            counters["filter_continuations"] += tree.filter_continuations
            counters["selections"] += tree.selections
            counters["nodes"] += len(tree.nodes)
            counters["budget_stops"] += tree.budget_stop
            counters["truncated"] += sum(n.truncated for n in tree.nodes.values())
            for n in tree.nodes.values():
                ContinuationTally.add(counters, n.sampled_texts())
            rows_, nodes_, pairs_ = self._outputs(group, tree, status)
            out += rows_
            tree_rows += nodes_
            pair_rows += pairs_
            counters["pairs"] += len(pairs_)
        wanted = self.side_outputs()
        return out, counters, {k: v for k, v in (("tree", tree_rows), ("pairs", pair_rows)) if k in wanted}

    def _error_rows(self, group: list[dict], error: str) -> list[dict]:
        """The rows of a problem that cannot be searched: its trajectory rows keep an error (an upstream one
        as it was); a problem row becomes one trajectory row with no steps and the error."""
        if "steps" in group[0]:
            return [{**r, **_EMPTY, "error": r.get("error") or RowError(self.name, error)} for r in group]
        r = group[0]
        return [{"id": f"{r['problem_id']}:m0", "problem_id": r["problem_id"], "source": r.get("source"),
                 "prompt": r["prompt"], "reference_answer": r.get("reference_answer"), "steps": [],
                 "step_separator": "\n", "generator": self.generator, **_EMPTY,
                 "error": r.get("error") or RowError(self.name, error)}]

    async def _search_all(self, groups, bad):
        import asyncio  # (imported where used: a command's --help loads no asyncio)
        return await asyncio.gather(*(self._search_one(g, bad) for g in groups))

    async def _search_one(self, group: list[dict], bad: dict):
        first = group[0]
        if all(r.get("error") for r in group):
            return None, None, "all rows failed upstream"
        gold = first.get("reference_answer")
        if not gold:
            return None, None, "no reference_answer (rollouts are graded against it)"
        if bad.get(gold):
            return None, None, f"unusable reference_answer: {bad[gold]}"
        seeds = [r for r in group if r.get("steps") and not r.get("error")]
        sep = (seeds[0].get("step_separator") if seeds else None) or ("\n\n" if self.cfg.split == "blank" else "\n")

        def sample_each(prefix: tuple[str, ...], k: int) -> list:
            """The k rollouts of a state, each graded as it arrives (the tree decides a probe by the first
            correct one); an error completion raises (the problem's rows keep the error)."""
            prompt = render_continuation(self.engine, first["prompt"], list(prefix), sep, len(prefix), self.template)
            return [graded(f) for f in self.engine.agenerate_each(Request(prompt, k), self.sampling)]

        async def graded(fut):
            c = await fut
            if c.finish_reason == "error":
                raise _EngineRowError(c.error)
            steps = split_steps(c.text, self.cfg.split)[0]
            ok = None  # truncated, or empty (no answer to grade: Rollout.empty), is never wrong
            if not c.truncated and not c.empty:  # the loop keeps serving the other searches meanwhile
                ok = bool((await check_answers(self.checker, [(gold, extract_final_answer(c.text))]))[0])
            return steps, c.text, ok, c.num_tokens

        tree = Tree(self.cfg, None, sep, sample_each=sample_each)
        count = getattr(self.engine, "count_tokens", None)
        seed_rollouts = [Rollout(tree.root, tuple(r["steps"]), sep.join(r["steps"]), r.get("outcome_correct"),
                                 count(sep.join(r["steps"])) if count else 0, seed=r) for r in seeds]
        try:
            status = await tree.search(seed_rollouts)
        except _EngineRowError as e:
            return tree, None, f"engine: {e}"
        return tree, status, None

    def _outputs(self, group: list[dict], tree: Tree, status: str):
        """(trajectory rows, node rows, pair rows) of one searched problem."""
        first = group[0]
        pid = first["problem_id"]
        node_id = {n: f"{pid}/n{n.index}" for n in tree.nodes.values()}
        values = {n: tree.value(n) for n in tree.nodes.values()}
        searched = status == "ok"
        rows, seen = [], set()
        for r in group:  # seeds first, in input order; rows that failed upstream pass through
            if "steps" not in r:  # a problems shard: nothing to keep but the new rollouts
                continue
            if r.get("error") or not r.get("steps"):
                rows.append({**r, **_EMPTY})
                continue
            seen.add(tuple(r["steps"]))
            rows.append({**r, **self._labels(tree, tuple(r["steps"]), r.get("outcome_correct"), status, node_id,
                                             values)})
        j = 0
        used = {r.get("id") for r in group}
        for n in sorted(tree.nodes.values(), key=lambda n: n.index):
            for ro in n.rollouts:
                if ro.seed is not None or ro.correct is None or not ro.steps or ro.path in seen:
                    continue
                seen.add(ro.path)
                while f"{pid}:m{j}" in used:  # never the id of a seed (e.g. mcts-label's own output as IN)
                    j += 1
                row = {"id": f"{pid}:m{j}", "problem_id": pid, "source": first.get("source"),
                       "prompt": first["prompt"], "reference_answer": first.get("reference_answer"),
                       "reference_steps": first.get("reference_steps"), "steps": list(ro.path),
                       "step_separator": tree.sep, "final_answer": extract_final_answer(ro.text),
                       "outcome_correct": ro.correct, "generator": self.generator, "error": None}
                row.update(self._labels(tree, ro.path, ro.correct, status, node_id, values))
                rows.append(row)
                j += 1
        nodes = []
        for n in sorted(tree.nodes.values(), key=lambda n: n.index):
            p = tree.parent(n)
            nodes.append({"problem_id": pid, "node_id": node_id[n], "parent_id": node_id[p] if p else None,
                          "depth": len(n.prefix), "step": n.prefix[-1] if n.prefix else None,
                          "edge_steps": list(n.prefix[len(p.prefix):]) if p else [],
                          "visits": n.visits, "rollouts": len(n.rollouts), "successes": n.successes,
                          "truncated": n.truncated, "empty": n.empty,
                          "distinct": len(set(n.sampled_texts())), "value_own": n.mc, "value_subtree": tree.subtree_value(n)})
        pairs = self._pairs(tree, first, node_id, values) if searched else []
        return rows, nodes, pairs

    def _labels(self, tree: Tree, path: tuple[str, ...], correct: bool | None, status: str, node_id, values):
        m = len(path)
        cols = {k: [] for k in ("mcts_value", "mcts_rollouts", "mcts_successes", "mcts_empty", "mcts_distinct",
                                "mcts_visits", "mcts_label", "mcts_node_id")}
        for s in range(m):
            n = tree.nodes.get(path[:s + 1])
            v = values[n] if n is not None else None
            if s == m - 1 and correct is not None:
                v = 1.0 if correct else 0.0  # the value after the last step is the graded outcome
            cols["mcts_value"].append(v)
            cols["mcts_rollouts"].append(len(n.rollouts) if n else None)
            cols["mcts_successes"].append(n.successes if n else None)
            cols["mcts_empty"].append(n.empty if n else None)
            cols["mcts_distinct"].append(len(set(n.sampled_texts())) if n else None)
            cols["mcts_visits"].append(n.visits if n else None)
            cols["mcts_label"].append(None if v is None else v > 0)
            cols["mcts_node_id"].append(node_id[n] if n else None)
        if correct is None:
            status, first = "ungraded", None
        elif status in ("all_wrong", "no_signal"):
            first = None  # nothing was searched: "wrong from step 0" would be a guess
            cols["mcts_label"] = [None] * m
        else:
            first = self._first_error(tree, path, cols["mcts_value"], values, correct)
        return {**cols, "mcts_first_error": first, "mcts_status": status}

    @staticmethod
    def _first_error(tree: Tree, path: tuple[str, ...], step_values: list, values, correct: bool) -> int | None:
        """The first step of value 0 when the tree pins it down: the prefix before it is a node of value
        > 0 (the root, for step 0), as a finished binary search leaves it. -1 for a correct path with no
        zero (values do not recover once 0); None when the path was not searched far enough to know."""
        z = next((s for s, v in enumerate(step_values) if v == 0), None)
        if z is None:
            return -1 if correct else None
        before = tree.nodes.get(path[:z])
        known = before is not None and values.get(before) is not None and values[before] > 0
        return z if known else None

    def _pairs(self, tree: Tree, first: dict, node_id, values) -> list[dict]:
        children: dict[Node, list[Node]] = {}
        for n in sorted(tree.nodes.values(), key=lambda n: n.index):
            p = tree.parent(n)
            if p is not None:
                children.setdefault(p, []).append(n)
        out = []
        for parent, kids in children.items():
            for a_i, a in enumerate(kids):
                for b in kids[a_i + 1:]:
                    va, vb = values[a], values[b]
                    if va is None or vb is None or abs(va - vb) < self.cfg.pair_margin:
                        continue
                    good, worse = (a, b) if va > vb else (b, a)
                    out.append({"problem_id": first["problem_id"], "prompt": first["prompt"],
                                "node_id": node_id[parent], "prefix_steps": list(parent.prefix),
                                "chosen": list(good.prefix[len(parent.prefix):]),
                                "rejected": list(worse.prefix[len(parent.prefix):]),
                                "chosen_node_id": node_id[good], "rejected_node_id": node_id[worse],
                                "chosen_value": values[good], "rejected_value": values[worse],
                                "chosen_rollouts": len(good.rollouts), "chosen_successes": good.successes,
                                "rejected_rollouts": len(worse.rollouts), "rejected_successes": worse.successes,
                                "step_separator": tree.sep})
        return out


class _EngineRowError(Exception):
    """The engine failed on one of a problem's requests: the problem's rows keep an error."""


