"""Defects of the third breaking run (docs/breaking-2026-12-03.md) and the low/medium defects of the second
one (issue 25: E4, E5, E14, E16, E17) that had no fix, each on real ProcessBench gsm8k rows, in process."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepkit.errors import ConfigError
from stepkit.runner import run_stage
from stepkit.stages.dataset_card import label_stats
from stepkit.stages.export import ExportConfig, export
from stepkit.stages.filter import FilterConfig, FilterStage
from tests.conftest import run_cli
from tests.test_export import labelled, load, write

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")


def error_line(r) -> str:
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_card_names_the_column_a_cut_was_made_by_and_claims_nothing_of_other_labels(tmp_path):
    """E4: after keep-correct-steps:mc_label, the card said "every kept step is labelled correct" of an export
    whose labels were another column's, false on kept steps."""
    rows = [r for r in labelled(8) if len(r["steps"]) >= 3 and r["reference_first_error"] in (0, 1)][:2]
    assert len(rows) == 2
    for r in rows:  # mc says: only the last step is wrong; the human says step 0 or 1 is
        n = len(r["steps"])
        r.update(mc_status="ok", mc_label=[True] * (n - 1) + [False], mc_first_error=n - 1)
    inp = write(tmp_path / "in.parquet", rows)
    run_stage(FilterStage(FilterConfig(rule=("keep-correct-steps:mc_label",), dropped=str(tmp_path / "d.parquet"))),
              inp, tmp_path / "cut.parquet", progress=False)
    export(tmp_path / "cut.parquet", tmp_path / "ref", ExportConfig(labels="reference_first_error"))
    assert any(not all(r["labels"]) for r in load(tmp_path / "ref"))  # kept steps the export labels wrong
    run_cli("publish", tmp_path / "ref", "--dry-run")
    card = " ".join((tmp_path / "ref" / "README.md").read_text().split())
    assert "were cut to **the steps before their first error** by `mc_label`" in card
    assert "every kept step is labelled correct" not in card
    assert "the exported labels (`reference_first_error`) still mark a wrong step in 2 rows" in card
    export(tmp_path / "cut.parquet", tmp_path / "mc", ExportConfig(labels="mc_label"))
    run_cli("publish", tmp_path / "mc", "--dry-run")
    card = " ".join((tmp_path / "mc" / "README.md").read_text().split())
    assert "by `mc_label` (imitation data: every kept step is labelled correct)" in card


def test_test_problems_are_drawn_among_the_problems_that_are_exported(tmp_path):
    """E5: --test-size drew its problems among every input problem, those whose rows are all dropped too: for
    some seeds the test split was empty (an error), 0.5 did not give half."""
    rows = labelled(8)
    for k, r in enumerate(rows):
        r["mc_status"] = "ok"
        if k % 2:
            r["mc_label"] = None  # null labels: dropped by the export
    inp = write(tmp_path / "in.parquet", rows)
    exported = {r["problem_id"] for r in rows if r["mc_label"] is not None}
    for seed in range(6):
        m = export(inp, tmp_path / f"s{seed}", ExportConfig(labels="mc_label", test_size=1, seed=seed))
        test = set(load(tmp_path / f"s{seed}", "test")["id"])
        assert m["splits"]["test"]["rows"] == 1 and test <= exported, seed
    m = export(inp, tmp_path / "half", ExportConfig(labels="mc_label", test_size=0.5))
    assert m["splits"]["test"]["rows"] == m["splits"]["train"]["rows"] == 2
    assert m["counts"]["null_labels"] == 4  # counted once, not again by the draw
    with pytest.raises(ConfigError, match="takes 4 of 4 problems"):
        export(inp, tmp_path / "all", ExportConfig(labels="mc_label", test_size=4))


def test_a_later_filter_does_not_count_a_pending_cut_again(tmp_path):
    """E14: a --flag-only cut (counted as pending) was counted again by the next filter, which applied it: the
    card said "N steps cut" twice for N cut steps."""
    rows = labelled(4)
    for r in rows:
        n = len(r["steps"])
        r.update(mc_status="ok", mc_label=[True] * (n - 1) + [False], mc_first_error=n - 1)
    inp = write(tmp_path / "in.parquet", rows)
    run_stage(FilterStage(FilterConfig(rule=("keep-correct-steps:mc_label",), flag_only=True)), inp,
              tmp_path / "f1.parquet", progress=False)
    run_stage(FilterStage(FilterConfig(rule=("dedupe",), dropped=str(tmp_path / "d.parquet"))),
              tmp_path / "f1.parquet", tmp_path / "f2.parquet", progress=False)
    first = json.loads((tmp_path / "f1.manifest.json").read_text())["counts"]
    second = json.loads((tmp_path / "f2.manifest.json").read_text())["counts"]
    assert first["steps_cut"] == 4 and first["rows_cut"] == 4
    assert second["steps_cut"] == 0 and second["rows_cut"] == 0
    assert [len(r["steps"]) for r in pq.read_table(tmp_path / "f2.parquet").to_pylist()] == \
        [len(r["steps"]) - 1 for r in rows]  # the pending cut is applied
    # a cut of its own after the pending one is counted (only the steps it cut)
    run_stage(FilterStage(FilterConfig(rule=("truncate-after-first-error:reference_first_error",),
                                       dropped=str(tmp_path / "d3.parquet"))),
              tmp_path / "f1.parquet", tmp_path / "f3.parquet", progress=False)
    third = json.loads((tmp_path / "f3.manifest.json").read_text())["counts"]
    want = sum(max(0, (len(r["steps"]) - 1) - (r["reference_first_error"] + 1)) for r in rows
               if r["reference_first_error"] >= 0)
    assert third["steps_cut"] == want


def test_math_shepherd_card_reads_labels_at_the_tags_only(tmp_path):
    """E16: the card split the label text on newlines, so a step's own line ending in ' -' read as a label."""
    rows = labelled(2)  # row 0 has an error, row 1 none; row 1's first step gets a line of its own ending in ' -'
    assert rows[0]["reference_first_error"] >= 0 and rows[1]["reference_first_error"] == -1
    rows[1]["steps"] = ["We have 7 -\n2 = 5 apples", *rows[1]["steps"][1:]]
    for r in rows:
        r["mc_status"] = "ok"
    inp = write(tmp_path / "in.parquet", rows)
    export(inp, tmp_path / "ms", ExportConfig(format="math-shepherd", labels="reference_first_error",
                                              step_separator="\\n\\n", separator_in_step="rejoin"))
    files = [f"data/{p.name}" for p in (tmp_path / "ms" / "data").glob("*.parquet")]
    stats = label_stats(tmp_path / "ms", {"train": files}, "math-shepherd")
    want = sum(len(r["steps"]) for r in rows)
    assert stats["steps"] == want
    assert stats["first_error_histogram"] == {-1: 1, rows[0]["reference_first_error"]: 1}


@pytest.mark.parametrize("args, message", [
    (("--test-size", "1", "--split", "valid"), "--split valid: with --test-size the splits are train and test"),
    (("--task", "MATH"), "--task is for --format math-shepherd, not trl"),
    (("--labels", "mc_label", "--threshold", "0.5"), "holds step labels: --threshold is for step values"),
    (("--labels", "mc_first_error", "--threshold", "0.5"), "holds first-error indices: --threshold is for step"),
    (("--labels", "mc_value", "--soft", "--threshold", "0.5"), "--soft writes the values themselves"),
])
def test_export_refuses_options_that_do_not_apply(tmp_path, args, message):
    """E17: --split with --test-size, --task outside math-shepherd, --threshold on labels that are not values or
    with --soft were silently ignored."""
    rows = labelled(4)
    for r in rows:
        r["mc_status"] = "ok"
    inp = write(tmp_path / "in.parquet", rows)
    full = args if "--labels" in args else ("--labels", "mc_value", *args)
    assert message in error_line(run_cli("export", inp, tmp_path / "o", *full, check=False))
    assert not (tmp_path / "o").exists()
    run_cli("export", inp, tmp_path / "ok", "--labels", "mc_value", "--threshold", "0.5")  # values: it applies


def test_train_prm_takes_the_exports_separator_and_reads_it_as_typed(tmp_path):
    """train-prm trained a '\\n\\n' export (ProcessBench's paragraphs, recorded by export, whose steps may hold a
    newline) with '\\n' unless told, silently; and ``--step-separator '\\n\\n'`` typed in a shell was the four
    characters backslash n backslash n (export reads it as two newlines)."""
    from tests.conftest import DATA
    from tests.test_train_prm import PRM_FILE, build_tiny_base

    base = build_tiny_base(tmp_path / "base")
    run_cli("ingest", "processbench", DATA / "processbench" / "gsm8k.json", tmp_path / "pb.parquet", "--limit", 2)
    run_cli("export", tmp_path / "pb.parquet", tmp_path / "trl", "--labels", "reference_first_error")
    assert json.loads((tmp_path / "trl" / "stepkit.manifest.json").read_text())["step_separator"]["value"] == "\n\n"
    common = ("--base-model", base, "--max-length", 256, "--max-steps", 1, "--batch-size", 2, "--no-progress")
    run_cli("train-prm", tmp_path / "trl", tmp_path / "m1", *common)
    assert json.loads((tmp_path / "m1" / PRM_FILE).read_text())["step_separator"] == "\n\n"
    r = run_cli("train-prm", tmp_path / "trl", tmp_path / "m2", *common, "--step-separator", "\\n")
    assert json.loads((tmp_path / "m2" / PRM_FILE).read_text())["step_separator"] == "\n"
    assert "--step-separator '\\n' is not the separator the export records ('\\n\\n')" in r.stderr
    r = run_cli("train-prm", tmp_path / "trl", tmp_path / "m1", *common, "--step-separator", "\\n\\n")
    assert "is up to date" in r.stderr  # the same separator as the default's: the same model


def test_check_steps_reads_a_long_step_in_linear_time():
    """A 550 KB step of 50,000 plain-text claims ("1 + 1 = 2.") did not finish in 2 minutes: every claim searched
    the whole line again (quadratic)."""
    from stepkit.grading import claims
    from tests.conftest import assert_linear

    assert_linear(claims.extract, lambda n: "1 + 1 = 2. " * (n // 11), n=11_000, factor=8)
    items, _ = claims.extract("It is 9 / 4 = 2 with a remainder of 1, and 3 + 4 = 7, then 3 + 4 = 8.")
    assert [getattr(i, "holds", None) for i in items if type(i).__name__ == "Arithmetic"] == [True, False]


def test_a_power_of_a_power_is_not_evaluated_for_hours(tmp_path):
    """``((((9^64)^64)^64)^64)^64 = 5`` in a step's plain text hung check-steps (its --timeout does not reach the
    arithmetic reader, whose Python integer power cannot be interrupted)."""
    import subprocess

    from stepkit.grading.clues import evaluate
    from tests.conftest import DATA, run_cli_process

    assert evaluate("(2^64)^64") == 2 ** 4096 and evaluate("((((9^64)^64)^64)^64)^64") is None
    run_cli("ingest", "processbench", DATA / "processbench" / "gsm8k.json", tmp_path / "pb.parquet", "--limit", 1)
    t = pq.read_table(tmp_path / "pb.parquet")
    rows = t.to_pylist()
    rows[0]["steps"] = ["We compute ((((9^64)^64)^64)^64)^64 = 5 apples.", *rows[0]["steps"][1:]]
    pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), tmp_path / "pow.parquet")
    try:
        run_cli_process("check-steps", tmp_path / "pow.parquet", tmp_path / "c.parquet", "--no-progress",
                        timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("check-steps did not finish one row in 120 s")
    assert pq.read_table(tmp_path / "c.parquet").num_rows == 1


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_with_chunks_in_flight_is_one_line(tmp_path, sig):
    """SIGTERM or Ctrl-C while judge had 4 chunks in flight printed its one line, then about 40 lines of asyncio
    tracebacks (the handler's exception raised inside a chunk's task, the loop closed on pending tasks). The rerun
    gives the rows of an uninterrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import DATA

    run_cli("ingest", "processbench", DATA / "processbench" / "gsm8k.json", tmp_path / "pb.parquet", "--limit", 64)
    judge = ["judge", tmp_path / "pb.parquet", None, "--engine", "scripted", "--model", "scripted:judge",
             "--no-progress", "--chunk-size", "4"]
    run_cli(*[tmp_path / "ref.parquet" if a is None else a for a in judge], "--chunks-in-flight", "1")
    out = tmp_path / "j.parquet"
    args = [str(out if a is None else a) for a in judge]
    p = subprocess.Popen([sys.executable, "-m", "stepkit.cli", *args, "--chunks-in-flight", "4"],
                         env={**os.environ, "STEPKIT_SCRIPTED_DELAY": "0.02"}, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (tmp_path / "j.parquet.parts" / "part-00002.parquet").exists():
        assert p.poll() is None and time.time() < deadline, "the run ended before its third chunk"
        time.sleep(0.02)
    p.send_signal(getattr(signal, sig))
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + getattr(signal, sig)
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith(tuple("│┃┏┡└┌╭╰"))]
    assert len(lines) == 1 and lines[0].startswith(f"error: {out}: stopped by {sig}; "), err
    run_cli(*args, "--chunks-in-flight", "2")
    assert pq.read_table(out).equals(pq.read_table(tmp_path / "ref.parquet"))


def test_a_second_train_prm_into_one_out_is_refused(tmp_path):
    """Two train-prm runs into one OUT at once both trained and exited 0; OUT kept the later one's files (its
    stepkit-prm.json named seed 2 beside whatever the other had written), the first's result was lost silently."""
    from stepkit.runner.parts import OutputLock
    from stepkit.stages.train_prm import TrainPRMConfig, train_prm
    from tests.conftest import DATA

    run_cli("ingest", "processbench", DATA / "processbench" / "gsm8k.json", tmp_path / "pb.parquet", "--limit", 2)
    run_cli("export", tmp_path / "pb.parquet", tmp_path / "trl", "--labels", "reference_first_error")
    out = tmp_path / "m"
    with OutputLock(out), pytest.raises(ConfigError, match="another stepkit run is writing this output"):
        train_prm(str(tmp_path / "trl"), out, TrainPRMConfig(base_model="smollm2-135m", max_steps=1), progress=False)
    assert not out.exists()


def test_a_score_on_a_0_1_scale_is_not_called_outside_0_1_and_an_empty_step_tag_is_refused(tmp_path):
    """check-steps' check_score (declared a 0-1 score) was refused with "holds 0-1 scores, not values in [0, 1]",
    which contradicts itself; ``prm-label --step-tag ''`` silently read the default tag."""
    from stepkit.stages.prm_label import PRMLabelConfig
    from tests.conftest import DATA

    run_cli("ingest", "processbench", DATA / "processbench" / "gsm8k.json", tmp_path / "pb.parquet", "--limit", 2)
    run_cli("check-steps", tmp_path / "pb.parquet", tmp_path / "cs.parquet", "--no-progress")
    line = error_line(run_cli("export", tmp_path / "cs.parquet", tmp_path / "o", "--labels", "check_score",
                              check=False))
    assert "holds 0-1 scores on a scale of their own (declared scale 'score'), not step values" in line
    assert "not values in [0, 1]" not in line
    with pytest.raises(ConfigError, match="--step-tag '': a step tag is text"):
        PRMLabelConfig(kind="math-shepherd", step_tag="")


@pytest.mark.parametrize("column, make", [
    ("steps", lambda t: pa.array(["\n\n".join(x) for x in t.column("steps").to_pylist()])),
    ("mc_value", lambda t: pa.array([[str(v) for v in x or []] for x in t.column("mc_value").to_pylist()],
                                    pa.list_(pa.string()))),
])
def test_stats_and_report_refuse_a_column_of_another_type(tmp_path, column, make):
    """stats and report read columns without checking their types: string steps were a traceback in report and
    counted by stats; list<string> values were a traceback in stats and drawn by report."""
    rows = labelled(3)
    for r in rows:
        r["mc_status"] = "ok"
    t = pq.read_table(write(tmp_path / "in.parquet", rows))
    i = t.schema.get_field_index(column)
    bad = t.set_column(i, pa.field(column, make(t).type), make(t))  # (written by another tool: no declaration)
    pq.write_table(bad, tmp_path / "bad.parquet")
    want = f"error: {tmp_path / 'bad.parquet'}: column '{column}': expected type"
    assert error_line(run_cli("stats", tmp_path / "bad.parquet", check=False)).startswith(want)
    assert error_line(run_cli("report", tmp_path / "bad.parquet", "-o", tmp_path / "r.html",
                              check=False)).startswith(want)
    run_cli("stats", tmp_path / "in.parquet")


def test_a_split_emptied_by_on_too_long_drop_says_so(tmp_path):
    """``--on-too-long drop`` leaving no row said 'input rows: 8, null labels: 0, flagged by filter: 0', naming no
    cause."""
    from tests.conftest import DATA

    run_cli("ingest", "processbench", DATA / "processbench" / "gsm8k.json", tmp_path / "pb.parquet", "--limit", 3)
    line = error_line(run_cli("export", tmp_path / "pb.parquet", tmp_path / "o", "--labels", "reference_first_error",
                              "--tokenizer", "smollm2-135m", "--max-length", 8, "--on-too-long", "drop", check=False))
    assert "the train split would have no rows (input rows: 3, null labels: 0, flagged by filter: 0, over " \
           "--max-length: 3); nothing written" in line
