"""The answer checker's worker killed, or hung on a pathological expression: that pair is ungradable, the
row is kept, the stage goes on."""

from __future__ import annotations

import signal
import threading
import time

import pyarrow.parquet as pq

from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.engines.scripted import ScriptedEngine
from stepkit.runner import run_stage
from stepkit.stages.rollout import RolloutConfig, RolloutStage
from tests.conftest import DATA
from tests.faults.common import rows_lost, stepkit
from tests.faults.helpers import DEADLY, DeadlyChecker

PATHOLOGICAL = "(x+1)^{10000}"  # math-verify expands it against the gold: minutes of sympy


def test_hung_and_crashing_checks_leave_rows_ungraded_and_the_stage_goes_on(tmp_path, fault_table):
    problems = tmp_path / "problems.parquet"
    stepkit("ingest", "gsm8k", DATA / "gsm8k" / "test.jsonl", problems, "--limit", "4")
    rows = pq.read_table(problems).to_pylist()
    answers = {rows[0]["prompt"]: f"${PATHOLOGICAL}$", rows[1]["prompt"]: DEADLY}

    def policy(prompt, j, n):  # problem 0 answers a pathological expression, problem 1 one that kills its worker
        answer = next((a for p, a in answers.items() if p in prompt), None)
        return f"Let me compute.\nThe answer is {answer or rows[[r['prompt'] in prompt for r in rows].index(True)]['reference_answer']}."

    checker = DeadlyChecker(timeout=2.0, workers=2)
    stage = RolloutStage(RolloutConfig(samples=2), EngineSpec.of(ScriptedEngine(policy)), SamplingConfig(),
                         checker_factory=lambda: checker)
    out = tmp_path / "rollout.parquet"
    t0 = time.monotonic()
    (res,) = run_stage(stage, problems, out, progress=False, chunk_size=2)
    seconds = time.monotonic() - t0
    got = pq.read_table(out).to_pylist()
    assert [r["problem_id"] for r in got] == [r["problem_id"] for r in rows for _ in range(2)]
    by = {r["problem_id"]: [] for r in rows}
    for r in got:
        by[r["problem_id"]].append(r)
    stuck = by[rows[0]["problem_id"]] + by[rows[1]["problem_id"]]
    assert [r["final_answer"] for r in stuck] == [PATHOLOGICAL] * 2 + [DEADLY] * 2
    assert all(r["outcome_correct"] is None and r["error"] is None for r in stuck)  # ungraded, kept, no error
    assert all(r["outcome_correct"] is True for p in rows[2:] for r in by[p["problem_id"]])  # the rest graded
    assert res.counters["ungradable"] == 4 and res.errors == 0
    assert checker.timeouts == 1 and checker.crashes == 1
    lost = rows_lost(problems, out, "problem_id")
    assert lost == 0
    fault_table.add(f"answer check hung (`{PATHOLOGICAL}` against a GSM8K gold) and an answer whose check kills its "
                    "worker every time (SIGKILL)",
                    "hung pair: timed out (2 s), pool rebuilt; deadly pair: retried once alone, then ungradable; "
                    "their rows kept with `outcome_correct` null (counted `ungradable`), the stage finished", lost,
                    f"4 of 8 rows ungradable, 4 graded; 1 timeout, 1 crash; {seconds:.1f} s for the shard")


class KilledFromOutside(DeadlyChecker):
    """Kills one of its own workers (SIGKILL, as the kernel's OOM killer would) 0.5 s after the pathological
    check is submitted, while other checks are in flight."""

    killed = None

    def _submit_pair(self, pool, key):
        if key[1] == PATHOLOGICAL and self.killed is None:
            self.killed = list(pool._processes.values())[0]
            threading.Timer(0.5, self.killed.kill).start()
        return super()._submit_pair(pool, key)


def test_a_worker_killed_from_outside_mid_check(tmp_path, fault_table):
    problems = tmp_path / "problems.parquet"
    stepkit("ingest", "gsm8k", DATA / "gsm8k" / "test.jsonl", problems, "--limit", "6")
    rows = pq.read_table(problems).to_pylist()

    def policy(prompt, j, n):
        row = next(r for r in rows if r["prompt"] in prompt)
        return f"Let me compute.\nThe answer is {f'${PATHOLOGICAL}$' if row is rows[0] else row['reference_answer']}."

    checker = KilledFromOutside(timeout=3.0, workers=2)
    stage = RolloutStage(RolloutConfig(samples=1), EngineSpec.of(ScriptedEngine(policy)), SamplingConfig(),
                         checker_factory=lambda: checker)
    out = tmp_path / "rollout.parquet"
    (res,) = run_stage(stage, problems, out, progress=False)
    assert checker.killed is not None and checker.killed.exitcode == -signal.SIGKILL
    got = pq.read_table(out).to_pylist()
    assert [r["outcome_correct"] for r in got] == [None] + [True] * 5  # the checks in the broken pool were rerun
    assert res.counters["ungradable"] == 1 and checker.timeouts == 1 and checker.crashes == 0
    lost = rows_lost(problems, out, "problem_id")
    assert lost == 0
    fault_table.add("an answer-check worker SIGKILLed from outside while checks are in flight",
                    "the broken pool's checks rerun on a fresh pool (each alone); the hung one times out as "
                    "ungradable (row kept, `outcome_correct` null), the others get their real result", lost,
                    "5 of 6 rows graded, 1 ungradable; 0 crashes counted (a single death is retried)")
