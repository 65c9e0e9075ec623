"""mc-label against the real vLLM engine (CPU) with the bundled model, on real GSM8K solutions.

SmolLM2-135M solves few problems, so these tests check structure, counts and invariants, not skill.
"""

from __future__ import annotations

import json
import math

import pyarrow.parquet as pq
import pytest

from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.grading.verify import checker_settings
from stepkit.prompts import DEFAULT_STOP
from stepkit.runner import run_stage
from stepkit.stages.ingest import IngestOptions, ingest
from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage
from tests.conftest import DATA

pytestmark = pytest.mark.engine
LIST_COLUMNS = ("mc_rollouts", "mc_successes", "mc_truncated", "mc_value", "mc_label", "mc_estimated", "mc_progress")


@pytest.fixture(scope="module")
def solutions(tmp_path_factory, checker):
    out = tmp_path_factory.mktemp("sol") / "solutions.parquet"
    ingest("gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", out,
           IngestOptions(limit=3, generators=("175b_verification",)), checker, checker_settings())
    return out


def check_rows(rows, k):
    for r in rows:
        m = len(r["steps"])
        assert r["error"] is None
        for col in LIST_COLUMNS:
            assert len(r[col]) == m, (r["id"], col)
        assert all(0 <= s <= n for s, n in zip(r["mc_successes"], r["mc_rollouts"]))
        assert all(t <= n for t, n in zip(r["mc_truncated"], r["mc_rollouts"]))
        assert r["mc_rollouts"][-1] == 0 and r["mc_value"][-1] == (1.0 if r["outcome_correct"] else 0.0)
        assert r["mc_status"] in ("ok", "no_signal")
        if r["mc_status"] == "ok" and not r["outcome_correct"]:
            assert 0 <= r["mc_first_error"] < m


@pytest.fixture
def engine(vllm_engine):
    return vllm_engine  # the session's (tests/shared_engines.py)


class KeepOpen(MCLabelStage):
    def close(self):
        pass


def stage(engine, checker, mode, k=2, max_tokens=96):
    return KeepOpen(MCLabelConfig(continuations=k, mode=mode), EngineSpec.of(engine),
                    SamplingConfig(temperature=0.8, max_tokens=max_tokens, stop=DEFAULT_STOP), lambda: checker)


def test_truncated_continuations_are_counted_not_wrong(engine, checker, solutions, tmp_path):
    """vllm-default-max-tokens-16 on the real engine: with a 3-token budget nearly every continuation ends with
    finish_reason 'length' (one may still stop sooner, at the end of its turn); those are reported as
    truncated and left out of the denominator, never graded as wrong."""
    out = tmp_path / "t.parquet"
    (res,) = run_stage(stage(engine, checker, "exhaustive", max_tokens=3), solutions, out, progress=False)
    rows = pq.read_table(out).to_pylist()
    check_rows(rows, 2)
    for r in rows:
        for i in range(len(r["steps"]) - 1):
            n, t, e, s = (r[c][i] for c in ("mc_rollouts", "mc_truncated", "mc_empty", "mc_successes"))
            graded = n - t - e
            assert r["mc_value"][i] == (None if graded == 0 else pytest.approx(s / graded))
            if graded == 0:
                assert s == 0
    per_step = sum(sum(r["mc_truncated"]) for r in rows)  # the counter also holds v_0's (the bare problem's)
    assert per_step <= res.counters["truncated"] <= per_step + 2 * len(rows)
    assert res.counters["truncated"] >= 0.8 * res.counters["continuations"]


def test_binary_mode_budget_on_real_engine(engine, checker, solutions, tmp_path):
    out = tmp_path / "b.parquet"
    (res,) = run_stage(stage(engine, checker, "binary", k=2), solutions, out, progress=False)
    rows = pq.read_table(out).to_pylist()
    check_rows(rows, 2)
    for r in rows:
        m = len(r["steps"])
        spent = sum(r["mc_rollouts"]) + 2  # + v0
        assert spent <= 2 * (math.ceil(math.log2(m)) + 1), r["id"]
        if r["outcome_correct"]:
            assert r["mc_estimated"] == [False] * (m - 1) + [True]
    assert res.counters["continuations"] == sum(sum(r["mc_rollouts"]) + 2 for r in rows)


def test_real_labels_through_filter_export_and_publish_dry_run(engine, checker, solutions, tmp_path):
    """The issue-9 path on real-engine labels: filter -> export (TRL, hard from mc_value) -> publish --dry-run;
    the card names the real engine, model and sampling parameters and the counts the manifests hold."""
    import datasets

    from stepkit.stages.export import ExportConfig, export
    from stepkit.stages.filter import FilterConfig, FilterStage
    from stepkit.stages.publish import PublishConfig, publish

    labelled, kept = tmp_path / "mc.parquet", tmp_path / "kept.parquet"
    # K=4, 192 tokens (the demo's settings): gsm8k-test-1's prefix through "1+2 = 3 bolts in total" is
    # finished correctly, so some row has a signal (at K=2 / 96 tokens every continuation can be truncated)
    run_stage(stage(engine, checker, "exhaustive", k=4, max_tokens=192), solutions, labelled, progress=False)
    rows = pq.read_table(labelled).to_pylist()
    assert any(r["mc_status"] == "ok" for r in rows), [r["mc_successes"] for r in rows]
    run_stage(FilterStage(FilterConfig(rule=("no-error", "steps:1-"), dropped=str(tmp_path / "d.parquet"))),
              labelled, kept, progress=False)
    m = export(kept, tmp_path / "ds", ExportConfig(labels="mc_value"))
    # rows with a value for every step and a signal (a no_signal row's values are all 0: no labels)
    assert m["counts"]["rows_out"] == sum(1 for r in rows if r["mc_value"] and None not in r["mc_value"]
                                          and r["mc_status"] == "ok")
    report = publish(tmp_path / "ds", PublishConfig(dry_run=True))
    card = report["card"]
    assert "engine `vllm`, model `smollm2-135m`" in card and "sampling.temperature=0.8" in card
    assert "sampling.max_tokens=192" in card and "continuations=4" in card
    assert f"continuations {json.loads(labelled.with_name('mc.manifest.json').read_text())['counts']['continuations']}" in card
    ds = datasets.load_dataset(str(tmp_path / "ds"), cache_dir=str(tmp_path / "cache"))
    assert all(len(r["labels"]) == len(r["completions"]) for r in ds["train"])
    assert (tmp_path / "ds" / "images" / "value_by_step.png").stat().st_size > 1000


def test_distinct_and_empty_counts_on_real_engine(engine, checker, solutions, tmp_path):
    """Issue 25, items 1-2 on the real engine: temperature 0 gives K copies per prefix (distinct share 0,
    the warning names temperature 0); sampling at 0.8 gives distinct texts. Counts stay consistent."""
    from stepkit.per_row import distinct_share

    shares = {}
    for temperature in (0.0, 0.8):
        st = KeepOpen(MCLabelConfig(continuations=4), EngineSpec.of(engine),
                      SamplingConfig(temperature=temperature, max_tokens=48, stop=DEFAULT_STOP), lambda: checker)
        out = tmp_path / f"t{temperature}.parquet"
        (res,) = run_stage(st, solutions, out, progress=False)
        for r in pq.read_table(out).to_pylist():
            for n, e, d, t in zip(r["mc_rollouts"], r["mc_empty"], r["mc_distinct"], r["mc_truncated"]):
                assert 0 <= e <= n and 0 <= d <= n - e and t <= n - e
        assert res.counters["empty"] * 2 <= res.counters["continuations"]  # not refused
        shares[temperature] = distinct_share(res.counters)
        warnings = st.run_warnings(res.counters)
        if temperature == 0:
            assert shares[0.0] < 0.5 and "temperature 0" in warnings[0]  # (the prefix cache may make one differ)
        else:
            assert shares[0.8] > 0.5 and warnings == []
    print(f"distinct share: temperature 0 -> {shares[0.0]:.2f}, 0.8 -> {shares[0.8]:.2f}")
