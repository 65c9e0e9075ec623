"""stepkit filter: every rule exactly, cutting of per-step columns, nothing lost, bad input, stats.

Rows are real ProcessBench gsm8k solutions (steps, human first errors); the label columns other stages
would write are set to known values here, so each rule's decision can be checked exactly."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepkit.columns import fields
from stepkit.errors import ConfigError, InputError
from stepkit.runner import run_stage
from stepkit.schema import REFERENCE_FIELDS, TRAJECTORY_SCHEMA, extend_schema
from stepkit.shards import read_manifest, read_rows, rows_to_table
from stepkit.stages import judge, mc_label
from stepkit.stages.filter import FilterConfig, FilterStage, Prof, parse_rule
from tests.conftest import DATA, run_cli

SCHEMA = extend_schema(TRAJECTORY_SCHEMA, REFERENCE_FIELDS + fields(mc_label.COLUMNS) + fields(judge.COLUMNS))


def real_rows(n: int) -> list[dict]:
    """``n`` ProcessBench gsm8k samples as trajectory rows (real steps and human labels), alternately from
    the erroneous ones (listed first in the file) and the correct ones."""
    data = json.loads((DATA / "processbench" / "gsm8k.json").read_text())
    wrong, right = [d for d in data if d["label"] >= 0], [d for d in data if d["label"] == -1]
    data = [(wrong, right)[i % 2][i // 2] for i in range(n)]
    return [{"id": d["id"], "problem_id": d["id"], "prompt": d["problem"], "steps": d["steps"],
             "step_separator": "\n\n", "outcome_correct": d["final_answer_correct"], "generator": d["generator"],
             "reference_first_error": d["label"]} for d in data]


def write(tmp_path, rows, name="in.parquet", schema=SCHEMA):
    p = tmp_path / name
    pq.write_table(rows_to_table(rows, schema), p)
    return p


def run_filter(tmp_path, inp, *rules, flag_only=False, **kw):
    out, dropped = tmp_path / "out.parquet", tmp_path / "dropped.parquet"
    cfg = FilterConfig(rule=rules, flag_only=flag_only, dropped=None if flag_only else str(dropped), **kw)
    run_stage(FilterStage(cfg), inp, out, progress=False, force=True)
    return read_rows(out), (read_rows(dropped) if not flag_only else []), read_manifest(out)


def with_labels(rows, labels_by_row):
    """Give each row mc_label / mc_value / judge_votes of its step count from ``labels_by_row``."""
    out = []
    for r, labels in zip(rows, labels_by_row):
        n = len(r["steps"])
        labels = (labels + [True] * n)[:n]
        out.append({**r, "mc_label": labels, "mc_value": [1.0 if x else 0.0 for x in labels],
                    "mc_rollouts": [4] * n, "judge_votes": [7, 7, 7]})
    return out


def test_case_truncate_after_first_error_both_modes(tmp_path, cases):
    case = cases["truncate-after-first-error"]
    base = real_rows(1)[0]
    steps, labels = case["input"]["steps"], case["input"]["labels"]
    row = {**base, "steps": steps, "mc_label": labels, "mc_value": [float(x) for x in labels],
           "judge_votes": [1, 2, 3, 4, 5, 6, 7]}  # not per step: never cut
    inp = write(tmp_path, [row])
    kept, dropped, m = run_filter(tmp_path, inp, "truncate-after-first-error:mc_label")
    assert kept[0]["steps"] == case["expected"]["truncate_mode_steps"]
    assert kept[0]["mc_label"] == case["expected"]["truncate_mode_labels"]
    assert kept[0]["mc_value"] == [1.0, 1.0, 0.0]
    assert kept[0]["judge_votes"] == [1, 2, 3, 4, 5, 6, 7]
    assert (kept[0]["filter_steps_before"], kept[0]["filter_kept_steps"]) == (5, 3)
    assert kept[0]["filter_cut_by"] == "truncate-after-first-error:mc_label"
    assert m["config"]["rule"] == ["truncate-after-first-error:mc_label"]  # the mode used is recorded
    assert m["counts"]["steps_cut"] == 2 and not dropped
    # keep-all mode: no truncation rule, every label kept
    kept, _, m = run_filter(tmp_path, inp, "steps:1-")
    assert kept[0]["mc_label"] == case["expected"]["keep_all_mode_labels"]
    assert kept[0]["filter_cut_by"] is None and m["counts"]["steps_cut"] == 0


def test_consensus_keeps_agreeing_rows_and_drops_nulls_as_unlabelled(tmp_path):
    rows = real_rows(4)
    rows[0].update(mc_first_error=-1, judge_first_error=-1)  # agree: no error
    rows[1].update(mc_first_error=1, judge_first_error=1)  # agree
    rows[2].update(mc_first_error=0, judge_first_error=2)  # disagree
    rows[3].update(mc_first_error=None, judge_first_error=1)  # no MC signal
    kept, dropped, m = run_filter(tmp_path, write(tmp_path, rows), "consensus:mc_first_error,judge_first_error")
    assert [r["id"] for r in kept] == [rows[0]["id"], rows[1]["id"]]
    assert {r["id"]: r["filter_reason"] for r in dropped} == {rows[2]["id"]: "consensus", rows[3]["id"]: "unlabelled"}
    assert all(r["filter_rule"] == "consensus:mc_first_error,judge_first_error" for r in dropped)
    c = m["counts"]
    assert (c["rows_in"], c["rows_kept"], c["dropped_consensus"], c["dropped_unlabelled"]) == (4, 2, 1, 1)
    assert c["steps_in"] == c["steps_kept"] + c["steps_dropped_consensus"] + c["steps_dropped_unlabelled"]


def test_consensus_reads_label_lists_as_first_false_step(tmp_path):
    rows = with_labels(real_rows(2), [[True, False], [True, True, True, True, True, True, True, True, True, True]])
    for r in rows:
        r["judge_label"] = [True, False] + [True] * (len(r["steps"]) - 2)
    kept, dropped, _ = run_filter(tmp_path, write(tmp_path, rows), "consensus:mc_label,judge_label")
    assert [r["id"] for r in kept] == [rows[0]["id"]] and dropped[0]["filter_reason"] == "consensus"


def prof_rows(specs):
    """specs: (problem, outcome, values) -> rows on real steps, one per spec."""
    base = real_rows(len(specs))
    return [{**b, "id": f"{pid}:{i}", "problem_id": pid, "outcome_correct": oc, "steps": b["steps"][:len(v)] or ["x"],
             "mc_value": v} for i, (b, (pid, oc, v)) in enumerate(zip(base, specs))]


def test_prof_scores_exactly_and_balances_outcomes(tmp_path):
    specs = [("p", True, [1.0, 1.0]), ("p", True, [0.5, 0.5]), ("p", True, [0.0, 1.0]), ("p", False, [0.0, 0.0]),
             ("q", True, [1.0, 0.5]), ("q", False, [1.0, 1.0]), ("q", False, [0.0, 0.5]), ("q", False, [0.5, 0.5])]
    rows = prof_rows(specs)
    for r in rows:  # every real sample here has at least 2 steps
        assert len(r["steps"]) == len(r["mc_value"])
    cfg = FilterConfig(rule=("prof:mc_value",), flag_only=True, remove=2)
    rule = Prof("prof:mc_value", "mc_value")
    mean_p = (1 + 1 + 0.5 + 0.5 + 0 + 1 + 0 + 0) / 8
    assert rule.score(rows[1], mean_p, cfg) == pytest.approx(2 * (0.5 - mean_p))
    assert rule.score(rows[3], mean_p, cfg) == pytest.approx(2 * (0 - mean_p) * -1)
    kept, dropped, m = run_filter(tmp_path, write(tmp_path, rows), "prof:mc_value", remove=2)
    # p: 3 correct, 1 incorrect -> both removals from the correct side, lowest scores: p:2 (mean .5) and p:1 (.5)
    # (ties broken by position); q: 1 correct, 3 incorrect -> both from the incorrect side, least consistent
    # (highest values) first: q:5 then q:7
    assert sorted(r["id"] for r in dropped) == ["p:1", "p:2", "q:5", "q:7"]
    assert {r["filter_reason"] for r in dropped} == {"prof"}
    assert sorted(r["id"] for r in kept) == ["p:0", "p:3", "q:4", "q:6"]


def test_prof_equal_sides_drops_the_less_consistent_and_penalises_step_counts(tmp_path):
    rows = prof_rows([("p", True, [1.0, 1.0]), ("p", False, [0.0])])  # mean 2/3; scores 2/3 and 4/3
    rule, cfg = Prof("prof:mc_value", "mc_value"), FilterConfig(rule=("prof:mc_value",), flag_only=True, remove=1)
    assert rule.score(rows[0], 2 / 3, cfg) == pytest.approx(2 / 3)
    assert rule.score(rows[1], 2 / 3, cfg) == pytest.approx(4 / 3)
    _, dropped, _ = run_filter(tmp_path, write(tmp_path, rows), "prof:mc_value", remove=1)
    assert [r["id"] for r in dropped] == ["p:0"]  # equal sides: the lower score goes
    # --min-steps 2 penalises the 1-step row: 4/3 - 5 is now the lowest
    _, dropped, _ = run_filter(tmp_path, write(tmp_path, rows), "prof:mc_value", remove=1, min_steps=2,
                               step_penalty=5.0)
    assert [r["id"] for r in dropped] == ["p:1"]


def test_prof_needs_remove_and_unscored_rows_are_unlabelled(tmp_path):
    with pytest.raises(ConfigError, match="--remove"):
        FilterConfig(rule=("prof:mc_value",), flag_only=True)
    rows = prof_rows([("p", True, [1.0, 1.0]), ("p", None, [1.0, 1.0]), ("p", False, [None, None])])
    _, dropped, _ = run_filter(tmp_path, write(tmp_path, rows), "prof:mc_value", remove=1)
    # the unscored rows are unlabelled; the one scored row stays (a problem keeps at least one row)
    assert {r["id"]: r["filter_reason"] for r in dropped} == {"p:1": "unlabelled", "p:2": "unlabelled"}


def test_values_status_dedupe_steps_no_error_in_order(tmp_path):
    rows = with_labels(real_rows(6), [[True, True], [True, False], [True], [True], [True], [True]])
    rows[1]["mc_status"] = "no_signal"
    rows[4] = {**rows[3], "id": "dup"}  # same prompt and steps as row 3
    rows[5]["error"] = "mc-label: engine: boom"
    rows[0]["mc_value_start"] = 0.2
    rows[2]["mc_value_start"] = 0.9
    kept, dropped, m = run_filter(tmp_path, write(tmp_path, rows), "no-error", "status:mc_status!=no_signal",
                                  "dedupe", "steps:1-99")
    assert {r["id"]: r["filter_reason"] for r in dropped} == {rows[5]["id"]: "error", rows[1]["id"]: "status",
                                                             "dup": "dedupe"}
    assert len(kept) == 3
    kept, dropped, _ = run_filter(tmp_path, write(tmp_path, rows[:3]), "min-value:mc_value_start>=0.5")
    assert [r["id"] for r in kept] == [rows[2]["id"]]
    assert {r["filter_reason"] for r in dropped} == {"min-value", "unlabelled"}  # row 1 has no value at all
    kept, _, _ = run_filter(tmp_path, write(tmp_path, rows[:2]), "max-value:mc_value<1")  # list: its maximum
    assert kept == []
    kept, _, _ = run_filter(tmp_path, write(tmp_path, rows[:2]), "min-value:mc_value>0.5")  # list: its minimum
    assert [r["id"] for r in kept] == [rows[0]["id"]]
    n0 = len(rows[0]["steps"])
    kept, dropped, _ = run_filter(tmp_path, write(tmp_path, rows[:2]), f"steps:{n0}-{n0}")
    assert all(len(r["steps"]) == n0 for r in kept) and all(len(r["steps"]) != n0 for r in dropped)


def test_keep_correct_steps_keeps_the_prefix_before_the_error(tmp_path):
    rows = real_rows(3)
    rows[0]["reference_first_error"] = 2
    rows[1]["reference_first_error"] = 0
    rows[2]["reference_first_error"] = -1
    for r in rows:
        n = len(r["steps"])
        r["reference_labels"] = [r["reference_first_error"] == -1 or s < r["reference_first_error"] for s in range(n)]
    kept, dropped, m = run_filter(tmp_path, write(tmp_path, rows), "keep-correct-steps:reference_first_error")
    assert kept[0]["steps"] == rows[0]["steps"][:2] and kept[0]["reference_labels"] == [True, True]
    assert kept[1]["steps"] == rows[2]["steps"] and kept[1]["filter_cut_by"] is None
    assert dropped[0]["id"] == rows[1]["id"] and dropped[0]["filter_reason"] == "no-correct-steps"
    assert dropped[0]["steps"] == rows[1]["steps"]  # a dropped row is kept whole
    assert m["counts"]["reference_labels_false_in"] > 0 and m["counts"]["reference_labels_false_kept"] == 0


def test_flag_only_keeps_every_row_and_step_and_later_filter_drops_them(tmp_path):
    rows = real_rows(4)
    rows[0]["reference_first_error"] = 1
    inp = write(tmp_path, rows)
    kept, _, m = run_filter(tmp_path, inp, "truncate-after-first-error:reference_first_error",
                            "status:outcome_correct=True", flag_only=True)
    assert len(kept) == 4 and [r["steps"] for r in kept] == [r["steps"] for r in rows]
    assert kept[0]["filter_kept_steps"] == 2 and kept[0]["filter_steps_before"] == len(rows[0]["steps"])
    flagged = {r["id"] for r in kept if r["filter_reason"]}
    assert flagged == {r["id"] for r in rows if not r["outcome_correct"]}
    assert m["counts"]["rows_kept"] == 4 - len(flagged)
    # a second, real filter run drops the flagged rows with their reason
    flagged_in = tmp_path / "flagged.parquet"
    (tmp_path / "out.parquet").rename(flagged_in)
    out, dropped = tmp_path / "second.parquet", tmp_path / "second-dropped.parquet"
    run_stage(FilterStage(FilterConfig(rule=("steps:1-",), dropped=str(dropped))), flagged_in, out, progress=False)
    assert {r["id"] for r in read_rows(dropped)} == flagged
    assert {r["filter_reason"] for r in read_rows(dropped)} == {"status"}


def test_bad_input_and_bad_rules_are_one_line(tmp_path):
    rows = with_labels(real_rows(2), [[True], [True]])
    rows[1]["mc_label"] = rows[1]["mc_label"][:-1]  # one label short
    inp = write(tmp_path, rows)
    with pytest.raises(InputError, match=r"row 1, column 'mc_label': per-step column has \d+ entries for \d+ steps"):
        run_filter(tmp_path, inp, "dedupe")
    assert not (tmp_path / "out.parquet").exists()
    ok = write(tmp_path, real_rows(2), "ok.parquet")
    with pytest.raises(InputError, match="column 'lh_first_error': missing column for --rule"):
        run_filter(tmp_path, ok, "consensus:mc_first_error,lh_first_error")
    with pytest.raises(InputError, match="needs a first-error index"):
        run_filter(tmp_path, ok, "truncate-after-first-error:prompt")
    for bad, msg in [("consensus:a", "two columns"), ("steps:5-2", "above MAX"), ("min-value:x<=1", "min-value:COL>="),
                     ("min-value:x>=nan", "finite"), ("frobnicate", "unknown rule"), ("status:x", "status:COL=VALUE")]:
        with pytest.raises(ConfigError, match=msg):
            parse_rule(bad)
    with pytest.raises(ConfigError, match="--dropped FILE"):
        FilterConfig(rule=("dedupe",))
    p = run_cli("filter", ok, tmp_path / "o.parquet", "--rule", "dedupe", check=False)
    assert p.returncode != 0 and p.stderr.strip().splitlines()[-1].startswith("error: give --dropped FILE")


def test_cli_stats_show_reasons_and_balance_and_rerun_is_up_to_date(tmp_path):
    rows = real_rows(6)
    for r in rows:
        r["mc_first_error"] = r["reference_first_error"]
        r["judge_first_error"] = -1
    inp = write(tmp_path, rows)
    out, dropped = tmp_path / "kept.parquet", tmp_path / "dropped.parquet"
    args = ["filter", inp, out, "--rule", "consensus:mc_first_error,judge_first_error", "--dropped", dropped,
            "--no-progress"]
    run_cli(*args)
    again = run_cli(*args)
    assert "up to date" in again.stderr
    n_kept = sum(r["reference_first_error"] == -1 for r in rows)
    assert pq.read_metadata(out).num_rows == n_kept and pq.read_metadata(dropped).num_rows == 6 - n_kept
    s = run_cli("stats", out).stdout
    assert "dropped: consensus" in s and "label balance before -> after" in s
    assert f"{sum(r['outcome_correct'] for r in rows)} -> " in s
    d = run_cli("stats", dropped).stdout
    assert "by filter_reason" in d and "consensus" in d
    # the dropped side output is OUT's schema
    assert pq.read_schema(dropped).names == pq.read_schema(out).names


def test_schema_of_per_step_columns_is_declared():
    from stepkit.columns import Meanings
    from stepkit.stages import mcts_label

    per_step = set(Meanings(extend_schema(SCHEMA, fields(mcts_label.COLUMNS))).per_step())
    assert {"steps", "mc_value", "mc_label", "judge_label", "mcts_value", "reference_labels"} <= per_step
    assert not {"judge_votes", "judge_replies", "reference_steps"} & per_step
    assert pa.types.is_list(SCHEMA.field("mc_value").type)


# --- what the shard declares: no-label statuses, float status values, first errors past the steps ---------

def test_value_rules_read_a_no_signal_row_as_unlabelled(tmp_path):
    """Breaking run E2: ``mc_status = no_signal`` means every ``mc_value`` is a placeholder 0 (mc-label declares
    it); prof, min-value and consensus must not read those zeros as values. One problem: A labelled incorrect,
    B no_signal incorrect, C labelled correct."""
    base = [r for r in real_rows(12) if len(r["steps"]) >= 3][:3]
    spec = [("P:A", False, "ok", [1.0, 0.5, 0.0], 2), ("P:B", False, "no_signal", [0.0, 0.0, 0.0], None),
            ("P:C", True, "ok", [1.0, 1.0, 1.0], -1)]
    rows = []
    for r, (i, oc, st, v, fe) in zip(base, spec):
        steps = r["steps"][:3]
        rows.append({**r, "id": i, "problem_id": "P", "steps": steps, "outcome_correct": oc, "mc_status": st,
                     "mc_value": v, "mc_first_error": fe, "reference_first_error": None,
                     "mc_label": None if fe is None else [x > 0 for x in v]})
    inp = write(tmp_path, rows)
    kept, dropped, _ = run_filter(tmp_path, inp, "prof:mc_value", remove=1)
    decided = {r["id"]: r["filter_reason"] for r in dropped} | {r["id"]: None for r in kept}
    assert decided["P:B"] == "unlabelled"
    # A and C are decided as if B were not there (B's zeros no longer pull the problem's mean down)
    alone = write(tmp_path, [r for r in rows if r["id"] != "P:B"], "alone.parquet")
    kept2, dropped2, _ = run_filter(tmp_path, alone, "prof:mc_value", remove=1)
    assert {r["id"]: r["filter_reason"] for r in dropped2} | {r["id"]: None for r in kept2} == \
        {k: v for k, v in decided.items() if k != "P:B"}
    kept, dropped, _ = run_filter(tmp_path, inp, "min-value:mc_value>=0")
    assert [r["id"] for r in dropped] == ["P:B"] and dropped[0]["filter_reason"] == "unlabelled"
    # a status column of a stage that declares no "no labels" value leaves the row labelled
    plain = write(tmp_path, rows, "plain.parquet", extend_schema(TRAJECTORY_SCHEMA, [
        pa.field(f.name, f.type) for f in fields(mc_label.COLUMNS) if f.name != "mc_status"]
        + [pa.field("mc_status", pa.string(), metadata={b"stepkit": b'{"role": "status", "doc": "x"}'})]))
    kept, dropped, _ = run_filter(tmp_path, plain, "min-value:mc_value>=0")
    assert not dropped


def test_status_rule_on_a_float_column_reads_floats(tmp_path):
    """Breaking run E12: ``status:mc_value_start=0.0`` refused with 'present: 0.0', and ``!=`` dropped nothing."""
    rows = [{**r, "mc_value_start": v} for r, v in zip(real_rows(4), [0.0, 1.0, 0.0, 0.5])]
    inp = write(tmp_path, rows)
    kept, dropped, _ = run_filter(tmp_path, inp, "status:mc_value_start=0.0")
    assert [r["mc_value_start"] for r in kept] == [0.0, 0.0] and len(dropped) == 2
    kept, dropped, _ = run_filter(tmp_path, inp, "status:mc_value_start!=0")
    assert [r["mc_value_start"] for r in kept] == [1.0, 0.5]
    with pytest.raises(InputError, match="is not a float value"):
        run_filter(tmp_path, inp, "status:mc_value_start=nan")


@pytest.mark.parametrize("rule", ["truncate-after-first-error:mc_first_error", "keep-correct-steps:mc_first_error",
                                  "consensus:mc_first_error,reference_first_error"])
def test_a_first_error_past_the_steps_is_bad_input(tmp_path, rule):
    """Breaking run E13: a first error of 99 for 3 steps (or -3) was read as "no error" and the row kept."""
    rows = real_rows(2)
    rows = [{**r, "mc_first_error": fe, "mc_status": "ok"} for r, fe in zip(rows, (0, 99))]
    inp = write(tmp_path, rows)
    with pytest.raises(InputError) as e:
        run_filter(tmp_path, inp, rule)
    assert str(e.value) == f"{inp}: row 1, column 'mc_first_error': first-error index 99 outside " \
                           f"-1..{len(rows[1]['steps']) - 1}"
    rows[1]["mc_first_error"] = -3
    inp = write(tmp_path, rows, "neg.parquet")
    with pytest.raises(InputError, match="first-error index -3 outside"):
        run_filter(tmp_path, inp, rule)
