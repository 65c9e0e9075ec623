"""The dataset card tells what stepkit knows: title, license and source datasets from the sources' own cards,
citations, only the options that applied, the step separator, TRL's version facts, a "Read before use" section
stating degenerate labels; and ``stats`` averages MC values by position over rows with a signal only."""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest
import yaml

from stepkit.stages.export import ExportConfig, export
from stepkit.stages.publish import PublishConfig, publish
from tests.conftest import DATA
from tests.test_export_text import invoke, ok


def front(card):
    return yaml.safe_load(card.split("---\n")[1])


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Real shards: ProcessBench gsm8k rows (human labels; 3 of them wrong from their first step) and GSM8K
    model solutions labelled by mc-label (scripted engine, K=2)."""
    d = tmp_path_factory.mktemp("card")
    ok("ingest", "processbench", DATA / "processbench" / "gsm8k.json", d / "pb.parquet")
    t = pq.read_table(d / "pb.parquet")
    first0 = [i for i, x in enumerate(t.column("reference_first_error").to_pylist()) if x == 0][:3]
    pq.write_table(t.take(first0), d / "pb-first0.parquet")
    (d / "pb.manifest.json").rename(d / "pb-first0.manifest.json")
    ok("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", d / "sol.parquet",
       "--limit", "3")
    ok("mc-label", d / "sol.parquet", d / "mc.parquet", "--engine", "scripted", "--model", "scripted:echo", "-k", "2",
       "--no-progress")
    return d


def test_processbench_card_license_sources_citations_and_read_before_use(shards, tmp_path):
    out = tmp_path / "ds"
    export(shards / "pb-first0.parquet", out, ExportConfig(labels="reference_first_error"))
    card = publish(out, PublishConfig(dry_run=True, repo_id="org/pb-first-steps", pretty_name="First steps"))["card"]
    meta = front(card)
    assert meta["license"] == "apache-2.0" and meta["source_datasets"] == ["Qwen/ProcessBench"]
    assert meta["pretty_name"] == "First steps" and "\n# First steps\n" in card
    assert "arXiv:2412.06559" in card and "```bibtex" in card
    assert "## Read before use" in card and "The first step is labelled wrong in 3 of 3 rows." in card
    assert '**Step separator:** `"\\n\\n"`' in card and "trl 1.13.0" in card and "stepkit train-prm" in card
    assert not re.search(r"`options\.(gold_col|outcome_col|prompt_col|seed)=", card)


def test_gsm8k_card_from_mc_labels_says_how_often_the_labeller_solves(shards, tmp_path):
    out = tmp_path / "ds"
    export(shards / "mc.parquet", out, ExportConfig(labels="mc_value"))
    card = publish(out, PublishConfig(dry_run=True))["card"]
    meta = front(card)
    assert meta["license"] == "mit" and meta["source_datasets"] == ["openai/gsm8k"]
    assert "arXiv:2110.14168" in card and "arXiv:2312.08935" in card  # GSM8K and Math-Shepherd
    v0 = [r["mc_value_start"] for r in pq.read_table(shards / "mc.parquet").to_pylist()
          if r["mc_status"] == "ok" and r["mc_value_start"] is not None]
    assert v0  # the scripted completer solves none of them: a degenerate labeller the card must name
    assert f"the labelling model solves {100 * sum(v0) / len(v0):.0f}% of these problems" in card.lower()
    no_signal = sum(r["mc_status"] == "no_signal" for r in pq.read_table(shards / "mc.parquet").to_pylist())
    assert no_signal and f"{no_signal} row(s) had no labels" in card
    assert "`options.limit=3`" in card  # the options that applied are listed ...
    assert "`options.gold_col=" not in card and "`options.outcome_col=" not in card  # ... messages-only ones not


def test_unknown_source_is_unknown_and_known_ones_stay_listed(shards, tmp_path):
    t = pq.read_table(shards / "pb-first0.parquet")
    pq.write_table(t.replace_schema_metadata({}), tmp_path / "mine.parquet")  # no lineage: nothing known
    export(tmp_path / "mine.parquet", tmp_path / "ds", ExportConfig(labels="reference_first_error"))
    meta = front(publish(tmp_path / "ds", PublishConfig(dry_run=True))["card"])
    assert meta["license"] == "unknown" and "source_datasets" not in meta


def test_stats_value_by_position_leaves_no_signal_rows_out(shards):
    rows = pq.read_table(shards / "mc.parquet").to_pylist()
    no_signal = sum(r["mc_status"] == "no_signal" for r in rows)
    r = invoke("stats", shards / "mc.parquet")
    assert r.exit_code == 0, r.output
    ok_rows = [x for x in rows if x["mc_status"] == "ok" and len(x["steps"]) > 1 and x["mc_value"][0] is not None]
    assert no_signal and ok_rows
    assert f"{no_signal} no_signal row(s) left out" in " ".join(r.output.split())
    if ok_rows:
        mean = sum(x["mc_value"][0] for x in ok_rows) / len(ok_rows)
        line = next(ln for ln in r.output.splitlines() if re.match(r"\s*│?\s*0\s*│", ln))
        assert f"{mean:.3f}" in line and f" {len(ok_rows)} " in line
