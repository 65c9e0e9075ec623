"""filter on tool-calling conversations (issue 13): real τ-bench rows from ``ingest messages``, cut by turn
labels; the cut rows' per-turn columns and conversations. Also the τ-bench helpers the export and view
tests share."""

from __future__ import annotations

import functools
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepkit.conversations import parse_conversation, render_turn, row_messages
from stepkit.errors import InputError
from stepkit.shards import read_rows
from tests.conftest import DATA, run_cli
from tests.test_filter import run_filter

TAU = DATA / "tau-bench" / "gpt-4o-airline.json"
N = 7  # conversations 0..6: 5 to 30 turns, one without any tool call (1), one success (6)
FIRST_ERRORS = [3, 0, -1, 5, 11, 1, -1]  # per conversation: its first wrong turn (-1: none); 11 is row 4's last


@functools.cache
def tau_source() -> list[dict]:
    """The τ-bench records of the data file."""
    return json.loads(TAU.read_text())


def source_messages(row: dict) -> list[dict]:
    """The τ-bench conversation a row was ingested from (``source`` is ``<file>/<index>``)."""
    return tau_source()[int(row["source"].rsplit("/", 1)[1])]["traj"]


def ingest_tau(path, n: int = N):
    """``stepkit ingest messages`` of the first ``n`` τ-bench conversations into ``path``."""
    run_cli("ingest", "messages", TAU, path, "--limit", n)
    return path


def with_turn_labels(src, out, first_errors=FIRST_ERRORS, col="judge_label"):
    """``src`` plus a list<bool> column ``col``: per row, turns before its first error true, the rest false."""
    t = pq.read_table(src)
    n_turns = [len(s) for s in t.column("steps").to_pylist()]
    labels = [[k == -1 or s < k for s in range(n)] for n, k in zip(n_turns, first_errors)]
    pq.write_table(t.append_column(col, pa.array(labels, pa.list_(pa.bool_()))), out)
    return out


@pytest.fixture(scope="module")
def tau(tmp_path_factory):
    return ingest_tau(tmp_path_factory.mktemp("tau") / "tau.parquet")


def check_prefix(row: dict, orig: dict, turns: int) -> list[dict]:
    """The cut row keeps the first ``turns`` turns of ``orig`` whole, and its conversation is the source's
    up to a turn boundary, valid on its own; returns it."""
    assert len(row["steps"]) == len(row["step_observations"]) == len(row["step_messages"]) == turns
    for c in ("steps", "step_observations", "step_messages", "judge_label"):
        assert row[c] == orig[c][:turns], c
    assert row["prompt_messages"] == orig["prompt_messages"]
    msgs, source = row_messages(row), source_messages(row)
    assert msgs == source[:len(msgs)]
    conv = parse_conversation(msgs)  # every tool result answers a call of a kept turn
    assert [render_turn(t.message) for t in conv.turns] == row["steps"]
    if turns < len(orig["steps"]):
        assert source[len(msgs)] == json.loads(orig["step_messages"][turns])[0]  # the next message: the next turn
    return msgs


def test_ingested_rows_give_back_their_conversations(tau):
    rows = read_rows(tau)
    assert len(rows) == N
    for r in rows:
        assert row_messages(r) == source_messages(r)
        assert len(r["steps"]) == len(r["step_messages"]) == len(r["step_observations"])
    assert [r["outcome_correct"] for r in rows] == [x["reward"] >= 1 for x in tau_source()[:N]]


def test_truncate_after_first_error_cuts_whole_turns(tau, tmp_path):
    src = with_turn_labels(tau, tmp_path / "labelled.parquet")
    before = read_rows(src)
    kept, dropped, m = run_filter(tmp_path, src, "truncate-after-first-error:judge_label")
    assert not dropped and [r["id"] for r in kept] == [r["id"] for r in before]
    for r, orig, k in zip(kept, before, FIRST_ERRORS):
        n = len(orig["steps"])
        want = n if k == -1 else k + 1
        check_prefix(r, orig, want)
        assert (r["filter_steps_before"], r["filter_kept_steps"]) == (n, want)
        assert r["judge_label"][-1] is (k == -1)  # the wrong turn is kept, and is the last
        if k not in (-1, n - 1):
            assert r["filter_cut_by"] == "truncate-after-first-error:judge_label"
    # row 0's wrong turn calls a tool: its result stays with it, and the conversation ends there
    wrong = json.loads(before[0]["step_messages"][3])
    assert wrong[0]["tool_calls"] and wrong[1]["role"] == "tool"
    assert row_messages(kept[0])[-len(wrong):] == wrong
    assert m["counts"]["steps_cut"] == sum(len(b["steps"]) - len(r["steps"]) for b, r in zip(before, kept))


def test_keep_correct_steps_keeps_the_turns_before_the_first_error(tau, tmp_path):
    src = with_turn_labels(tau, tmp_path / "labelled.parquet")
    before = read_rows(src)
    kept, dropped, _ = run_filter(tmp_path, src, "keep-correct-steps:judge_label")
    assert [(r["id"], r["filter_reason"]) for r in dropped] == [(before[1]["id"], "no-correct-steps")]
    assert dropped[0]["step_messages"] == before[1]["step_messages"]  # a dropped row is kept whole
    survivors = [(b, k) for b, k in zip(before, FIRST_ERRORS) if k != 0]
    assert [r["id"] for r in kept] == [b["id"] for b, _ in survivors]
    for r, (orig, k) in zip(kept, survivors):
        want = len(orig["steps"]) if k == -1 else k
        msgs = check_prefix(r, orig, want)
        assert all(r["judge_label"])
        if k > 0:  # the wrong turn and every message after it are gone, its tool calls' results too
            wrong = json.loads(orig["step_messages"][k])[0]
            ids = {c["id"] for c in wrong.get("tool_calls") or []}
            assert not any(m.get("tool_call_id") in ids for m in msgs)
    # row 0 keeps turns 0-2; turn 2 called a tool, so the kept conversation ends with that call's result
    last = row_messages(kept[0])[-1]
    assert last["role"] == "tool" and last["tool_call_id"] == json.loads(kept[0]["step_messages"][2])[0][
        "tool_calls"][0]["id"]


def test_flag_only_records_the_cut_and_keeps_every_turn(tau, tmp_path):
    src = with_turn_labels(tau, tmp_path / "labelled.parquet")
    before = read_rows(src)
    kept, _, _ = run_filter(tmp_path, src, "truncate-after-first-error:judge_label", flag_only=True)
    assert [r["step_messages"] for r in kept] == [r["step_messages"] for r in before]
    assert [r["filter_kept_steps"] for r in kept] == [len(b["steps"]) if k == -1 else k + 1
                                                     for b, k in zip(before, FIRST_ERRORS)]


def test_a_turn_column_of_the_wrong_length_is_refused(tau, tmp_path):
    t = pq.read_table(with_turn_labels(tau, tmp_path / "labelled.parquet"))
    msgs = t.column("step_messages").to_pylist()
    msgs[2] = msgs[2][:-1]
    bad = tmp_path / "bad.parquet"
    pq.write_table(t.set_column(t.schema.get_field_index("step_messages"), "step_messages",
                                pa.array(msgs, pa.list_(pa.string()))), bad)
    with pytest.raises(InputError, match=r"row 2, column 'step_messages': per-step column has \d+ entries"):
        run_filter(tmp_path, bad, "truncate-after-first-error:judge_label")
