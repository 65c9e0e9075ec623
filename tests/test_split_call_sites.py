"""Where stepkit splits text into steps (rollout completions, ingest's string steps), display math and code
blocks stay whole: the call sites use split_steps' rule, on real MATH-500 text."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.engines.scripted import ScriptedEngine
from stepkit.grading.verify import checker_settings
from stepkit.runner import run_stage
from stepkit.stages.ingest import IngestOptions, ingest
from stepkit.stages.rollout import RolloutConfig, RolloutStage
from tests.conftest import DATA


def _math500_with_blank_lines_in_align() -> tuple[str, str]:
    """A real MATH-500 solution holding an ``align*`` block, with a blank line added inside the block (as
    models write between rows), and that block."""
    for line in open(DATA / "math500" / "test.jsonl"):
        solution = json.loads(line)["solution"]
        start, end = solution.find("\\begin{align*}\n"), solution.find("\\end{align*}")
        if 0 <= start < end and solution.count("\\begin{align*}") == 1 and "\n\n" not in solution:
            block = solution[start:end + len("\\end{align*}")]
            wide = block.replace("\n", "\n\n", 2)
            return solution.replace(block, wide), wide
    raise AssertionError("no MATH-500 solution with one align* block")


@pytest.fixture(scope="module")
def problems(tmp_path_factory, checker):
    out = tmp_path_factory.mktemp("p") / "problems.parquet"
    ingest("gsm8k", DATA / "gsm8k" / "test.jsonl", out, IngestOptions(limit=1), checker, checker_settings())
    return out


@pytest.mark.parametrize("split", ["blank", "auto", "newline"])
def test_rollout_keeps_display_math_in_one_step(problems, checker, tmp_path, split):
    text, block = _math500_with_blank_lines_in_align()
    engine = ScriptedEngine(lambda prompt, j, n: text, "scripted:test")
    stage = RolloutStage(RolloutConfig(samples=1, split=split), EngineSpec.of(engine), SamplingConfig(max_tokens=64),
                         None, lambda: checker, generator="scripted:test")  # the prompt (and split) from the config
    run_stage(stage, problems, tmp_path / "r.parquet", progress=False)
    (row,) = pq.read_table(tmp_path / "r.parquet").to_pylist()
    assert any(block in s for s in row["steps"]), row["steps"]
    # auto: the only blank lines are inside the block, so the text has no paragraphs: one step per line
    assert row["step_separator"] == ("\n\n" if split == "blank" else "\n")


@pytest.mark.parametrize("split", ["blank", "auto"])
def test_ingest_string_steps_keep_display_math_and_code_in_one_step(tmp_path, checker, split):
    text, block = _math500_with_blank_lines_in_align()
    code = "```python\nprint(1)\n\nprint(2)\n```"
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps({"prompt": "p", "steps": f"{text}\n\nIn code:\n\n{code}\n\n \n\nDone."}) + "\n")
    ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(split=split), checker, checker_settings())
    (row,) = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert any(block in s for s in row["steps"]) and code in row["steps"]
    assert row["steps"][-2:] == [code, "Done."] and all(s.strip() == s and s for s in row["steps"])
    assert row["step_separator"] == "\n\n"
