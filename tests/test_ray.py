"""The Ray executor (issue 12) with the scripted engine, on the session's local Ray instance
(``ray_cluster`` in conftest): output identical to ``--executor local``, an actor killed mid-shard retried
and resumed from its committed chunks, a failing shard reported while the others finish, results matched
to shards by identity, and the one-line errors of the options around it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.prompts import DEFAULT_STOP
from stepkit.runner import run_stage
from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage
from tests.conftest import DATA, ROOT
from tests.toy_stage import CountingToyStage, ToyConfig, ToyStage

STEPKIT = [sys.executable, "-m", "stepkit.cli"]
SCRIPTED = ["--engine", "scripted", "--model", "scripted:echo", "-k", "2", "--chunk-size", "1"]
SIZES = (7, 3, 3, 3)  # rows of the 4 shards: the first is the longest, so it finishes last


def run(*args, env=None, check=True, timeout=300):
    p = subprocess.run([*STEPKIT, *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, **(env or {})}, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"stepkit {args} failed ({p.returncode}):\n{p.stderr}")
    return p


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """16 real GSM8K model solutions (4 problems x 4 generators) in 4 shards of SIZES rows."""
    tmp = tmp_path_factory.mktemp("ray")
    run("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", tmp / "all.parquet",
        "--limit", "4")
    table = pq.read_table(tmp / "all.parquet")
    folder = tmp / "in"
    folder.mkdir()
    start = 0
    for i, n in enumerate(SIZES):
        pq.write_table(table.slice(start, n), folder / f"s{i}.parquet")
        start += n
    return folder


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory) -> Path:
    """The same folder labelled with --executor local."""
    out = tmp_path_factory.mktemp("ref") / "out"
    run("mc-label", shards, out, *SCRIPTED, "--no-progress")
    return out


def rows_of(folder: Path) -> dict[str, list[dict]]:
    return {p.name: pq.read_table(p).to_pylist() for p in sorted(folder.glob("*.parquet"))}


def manifest(out: Path) -> dict:
    return json.loads(out.with_name(out.name.removesuffix(".parquet") + ".manifest.json").read_text())


def test_four_shards_on_ray_equal_the_local_run(shards, reference, ray_cluster, tmp_path):
    out = tmp_path / "out"
    p = run("mc-label", shards, out, *SCRIPTED, "--executor", "ray", "--ray-address", ray_cluster)
    assert rows_of(out) == rows_of(reference) and len(rows_of(out)) == 4
    for name in rows_of(out):
        ours, theirs = manifest(out / name), manifest(reference / name)
        assert ours["identity"] == theirs["identity"] and ours["counts"] == theirs["counts"]
        assert ours["run"]["chunks_this_run"] == ours["run"]["chunks"] and not (out / f"{name}.parts").exists()
    # one progress view for all shards, then the same summary table as a local run
    assert "mc-label (4 shards on ray)" in p.stderr and "16/16 rows" in p.stderr
    assert "shards: 4 done, 0 running, 0 failed, 0 waiting" in p.stderr
    assert "chunks resumed / total" in p.stderr and "s3.parquet" in p.stderr
    again = run("mc-label", shards, out, *SCRIPTED, "--executor", "ray", "--ray-address", ray_cluster, "--no-progress")
    assert again.stderr.count("up to date") == 4  # finished shards are not sent to Ray again


def _shard_actor_pid(parts: Path, deadline: float) -> int:
    """The pid of the Ray actor running the shard of ``parts``: the process that logged its chunks there
    (``log.jsonl``), checked to be a live Ray actor process (its title ``ray::_ShardActor...``)."""
    while time.time() < deadline:
        try:
            events = [json.loads(line) for line in (parts / "log.jsonl").read_text().splitlines() if line.strip()]
        except (OSError, json.JSONDecodeError):
            events = []
        for e in reversed(events):
            try:
                title = Path(f"/proc/{e['pid']}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if title.startswith("ray::_ShardActor"):
                return e["pid"]
        time.sleep(0.05)
    raise AssertionError(f"no live actor seen writing {parts}")


def test_an_actor_killed_mid_shard_is_retried_and_resumes(shards, reference, ray_cluster, tmp_path):
    out = tmp_path / "out"
    parts = out / "s0.parquet.parts"
    proc = subprocess.Popen([*STEPKIT, "mc-label", str(shards), str(out), *SCRIPTED, "--chunks-in-flight", "1",
                             "--executor", "ray", "--ray-address", ray_cluster], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "STEPKIT_SCRIPTED_DELAY": "0.05"})
    deadline = time.time() + 120
    while len(list(parts.glob("part-*.parquet"))) < 2:
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.02)
    pid = _shard_actor_pid(parts, deadline)
    os.kill(pid, signal.SIGKILL)  # the actor's process dies mid-shard, as when its machine is lost
    committed = {p.name: pq.read_table(p).to_pylist() for p in parts.glob("part-*.parquet")}
    assert 2 <= len(committed) < SIZES[0] and not (out / "s0.parquet").exists()
    stderr = proc.communicate(timeout=180)[1]
    assert proc.returncode == 0, stderr
    assert rows_of(out) == rows_of(reference)
    m = manifest(out / "s0.parquet")["run"]
    assert m["resumed_chunks"] == len(committed) and m["chunks_this_run"] == SIZES[0] - len(committed)
    final = pq.read_table(out / "s0.parquet").to_pylist()
    for name, rows in committed.items():  # the chunks committed before the kill are in OUT as they were
        assert final[int(name[5:10])] == rows[0]
    assert "1 retried" in stderr and "shards: 4 done" in stderr


def test_a_failing_shard_is_reported_while_the_others_finish(shards, reference, ray_cluster, tmp_path):
    """Shard s2's generator text is damaged (not UTF-8: planning reads no such column, so it shows when the
    task reads its rows): its one-line error is printed, the other three shards finish, the exit status is 1."""
    folder = tmp_path / "in"
    folder.mkdir()
    for p in shards.glob("*.parquet"):
        (folder / p.name).write_bytes(p.read_bytes())
    t = pq.read_table(folder / "s2.parquet")
    t = t.set_column(t.schema.get_field_index("generator"), "generator",
                     pa.array([f"MARKER-{i}" for i in range(t.num_rows)]))
    pq.write_table(t, folder / "s2.parquet", compression="none", write_statistics=False)
    (folder / "s2.parquet").write_bytes((folder / "s2.parquet").read_bytes().replace(b"MARKER-", b"\xffARKER-"))
    out = tmp_path / "out"
    p = run("mc-label", folder, out, *SCRIPTED, "--executor", "ray", "--ray-address", ray_cluster, "--no-progress",
            check=False)
    assert p.returncode == 1
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {folder / 's2.parquet'}: cannot read rows after row 0 ('utf-8' codec can't decode "
                      "byte 0xff in position 0: invalid start byte)"]
    assert "failed" in p.stderr and "Traceback" not in p.stderr
    done = rows_of(out)
    assert sorted(done) == ["s0.parquet", "s1.parquet", "s3.parquet"]
    assert done == {k: v for k, v in rows_of(reference).items() if k != "s2.parquet"}
    assert not (out / "s2.parquet.parts").exists()  # nothing committed: no parts folder left behind


def test_results_are_matched_to_shards_by_identity_and_failures_come_back(shards, ray_cluster, tmp_path):
    """In-process (this session's Ray connection), with the toy stage: the shards finish in another order
    than planned (s0, the longest, after s1), yet each result is its own shard's, in plan order; a shard
    over its error budget comes back failed, with its parts kept, while the others finish."""
    from stepkit.runner.ray_executor import RayExecutor

    folder = tmp_path / "in"
    folder.mkdir()
    for p in shards.glob("*.parquet"):
        (folder / p.name).write_bytes(p.read_bytes())
    t = pq.read_table(folder / "s3.parquet")  # s3's steps are all short: every row is a toy row error
    steps = pa.array([["x"]] * t.num_rows, t.schema.field("steps").type)
    pq.write_table(t.set_column(t.schema.get_field_index("steps"), "steps", steps), folder / "s3.parquet")
    cfg = ToyConfig(steps_out=str(tmp_path / "steps"), min_length=2, delay=0.3)
    stage = ToyStage(cfg)
    results = run_stage(stage, folder, tmp_path / "out", progress=False, chunk_size=1, executor=RayExecutor())
    out = tmp_path / "out"
    assert (out / "s1.parquet").stat().st_mtime < (out / "s0.parquet").stat().st_mtime  # finished first
    assert [r.output.name for r in results] == [f"s{i}.parquet" for i in range(4)]
    assert [r.status for r in results] == ["done", "done", "done", "failed"]
    assert [r.rows for r in results[:3]] == list(SIZES[:3])
    assert results[3].error.startswith(f"{folder / 's3.parquet'}: 3 of 3 rows failed (short step: 3)")
    assert (out / "s3.parquet.parts").exists()  # kept for a rerun with a higher budget, as with local
    for r in results[:3]:
        assert pq.read_table(r.output).num_rows == r.rows == manifest(r.output)["input"]["rows"]
        assert manifest(r.output)["input"]["path"] == str(r.input)
        assert pq.read_table(tmp_path / "steps" / r.output.name).num_rows > 0  # its side output too


def test_the_stage_goes_to_the_tasks_unopened(shards, ray_cluster, tmp_path):
    """The driver never builds the engine: each task opens the stage it was sent (and a stage already
    open is refused rather than shipped with its engine)."""
    from stepkit.errors import ConfigError
    from stepkit.runner.ray_executor import RayExecutor

    stage = MCLabelStage(MCLabelConfig(continuations=2), EngineSpec("scripted", "scripted:echo"),
                         SamplingConfig(max_tokens=64, stop=DEFAULT_STOP))
    one = tmp_path / "one"
    one.mkdir()
    (one / "s1.parquet").write_bytes((shards / "s1.parquet").read_bytes())
    (res,) = run_stage(stage, one, tmp_path / "out", progress=False, executor=RayExecutor())
    assert res.status == "done" and res.tokens > 0 and stage.engine is None and stage.checker is None
    stage.open()
    try:
        with pytest.raises(ConfigError, match="the stage is open already"):
            run_stage(stage, one, tmp_path / "out2", progress=False, executor=RayExecutor())
    finally:
        stage.close()


def test_ray_options_need_the_ray_executor_and_ray_itself(shards, tmp_path):
    p = run("mc-label", shards, tmp_path / "o", *SCRIPTED, "--gpus-per-shard", "1", check=False)
    assert p.returncode == 1
    assert p.stderr == "error: --gpus-per-shard is an option of --executor ray; this run uses --executor local\n"
    # Ray missing: one line saying how to install it (the import is blocked in this process)
    code = ("import sys; sys.modules['ray'] = None\nfrom stepkit.cli import main\n"
            f"main({['mc-label', str(shards), str(tmp_path / 'o'), *SCRIPTED, '--executor', 'ray']!r})")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 1
    assert p.stderr == "error: --executor ray needs Ray, which is not installed: pip install 'stepkit[ray]'\n"
    assert not (tmp_path / "o").exists()
    for flag, value in (("--cpus-per-shard", "0"), ("--shard-retries", "-1"), ("--executor", "dask")):
        p = run("mc-label", shards, tmp_path / "o", *SCRIPTED, flag, value, check=False)
        assert p.returncode == 2 and flag in p.stderr


def test_tensor_parallelism_must_fit_the_gpus_of_a_shard(shards, tmp_path):
    from stepkit.errors import ConfigError
    from stepkit.runner.ray_executor import RayExecutor

    stage = MCLabelStage(MCLabelConfig(), EngineSpec("vllm", "smollm2-135m", 0, {"tensor_parallel_size": 2}),
                         SamplingConfig())
    with pytest.raises(ConfigError, match=r"^--tensor-parallel-size 2 needs 2 GPUs per shard, but --gpus-per-shard is 1$"):
        RayExecutor(gpus_per_shard=1)._check_stage(stage)


@pytest.mark.parametrize("command", [["rollout"], ["mc-label"], ["mcts-label"], ["judge"], ["clue", "recover"],
                                     ["clue", "score"], ["likelihood-label"]])
def test_every_model_stage_has_the_executor_options(command):
    from click.testing import CliRunner

    from stepkit.cli import main

    r = CliRunner().invoke(main, [*command, "--help"])
    assert r.exit_code == 0, r.output
    for flag in ("--executor [local|ray]", "--ray-address", "--cpus-per-shard", "--gpus-per-shard",
                 "--shard-retries", "--rank R|auto"):
        assert flag in r.output, (command, flag)


def test_each_actor_opens_the_stage_once_for_all_its_shards(shards, ray_cluster, tmp_path):
    """4 shards on the session's 2 CPUs with 1 CPU per shard: 2 actors, each opening the stage once, running
    its shards, closing it once, and then gone (its process ends, so an engine's memory is given back)."""
    from stepkit.runner.ray_executor import RayExecutor

    log = tmp_path / "opens.log"
    stage = CountingToyStage(ToyConfig(steps_out=str(tmp_path / "steps"), delay=0.1), str(log))
    results = run_stage(stage, shards, tmp_path / "out", progress=False, chunk_size=1, executor=RayExecutor())
    assert [r.status for r in results] == ["done"] * 4
    events = [line.split() for line in log.read_text().splitlines()]
    opens = [pid for what, pid in events if what == "open"]
    closes = [pid for what, pid in events if what == "close"]
    assert len(opens) == 2 and len(set(opens)) == 2 and sorted(closes) == sorted(opens), events
    assert str(os.getpid()) not in opens
    deadline = time.time() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in opens) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in opens), "an actor process outlived the run"


def _one_bad_shard(shards: Path, folder: Path, name: str, damage) -> Path:
    """A copy of ``shards`` in ``folder`` whose shard ``name`` is ``damage(table)``."""
    folder.mkdir()
    for p in shards.glob("*.parquet"):
        (folder / p.name).write_bytes(p.read_bytes())
    pq.write_table(damage(pq.read_table(folder / name)), folder / name)
    return folder


def test_shards_with_bad_rows_fail_alone_on_ray(shards, reference, ray_cluster, tmp_path):
    """Each actor plans its own shard: s1 has no `steps` column and s2 a row whose `steps` list is empty. Each
    fails with the one line a local run of it gives, while s0 and s3 finish; exit status 1. (With --executor
    local, planning reads every shard first and the first bad one stops the command before any work.)"""
    def no_steps(t):
        return t.drop_columns(["steps"])

    def empty_steps(t):
        steps = t.column("steps").to_pylist()
        steps[1] = []
        return t.set_column(t.schema.get_field_index("steps"), "steps", pa.array(steps, t.schema.field("steps").type))

    folder = _one_bad_shard(shards, tmp_path / "in", "s1.parquet", no_steps)
    pq.write_table(empty_steps(pq.read_table(folder / "s2.parquet")), folder / "s2.parquet")
    expected = []
    for name in ("s1.parquet", "s2.parquet"):  # the error line of a local run of that shard alone
        alone = tmp_path / f"alone-{name}"
        alone.mkdir()
        (alone / name).write_bytes((folder / name).read_bytes())
        local = run("mc-label", alone, tmp_path / f"out-{name[:2]}", *SCRIPTED, "--no-progress", check=False)
        assert local.returncode == 1 and local.stderr.startswith("error: "), local.stderr
        expected.append(local.stderr.strip().replace(str(alone), str(folder)))
    out = tmp_path / "out"
    p = run("mc-label", folder, out, *SCRIPTED, "--executor", "ray", "--ray-address", ray_cluster, check=False)
    assert p.returncode == 1, p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert errors == expected and "steps" in errors[0] and "Traceback" not in p.stderr
    assert "shards: 2 done, 0 running, 2 failed, 0 waiting" in p.stderr
    assert rows_of(out) == {k: v for k, v in rows_of(reference).items() if k in ("s0.parquet", "s3.parquet")}
    assert not (out / "s1.parquet.parts").exists() and not (out / "s2.parquet.parts").exists()


@pytest.mark.parametrize("deaths", [1, 99])
def test_an_actor_killed_by_rays_memory_monitor_is_retried_then_one_line(deaths, shards, ray_cluster, tmp_path,
                                                                          monkeypatch):
    """Ray's memory monitor killing an actor surfaces as ``OutOfMemoryError``, which is no ``RayActorError``
    (issue 25 item 3): it is retried like any actor death, and past ``--shard-retries`` the shard fails with
    one line that says how its actor died. The driver's ``ray.get`` of a shard's result raises it here."""
    import ray

    from stepkit.runner.ray_executor import RayExecutor

    real_get, seen = ray.get, []

    def get(ref, *args, **kwargs):
        if args or kwargs:  # the progress board's snapshot (with a timeout), not a shard's result
            return real_get(ref, *args, **kwargs)
        seen.append(ref)
        if len(seen) <= deaths:
            raise ray.exceptions.OutOfMemoryError("Task was killed due to the node running low on memory.")
        return real_get(ref)

    one = tmp_path / "one"
    one.mkdir()
    (one / "s1.parquet").write_bytes((shards / "s1.parquet").read_bytes())
    monkeypatch.setattr(ray, "get", get)
    (res,) = run_stage(ToyStage(ToyConfig(steps_out=str(tmp_path / "steps"))), one, tmp_path / "out",
                       progress=False, executor=RayExecutor(max_retries=1))
    if deaths == 1:  # retried on a new actor: the shard is finished (by the first actor before its result was lost)
        assert res.status in ("done", "up to date") and pq.read_table(tmp_path / "out" / "s1.parquet").num_rows == 3
    else:
        assert res.status == "failed" and len(seen) == 2 and "\n" not in res.error
        assert "its actor died 2 time(s), the last killed by Ray's memory monitor" in res.error
        assert "OutOfMemoryError" in res.error and "run the same command again to resume" in res.error


def test_an_address_where_no_cluster_answers_is_one_line_at_once(shards, tmp_path):
    """Breaking run E11: an unreachable --ray-address (or RAY_ADDRESS with auto) hung with no message."""
    from stepkit.errors import ConfigError
    from stepkit.runner.ray_executor import check_reachable
    from tests.servers import free_port

    port = free_port()
    with pytest.raises(ConfigError, match=rf"--ray-address 127.0.0.1:{port}: nothing answers at 127.0.0.1:{port} "
                                          r"\(connection refused"):
        check_reachable(f"127.0.0.1:{port}")
    with pytest.raises(ConfigError, match=rf"--ray-address auto \(RAY_ADDRESS=ray://127.0.0.1:{port}\): nothing"):
        check_reachable("auto", env={"RAY_ADDRESS": f"ray://127.0.0.1:{port}"})
    check_reachable("auto", env={})  # Ray looks for a local cluster itself
    with pytest.raises(ConfigError, match="expected host:port"):
        check_reachable("my-cluster")
    p = run("mc-label", shards, tmp_path / "o", *SCRIPTED, "--executor", "ray", "--ray-address", f"127.0.0.1:{port}",
            check=False, timeout=60)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "nothing answers at" in p.stderr, p.stderr
