"""recipes/gsm8k.mk: ingest -> rollout -> mc-label over shards with pattern rules (scripted engine)."""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq

from tests.conftest import DATA, ROOT


def make(work, *extra, k=2, ok=True):
    args = ["make", "-f", "recipes/gsm8k.mk", f"WORK={work}", f"DATA={DATA}", "SHARDS=3", "PER_SHARD=2",
            "SAMPLES=2", f"K={k}", "MODEL=scripted:echo", "ENGINE_ARGS=--engine scripted",
            f"STEPKIT={sys.executable} -m stepkit.cli", *extra]
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if not ok:
        assert p.returncode != 0
        return p.stderr
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return [line for line in p.stdout.splitlines() if "stepkit.cli" in line]


def test_recipe_chains_shards_in_parallel_and_reruns_only_missing(tmp_path):
    work = tmp_path / "w"
    cmds = make(work, "-j2")
    assert len(cmds) == 9  # 3 shards x (ingest, rollout, mc-label)
    ids = []
    for i in range(3):
        rows = pq.read_table(work / "labeled" / f"shard-{i:05d}.parquet").to_pylist()
        assert len(rows) == 4 and all("mc_status" in r for r in rows)
        ids += [r["problem_id"] for r in rows]
    assert ids == [f"gsm8k-test-{i}" for i in range(6) for _ in range(2)]  # disjoint slices, in order
    assert make(work) == []  # nothing to redo
    (work / "labeled" / "shard-00001.parquet").unlink()
    (cmd,) = make(work, "-j2")
    assert "mc-label" in cmd and "shard-00001" in cmd
    assert "pass the same variables" in make(work, k=3, ok=False)  # no silent mix of configurations


def test_processbench_recipe_prints_both_f1_scores(tmp_path):
    import json

    work = tmp_path / "pb"
    args = ["make", "-f", "recipes/processbench.mk", f"WORK={work}", f"DATA={DATA}", "SPLITS=gsm8k math", "SAMPLE=6",
            "MODEL=scripted:echo", "JUDGE_MODEL=scripted:judge", "ENGINE_ARGS=--engine scripted", "K=2",
            "VOTES=3", "MC_MAX_ERROR_RATE=1", f"STEPKIT={sys.executable} -m stepkit.cli"]
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "mc_first_error vs reference_first_error" in p.stdout and "judge_first_error vs" in p.stdout
    for name in ("f1-mc", "f1-judge"):
        rep = json.loads((work / "eval" / f"{name}.json").read_text())
        assert set(rep["splits"]) == {"gsm8k", "math"} and rep["average"]["rows"] == 12
    for split in ("gsm8k", "math"):  # one shard holds both labelers; the judge needs no gold answer
        rows = pq.read_table(work / "labeled" / f"{split}.parquet").to_pylist()
        assert all(r["judge_status"] == "ok" for r in rows)
        assert all(r["mc_status"] for r in rows if r["reference_answer"])
    assert json.loads((work / "eval" / "f1-judge.json").read_text())["splits"]["math"]["missing"] == 0
    agree = json.loads((work / "eval" / "agreement.json").read_text())
    assert agree["rows"] == 12


def test_processbench_recipe_judge_only(tmp_path):
    work = tmp_path / "pbj"
    args = ["make", "-f", "recipes/processbench.mk", f"WORK={work}", f"DATA={DATA}", "SPLITS=math", "SAMPLE=10",
            "SEED=4", "LABELERS=judge", "JUDGE_MODEL=scripted:judge", "JUDGE_ENGINE_ARGS=--engine scripted",
            f"STEPKIT={sys.executable} -m stepkit.cli"]
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "judge_first_error vs" in p.stdout and "mc_first_error" not in p.stdout
    assert not (work / "labeled").exists() and (work / "eval" / "f1-judge.json").exists()


def test_pipeline_recipe_ends_with_a_hub_ready_folder(tmp_path):
    """ingest -> rollout -> mc-label -> judge -> filter -> export -> publish --dry-run, scripted engines,
    with nothing but MODEL=scripted:echo given (issue 25, item 8: it stopped at filter, no row having a
    signal)."""
    import datasets

    from tests.conftest import run_cli

    work = tmp_path / "pipe"
    args = ["make", "-f", "recipes/pipeline.mk", f"WORK={work}", f"DATA={DATA}", "N=3", "SAMPLES=2", "K=2",
            "MODEL=scripted:echo", f"STEPKIT={sys.executable} -m stepkit.cli"]
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    stages = [line.split("stepkit.cli ")[1].split()[0] for line in p.stdout.splitlines() if "stepkit.cli" in line]
    assert stages == ["ingest", "rollout", "mc-label", "judge", "filter", "export", "publish"]
    assert "nothing uploaded" in p.stderr
    # why the real-model default keeps nothing here: echo's continuations never succeed, and are copies
    labelled = pq.read_table(work / "labeled.parquet").to_pylist()
    assert {r["mc_status"] for r in labelled} == {"no_signal"}
    assert p.stderr.count("warning: mc-label: distinct share 0%") == 1
    r = run_cli("filter", work / "judged.parquet", tmp_path / "f.parquet", "--rule", "status:mc_status=ok",
                "--flag-only", check=False)
    (line,) = r.stderr.strip().splitlines()
    assert r.returncode == 1 and "(present: no_signal (6 rows))" in line and "this is no typo" in line
    assert "a typo would drop" not in line and "could label no row" in line and "scripted stand-in" in line
    card = (work / "dataset" / "README.md").read_text()
    for stage in ("ingest", "rollout", "mc-label", "judge", "filter"):
        assert f"**`{stage}`**" in card
    ds = datasets.load_dataset(str(work / "dataset"), cache_dir=str(tmp_path / "cache"))
    assert ds["train"].num_rows == 6 and ds["train"].features["labels"] == datasets.List(datasets.Value("bool"))
    again = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert [line for line in again.stdout.splitlines() if "stepkit.cli" in line and "publish" not in line] == []
