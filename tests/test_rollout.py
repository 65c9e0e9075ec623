"""rollout: N samples per problem, steps split, answers graded; scripted (exact) and real vLLM."""

from __future__ import annotations

import json
import sys

import pyarrow.parquet as pq
import pytest

from stepkit.engines.base import Completion, EngineSpec, SamplingConfig
from stepkit.engines.scripted import ScriptedEngine
from stepkit.errors import ConfigError
from stepkit.grading.verify import checker_settings
from stepkit.runner import run_stage
from stepkit.stages.ingest import IngestOptions, ingest
from stepkit.stages.rollout import RolloutConfig, RolloutPrompt, RolloutStage, fewshot_from_problems, load_recipe
from tests.conftest import DATA, ROOT, run_cli

STEPKIT = [sys.executable, "-m", "stepkit.cli"]


@pytest.fixture(scope="module")
def problems(tmp_path_factory, checker):
    out = tmp_path_factory.mktemp("p") / "problems.parquet"
    ingest("gsm8k", DATA / "gsm8k" / "test.jsonl", out, IngestOptions(limit=4), checker, checker_settings())
    return out


@pytest.fixture(scope="module")
def shots(tmp_path_factory, checker):
    """Few-shot exemplars from real GSM8K rows disjoint from the problems (rows 100..101)."""
    src = tmp_path_factory.mktemp("s") / "pool.jsonl"
    src.write_text("\n".join((DATA / "gsm8k" / "test.jsonl").read_text().splitlines()[100:102]) + "\n")
    out = src.with_suffix(".parquet")
    ingest("gsm8k", src, out, IngestOptions(), checker, checker_settings())
    return out


def scripted_stage(policy, checker, samples=3, prompt=RolloutPrompt()):
    engine = ScriptedEngine(policy, "scripted:test")
    return RolloutStage(RolloutConfig(samples=samples), EngineSpec.of(engine), SamplingConfig(max_tokens=64), prompt,
                        lambda: checker, generator="scripted:test"), engine


def test_rows_per_sample_graded_truncated_and_empty(problems, checker, tmp_path):
    def policy(prompt, j, n):
        return [Completion("Half of 36 is 18.\nThe answer is 18.", "stop", 12),
                Completion("First we add\nthen we", "length", 64),
                Completion("   ", "stop", 1)][j]

    stage, engine = scripted_stage(policy, checker)
    out = tmp_path / "r.parquet"
    (res,) = run_stage(stage, problems, out, progress=False, max_error_rate=0.5)
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 12 and [r["id"] for r in rows[:3]] == ["gsm8k-test-0:r0", "gsm8k-test-0:r1", "gsm8k-test-0:r2"]
    ok, cut, empty = rows[0], rows[1], rows[2]
    assert ok["steps"] == ["Half of 36 is 18.", "The answer is 18."] and ok["final_answer"] == "18"
    assert ok["outcome_correct"] is True  # problem 0's gold is 18
    assert rows[3]["outcome_correct"] is False  # problem 1's gold is 3
    assert cut["rollout_finish_reason"] == "length" and cut["outcome_correct"] is None and cut["error"] is None
    assert empty["error"] == "rollout: empty completion" and empty["steps"] == []
    assert res.counters["truncated"] == 4 and res.counters["samples"] == 12
    assert ok["rollout_completion_tokens"] == 12 and ok["generator"] == "scripted:test"
    assert all(r.n == 3 for r in engine.calls)


def test_fewshot_exemplars_are_real_turns(shots):
    prompt = RolloutPrompt(fewshot=fewshot_from_problems(shots, 2), system="Be brief.")
    msgs = prompt.messages("What is 2+2?")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[2]["content"].endswith("The answer is " + fewshot_from_problems(shots, 1)[0]["answer"] + ".")
    assert "<<" not in msgs[2]["content"]
    with pytest.raises(ConfigError, match="only 2 rows"):
        fewshot_from_problems(shots, 5)
    assert RolloutPrompt().hash() != prompt.hash()


def test_recipe_file(tmp_path):
    assert load_recipe(ROOT / "recipes" / "gsm8k-rollout.yaml")["samples"] >= 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("temprature: 0.5\n")
    with pytest.raises(ConfigError, match="unknown recipe keys"):
        load_recipe(bad)


def test_cli_chain_ingest_rollout_mc_label_scripted(problems, tmp_path):
    roll, lab = tmp_path / "roll.parquet", tmp_path / "lab.parquet"
    p = run_cli("rollout", problems, roll, "--engine", "scripted", "--model", "scripted:echo", "-n", "2", "--no-progress", "--recipe", ROOT / "recipes" / "gsm8k-rollout.yaml", "--temperature", "0.3", check=False)
    assert p.returncode == 0, p.stderr
    m = json.loads((tmp_path / "roll.manifest.json").read_text())
    assert m["config"]["samples"] == 2 and m["config"]["sampling"]["temperature"] == 0.3  # flag beats recipe
    recipe = load_recipe(ROOT / "recipes" / "gsm8k-rollout.yaml")
    assert m["config"]["sampling"]["max_tokens"] == recipe["max_tokens"]  # recipe beats default
    p = run_cli("mc-label", roll, lab, "--engine", "scripted", "--model", "scripted:echo", "-k", "2", "--no-progress", check=False)
    assert p.returncode == 0, p.stderr
    rows = pq.read_table(lab).to_pylist()
    assert len(rows) == 8 and all(len(r["mc_value"]) == len(r["steps"]) for r in rows if r["mc_value"])


@pytest.mark.engine
def test_rollout_real_engine_4_problems_x_4_samples(problems, tmp_path):
    out = tmp_path / "roll.parquet"
    p = run_cli("rollout", problems, out, "--model", "smollm2-135m", "-n", "4", "--max-tokens", "160", "--no-progress", check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 16
    assert [r["id"] for r in rows[:4]] == [f"gsm8k-test-0:r{j}" for j in range(4)]
    for r in rows:
        assert r["rollout_finish_reason"] in ("stop", "length")
        assert r["rollout_completion_tokens"] > 0 and r["rollout_prompt_tokens"] > 0
        assert r["generator"] == "smollm2-135m"
        if r["error"] is None:
            assert r["steps"] and all(s.strip() for s in r["steps"])
        if r["rollout_finish_reason"] == "length":
            assert r["outcome_correct"] is None
        elif r["error"] is None:
            assert r["outcome_correct"] in (True, False)
    m = json.loads((tmp_path / "roll.manifest.json").read_text())
    assert m["config"]["sampling"]["max_tokens"] == 160 and m["provenance"]["engine"]["engine"] == "vllm"
    assert m["counts"]["samples"] == 16


def test_recipe_values_are_typed(tmp_path):
    r = tmp_path / "r.yaml"
    r.write_text('stop: "\\n\\n"\n')
    assert load_recipe(r)["stop"] == ["\n\n"]  # one stop string, not its characters
    r.write_text("samples: '3'\n")
    with pytest.raises(ConfigError, match="recipe key 'samples'"):
        load_recipe(r)


def test_rollout_refuses_repeated_problem_ids(problems, tmp_path, checker):
    import pyarrow as pa

    t = pq.read_table(problems)
    dup = tmp_path / "dup.parquet"
    pq.write_table(pa.concat_tables([t, t.slice(0, 1)]), dup)
    stage, _ = scripted_stage(lambda p, j, n: "x", checker)
    from stepkit.errors import InputError

    with pytest.raises(InputError, match="row 4, column 'problem_id': duplicate value"):
        run_stage(stage, dup, tmp_path / "o.parquet", progress=False)


def test_rollout_keeps_reference_steps(problems, checker, tmp_path):
    stage, _ = scripted_stage(lambda p, j, n: "The answer is 3.", checker, samples=1)
    run_stage(stage, problems, tmp_path / "o.parquet", progress=False)
    rows = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert rows[0]["reference_steps"] == pq.read_table(problems).column("reference_steps").to_pylist()[0]


def test_fewshot_exemplars_must_not_be_the_problems_sampled(problems, tmp_path):
    p = run_cli("rollout", problems, tmp_path / "o.parquet", "--engine", "scripted", "--model", "scripted:echo", "--fewshot", "1", "--fewshot-file", problems, "--no-progress", check=False)
    assert p.returncode == 1 and "row 0, column 'prompt': this problem is also a few-shot exemplar" in p.stderr


@pytest.mark.parametrize("text, msg", [
    ("samples: " + "1" * 5000 + "\n", "cannot read recipe (an integer of more than 4300 digits)"),
    ("description: " + "[" * 100_000 + "]" * 100_000 + "\n", "cannot read recipe (nested too deeply)"),
    ('split: "(?<=a+)"\n', "recipe key 'split': step split mode '(?<=a+)' is neither a known mode nor a valid regex"),
    (b'instruction: "\xff\xfe"\n', "cannot read recipe ('utf-8' codec can't decode byte 0xff"),
    ("fewshot: 2\n", "--fewshot needs --fewshot-file (or fewshot_file in the recipe)"),
    ("fewshot: 1\nfewshot_file: nowhere.parquet\n", "nowhere.parquet: no such file"),
])
def test_bad_recipe_is_one_error_naming_the_recipe(problems, tmp_path, text, msg):
    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(text if isinstance(text, bytes) else text.encode())
    p = run_cli("rollout", problems, tmp_path / "o.parquet", "--engine", "scripted", "--model", "scripted:echo", "--no-progress", "--recipe", recipe, check=False)
    assert p.returncode == 1 and p.stderr.startswith(f"error: {recipe}: ") and p.stderr.count("\n") == 1, p.stderr
    assert msg in p.stderr


def test_grading_leaves_the_event_loop_free(problems, checker, monkeypatch):
    """A chunk's answers are graded from a worker thread (``agrade_many``): meanwhile the event loop keeps
    running, so the runner's other chunks in flight send their requests. A check that takes 0.3 s (here a
    stand-in slowness in ``check_many``) used to stop the loop for as long."""
    import asyncio
    import time

    from stepkit.shards import read_rows

    real = type(checker).check_many

    def slow(self, pairs):
        time.sleep(0.3)
        return real(self, pairs)

    monkeypatch.setattr(type(checker), "check_many", slow)
    # an answer no other test grades, so the checker's memo does not answer it at once
    stage, _ = scripted_stage(lambda prompt, j, n: f"The answer is {18 + 1000 * j}7171.", checker, samples=2)
    stage.open()
    rows = read_rows(problems)

    async def both():
        ticks, done = [], asyncio.Event()

        async def tick():
            while not done.is_set():
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        out, counters = await stage.aprocess(rows)
        done.set()
        await ticker
        return out, counters, ticks

    out, counters, ticks = asyncio.run(both())
    assert counters["samples"] == 8 and counters["correct"] == 0 and len(ticks) > 20
    assert max(b - a for a, b in zip(ticks, ticks[1:])) < 0.2, "the loop stood still while answers were graded"
