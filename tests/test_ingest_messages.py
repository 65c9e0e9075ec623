"""``ingest messages`` on τ-bench's real airline conversations: counts, an exact round trip to the source
messages, the documented rendering, and one-line errors for each kind of malformed conversation."""

from __future__ import annotations

import copy
import json

import pyarrow.parquet as pq
import pytest

from stepkit.conversations import SEPARATOR, render_prefix, render_turn, row_messages, turn_actions
from stepkit.errors import ConfigError, InputError
from stepkit.grading.verify import checker_settings
from stepkit.stages.ingest import IngestOptions, ingest
from tests.conftest import DATA, run_cli

TAU = DATA / "tau-bench" / "gpt-4o-airline.json"


@pytest.fixture(scope="module")
def tau():
    return json.loads(TAU.read_text())


@pytest.fixture(scope="module")
def all_rows(tmp_path_factory, checker):
    out = tmp_path_factory.mktemp("tau") / "tau.parquet"
    manifest = ingest("messages", TAU, out, IngestOptions(), checker, checker_settings())
    return pq.read_table(out).to_pylist(), manifest


def test_counts_on_all_200_conversations(all_rows, tau):
    rows, manifest = all_rows
    assert manifest["counts"] == {"rows": 200, "turns": 2454, "tool_calls": 1164, "successes": 84,
                                  "gold_actions": 632}
    assert sum(len(r["steps"]) for r in rows) == sum(m["role"] == "assistant" for c in tau for m in c["traj"])
    assert sum(r["outcome_correct"] for r in rows) == sum(c["reward"] == 1.0 for c in tau) == 84


def test_every_row_round_trips_to_its_messages(all_rows, tau):
    rows, _ = all_rows
    assert [r["id"] for r in rows] == [f"{c['task_id']}-{c['trial']}" for c in tau]
    for r, c in zip(rows, tau):
        assert row_messages(r) == c["traj"]
        assert r["problem_id"] == str(c["task_id"])
        assert r["source_reward"] == c["reward"]
        assert len(r["step_observations"]) == len(r["step_messages"]) == len(r["steps"])
        gold = [json.dumps({"name": a["name"], "arguments": a["kwargs"]}, sort_keys=True, separators=(",", ":"))
                for a in c["info"]["task"]["actions"]]
        assert [json.loads(a) for a in r["reference_actions"]] == [json.loads(g) for g in gold]


def test_rendering_is_the_documented_one(all_rows, tau):
    rows, _ = all_rows
    r, c = rows[0], tau[0]
    assert r["step_separator"] == SEPARATOR
    assert r["prompt"] == f"System: {c['traj'][0]['content']}\n\nUser: {c['traj'][1]['content']}"
    assert r["steps"][0] == c["traj"][2]["content"]
    assert r["step_observations"][0] == f"User: {c['traj'][3]['content']}"
    call = next(i for i, m in enumerate(c["traj"]) if m.get("tool_calls"))
    k = sum(m["role"] == "assistant" for m in c["traj"][:call])
    fn = c["traj"][call]["tool_calls"][0]["function"]
    assert r["steps"][k] == ("<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": json.loads(fn["arguments"])})
                             + "\n</tool_call>")
    assert r["step_observations"][k].startswith(f"Tool ({fn['name']}): ")
    assert turn_actions(r["step_messages"][k])[0] == json.dumps(
        {"arguments": json.loads(fn["arguments"]), "name": fn["name"]}, sort_keys=True, separators=(",", ":"))
    prefix = render_prefix(r["prompt"], r["steps"], r["step_observations"], 2)
    assert prefix == SEPARATOR.join([r["prompt"], r["steps"][0], r["step_observations"][0], r["steps"][1],
                                     r["step_observations"][1], r["steps"][2]])
    # a turn with text and a call renders both, text first
    both = next(m for c in tau for m in c["traj"] if m["role"] == "assistant" and m.get("content") and m.get("tool_calls"))
    assert render_turn(both).startswith(both["content"] + "\n<tool_call>\n")


def test_jsonl_input_and_column_flags(tmp_path, tau, checker):
    src = tmp_path / "conv.jsonl"
    recs = [{"conv_id": f"c{i}", "task": {"ok": bool(c["reward"])}, "messages": c["traj"],
             "gold": [{"name": a["name"], "arguments": json.dumps(a["kwargs"])} for a in c["info"]["task"]["actions"]]}
            for i, c in enumerate(tau[:3])]
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "o.parquet"
    ingest("messages", src, out, IngestOptions(id_col="conv_id", outcome_col="task.ok", gold_col="gold"), checker,
           checker_settings())
    rows = pq.read_table(out).to_pylist()
    assert [r["id"] for r in rows] == ["c0", "c1", "c2"]
    assert [r["outcome_correct"] for r in rows] == [bool(c["reward"]) for c in tau[:3]]
    assert [len(r["reference_actions"]) for r in rows] == [len(c["info"]["task"]["actions"]) for c in tau[:3]]
    # a reward of 0.5 with --success-threshold 0.5 is a success; with the default 1.0 it is not
    recs[0]["score"] = 0.5
    src.write_text("".join(json.dumps(r) + "\n" for r in recs[:1]))
    for threshold, want in ((0.5, True), (1.0, False)):
        ingest("messages", src, out, IngestOptions(outcome_col="score", success_threshold=threshold), checker,
               checker_settings())
        assert pq.read_table(out).to_pylist()[0]["outcome_correct"] is want


def _bad(tau, edit):
    conv = copy.deepcopy(tau[0])
    edit(conv["traj"])
    return conv


def _call_index(traj):
    return next(i for i, m in enumerate(traj) if m.get("tool_calls"))


BAD = {
    "unknown role": (lambda t: t[3].update(role="customer"), "traj[3]", "unknown role 'customer'"),
    "no matching call id": (lambda t: t[_call_index(t) + 1].update(tool_call_id="call_nope"), "traj[{call1}]",
                            "tool result for call id 'call_nope'"),
    "arguments not JSON": (lambda t: t[_call_index(t)]["tool_calls"][0]["function"].update(arguments='{"user_id": '),
                           "traj[{call}]", "arguments are not JSON"),
    "arguments a list": (lambda t: t[_call_index(t)]["tool_calls"][0]["function"].update(arguments="[1]"),
                         "traj[{call}]", "a JSON list, not an object"),
    "content a number": (lambda t: t[1].update(content=5), "traj[1]", "content is a int"),
    "no assistant turn": (lambda t: t.__setitem__(slice(2, None), []), "traj", "no assistant message"),
    "tool_call_id a list": (lambda t: t[_call_index(t) + 1].update(tool_call_id=["x"]), "traj[{call1}]",
                            "tool_call_id is a list, not the id of a call"),
    "tool name a number": (lambda t: t[_call_index(t) + 1].update(name=5), "traj[{call1}]", "name is a int, not a string"),
    "empty turn": (lambda t: t[2].update(content=" \n"), "traj[2]", "no text and no tool call (an empty turn)"),
    # arguments json.loads took, or failed on with a traceback (RecursionError, a surrogate pyarrow could not
    # write, an AttributeError reading the int-limit ValueError)
    "arguments NaN": (lambda t: t[_call_index(t)]["tool_calls"][0]["function"].update(arguments='{"a": NaN}'),
                      "traj[{call}]", "arguments are not JSON (NaN is not a JSON value)"),
    "arguments nested too deeply": (
        lambda t: t[_call_index(t)]["tool_calls"][0]["function"].update(arguments="[" * 100_000),
        "traj[{call}]", "arguments are nested too deeply to read"),
    "arguments lone surrogate": (
        lambda t: t[_call_index(t)]["tool_calls"][0]["function"].update(arguments='{"user_id": "\\ud800"}'),
        "traj[{call}]", "arguments hold a lone UTF-16 surrogate"),
    "arguments integer too long": (
        lambda t: t[_call_index(t)]["tool_calls"][0]["function"].update(arguments='{"a": 1' + "0" * 5000 + "}"),
        "traj[{call}]", "arguments are not JSON (Exceeds the limit (4300 digits)"),
    # a result after the next turn was kept as that turn's observation: its call's own turn then looked
    # unanswered (an "Error..." result no longer excused it) and the later turn "obtained" its values
    "tool result after the next turn": (
        lambda t: t.insert(_call_index(t) + 2, t.pop(_call_index(t) + 1)), "traj[{call2}]", "of the turn at message {call}, after a later turn (message {call1})"),
    "two calls of a turn with one id": (
        lambda t: t[_call_index(t)]["tool_calls"].append(copy.deepcopy(t[_call_index(t)]["tool_calls"][0])),
        "traj[{call}]", "two tool calls of the turn have id"),
    "tool result answered twice": (lambda t: t.insert(_call_index(t) + 2, dict(t[_call_index(t) + 1])),
                                   "traj[{call2}]", "no earlier assistant call left unanswered"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_malformed_conversation_is_one_line_naming_conversation_and_message(tmp_path, tau, kind):
    edit, column, text = BAD[kind]
    call = _call_index(tau[0]["traj"])
    column, text = (x.format(call=call, call1=call + 1, call2=call + 2) for x in (column, text))
    assert tau[0]["traj"][call + 1]["role"] == "tool" and tau[0]["traj"][call + 2]["role"] == "assistant"
    src = tmp_path / "bad.json"
    src.write_text(json.dumps([tau[1], _bad(tau, edit)]))
    out = tmp_path / "o.parquet"
    res = run_cli("ingest", "messages", str(src), str(out), check=False)
    assert res.returncode == 1 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"error: {src}: row 1, column '{column}': "), lines[0]
    assert text in lines[0]
    assert not out.exists()


def test_other_bad_records(tmp_path, tau, checker):
    src = tmp_path / "bad.json"
    cases = [
        ([{**tau[0], "reward": "yes"}], "row 0, column 'reward': the outcome must be a number"),
        ([{k: v for k, v in tau[0].items() if k != "traj"}], "row 0, column 'messages': missing"),
        ([tau[0], tau[0]], "row 1: id '0-0' was already given to row 0"),
        ([{**tau[0], "info": {"task": {"actions": [{"name": "x", "kwargs": "[1"}]}}}],
         "row 0, column 'info.task.actions': action 0: tool call x: arguments are not JSON"),
        ([[1, 2]], "row 0: expected an object, found list"),
        ([{**tau[0], "traj": [{"role": "system", "content": ""}, {"role": "user", "content": " "}, *tau[0]["traj"][2:]]}],
         "row 0, column 'traj': no message with text before the first assistant turn"),
        ([{**tau[0], "reward": 10 ** 400}], "row 0, column 'reward': the outcome is inf (not a finite number)"),
        ([{**tau[0], "info": {"task": {"actions": [{"name": "x", "kwargs": '{"a": "\\udfff"}'}]}}}],
         "row 0, column 'info.task.actions': action 0: tool call x: arguments hold a lone UTF-16 surrogate"),
    ]
    for data, want in cases:
        src.write_text(json.dumps(data))
        with pytest.raises(InputError) as e:
            ingest("messages", src, tmp_path / "o.parquet", IngestOptions(), checker, checker_settings())
        assert want in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match="--success-threshold applies only to format messages"):
        ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(success_threshold=0.5), checker,
               checker_settings())


# ---- fuzz: faults put into a real conversation ---------------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from stepkit.errors import StepkitError  # noqa: E402

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                     st.sampled_from(["", "{", "{}", "[]", '{"a": 1}', "\x00", "\u202e", "null", "assistant", "tool"]))
_JSON = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                     max_leaves=6)
_KEYS = ["role", "content", "tool_calls", "tool_call_id", "name"]


@st.composite
def faults(draw, n_messages):
    kind = draw(st.sampled_from(["set", "delete", "replace", "insert", "arguments", "fn_name", "messages"]))
    i = draw(st.integers(0, n_messages - 1))
    return kind, i, draw(st.sampled_from(_KEYS)), draw(_JSON)


def _apply(conv, fault):
    kind, i, key, value = fault
    traj = conv["traj"]
    calls = [k for k, m in enumerate(traj) if m.get("tool_calls")]
    if kind == "set":
        traj[i][key] = value
    elif kind == "delete":
        traj[i].pop(key, None)
    elif kind == "replace":
        traj[i] = value
    elif kind == "insert":
        traj.insert(i, value if isinstance(value, dict) else {"role": "user", "content": value})
    elif kind == "arguments" and calls:
        traj[calls[i % len(calls)]]["tool_calls"][0]["function"]["arguments"] = value
    elif kind == "fn_name" and calls:
        traj[calls[i % len(calls)]]["tool_calls"][0]["function"]["name"] = value
    elif kind == "messages":
        conv["traj"] = value


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_ingest_messages_fuzz(tmp_path, tau, checker, data):
    """A fault put into conversation 1 of two real ones: ingest succeeds and every row gives back its
    (faulted) messages, or it fails in one line naming the file and row 1; never another exception,
    never a shard left behind."""
    conv = copy.deepcopy(tau[7])
    fault = data.draw(faults(len(conv["traj"])))
    _apply(conv, fault)
    src, out = tmp_path / "f.json", tmp_path / "f.parquet"
    out.unlink(missing_ok=True)
    src.write_text(json.dumps([tau[2], conv]))
    try:
        ingest("messages", src, out, IngestOptions(), checker, checker_settings())
    except StepkitError as e:
        msg = str(e)
        assert "\n" not in msg and msg.startswith(f"{src}: row 1"), msg
        assert not out.exists()
        return
    rows = pq.read_table(out).to_pylist()
    assert [row_messages(r) for r in rows] == [tau[2]["traj"], conv["traj"]]
    for r in rows:
        assert len(r["steps"]) == len(r["step_observations"]) == len(r["step_messages"]) >= 1
        assert all(s.strip() for s in r["steps"])  # an empty step would be refused by every later stage


@pytest.mark.parametrize("as_list", [True, False], ids=["json-list", "jsonl"])
def test_ingest_messages_from_a_named_pipe_reads_it_once(tmp_path, tau, as_list):
    """A pipe can be read once: the format used to be guessed from a first read of FILE, which ate the
    pipe's head (``error: ...: expected a JSON list of ProcessBench rows`` / ``row 0: not valid JSON``)."""
    import hashlib
    import os
    import threading

    convs = tau[:3]
    data = (json.dumps(convs) if as_list else "".join(json.dumps(c) + "\n" for c in convs)).encode()
    fifo = tmp_path / "convs.json"
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "wb") as f:
            f.write(data)

    threading.Thread(target=feed, daemon=True).start()
    out = tmp_path / "o.parquet"
    p = run_cli("ingest", "messages", fifo, out, check=False)
    assert p.returncode == 0, p.stderr
    assert [row_messages(r) for r in pq.read_table(out).to_pylist()] == [c["traj"] for c in convs]
    m = json.loads(out.with_name("o.manifest.json").read_text())
    assert m["input"]["sha256"] == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("flag, key", [("--outcome-col", "rewards"), ("--gold-col", "info.task.action")])
def test_a_key_that_no_record_has_is_a_typo(tmp_path, flag, key):
    """Breaking run E1: a mistyped --outcome-col / --gold-col was accepted (every outcome null, every gold
    action gone, exit 0). The defaults may name keys a file lacks (its rows are then ungraded)."""
    src = DATA / "tau-bench" / "gpt-4o-airline.json"
    p = run_cli("ingest", "messages", src, tmp_path / "o.parquet", "--limit", 5, flag, key, check=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"error: {src}: column '{key}': {flag} names no key of any record (keys: ")
    assert "reward" in p.stderr and not (tmp_path / "o.parquet").exists()
    convs = json.loads(src.read_text())[:3]
    for c in convs:
        del c["reward"], c["info"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(convs))
    run_cli("ingest", "messages", bare, tmp_path / "bare.parquet")  # no outcome, no gold: ungraded rows
    rows = pq.read_table(tmp_path / "bare.parquet").to_pylist()
    assert [r["outcome_correct"] for r in rows] == [None] * 3 and all(r["reference_actions"] is None for r in rows)


def test_a_mistyped_id_key_is_named_and_a_tau_bench_file_is_recognised(tmp_path):
    """Breaking run E18: a mistyped --id-col printed ``<object object at 0x...>``; E19: a τ-bench file given
    to ``ingest gsm8k`` was said to look like ProcessBench input."""
    p = run_cli("ingest", "messages", TAU, tmp_path / "x.parquet", "--limit", 2, "--id-col", "trial_id", check=False)
    assert p.returncode == 1 and "object at 0x" not in p.stderr
    assert p.stderr.strip() == (f"error: {TAU}: row 0, column 'trial_id': names no key of the record (keys: "
                                "task_id, reward, info, traj, trial)")
    p = run_cli("ingest", "gsm8k", TAU, tmp_path / "w.parquet", check=False)
    assert p.returncode == 1 and "the file looks like messages input (stepkit ingest messages FILE OUT)" in p.stderr
    pb = DATA / "processbench" / "gsm8k.json"
    p = run_cli("ingest", "gsm8k", pb, tmp_path / "w.parquet", check=False)
    assert "looks like processbench input" in p.stderr  # a JSON list of steps is still ProcessBench
