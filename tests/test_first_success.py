"""A binary-search probe is decided by its first correct sample (``mc-label --mode binary``, ``mcts-label``):
the next probe is sent while the probe's other samples are still running, and the rows are those of a
search whose probes each wait for all K samples (the scripted engine's, answering whole requests)."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepkit.engines.base import Completion, EngineSpec, Request, SamplingConfig
from stepkit.engines.scripted import ScriptedEngine
from stepkit.errors import StepkitError
from stepkit.runner import run_stage
from stepkit.schema import TRAJECTORY_SCHEMA
from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage
from stepkit.stages.mcts_label import MCTSConfig, MCTSLabelStage

QUIET = 0.5  # s without a new request before the held samples are let go


def depth(prompt: str) -> int:
    """The steps of the prefix a continuation prompt ends with (the scripted chat template's)."""
    return len([s for s in prompt.rsplit("<|assistant|>\n", 1)[-1].split("\n") if s.strip()])


class Held(ScriptedEngine):
    """The scripted policy, each request's sample 0 answered at once and its other samples held until no
    request has come for :data:`QUIET` seconds. ``sent`` logs each request as ``(depth, depths held)``:
    the prefixes whose held samples were still unanswered when it was sent."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.sent, self.held, self.lock, self.last = [], [], threading.Lock(), time.monotonic()
        self.stop = threading.Event()
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()

    def submit_each(self, request, sampling):
        samples = self.generate([request], sampling)[0]
        parts = [concurrent.futures.Future() for _ in samples]
        with self.lock:
            self.sent.append((depth(request.prompt), {depth(p) for p, _, _ in self.held}))
            self.last = time.monotonic()
            self.held += [(request.prompt, f, c) for f, c in zip(parts[1:], samples[1:])]
        parts[0].set_result(samples[0])
        return parts

    def _watch(self):
        while not self.stop.wait(0.02):
            with self.lock:
                go = self.held if self.held and time.monotonic() - self.last > QUIET else []
                if go:
                    self.held = []
            for _, f, c in go:
                f.set_result(c)

    def close(self):
        self.stop.set()


class Exact:
    """A stand-in answer checker (equal strings), answering at once: the held samples' timing is the
    engine's alone (the math-verify pool's first checks would take part of :data:`QUIET`)."""

    def check_many(self, pairs):
        return [pred is not None and gold == pred for gold, pred in pairs]

    def gold_problems(self, golds):
        return dict.fromkeys(golds)

    def close(self):
        pass


STEPS = [f"s{i}" for i in range(1, 9)]


def prefix_policy(prompt: str, j: int, n: int) -> str:
    """Sample 0 reaches 42 from a prefix of at most 5 steps; every other sample, and any sample beyond, does not."""
    return "The answer is 42." if j == 0 and depth(prompt) <= 5 else "The answer is 7."


def test_binary_mc_label_sends_the_next_probe_on_the_first_correct_sample(tmp_path):
    row = {"id": "r0", "problem_id": "p0", "source": None, "prompt": "What is 6*7?", "reference_answer": "42",
           "steps": STEPS, "step_separator": "\n", "final_answer": "7", "outcome_correct": False,
           "generator": "human", "error": None}
    src = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist([row], schema=TRAJECTORY_SCHEMA), src)
    rows = []
    for i, cls in enumerate((ScriptedEngine, Held)):
        engine = cls(prefix_policy, "scripted:prefix")
        st = MCLabelStage(MCLabelConfig(continuations=3, mode="binary"), EngineSpec.of(engine),
                          SamplingConfig(max_tokens=64), Exact)
        run_stage(st, src, tmp_path / f"o{i}.parquet", progress=False)
        rows.append(pq.read_table(tmp_path / f"o{i}.parquet").to_pylist())
    assert rows[0] == rows[1]
    r = rows[1][0]
    # probes 4 (> 0: a first correct sample), 6 (0: all three wrong), 5 (> 0): the first error is step 5
    assert r["mc_first_error"] == 5 and r["mc_rollouts"] == [0, 0, 0, 3, 3, 3, 0, 0]
    assert r["mc_successes"] == [0, 0, 0, 1, 1, 0, 0, 0]
    sent = dict(engine.sent)
    assert [d for d, _ in engine.sent] == [0, 4, 6, 5]
    assert 4 in sent[6]  # probe 6 went out while probe 4's other samples were held (decided by sample 0)
    assert 6 not in sent[5]  # probe 6 had no correct sample: probe 5 waited for all three


def branch_policy(prompt: str, j: int, n: int) -> str:
    """From a prefix of correct steps ``c1..``: sample 0 finishes right, the others go wrong at step 4
    (``c1 c2 c3 w4 w5 w6``); from a prefix with a wrong step, every sample is wrong."""
    after = [s for s in prompt.rsplit("<|assistant|>\n", 1)[-1].split("\n") if s.strip()]
    if any(s.startswith("w") for s in after):
        return "w-more\nThe answer is 0."
    d = len(after)
    if j == 0:
        return "\n".join([f"c{i}" for i in range(d + 1, 7)] + ["The answer is 42."])
    return "\n".join([f"c{i}" for i in range(d + 1, 4)] + [f"w{i}" for i in range(max(4, d + 1), 7)]
                     + ["The answer is 0."])


def test_mcts_sends_the_next_probe_on_the_first_correct_rollout(tmp_path):
    prob = {"problem_id": "p0", "source": None, "prompt": "What is 6*7?", "reference_answer": "42"}
    src = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([prob]), src)
    out = []
    for i, cls in enumerate((ScriptedEngine, Held)):
        engine = cls(branch_policy, "scripted:branch")
        st = MCTSLabelStage(MCTSConfig(continuations=3, search_limit=1, tree_out=str(tmp_path / f"t{i}.parquet")),
                            EngineSpec.of(engine), SamplingConfig(max_tokens=64), Exact)
        run_stage(st, src, tmp_path / f"m{i}.parquet", progress=False)
        out.append((pq.read_table(tmp_path / f"m{i}.parquet").to_pylist(),
                    pq.read_table(tmp_path / f"t{i}.parquet").to_pylist()))
    assert out[0] == out[1]
    # the root (MC 1/3) is searched along c1 c2 c3 w4 w5 w6 (7 steps): probes 4 (c1..w4: 0), 2 (> 0), 3 (> 0)
    assert [d for d, _ in engine.sent] == [0, 4, 2, 3]
    sent = dict(engine.sent)
    assert 4 not in sent[2]  # probe 4 had no correct rollout: probe 2 waited for all three
    assert 2 in sent[3]  # probe 3 went out while probe 2's other rollouts were held (decided by rollout 0)
    nodes = out[1][1]
    assert sorted(n["depth"] for n in nodes) == [0, 2, 3, 4] and all(n["rollouts"] == 3 for n in nodes)
    assert {n["depth"]: n["successes"] for n in nodes} == {0: 1, 2: 1, 3: 1, 4: 0}


def test_submit_each_spreads_a_whole_request_and_its_failure():
    engine = ScriptedEngine(lambda p, j, n: f"answer {j}", "scripted:each")
    parts = engine.submit_each(Request("q", 3), SamplingConfig())
    assert [f.result().text for f in parts] == ["answer 0", "answer 1", "answer 2"]

    class Short(ScriptedEngine):
        def generate(self, requests, sampling):
            return [[Completion("only one", "stop", 2)] for _ in requests]

    parts = Short(lambda *a: "", "scripted:short").submit_each(Request("q", 2), SamplingConfig())
    for f in parts:
        with pytest.raises(StepkitError, match="returned 1 completions for n = 2"):
            f.result()


def failing(policy, at: int):
    """``policy``, with sample 2 of the prefix of ``at`` steps an engine error."""
    def wrapped(prompt: str, j: int, n: int):
        return Completion("boom", "error") if j == 2 and depth(prompt) == at else policy(prompt, j, n)
    return wrapped


@pytest.mark.parametrize("case", ["mc-label", "mcts-label"])
def test_an_error_after_an_early_decision_gives_the_rows_and_counts_of_a_search_that_waits(tmp_path, case):
    """The probe decided by its sample 0 fails at sample 2: the probe sent early is never counted, so the
    rows and the manifest's counts are the scripted engine's (which sends no probe after the failing one)."""
    from stepkit.shards import read_manifest

    if case == "mc-label":
        row = {"id": "r0", "problem_id": "p0", "source": None, "prompt": "What is 6*7?", "reference_answer": "42",
               "steps": STEPS, "step_separator": "\n", "final_answer": "7", "outcome_correct": False,
               "generator": "human", "error": None}
        src = tmp_path / "in.parquet"
        pq.write_table(pa.Table.from_pylist([row], schema=TRAJECTORY_SCHEMA), src)
        policy = failing(prefix_policy, 4)

        def stage(engine):
            return MCLabelStage(MCLabelConfig(continuations=3, mode="binary"), EngineSpec.of(engine),
                                SamplingConfig(max_tokens=64), Exact)
    else:
        src = tmp_path / "p.parquet"
        pq.write_table(pa.Table.from_pylist([{"problem_id": "p0", "source": None, "prompt": "What is 6*7?",
                                              "reference_answer": "42"}]), src)
        policy = failing(branch_policy, 2)

        def stage(engine):
            return MCTSLabelStage(MCTSConfig(continuations=3, search_limit=1), EngineSpec.of(engine),
                                  SamplingConfig(max_tokens=64), Exact)
    out = []
    for i, cls in enumerate((ScriptedEngine, Held)):
        engine = cls(policy, "scripted:failing")
        run_stage(stage(engine), src, tmp_path / f"o{i}.parquet", progress=False, max_error_rate=1.0)
        out.append((pq.read_table(tmp_path / f"o{i}.parquet").to_pylist(), read_manifest(tmp_path / f"o{i}.parquet")["counts"]))
    assert out[0] == out[1]
    assert "boom" in str(out[1][0][0]["error"])
    # what a search that waits spends: v_0 + probe 4 (mc-label); the root + probes 4 and 2 (mcts-label)
    assert out[1][1]["continuations"] == {"mc-label": 6, "mcts-label": 9}[case]
    later = {"mc-label": 6, "mcts-label": 3}[case]
    assert later in [d for d, _ in engine.sent]  # the probe after the failing one was sent, and not counted
