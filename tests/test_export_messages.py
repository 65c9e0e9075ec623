"""export --format messages (issue 13): real τ-bench conversations from ``ingest messages`` exported with one
label per assistant turn, read back with ``datasets`` and compared with the source file; filtered shards
export their prefix; bad input is one line and writes nothing."""

from __future__ import annotations

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepkit.errors import ConfigError, InputError
from stepkit.runner import run_stage
from stepkit.shards import read_rows
from stepkit.stages.export import ExportConfig, export
from stepkit.stages.filter import FilterConfig, FilterStage
from tests.conftest import run_cli
from tests.test_agent_turns import FIRST_ERRORS, N, ingest_tau, source_messages, tau_source, with_turn_labels
from tests.test_export import labelled, load
from tests.test_export import write as write_math

KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


def as_struct(m: dict) -> dict:
    """A source message as the export writes it: the five keys, absent ones null."""
    return {k: m.get(k) for k in KEYS}


def set_column(src, out, name, values, typ):
    t = pq.read_table(src)
    i = t.schema.get_field_index(name)
    col = pa.array(values, typ)
    pq.write_table(t.set_column(i, name, col) if i >= 0 else t.append_column(name, col), out)
    return out


@pytest.fixture(scope="module")
def tau(tmp_path_factory):
    return ingest_tau(tmp_path_factory.mktemp("tau") / "tau.parquet")


@pytest.fixture
def labelled_tau(tau, tmp_path):
    return with_turn_labels(tau, tmp_path / "labelled.parquet")


def test_round_trip_gives_the_source_conversations_and_one_label_per_assistant_turn(labelled_tau, tmp_path):
    m = export(labelled_tau, tmp_path / "ds", ExportConfig(format="messages", labels="judge_label"))
    ds = load(tmp_path / "ds")
    call = {"id": datasets.Value("string"), "type": datasets.Value("string"),
            "function": {"name": datasets.Value("string"), "arguments": datasets.Value("string")}}
    assert ds.features["messages"] == datasets.List({
        "role": datasets.Value("string"), "content": datasets.Value("string"), "tool_calls": datasets.List(call),
        "tool_call_id": datasets.Value("string"), "name": datasets.Value("string")})
    assert ds.features["labels"] == datasets.List(datasets.Value("bool"))
    assert list(ds.features) == ["id", "problem_id", "messages", "labels", "turn_index", "outcome_correct", "reward"]
    rows = read_rows(labelled_tau)
    assert ds["id"] == [r["id"] for r in rows]
    for rec, row, k in zip(ds, rows, FIRST_ERRORS):
        source = source_messages(row)
        assert rec["messages"] == [as_struct(x) for x in source]
        assistant = [i for i, x in enumerate(source) if x["role"] == "assistant"]
        assert rec["turn_index"] == assistant and len(rec["labels"]) == len(assistant)
        assert rec["labels"] == [k == -1 or s < k for s in range(len(assistant))]
        record = tau_source()[int(row["source"].rsplit("/", 1)[1])]
        assert (rec["reward"], rec["outcome_correct"]) == (record["reward"], record["reward"] >= 1)
    # a tool call's arguments are the source's JSON text, byte for byte; content may be null
    first = ds[0]["messages"]
    calls = [(x, y) for x, y in zip(first, source_messages(rows[0])) if y.get("tool_calls")]
    assert calls and all(x["content"] is None and x["tool_calls"][0]["function"]["arguments"]
                         == y["tool_calls"][0]["function"]["arguments"] for x, y in calls)
    c = m["counts"]
    assert c["steps"] == sum(len(r["steps"]) for r in rows) == c["labels_true"] + c["labels_false"]
    assert c["messages"] == sum(len(source_messages(r)) for r in rows)
    assert c["tool_calls"] == sum(len(x.get("tool_calls") or []) for r in rows for x in source_messages(r))
    assert c["message_fields_dropped"] == 0 and m["dropped_message_keys"] == {}


@pytest.mark.parametrize("rule", ["truncate-after-first-error:judge_label", "keep-correct-steps:judge_label"])
def test_a_filtered_shard_exports_its_prefix_and_flagging_exports_the_same(labelled_tau, tmp_path, rule):
    cut, flagged = tmp_path / "cut.parquet", tmp_path / "flagged.parquet"
    run_stage(FilterStage(FilterConfig(rule=(rule,), dropped=str(tmp_path / "d.parquet"))), labelled_tau, cut,
              progress=False)
    run_stage(FilterStage(FilterConfig(rule=(rule,), flag_only=True)), labelled_tau, flagged, progress=False)
    export(cut, tmp_path / "a", ExportConfig(format="messages", labels="judge_label"))
    m = export(flagged, tmp_path / "b", ExportConfig(format="messages", labels="judge_label"))
    a, b = load(tmp_path / "a"), load(tmp_path / "b")
    assert a.to_list() == b.to_list()  # flagging == filtering, exported
    through = rule.startswith("truncate")
    rows = {r["id"]: r for r in read_rows(labelled_tau)}
    firsts = dict(zip(rows, FIRST_ERRORS))
    assert a["id"] == [i for i, k in firsts.items() if through or k != 0]
    assert m["counts"]["filtered"] == (0 if through else 1)
    for rec in a:
        row, k = rows[rec["id"]], firsts[rec["id"]]
        n = len(row["steps"])
        turns = n if k == -1 else k + 1 if through else k
        source = source_messages(row)
        assert rec["messages"] == [as_struct(x) for x in source[:len(rec["messages"])]]
        assert len(rec["labels"]) == len(rec["turn_index"]) == turns
        assert sum(x["role"] == "assistant" for x in rec["messages"]) == turns
        if turns < n:  # cut at a turn boundary: the next source message is the next turn
            assert source[len(rec["messages"])]["role"] == "assistant"
        assert rec["labels"] == ([True] * turns if k == -1 or not through else [True] * k + [False])


def test_values_give_hard_labels_above_the_threshold_or_soft_labels(labelled_tau, tmp_path):
    rows = read_rows(labelled_tau)
    values = [[0.25 * (s % 5) for s in range(len(r["steps"]))] for r in rows]
    src = set_column(labelled_tau, tmp_path / "values.parquet", "mc_value", values, pa.list_(pa.float32()))
    export(src, tmp_path / "hard", ExportConfig(format="messages", labels="mc_value", threshold=0.5))
    hard = load(tmp_path / "hard")
    assert hard["labels"] == [[v > 0.5 for v in vs] for vs in values]
    assert hard["soft_labels"] == values and hard.features["soft_labels"] == datasets.List(datasets.Value("float32"))
    export(src, tmp_path / "soft", ExportConfig(format="messages", labels="mc_value", soft=True))
    soft = load(tmp_path / "soft")
    assert soft["labels"] == values and "soft_labels" not in soft.features
    assert soft.features["labels"] == datasets.List(datasets.Value("float32"))
    with pytest.raises(ConfigError, match="--soft is for --format trl or messages"):
        ExportConfig(format="math-shepherd", labels="mc_value", soft=True)


@pytest.mark.parametrize("col", ["judge_score", "clue_score"])
def test_scores_on_their_own_scale_need_a_threshold_and_are_never_soft(labelled_tau, tmp_path, col):
    """judge_score is 0-10 (correct above 5), clue_score 0-2 around a neutral 1: with the default
    ``value > 0`` a turn the judge scored 2 exported as correct, and ``--soft`` wrote "probabilities" of 8.0
    or 2.0. Now both need --threshold (or the stage's own label column)."""
    rows = read_rows(labelled_tau)
    top = {"judge_score": 10.0, "clue_score": 2.0}[col]
    values = [[top * (s % 3) / 4 for s in range(len(r["steps"]))] for r in rows]  # 0, top/4, top/2, ...
    src = set_column(labelled_tau, tmp_path / "scores.parquet", col, values, pa.list_(pa.float32()))
    for soft in (False, True):
        with pytest.raises(InputError, match=rf"column '{col}': holds 0-{top:g} scores on a scale of their own \(declared scale 'score'\), not step values"):
            export(src, tmp_path / "o", ExportConfig(format="messages", labels=col, soft=soft))
        assert not (tmp_path / "o").exists()
    with pytest.raises(InputError, match="they are no soft labels"):
        export(src, tmp_path / "o", ExportConfig(format="trl", labels=col, soft=True, threshold=top / 2))
    export(src, tmp_path / "hard", ExportConfig(format="messages", labels=col, threshold=top / 2 - 0.01))
    assert load(tmp_path / "hard")["labels"] == [[v > top / 2 - 0.01 for v in vs] for vs in values]
    p = run_cli("export", src, tmp_path / "cli", "--format", "messages", "--labels", col, check=False)
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        f"error: {src}: column '{col}': holds 0-{top:g} scores on a scale of their own (declared scale 'score'), not "
        f"step values: value > 0 would call nearly "
        f"every step correct; use --labels {col.replace('_score', '_label')}, or hard labels with --threshold X"]


def test_message_variants_are_written_in_the_fixed_struct_and_left_out_keys_counted(labelled_tau, tmp_path):
    t = pq.read_table(labelled_tau)
    steps = t.column("step_messages").to_pylist()
    first = [json.loads(s) for s in steps[0]]
    call_turn = next(k for k, e in enumerate(first) if e[0].get("tool_calls"))
    fn = first[call_turn][0]["tool_calls"][0]["function"]
    fn["arguments"] = json.loads(fn["arguments"])  # an object, not a string
    first[0][0]["reasoning_content"] = "thinking"  # a key the format has no field for
    first[0][0]["content"] = [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]
    steps[0] = [json.dumps(e) for e in first]
    src = set_column(labelled_tau, tmp_path / "variants.parquet", "step_messages", steps, pa.list_(pa.string()))
    p = run_cli("export", src, tmp_path / "ds", "--format", "messages", "--labels", "judge_label")
    assert "1 message field(s) not in the messages format were left out: reasoning_content" in p.stderr
    m = json.loads((tmp_path / "ds" / "stepkit.manifest.json").read_text())
    assert m["dropped_message_keys"] == {"reasoning_content": 1} and m["counts"]["message_fields_dropped"] == 1
    rec = load(tmp_path / "ds")[0]
    turns = rec["turn_index"]
    assert rec["messages"][turns[0]]["content"] == "Part one. Part two."
    assert json.loads(rec["messages"][turns[call_turn]]["tool_calls"][0]["function"]["arguments"]) == fn["arguments"]


def test_rows_not_from_ingest_messages_and_bad_conversations_are_one_line(labelled_tau, tmp_path):
    math = write_math(tmp_path / "math.parquet", labelled(2))
    with pytest.raises(InputError, match=r"math.parquet: column 'prompt_messages': missing column: export "
                                         r"--format messages needs rows from `stepkit ingest messages`"):
        export(math, tmp_path / "o", ExportConfig(format="messages", labels="mc_label"))
    p = run_cli("export", math, tmp_path / "o", "--format", "messages", "--labels", "mc_label", check=False)
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1].startswith("error: ") and \
        "needs rows from `stepkit ingest messages`" in p.stderr
    steps = pq.read_table(labelled_tau).column("step_messages").to_pylist()
    bad_cases = []
    nulls = list(steps)
    nulls[2] = None
    bad_cases.append((nulls, r"row 2, column 'step_messages': null: export --format messages needs rows from"))
    garbled = [list(s) for s in steps]
    garbled[3][1] = "{not json"
    bad_cases.append((garbled, r"row 3, column 'step_messages': not a JSON list of messages"))
    orphan = [list(s) for s in steps]
    entry = json.loads(orphan[0][3])  # turn 3 of row 0 calls a tool: its result now answers an unknown id
    entry[1]["tool_call_id"] = "call_nobody_made"
    orphan[0][3] = json.dumps(entry)
    bad_cases.append((orphan, r"row 0, column 'step_messages': not a valid conversation: message 9: tool result "
                              r"for call id 'call_nobody_made'"))
    named = [list(s) for s in steps]
    entry = json.loads(named[0][2])  # turn 2 of row 0 and its tool result, message 7
    entry[1]["name"] = 5
    named[0][2] = json.dumps(entry)
    bad_cases.append((named, r"row 0, column 'step_messages': not a valid conversation: message 7: name is a int, not a "
                              r"string"))
    short = [list(s) for s in steps]
    short[4].pop()
    bad_cases.append((short, r"row 4, column 'step_messages': 11 entries for 12 steps"))
    merged = [list(s) for s in steps]
    merged[5][0] = json.dumps(json.loads(merged[5][0]) + json.loads(merged[5].pop(1)))
    bad_cases.append((merged, r"row 5, column 'step_messages': entry 0 is not one assistant turn and its "
                              r"observation \(roles: assistant, user, assistant, tool\)"))
    for k, (values, msg) in enumerate(bad_cases):
        src = set_column(labelled_tau, tmp_path / f"bad{k}.parquet", "step_messages", values, pa.list_(pa.string()))
        if "entry 0" in msg:  # as many entries as steps and labels: the entry itself is wrong
            t = pq.read_table(src)
            src = set_column(src, src, "steps", [x[:-1] if i == 5 else x for i, x in
                                                 enumerate(t.column("steps").to_pylist())], pa.list_(pa.string()))
            src = set_column(src, src, "judge_label", [x[:-1] if i == 5 else x for i, x in
                                                       enumerate(t.column("judge_label").to_pylist())],
                             pa.list_(pa.bool_()))
        with pytest.raises(InputError, match=msg):
            export(src, tmp_path / f"out{k}", ExportConfig(format="messages", labels="judge_label"))
        assert not (tmp_path / f"out{k}").exists()  # nothing written
    # a label column one turn short is the label rule every format has
    labels = pq.read_table(labelled_tau).column("judge_label").to_pylist()
    labels[1] = labels[1][:-1]
    short = set_column(labelled_tau, tmp_path / "short.parquet", "judge_label", labels, pa.list_(pa.bool_()))
    with pytest.raises(InputError, match=r"row 1, column 'judge_label': \d+ labels for \d+ steps"):
        export(short, tmp_path / "short", ExportConfig(format="messages", labels="judge_label"))
    # an earlier export is never lost to a failed one
    export(labelled_tau, tmp_path / "keep", ExportConfig(format="messages", labels="judge_label"))
    with pytest.raises(InputError):
        export(short, tmp_path / "keep", ExportConfig(format="messages", labels="judge_label"), force=True)
    assert load(tmp_path / "keep").num_rows == N


def test_publish_card_describes_the_messages_format(labelled_tau, tmp_path):
    cut = tmp_path / "cut.parquet"
    run_stage(FilterStage(FilterConfig(rule=("truncate-after-first-error:judge_label",), flag_only=True)),
              labelled_tau, cut, progress=False)
    export(cut, tmp_path / "ds", ExportConfig(format="messages", labels="judge_label", test_size=2))
    run_cli("publish", tmp_path / "ds", "--dry-run")
    card = (tmp_path / "ds" / "README.md").read_text()
    assert "in the **messages** format" in card and "`turn_index[i]` is the position in `messages`" in card
    assert "Conversations were **cut after their first error**" in card and "| labelled turns |" in card
    assert "- tool-calling" in card
    ds = datasets.load_dataset(str(tmp_path / "ds"), cache_dir=str(tmp_path / "cache"))
    assert {s: d.num_rows for s, d in ds.items()} == {"train": N - 2, "test": 2}
    assert ds["test"].features["messages"] == ds["train"].features["messages"]
