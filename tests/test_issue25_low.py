"""The low defects of issue 25 (breaking run D7-D12), each as a test on real ProcessBench / GSM8K rows, in
process: processbench's separator refusal, --license ids, report over two exports / one IN twice / per-step
lists of the wrong length, a problems shard given to a labelling stage."""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest

from stepkit.errors import ConfigError
from stepkit.stages.card_sources import HUB_LICENSES
from stepkit.stages.publish import PublishConfig
from tests.conftest import DATA, run_cli
from tests.test_export import labelled, write

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")


def error_line(r):
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.fixture
def shard(tmp_path):
    return write(tmp_path / "in.parquet", labelled(4))


def test_processbench_separator_refusal_says_the_steps_stay_a_list(tmp_path, shard):
    """D7: processbench keeps steps as a list; the refusal said 'joined, it would read as two steps' as if the
    export joined them."""
    r = run_cli("export", shard, tmp_path / "pb", "--format", "processbench", "--labels", "mc_first_error",
                "--step-separator", " ", check=False)
    line = error_line(r)
    assert "column 'steps': step 0 holds the step separator ' ': --format processbench keeps the steps a list, but " \
           "a reader that joins them with the separator this export records" in line
    assert "joined into the text" not in line
    r = run_cli("export", shard, tmp_path / "ms", "--format", "math-shepherd", "--labels", "mc_label",
                "--step-separator", " ", check=False)  # a text format: the export itself joins them
    assert "joined into the text, it would read as two steps" in error_line(r)
    run_cli("export", shard, tmp_path / "pb2", "--format", "processbench", "--labels", "mc_first_error",
            "--step-separator", "\\n\\n\\n")  # one no step holds: fine


def test_publish_license_must_be_a_hub_license_id(tmp_path, shard):
    """D9: any --license text (a typo, '', 'MIT') went into the card."""
    for bad, hint in (("not-a-license", ""), ("", ""), ("MIT", "did you mean 'mit'? ")):
        with pytest.raises(ConfigError, match=re.escape(f"--license {bad!r}: not a license id of the Hub ({hint}")):
            PublishConfig(dry_run=True, license=bad)
    assert {"mit", "apache-2.0", "cc-by-4.0", "cc-by-nc-sa-4.0", "other", "unknown"} <= HUB_LICENSES
    run_cli("export", shard, tmp_path / "ds", "--labels", "mc_value")
    r = run_cli("publish", tmp_path / "ds", "--dry-run", "--license", "cc-by-4-0", check=False)
    assert error_line(r).startswith("error: --license 'cc-by-4-0': not a license id of the Hub")
    assert not (tmp_path / "ds" / "README.md").exists()
    run_cli("publish", tmp_path / "ds", "--dry-run", "--license", "cc-by-4.0")
    assert "license: cc-by-4.0" in (tmp_path / "ds" / "README.md").read_text()


def test_report_over_two_exports_keeps_each_exports_labels(tmp_path, shard):
    """D8: the second export's label rule became the title of both exports' labels (one labeller)."""
    run_cli("export", shard, tmp_path / "a", "--labels", "mc_value")
    run_cli("export", shard, tmp_path / "b", "--labels", "reference_first_error")
    r = run_cli("report", tmp_path / "a", tmp_path / "b", "-o", tmp_path / "r.html")
    assert "`mc_value`" in r.stderr and "`reference_first_error`" in r.stderr
    page = (tmp_path / "r.html").read_text()
    keys = set(re.findall(r'"key": ?"(export\d*)"', page))
    assert keys == {"export", "export2"}, keys


def test_report_refuses_one_in_given_twice(tmp_path, shard):
    """D10: the same IN twice counted every row twice."""
    assert error_line(run_cli("report", shard, shard, "-o", tmp_path / "r.html", check=False)) == \
        f"error: {shard}: given twice: its rows would be counted twice; give each IN once"
    assert "also read through" in error_line(run_cli("report", tmp_path, shard, "-o", tmp_path / "r.html",
                                                     check=False))
    run_cli("export", shard, tmp_path / "ds", "--labels", "mc_value")
    assert "given twice" in error_line(run_cli("report", tmp_path / "ds", tmp_path / "ds", check=False))
    assert not (tmp_path / "r.html").exists()


def test_report_refuses_per_step_lists_of_the_wrong_length(tmp_path):
    """D11: a row whose mc_value has fewer entries than steps was drawn with no word."""
    rows = labelled(4)
    rows[2]["mc_value"] = rows[2]["mc_value"][:-1]
    bad = write(tmp_path / "bad.parquet", rows)
    n = len(rows[2]["steps"])
    assert error_line(run_cli("report", bad, "-o", tmp_path / "r.html", check=False)) == \
        f"error: {bad}: row 2, column 'mc_value': {n - 1} entries for {n} steps (a per-step column has one per step)"
    rows[2]["mc_value"] = None  # a row without values is fine
    run_cli("report", write(tmp_path / "ok.parquet", rows), "-o", tmp_path / "r.html")


def test_a_problems_shard_given_to_a_trajectory_stage_says_run_rollout(tmp_path):
    """D12: judge on a problems shard said "column 'id': missing column"."""
    problems = tmp_path / "problems.parquet"
    run_cli("ingest", "gsm8k", DATA / "gsm8k" / "test.jsonl", problems, "--limit", "2")
    assert "steps" not in pq.read_schema(problems).names
    want = f"error: {problems}: holds problems, not trajectories (no steps to label): run `stepkit rollout IN OUT` " \
           "first, and give its OUT here"
    for args in (["judge", problems, tmp_path / "j.parquet", "--engine", "scripted", "--model", "scripted:judge"],
                 ["mc-label", problems, tmp_path / "m.parquet", "--engine", "scripted", "--model", "scripted:echo"],
                 ["filter", problems, tmp_path / "f.parquet", "--rule", "dedupe", "--flag-only"],
                 ["export", problems, tmp_path / "ds", "--labels", "mc_label"],
                 ["report", problems, "-o", tmp_path / "r.html"]):
        assert error_line(run_cli(*args, check=False)) == want, args
