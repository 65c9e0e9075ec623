"""mc-label --executor ray with the real vLLM engine (CPU) and the bundled model, on 2 shards of 2 real
GSM8K solutions, on one Ray actor (--cpus-per-shard 2 on the session's 2-CPU Ray instance) that builds
the engine once and labels both shards with it.

The actor builds its engine inside its own process, so this module loads no engine of its own in the
pytest process and shares none: the engine tests' module-scoped engines are closed when their module ends,
and this module runs alone, so at most one engine is loaded at a time here (the session's Ray instance is
already up from tests/test_ray.py when it runs, or starts here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from tests.conftest import DATA, ROOT, run_cli

pytestmark = pytest.mark.engine


@pytest.mark.own_engine
def test_mc_label_on_ray_builds_the_engine_once_in_its_actor(ray_cluster, tmp_path):
    sol = tmp_path / "sol.parquet"
    run_cli("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", sol, "--limit", "1")
    table = pq.read_table(sol)
    assert table.num_rows == 4
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(2):
        pq.write_table(table.slice(2 * i, 2), folder / f"s{i}.parquet")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "stepkit.cli", "mc-label", str(folder), str(out), "--model", "smollm2-135m",
           "-k", "2", "--max-tokens", "48", "--chunk-size", "1", "--executor", "ray", "--ray-address", ray_cluster,
           "--cpus-per-shard", "2"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900,
                       env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "shards: 2 done, 0 running, 0 failed, 0 waiting" in p.stderr and "Traceback" not in p.stderr
    assert "Triton is installed" not in p.stderr  # the workers' start-up notices stay in Ray's logs
    for i in range(2):
        rows = pq.read_table(out / f"s{i}.parquet").to_pylist()
        assert [r["id"] for r in rows] == table.slice(2 * i, 2).column("id").to_pylist()
        for r in rows:
            m = len(r["steps"])
            assert r["error"] is None and r["mc_status"] in ("ok", "no_signal")
            assert r["mc_rollouts"] == [2] * (m - 1) + [0]
            assert all(0 <= s <= n for s, n in zip(r["mc_successes"], r["mc_rollouts"]))
        m = json.loads((out / f"s{i}.manifest.json").read_text())
        assert m["provenance"]["engine"]["engine"] == "vllm" and m["provenance"]["engine"]["vllm_version"]
        assert m["counts"]["continuations"] == sum(2 * len(r["steps"]) for r in rows)
        assert m["run"]["chunks_this_run"] == 2 and m["run"]["tokens_this_run"] > 0
    # one actor with the 2 CPUs ran both shards (the scripted tests' actors took 1 CPU each), then was killed
    actor = _actor_with(ray_cluster, cpus=2.0)
    assert actor.pid not in (None, os.getpid()) and actor.state == "DEAD"
    _finished_runs(ray_cluster, actor.actor_id, 2)


# Ray's state API is asked at the session's instance by its address: left to find one, it fails with "Found
# multiple active Ray instances" whenever another Ray instance runs on the machine (`make test`'s other part
# runs the scripted Ray tests at the same time).
def _actor_with(address: str, cpus: float):
    """The one ``_ShardActor`` that reserved ``cpus`` CPUs (Ray's state API)."""
    from ray.util.state import list_actors

    actors = [a for a in list_actors(address=address, filters=[("class_name", "=", "_ShardActor")], detail=True,
                                     limit=1000)
              if (a.required_resources or {}).get("CPU") == cpus]
    assert len(actors) == 1, actors
    return actors[0]


def _finished_runs(address: str, actor_id: str, n: int) -> None:
    """The actor ran ``n`` shards, once Ray's state API reports them finished (task events reach it a moment
    after the task ends)."""
    from ray.util.state import list_tasks

    deadline = time.time() + 30
    while True:
        runs = list_tasks(address=address, filters=[("actor_id", "=", actor_id), ("name", "=", "_ShardActor.run")])
        if [t.state for t in runs] == ["FINISHED"] * n or time.time() > deadline:
            assert [t.state for t in runs] == ["FINISHED"] * n, runs
            return
        time.sleep(0.2)
