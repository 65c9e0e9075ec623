"""show and stats on tool-calling conversations (issue 13), on real τ-bench rows from ``ingest messages``."""

from __future__ import annotations

import io
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from stepkit.conversations import parse_conversation
from stepkit.errors import InputError
from stepkit.runner import run_stage
from stepkit.stages.filter import FilterConfig, FilterStage
from stepkit.views import print_row, print_stats
from tests.conftest import run_cli
from tests.test_agent_turns import FIRST_ERRORS, N, ingest_tau, tau_source, with_turn_labels


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    d = tmp_path_factory.mktemp("tau")
    return with_turn_labels(ingest_tau(d / "tau.parquet"), d / "labelled.parquet")


def views():
    from stepkit.cli import stage_views

    return stage_views()


def shown(shard, **kw) -> str:
    out = io.StringIO()
    print_row(shard, views=views(), console=Console(file=out, width=100_000, color_system=None), **kw)
    return out.getvalue()


def test_show_renders_roles_tool_calls_clipped_results_and_turn_labels(labelled):
    text = shown(labelled, index=0)
    source = tau_source()[0]["traj"]
    system = source[0]["content"]
    assert f"system: {system[:300]}… ({len(system)} chars)" in text  # the policy, clipped
    assert f"user: {source[1]['content']}" in text
    assert "assistant: To assist you with booking a flight" in text
    assert '  → call get_user_details {"user_id": "mia_li_3668"}' in text
    result = next(m for m in source if m["role"] == "tool")
    assert f"tool (get_user_details): {result['content'][:300]}… ({len(result['content'])} chars)" in text
    n = len(parse_conversation(source).turns)
    for k in range(n):  # each turn's label, from the column the test wrote (first error at turn 3)
        assert f"── turn {k} ──  judge_label {'ok' if k < FIRST_ERRORS[0] else 'WRONG'}" in text
    assert f"── turn {n} ──" not in text
    assert f"{n} turns, 8 tool calls, reward 0.0" in text
    whole = shown(labelled, index=0, clip=0)
    assert system.rstrip() in whole and result["content"] in whole and "chars)" not in whole
    # the CLI prints the same (text as data: JSON brackets are never read as markup)
    p = run_cli("show", labelled, "--index", 0, "--clip", 40)
    assert "→ call get_user_details" in p.stdout and "tool (get_user_details): " in p.stdout
    assert f"({len(result['content'])} chars)" in p.stdout and "judge_label WRONG" in p.stdout


def test_show_uses_the_stage_view_for_its_own_columns_and_shows_a_cut(labelled, tmp_path):
    t = pq.read_table(labelled)
    n_turns = [len(s) for s in t.column("steps").to_pylist()]
    t = (t.append_column("judge_status", pa.array(["ok"] * N))
         .append_column("judge_correct_votes", pa.array([[3 if s < 3 else 1 for s in range(n)] for n in n_turns],
                                                        pa.list_(pa.int32())))
         .append_column("judge_valid_votes", pa.array([3] * N, pa.int32())))
    t = t.set_column(t.schema.get_field_index("reference_labels"), "reference_labels",  # ingest wrote it null
                     pa.array([[s % 2 == 0 for s in range(n)] for n in n_turns], pa.list_(pa.bool_())))
    judged = tmp_path / "judged.parquet"
    pq.write_table(t, judged)
    text = shown(judged, index=0)
    assert "── turn 3 ──  judge WRONG (1/3 say ok)  reference_labels WRONG" in text
    assert "── turn 0 ──  judge ok (3/3 say ok)  reference_labels ok" in text
    assert "judge_label" not in text  # drawn by the judge view, not twice
    cut = tmp_path / "cut.parquet"
    run_stage(FilterStage(FilterConfig(rule=("truncate-after-first-error:judge_label",),
                                       dropped=str(tmp_path / "d.parquet"))), judged, cut, progress=False)
    text = shown(cut, index=0)
    assert f"filter: {n_turns[0]} steps cut to 4 by truncate-after-first-error:judge_label" in text
    assert "── turn 3 ──" in text and "── turn 4 ──" not in text
    assert '→ call search_direct_flight {"origin": "JFK"' in text  # the wrong turn, kept last


def test_stats_reports_turns_tool_calls_success_and_labels_per_turn(labelled):
    out = io.StringIO()
    figs = print_stats(labelled, views(), Console(file=out, width=300, color_system=None))
    convs = [parse_conversation(x["traj"]) for x in tau_source()[:N]]
    calls = [[len(t.message.get("tool_calls") or []) for t in c.turns] for c in convs]
    turns = sum(len(c) for c in calls)
    with_call = sum(1 for c in calls for x in c if x)
    f = figs["conversations"]
    assert (f["conversations"], f["turns"], f["tool_calls"]) == (N, turns, sum(map(sum, calls)))
    assert f["turns_with_tool_calls"] == with_call
    assert f["share_turns_with_tool_calls"] == pytest.approx(with_call / turns)
    rewards = [x["reward"] for x in tau_source()[:N]]
    assert f["success_rate"] == pytest.approx(sum(r >= 1 for r in rewards) / N) and f["mean_reward"] == sum(rewards) / N
    names = [t.message["tool_calls"][0]["function"]["name"] for c in convs for t in c.turns if t.message.get("tool_calls")]
    assert f["tools"]["get_user_details"] == names.count("get_user_details")
    labels = [[k == -1 or s < k for s in range(len(c))] for c, k in zip(calls, FIRST_ERRORS)]
    on_tool = [x for c, lab in zip(calls, labels) for n, x in zip(c, lab) if n]
    jl = f["turn_labels"]["judge_label"]
    assert jl["turns"] == turns and jl["mean"] == pytest.approx(sum(map(sum, labels)) / turns)
    assert jl["with_tool_call"] == pytest.approx(sum(on_tool) / len(on_tool))
    assert jl["rows_with_false"] == sum(k != -1 for k in FIRST_ERRORS)
    text = out.getvalue()
    for line in ("turns per conversation", f"{with_call}/{turns}", "labels per turn", "judge_label"):
        assert line in text
    assert re.search(rf"success rate +│ {f['success_rate']:.3f} \({sum(r >= 1 for r in rewards)}/{N}\)", text)
    p = run_cli("stats", labelled)
    assert "conversations" in p.stdout and "turns with tool calls" in p.stdout and "get_user_details" in p.stdout


def test_a_damaged_conversation_is_one_line(labelled, tmp_path):
    t = pq.read_table(labelled)
    msgs = t.column("step_messages").to_pylist()
    msgs[0][2] = "{not json"
    bad = tmp_path / "bad.parquet"
    i = t.schema.get_field_index("step_messages")
    pq.write_table(t.set_column(i, "step_messages", pa.array(msgs, pa.list_(pa.string()))), bad)
    with pytest.raises(InputError, match=r"bad.parquet: column 'step_messages': row '0-0': not a JSON list"):
        shown(bad, index=0)
    p = run_cli("stats", bad, check=False)
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1].startswith("error: ")
    assert json.loads(msgs[1][0])[0]["role"] == "assistant"  # the other rows are fine
    assert "turn 0" in shown(bad, index=1)


def test_turns_that_disagree_with_the_steps_are_one_line(labelled, tmp_path):
    """A row with one ``step_messages`` entry fewer than steps: show drew the labels on the turns it had and
    dropped the last, stats left the row's labels out of the per-turn table; both now refuse the row."""
    t = pq.read_table(labelled)
    msgs = t.column("step_messages").to_pylist()
    msgs[0] = msgs[0][:-1]
    bad = tmp_path / "bad.parquet"
    i = t.schema.get_field_index("step_messages")
    pq.write_table(t.set_column(i, "step_messages", pa.array(msgs, pa.list_(pa.string()))), bad)
    n = len(t.column("steps")[0])
    with pytest.raises(InputError, match=rf"column 'step_messages': row '0-0': {n - 1} entries for {n} steps"):
        shown(bad, index=0)
    p = run_cli("stats", bad, check=False)
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1].startswith("error: ")
    assert f"{n - 1} entries for {n} steps" in p.stderr
