"""Labellers on agent turns, on τ-bench's real airline conversations: the scored judge template
(``judge --template judge-agent-step``), clues backtracked from the gold actions (``clue recover
--from-actions``) and ``clue score`` on turns, and the agreement of the two first errors."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from stepkit.conversations import canonical_action
from stepkit.errors import ConfigError
from stepkit.grading.actions import READ_ONLY_TOOLS, action_clues, covers, match_turns, read_only
from stepkit.grading.verdicts import VerdictParseError, parse_step_scores
from stepkit.prompts import load_template, render_judge
from stepkit.stages.clue import ClueRecoverConfig, ClueRecoverStage
from stepkit.stages.judge import vote_row
from tests.conftest import DATA, run_cli

TAU = DATA / "tau-bench" / "gpt-4o-airline.json"


@pytest.fixture(scope="module")
def tau():
    return json.loads(TAU.read_text())


@pytest.fixture(scope="module")
def tau_shard(tmp_path_factory):
    d = tmp_path_factory.mktemp("agent")
    run_cli("ingest", "messages", TAU, d / "tau.parquet")
    return d


@pytest.fixture(scope="module")
def scored(tau_shard):
    run_cli("clue", "recover", tau_shard / "tau.parquet", tau_shard / "clues.parquet", "--from-actions",
            "--no-progress")
    run_cli("clue", "score", tau_shard / "tau.parquet", tau_shard / "scored.parquet", "--clues",
            tau_shard / "clues.parquet", "--no-progress")
    return pq.read_table(tau_shard / "scored.parquet").to_pylist()


# ---- the scored judge template ------------------------------------------------------------------------

def test_parse_step_scores_reads_the_final_score_per_turn():
    assert parse_step_scores("Turn 0: score 3\nTurn 1: 9/10\nOn reflection:\nTurn 0: score 7", 2) == [7.0, 9.0]
    assert parse_step_scores("- **Turn 0:** score: 6.5\n2. Turn 1: Score 0", 2) == [6.5, 0.0]
    for bad, why in (("Turn 0: score 7", "scores for 1 of 2"), ("Turn 0: 11\nTurn 1: 2", "outside 0..10"),
                     ("Turn 0: 1\nTurn 1: 2\nTurn 2: 3", "turn 2 but the conversation has 2"),
                     ("All turns look fine: 8", "no verdict"), ("Turn 0: 5.5.5\nTurn 1: 2", "ambiguous score for turn 0")):
        with pytest.raises(VerdictParseError, match=why):
            parse_step_scores(bad, 2)


# Each of these was read as a score before (the value read in the comment); each is now a parse failure.
AMBIGUOUS_SCORES = {
    "Turn 0: -3\nTurn 1: 7": "score -3 for turn 0 is outside",  # 3.0: the sign was a separator
    "Turn 0 -3\nTurn 1: 7": "score -3 for turn 0 is outside",  # 3.0
    "Turn 0: \u22123\nTurn 1: 7": "score -3 for turn 0 is outside",  # skipped (a Unicode minus)
    "Turn 0: 4/5\nTurn 1: 2/5": "score 4/5 for turn 0 is not on the 0..10 scale",  # 4.0, 2.0
    "Turn 0: 8/100\nTurn 1: 9/10": "score 8/100 for turn 0 is not on the 0..10",  # 8.0
    "Turn 0-1: 2\nTurn 1: 7": "score line for a range of turns",  # turn 0: 1.0 (the range's end)
    "Turn 0: 5,5\nTurn 1: 7": "ambiguous score for turn 0",  # 5.0: incorrect, though 5.5 is correct
    "Turn 0: 0.6e1\nTurn 1: 7": "ambiguous score for turn 0",  # 0.6
    "Turn 0: 6 or 3\nTurn 1: 7": "ambiguous score for turn 0",  # 6.0
    "Turn 0: 5-7\nTurn 1: 7": "ambiguous score for turn 0",  # 5.0
    "Turn 0: 9\nTurn 1: 7\nTurn 1: 2 tool calls were wrong": "ambiguous score for turn 1",  # 2.0, the last
}


@pytest.mark.parametrize("reply", sorted(AMBIGUOUS_SCORES))
def test_parse_step_scores_never_guesses_a_score(reply):
    with pytest.raises(VerdictParseError, match=AMBIGUOUS_SCORES[reply]):
        parse_step_scores(reply, 2)


def test_parse_step_scores_formats_and_comments():
    for reply in ("Turn 0 - 7/10\nTurn 1 - 3/10", "turn_0: 7\nturn_1: 3", "| Turn 0 | 7 |\n| Turn 1 | 3 |",
                  "Turn 0: 7 out of 10\nTurn 1: score=3", "Turn 0: 7 - asks for the user id\nTurn 1: 3. Wrong flight.",
                  "Turn 0: score 7 (good)\nTurn 1: **3**, cancels without asking", "Turn 0 \u2013 7\nTurn 1: 3/10!",
                  "Turn 0 was fine.\nTurn 1 made 2 calls.\nTurn 0: 7\nTurn 1: 3"):
        assert parse_step_scores(reply, 2) == [7.0, 3.0], reply
    # a template that tags steps <paragraph_k> is answered "Paragraph k: S": those lines win over "Turn k"
    assert parse_step_scores("Turn 0: 1\nParagraph 0: 7\nParagraph 1: 3", 2, tags=("paragraph", "turn")) == [7.0, 3.0]


def test_own_score_template_without_step_tag_is_parsed(tmp_path):
    """A ``mode: per-step-score`` template of one's own (no ``step_tag``: steps tagged ``<paragraph_k>``)
    asking for ``Paragraph k: score S``: every reply was a parse failure (only ``Turn k`` lines were read)."""
    from stepkit.engines.base import EngineSpec, SamplingConfig
    from stepkit.engines.scripted import ScriptedEngine
    from stepkit.stages.judge import JudgeConfig, JudgeStage

    t = tmp_path / "mine.yaml"
    t.write_text("version: mine-v1\nmode: per-step-score\nuser: |-\n  {problem}\n  {steps}\n  End with "
                 "{n_steps} lines 'Paragraph k: score S' (0-10).\n")
    engine = ScriptedEngine(lambda prompt, j, n: "Paragraph 0: score 9\nParagraph 1: score 2", "scripted:judge")
    stage = JudgeStage(JudgeConfig(template=str(t)), EngineSpec.of(engine), SamplingConfig(temperature=0.7))
    stage.open()
    (r,), _ = stage.process([{"id": "a", "problem_id": "p", "prompt": "Book a flight.", "error": None,
                              "steps": ["I need your user id.", "Booked."]}])
    assert r["judge_status"] == "ok" and r["judge_score"] == [9.0, 2.0] and r["judge_label"] == [True, False]


def test_vote_row_scores_mean_and_label_above_five():
    r = vote_row("per-step-score", 3, [[8.0, 2.0, 6.0], [9.0, 5.0, 4.0]])
    assert r["judge_score"] == [8.5, 3.5, 5.0]
    assert r["judge_label"] == [True, False, False]  # turn 2: one vote above 5, one not: a tie is incorrect
    assert r["judge_first_error"] == 1 and r["judge_correct_votes"] == [2, 0, 1]


def test_agent_template_shows_turns_with_their_observations(tau_shard):
    row = pq.read_table(tau_shard / "tau.parquet").slice(0, 1).to_pylist()[0]
    tmpl = load_template("judge-agent-step")
    assert tmpl.mode == "per-step-score" and tmpl.step_tag == "turn"

    class Plain:
        def render_chat(self, messages):
            return "\n".join(m["content"] for m in messages)

    text = render_judge(Plain(), tmpl, row["prompt"], row["steps"], row["step_observations"])
    n = len(row["steps"])
    assert f"<turn_{n - 1}>" in text and "<paragraph_0>" not in text
    assert f"<observation_0>\n{row['step_observations'][0]}\n</observation_0>" in text
    assert text.index("<turn_0>") < text.index("<observation_0>") < text.index("<turn_1>")
    assert row["prompt"] in text and f'exactly {n} lines' in text


def test_judge_agent_step_scripted(tau_shard):
    out = tau_shard / "judged.parquet"
    small = tau_shard / "tau3.parquet"
    run_cli("ingest", "messages", TAU, small, "--limit", 3)
    run_cli("judge", small, out, "--engine", "scripted", "--model", "scripted:judge", "--template",
            "judge-agent-step", "--votes", 3, "--no-progress")
    rows = pq.read_table(out).to_pylist()
    for r in rows:
        n = len(r["steps"])
        # votes: sample 0 scores all turns 8; sample 1 errs at turn 0 (all 2); sample 2 at turn 1
        assert r["judge_score"] == pytest.approx([6.0] + [4.0] * (n - 1))
        assert r["judge_label"] == [True] + [False] * (n - 1) and r["judge_first_error"] == 1
        assert r["judge_status"] == "ok" and len(r["judge_replies"]) == 3
    from stepkit.shards import read_manifest

    assert read_manifest(out)["config"]["mode"] == "per-step-score"
    p = run_cli("judge", small, tau_shard / "x.parquet", "--engine", "scripted", "--model", "scripted:judge",
                "--template", "judge-agent-step", "--mode", "per-step", check=False)
    assert p.returncode == 2 and "is for mode 'per-step-score'" in p.stderr


# ---- clues from gold actions ------------------------------------------------------------------------

def test_action_clues_of_a_real_task(tau_shard):
    row = pq.read_table(tau_shard / "tau.parquet").slice(0, 1).to_pylist()[0]  # task 0: book_reservation
    clues = action_clues(row["reference_actions"])
    values = [c.value for c in clues if c.kind == "value"]
    # in the order of the canonical JSON (sorted keys): flights, payment_methods, user_id
    assert values == ["HAT136", "HAT039", "certificate_7504069", "credit_card_4421486", "mia_li_3668"]
    call = clues[-1]
    assert call.kind == "call" and json.loads(call.value)["name"] == "book_reservation"
    assert call.depends_on == tuple(range(len(values)))
    assert [c.kind for c in clues] == ["value"] * 5 + ["call"]


def test_read_only_tools_and_covers():
    assert all(read_only(n) for n in ("get_user_details", "search_direct_flight", "calculate", "think",
                                      "transfer_to_human_agents", "list_all_airports"))
    assert not any(read_only(n) for n in ("book_reservation", "cancel_reservation", "send_certificate",
                                          "update_reservation_flights"))
    gold = {"name": "update_reservation_flights",
            "arguments": {"reservation_id": "FQ8APE", "flights": [{"flight_number": "HAT056"}], "summary": "a b"}}
    made = {"name": "update_reservation_flights",
            "arguments": {"reservation_id": "FQ8APE", "flights": [{"flight_number": "HAT056", "origin": "EWR"}],
                          "summary": "other words"}}
    assert covers(made, gold)  # extra arguments and free text are not compared
    assert not covers({**made, "arguments": {**made["arguments"], "reservation_id": "XXXXXX"}}, gold)
    assert not covers({**made, "name": "cancel_reservation"}, gold)
    assert not covers({"name": "x", "arguments": {"a": 1}}, {"name": "x", "arguments": {"a": True}})


def _turn(calls, results=None, content=None):
    msg = {"role": "assistant", "content": content,
           "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                          for i, (n, a) in enumerate(calls)]}
    tools = [{"role": "tool", "tool_call_id": f"c{i}", "name": calls[i][0], "content": r}
             for i, r in enumerate(results or [])]
    return json.dumps([msg, *tools])


def test_match_turns_exactly():
    book = canonical_action("cancel_reservation", {"reservation_id": "ZFA04Y"})
    kinds, values = ["value", "call"], ["ZFA04Y", book]
    steps = [_turn([("get_user_details", {"user_id": "u_1"})], ['{"reservations": ["ZFA04Y"]}']),
             _turn([("cancel_reservation", {"reservation_id": "AAAA11"})], ["Error: not found"]),  # failed: no harm
             _turn([("send_certificate", {"user_id": "u_1", "amount": 100})], ["done"]),  # not gold: contradicts
             _turn([("cancel_reservation", {"reservation_id": "ZFA04Y"})], ["ok"])]
    obs = ['Tool (get_user_details): {"reservations": ["ZFA04Y"]}', "Tool (cancel_reservation): Error: not found",
           "Tool (send_certificate): done", "Tool (cancel_reservation): ok"]
    m = match_turns(kinds, values, "User: hi, I am u_1", steps, obs)
    assert m.first == [0, 3] and m.hits == [[0], [], [], [1]]
    assert m.contradicted == [0, 0, 1, 0] and m.reached
    # without the last turn the gold call is never made: the last turn contradicts too
    m = match_turns(kinds, values, "User: hi", steps[:3], obs[:3])
    assert m.first == [0, -1] and m.contradicted == [0, 0, 2] and not m.reached
    # a value the prompt already gives is not checked
    m = match_turns(kinds, values, "User: cancel ZFA04Y please", steps, obs)
    assert m.first == [None, 3]
    with pytest.raises(ValueError, match="unknown clue kind"):
        match_turns(["number"], ["1"], "", steps, obs)


def test_clue_score_on_all_200_conversations(scored):
    """The checks of issue 13: coverage separates successes from failures (ROC AUC against the reward),
    and no successful conversation gets a first error."""
    assert len(scored) == 200
    pairs = [(r["clue_coverage"], r["outcome_correct"]) for r in scored if r["clue_coverage"] is not None]
    pos, neg = [c for c, ok in pairs if ok], [c for c, ok in pairs if not ok]
    auc = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
    assert len(pairs) == 120 and len(pos) == 27  # 80 conversations' tasks change no state: no clues
    assert sum(pos) / len(pos) == 1.0 and 0.55 < sum(neg) / len(neg) < 0.65
    assert auc > 0.9, auc  # measured 0.941
    assert not any(r["clue_first_error"] >= 0 for r in scored if r["outcome_correct"])
    assert sum(r["clue_first_error"] >= 0 for r in scored if not r["outcome_correct"]) == 112
    for r in scored:
        assert len(r["clue_score"]) == len(r["clue_label"]) == len(r["clue_hits"]) == len(r["steps"])
        assert r["clue_first_error"] == next((s for s, ok in enumerate(r["clue_label"]) if not ok), -1)


def test_eval_agreement_of_clue_and_judge_first_errors(tau_shard, scored):
    small = tau_shard / "tau3.parquet"
    run_cli("ingest", "messages", TAU, small, "--limit", 3)
    judged = tau_shard / "judged3.parquet"
    run_cli("judge", small, judged, "--engine", "scripted", "--model", "scripted:judge", "--template",
            "judge-agent-step", "--no-progress")
    both = tau_shard / "both.parquet"
    run_cli("clue", "score", judged, both, "--clues", tau_shard / "clues.parquet", "--no-progress")
    p = run_cli("eval", "agreement", both, "--a", "clue_first_error", "--b", "judge_first_error", "--json",
                tau_shard / "agree.json")
    doc = json.loads((tau_shard / "agree.json").read_text())
    rows = pq.read_table(both).to_pylist()
    same = sum(r["clue_first_error"] == r["judge_first_error"] for r in rows)
    assert doc["rows"] == 3 and "agreement" in p.stdout.lower()
    assert doc["both"] == 3 and doc["exact"] == pytest.approx(same / 3)
    assert [r["judge_first_error"] for r in rows] == [-1, -1, -1]  # the scripted sample 0 finds no error


def test_from_actions_bad_input(tmp_path):
    with pytest.raises(ConfigError, match="exclude each other"):
        ClueRecoverStage(ClueRecoverConfig(from_actions=True, from_reference=True), None, None)
    with pytest.raises(ConfigError, match="not a regular expression"):
        ClueRecoverStage(ClueRecoverConfig(from_actions=True, read_only_tools="(get_"), None, None)
    gsm = tmp_path / "g.parquet"
    run_cli("ingest", "gsm8k", DATA / "gsm8k" / "test.jsonl", gsm, "--limit", 2)
    p = run_cli("clue", "recover", gsm, tmp_path / "c.parquet", "--from-actions", check=False)
    assert p.returncode == 1 and "column 'reference_actions': missing column" in p.stderr
    p = run_cli("clue", "recover", gsm, tmp_path / "c.parquet", "--from-actions", "--model", "m", check=False)
    assert p.returncode == 2 and "--from-actions uses no model" in p.stderr
    assert READ_ONLY_TOOLS.startswith("^")


def test_clue_kinds_must_fit_the_rows(tmp_path, tau):
    """Clues joined by problem_id onto rows of the other kind: agent clues on math solutions, and math
    clues on conversations, which were scored by the numbers in tool results (3 real τ-bench conversations
    under GSM8K's problem ids got ok rows with hits and first errors from GSM8K's clue values)."""
    convs = [{**c, "task_id": f"gsm8k-test-{k}"} for k, c in enumerate(tau[:3])]
    (tmp_path / "c.json").write_text(json.dumps(convs))
    run_cli("ingest", "messages", tmp_path / "c.json", tmp_path / "conv.parquet")
    run_cli("ingest", "gsm8k", DATA / "gsm8k" / "test.jsonl", tmp_path / "gsm.parquet", "--limit", 3)
    run_cli("clue", "recover", tmp_path / "gsm.parquet", tmp_path / "math_clues.parquet", "--from-reference")
    run_cli("clue", "score", tmp_path / "conv.parquet", tmp_path / "o.parquet", "--clues",
            tmp_path / "math_clues.parquet", "--max-error-rate", 1, "--no-progress")
    rows = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert [r["clue_label"] for r in rows] == [None] * 3 and [r["clue_status"] for r in rows] == [None] * 3
    assert all("math clues (no clue_kinds) cannot score a conversation" in r["error"] for r in rows)
    p = run_cli("clue", "score", tmp_path / "conv.parquet", tmp_path / "o2.parquet", "--clues",
                tmp_path / "math_clues.parquet", "--no-progress", check=False)
    assert p.returncode == 1 and "3 of 3 rows failed (math clues" in p.stderr


# ---- likelihood-label on turns (IGPO's information gain of the final gold action) ------------------------

def test_gold_action_answer_and_agent_scaffold_text():
    from stepkit.prompts import load_answer_scaffold
    from stepkit.stages.likelihood import gold_action_answer

    get = canonical_action("get_reservation_details", {"reservation_id": "ZFA04Y"})
    cancel = canonical_action("cancel_reservation", {"reservation_id": "ZFA04Y"})
    assert gold_action_answer([cancel, get]) == '{"name": "cancel_reservation", "arguments": {"reservation_id": "ZFA04Y"}}'
    assert gold_action_answer([get]) == '{"name": "get_reservation_details", "arguments": {"reservation_id": "ZFA04Y"}}'
    assert gold_action_answer([]) is None and gold_action_answer(None) is None
    sc = load_answer_scaffold("likelihood-agent")
    text, (a, b) = sc.answer_text("CHAT", ["t0", "t1", "t2"], "\n\n", 2, "ANS", ["o0", "", "o2"])
    assert text == "CHATt0\n\no0\n\nt1\n\n<tool_call>\nANS\n</tool_call>"
    assert text[a:b] == "ANS\n</tool_call>"


def test_likelihood_gold_action_of_a_task_with_no_gold_call_is_no_answer(tau, tmp_path):
    """τ-bench task 12 (trial 3) has no gold call: nothing to score, said as ``no_answer``, never a value."""
    src = tmp_path / "12-3.json"
    src.write_text(json.dumps([c for c in tau if (c["task_id"], c["trial"]) == (12, 3)]))
    run_cli("ingest", "messages", src, tmp_path / "one.parquet")
    run_cli("likelihood-label", tmp_path / "one.parquet", tmp_path / "lh.parquet", "--engine", "scripted",
            "--model", "scripted", "--target", "gold-action", "--no-progress")
    (r,) = pq.read_table(tmp_path / "lh.parquet").to_pylist()
    assert not r["reference_actions"] and r["error"] is None
    assert r["lh_status"] == "no_answer" and r["lh_value"] is None and r["lh_first_error"] is None


def test_likelihood_gold_action_scripted(tau_shard):
    small = tau_shard / "tau3.parquet"
    run_cli("ingest", "messages", TAU, small, "--limit", 3)
    out = tau_shard / "lh.parquet"
    run_cli("likelihood-label", small, out, "--engine", "scripted", "--model", "scripted", "--target", "gold-action",
            "--no-progress")
    rows = pq.read_table(out).to_pylist()
    from stepkit.shards import read_manifest

    m = read_manifest(out)
    assert m["config"]["target"] == "gold-action" and m["config"]["answer_scaffold"]["version"] == "likelihood-agent-v1"
    for r in rows:
        assert r["lh_status"] == "ok" and len(r["lh_gain"]) == len(r["steps"])
        assert sum(r["lh_gain"]) == pytest.approx(r["lh_value"][-1] - r["lh_value_start"], abs=1e-3)
    # The scripted scorer gives a token seen earlier in the text -0.5, a new one -3.0: the value of the gold
    # call rises exactly at the turns whose text or observation first shows its tokens (the user id, ...).
    r0 = rows[0]
    assert max(r0["lh_gain"]) > 0 and min(r0["lh_gain"]) >= 0
    p = run_cli("likelihood-label", small, tau_shard / "x.parquet", "--engine", "scripted", "--model", "scripted",
                "--target", "gold-action", "--method", "implicit-prm", "--reference-model", "scripted", check=False)
    assert p.returncode != 0 and "--target gold-action is for --method answer-gain" in p.stderr
    gsm = tau_shard / "g.parquet"
    run_cli("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", gsm, "--limit", 1)
    p = run_cli("likelihood-label", gsm, tau_shard / "y.parquet", "--engine", "scripted", "--model", "scripted",
                "--target", "gold-action", check=False)
    assert p.returncode == 1 and "reference_actions" in p.stderr


# ---- per-turn columns that disagree with the steps ------------------------------------------------------

def _edit(rows, how):
    if how == "observations short":
        rows[1]["step_observations"] = rows[1]["step_observations"][:-2]
    elif how == "observations null":
        rows[1]["step_observations"] = None
    elif how == "messages long":
        rows[1]["step_messages"] = rows[1]["step_messages"] + rows[1]["step_messages"][-1:]
    return {"observations short": "'step_observations': ", "observations null": "'step_observations': null on a "
            "conversation row", "messages long": "'step_messages': "}[how]


STAGES = {"judge": ("judge", "--engine", "scripted", "--model", "scripted:judge", "--template", "judge-agent-step"),
          "likelihood": ("likelihood-label", "--engine", "scripted", "--model", "scripted", "--target", "gold-action"),
          "clue score": ("clue", "score", "--clues", "{clues}")}


@pytest.mark.parametrize("how", ["observations short", "observations null", "messages long"])
def test_turn_columns_must_have_one_entry_per_step(tmp_path, tau_shard, how):
    """A conversation row whose step_observations / step_messages do not match its steps: judge raised an
    IndexError (observation k of a turn that has none), likelihood-label --target gold-action zipped the
    prefixes short (silently dropping turns); now every stage refuses the row in one line."""
    import pyarrow as pa

    t = pq.read_table(tau_shard / "tau.parquet").slice(0, 3)
    rows = t.to_pylist()
    want = _edit(rows, how)
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), bad)
    clues = tmp_path / "clues.parquet"
    run_cli("clue", "recover", tau_shard / "tau.parquet", clues, "--from-actions", "--no-progress")
    for name, cmd in STAGES.items():
        cmd = [c.format(clues=clues) for c in cmd]
        k = 2 if cmd[0] == "clue" else 1
        p = run_cli(*cmd[:k], bad, tmp_path / "o.parquet", *cmd[k:], "--no-progress", check=False)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1 and len(lines) == 1, (name, p.stderr[-2000:])
        assert lines[0].startswith(f"error: {bad}: row 1, column {want}"), (name, lines[0])
        assert not (tmp_path / "o.parquet").exists()
