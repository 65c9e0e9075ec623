"""``--rank auto`` (issue 12, item 3): the rank and world size of a Slurm array job or a torchrun-style
launcher, for splitting a folder of shards without Ray; one clear line when they are missing or disagree."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stepkit.errors import ConfigError
from stepkit.runner import RunOptions, rank_from_environment
from tests.conftest import DATA, ROOT

SCRIPTED = ["--engine", "scripted", "--model", "scripted:echo", "-k", "2", "--no-progress"]
CLEAN = {k: v for k, v in os.environ.items()
         if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE")}


@pytest.mark.parametrize("env,expected", [
    ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "4"}, (2, 4)),
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1",
      "SLURM_ARRAY_TASK_MAX": "4"}, (2, 4)),  # --array=1-4
    ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "0",
      "SLURM_ARRAY_TASK_MAX": "4", "SLURM_ARRAY_TASK_STEP": "2"}, (2, 3)),  # --array=0-4:2
    ({"RANK": "0", "WORLD_SIZE": "1"}, (0, 1)),
    ({"RANK": "5", "WORLD_SIZE": "8"}, (5, 8)),
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2", "RANK": "1", "WORLD_SIZE": "2"}, (1, 2)),
])
def test_rank_from_the_environment(env, expected):
    assert rank_from_environment(env) == expected
    os_env = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update({**CLEAN, **env})
        opts = RunOptions(rank="auto")
        assert (opts.rank, opts.world_size) == expected
    finally:
        os.environ.clear()
        os.environ.update(os_env)


@pytest.mark.parametrize("env,message", [
    ({}, "--rank auto: neither SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT (a Slurm array job) nor RANK/WORLD_SIZE "
         "(torchrun) is set; give --rank R --world-size W"),
    ({"SLURM_ARRAY_TASK_ID": "1"}, "--rank auto: SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not"),
    ({"WORLD_SIZE": "4"}, "--rank auto: WORLD_SIZE is set but RANK is not"),
    ({"RANK": "x1", "WORLD_SIZE": "4"}, "--rank auto: RANK='x1' is not an integer"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, "--rank auto: RANK/WORLD_SIZE give rank 4 of 4; need 0 <= rank < world size >= 1"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "--rank auto: RANK/WORLD_SIZE give rank 0 of 0"),
    ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1",
      "SLURM_ARRAY_TASK_MAX": "7"}, "--rank auto: the Slurm array (SLURM_ARRAY_TASK_MIN 1, MAX 7, STEP 1, COUNT 3) "
                                    "is not one evenly stepped range of 3 tasks"),  # --array=1,4,7
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "2", "RANK": "1", "WORLD_SIZE": "2"},
     "--rank auto: Slurm says rank 0 of 2 (SLURM_ARRAY_TASK_ID/COUNT) but RANK/WORLD_SIZE say 1 of 2"),
])
def test_missing_or_inconsistent_environment_is_one_line(env, message):
    with pytest.raises(ConfigError) as e:
        rank_from_environment(env)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def run(*args, env):
    return subprocess.run([sys.executable, "-m", "stepkit.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env={**CLEAN, **env}, timeout=300)


def test_rank_auto_splits_a_folder_as_slurm_says(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    sol = tmp_path / "sol.parquet"
    assert run("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", sol, "--limit", "1",
               env={}).returncode == 0
    for i in range(3):
        (folder / f"s{i}.parquet").write_bytes(sol.read_bytes())
    out = tmp_path / "out"
    p = run("mc-label", folder, out, *SCRIPTED, "--rank", "auto",
            env={"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2"})
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in out.glob("*.parquet")) == ["s1.parquet"]  # sorted(shards)[1::2]
    run_figures = json.loads((out / "s1.manifest.json").read_text())["run"]
    assert (run_figures["rank"], run_figures["world_size"]) == (1, 2)
    p = run("mc-label", folder, out, *SCRIPTED, "--rank", "auto", "--world-size", "3",
            env={"RANK": "0", "WORLD_SIZE": "2"})
    assert p.returncode == 1 and p.stderr == ("error: --rank auto: the environment says 2 ranks, but --world-size "
                                              "is 3; leave --world-size out or make them agree\n")
    p = run("mc-label", folder, out, *SCRIPTED, "--rank", "auto", env={})
    assert p.returncode == 1 and p.stderr.startswith("error: --rank auto: neither SLURM_ARRAY_TASK_ID")
    assert p.stderr.count("\n") == 1
    p = run("mc-label", folder, out, *SCRIPTED, "--rank", "first", env={})
    assert p.returncode == 2 and "'first' is not a valid integer" in p.stderr
