"""likelihood-label: the scoring call (every likelihood case), the first-error rule, calibration, both methods
with the scripted engine checked exactly, the openai scoring path against a fake server, and the CLI."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepkit.engines.base import EngineSpec, SamplingConfig, Scored, ScoreRequest, actual_token_logprobs, assign_tokens
from stepkit.engines.scripted import ScriptedEngine, scripted_tokens
from stepkit.errors import ConfigError, StepkitError
from stepkit.prompts import load_answer_scaffold
from stepkit.schema import REFERENCE_FIELDS, TRAJECTORY_SCHEMA, extend_schema
from stepkit.shards import read_manifest
from stepkit.stages.likelihood import (
    DEFAULT_THRESHOLD,
    LikelihoodConfig,
    LikelihoodStage,
    calibrate_threshold,
    first_error,
)
from tests.conftest import DATA, load_cases
from tests.conftest import run_cli as run

LIKELIHOOD_CASES = sorted(c["id"] for c in load_cases().values() if c["stage"] == "likelihood")
SAMPLING = SamplingConfig(temperature=0, max_tokens=1)


def test_every_likelihood_case_has_a_test():
    assert LIKELIHOOD_CASES == ["step-token-boundary-merge", "vllm-prompt-logprobs-pick-actual-token"]


# --- case: read the actual token's entry, never the top one ------------------------------------------

def test_case_prompt_logprobs_pick_actual_token(cases):
    c = cases["vllm-prompt-logprobs-pick-actual-token"]
    inp, want = c["input"], c["expected"]
    lps = actual_token_logprobs(inp["prompt_logprobs"], inp["prompt_token_ids"])  # JSON: str keys
    a, b = inp["step_token_span"]
    assert lps[0] is None
    assert math.isclose(sum(lps[a:b]), want["step_logprob_sum"]) and not math.isclose(
        sum(lps[a:b]), want["wrong_value_if_top_entry_taken"])


def test_prompt_logprobs_int_keys_objects_and_k_plus_one_entries():
    class Logprob:  # vLLM's offline shape: int keys, objects with .logprob
        def __init__(self, logprob, rank):
            self.logprob, self.rank = logprob, rank

    pl = [None, {7: Logprob(-0.1, 1)}, {5: Logprob(-0.3, 1), 9: Logprob(-4.0, 12)}]
    assert actual_token_logprobs(pl, [3, 7, 9]) == [None, -0.1, -4.0]


@pytest.mark.parametrize("pl,ids,why", [
    ([None, {"5": {"logprob": -0.3}}], [1, 6], "no entry for the actual token 6"),  # missing: never 0.0
    ([None, None], [1, 2], "no prompt log-prob at position 1"),
    ([None], [1, 2], "for 1 positions, but 2 tokens"),
])
def test_prompt_logprobs_missing_entries_raise(pl, ids, why):
    with pytest.raises(StepkitError, match=why):
        actual_token_logprobs(pl, ids)


# --- case: a token that merges across the prefix/target join belongs to the target -------------------

def greedy_stub(vocab):
    """The case's stub tokenizer: greedy longest match over ``vocab``; returns character offsets."""
    def tokenize(text):
        out, i = [], 0
        while i < len(text):
            piece = max((v for v in vocab if text.startswith(v, i)), key=len)
            out.append((i, i + len(piece)))
            i += len(piece)
        return out
    return tokenize


def test_case_boundary_merge(cases):
    c = cases["step-token-boundary-merge"]
    inp, want = c["input"], c["expected"]
    tokenize = greedy_stub(["ow", "H", "o", "w", " ", "a", "r", "e", "y", "u"])
    text = inp["prefix"] + inp["step"]
    offsets = tokenize(text)
    assert [text[a:b] for a, b in tokenize(inp["prefix"])] == inp["encode_prefix"]
    assert [text[a:b] for a, b in offsets] == inp["encode_prefix_plus_step"]
    (positions,) = assign_tokens(offsets, [(len(inp["prefix"]), len(text))])
    assert positions[0] == want["boundary"] != want["naive_boundary"]
    assert [text[slice(*offsets[j])] for j in positions] == want["step_token_span"]
    # end to end through an engine's score(): the merged token "ow" is scored as the step's
    engine = ScriptedEngine(tokenizer=tokenize, scorer=lambda ctx, tok: -1.0 if tok == "ow" else -0.25)
    (s,) = engine.score([ScoreRequest(text, ((len(inp["prefix"]), len(text)),))])
    assert s.logprobs[0][0] == -1.0 and len(s.logprobs[0]) == len(want["step_token_span"])
    assert math.isclose(s.sums[0], -1.0 - 0.25 * 8)


def test_boundary_rule_with_the_bundled_tokenizer():
    """The realistic trigger: SmolLM2's BPE merges trailing spaces and a newline into one token ("  \\n")."""
    from transformers import AutoTokenizer

    from stepkit.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    prefix, target = "Step two ", " \nThe answer is 18."
    text = prefix + target
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    naive = len(tok(prefix, add_special_tokens=False).input_ids)
    (positions,) = assign_tokens([tuple(o) for o in enc["offset_mapping"]], [(len(prefix), len(text))])
    assert positions[0] < naive  # the merged token spans the join: the target's, not the prefix's
    assert tok.decode([enc.input_ids[j] for j in positions]).endswith(target)
    # when nothing merges, the boundary equals len(encode(prefix))
    prefix2 = "Step two.\n"
    enc2 = tok(prefix2 + "The answer is 18.", add_special_tokens=False, return_offsets_mapping=True)
    (p2,) = assign_tokens([tuple(o) for o in enc2["offset_mapping"]], [(len(prefix2), len(prefix2) + 17)])
    assert p2[0] == len(tok(prefix2, add_special_tokens=False).input_ids)


def test_assign_tokens_between_adjacent_spans_and_coverage():
    assert assign_tokens([(0, 2), (2, 5)], [(0, 2), (2, 5)]) == [[0], [1]]  # "ab" | " cd"
    assert assign_tokens([(0, 1), (1, 3), (3, 5)], [(0, 2), (2, 5)]) == [[0], [1, 2]]  # "b " spans the join
    with pytest.raises(StepkitError, match="no token belongs"):  # span 0 loses its only token to span 1
        assign_tokens([(0, 3), (3, 5)], [(0, 2), (2, 5)])
    with pytest.raises(StepkitError, match="do not cover"):  # offsets with a hole
        assign_tokens([(0, 1), (3, 5)], [(0, 5)])
    assert assign_tokens([(0, 2), (2, 2), (2, 5)], [(0, 5)]) == [[0, 1, 2]]  # a zero-width token inside


@pytest.mark.parametrize("spans", [((3, 3),), ((2, 5), (1, 4)), ((0, 99),), ((-1, 2),)])
def test_score_request_spans_checked(spans):
    with pytest.raises(ConfigError, match="score span"):
        ScoreRequest("abcdef", spans)


def test_score_fails_a_target_at_position_zero_and_a_long_text():
    engine = ScriptedEngine(max_len=3)
    ok, zero, long = engine.score([ScoreRequest("a b", ((1, 3),)), ScoreRequest("a b", ((0, 1),)),
                                   ScoreRequest("a b c d", ((5, 7),))])
    assert ok.error is None and ok.logprobs == ((-3.0,),) and ok.token_ids and engine.stats.scored_tokens == 2
    assert "has no log-probability" in zero.error and zero.logprobs == ()
    assert long.error == "prompt too long: 4 tokens, max_model_len 3"


# --- the first-error rule and calibration ------------------------------------------------------------

@pytest.mark.parametrize("signal,fallback,outcome,threshold,want", [
    ([0.5, -2.0, -3.0], None, True, -1.0, 1),  # the first step below the threshold, whatever the outcome
    ([0.5, -0.5, 0.2], None, False, -1.0, 1),  # none below, incorrect: the lowest gain
    ([0.5, -0.5, -0.5], None, False, -1.0, 1),  # ... ties go to the earlier step
    ([0.5, -0.5, 0.2], None, True, -1.0, -1),  # none below, correct: no error
    ([0.5, -0.5, 0.2], None, None, -1.0, -1),  # ungraded: no fallback
    ([1.0, 2.0], [0.3, -0.1], False, 0.0, 1),  # implicit-prm: q compared, the lowest reward as fallback
    ([-1.0], None, True, -1.0, -1),  # "below" is strict
])
def test_first_error_rule(signal, fallback, outcome, threshold, want):
    assert first_error(signal, fallback if fallback is not None else signal, outcome, threshold) == want


def test_calibrate_picks_the_best_threshold():
    rows = [  # gold first errors 1, -1, 0: any threshold in (-3, -1] is right on all three
        {"lh_status": "ok", "lh_gain": [0.5, -2.0, 0.1], "outcome_correct": False, "reference_first_error": 1},
        {"lh_status": "ok", "lh_gain": [0.2, -1.0, 0.3], "outcome_correct": True, "reference_first_error": -1},
        {"lh_status": "ok", "lh_gain": [-3.0, 0.4], "outcome_correct": False, "reference_first_error": 0},
        {"lh_status": "no_answer", "lh_gain": None, "outcome_correct": True, "reference_first_error": -1},
    ]
    got = calibrate_threshold(rows, "answer-gain", "reference_first_error")
    assert got["f1"] == 1.0 and got["rows"] == 3 and -3.0 < got["threshold"] <= -1.0
    with pytest.raises(ConfigError, match="no row"):
        calibrate_threshold(rows[3:], "answer-gain", "reference_first_error")
    with pytest.raises(ConfigError, match="only one kind"):  # no F1 without both kinds of rows
        calibrate_threshold([rows[0], rows[2]], "answer-gain", "reference_first_error")


# --- answer-gain with the scripted engine, exactly -----------------------------------------------------

def oops_scorer(ctx: str, tok: str) -> float:
    """-1 nats per token, minus one for every "oops" written before it."""
    return -1.0 - ctx.count("oops")


def trow(rid, steps, answer="18", correct=False, error=None, sep="\n"):
    return {"id": rid, "problem_id": rid, "source": "t", "prompt": "Tom has 6 apples and buys 12 more. How many?",
            "reference_answer": answer, "steps": list(steps), "step_separator": sep, "final_answer": None,
            "outcome_correct": correct, "generator": "t", "error": error}


def gain_stage(engine=None, **cfg):
    engine = engine or ScriptedEngine(scorer=oops_scorer)
    stage = LikelihoodStage(LikelihoodConfig(**{"threshold": -1.0, **cfg}), EngineSpec.of(engine), SAMPLING)
    stage.open()
    return stage, engine


def test_answer_gain_values_gains_and_first_error_exactly():
    stage, engine = gain_stage()
    wrong = trow("w", ["6 + 12 = 18.", "oops, 18 - 1 = 17.", "The answer is 17."])
    right = trow("r", ["6 + 12 = 18.", "The answer is 18."], correct=True)
    flat = trow("f", ["6 + 12 = 19.", "The answer is 19."])
    (w, r, f), counters = stage.process([wrong, right, flat])
    # the answer " 18." is two scripted tokens (" 18", "."), each -1 - (oops before it)
    assert w["lh_value_start"] == -2.0 and w["lh_value"] == [-2.0, -4.0, -4.0] and w["lh_gain"] == [0.0, -2.0, 0.0]
    assert w["lh_first_error"] == 1 and w["lh_label"] == [True, False, False] and w["lh_status"] == "ok"
    assert w["lh_answer_tokens"] == 2
    assert r["lh_gain"] == [0.0, 0.0] and r["lh_first_error"] == -1 and r["lh_label"] == [True, True]
    assert f["lh_first_error"] == 0  # incorrect, no gain below -1: the lowest gain, earliest of ties
    assert w["lh_reward"] is None and w["lh_q"] is None
    assert counters["texts"] == 4 + 3 + 3 == len(engine.scored)
    assert counters["scored_tokens"] == sum(x["lh_scored_tokens"] for x in (w, r, f)) == engine.stats.scored_tokens
    # the scored text of prefix steps[:2]: chat + the steps joined and followed by the separator + scaffold
    chat = engine.render_chat([{"role": "user", "content": load_answer_scaffold().user.replace(
        "{problem}", wrong["prompt"])}])
    assert chat + "6 + 12 = 18.\noops, 18 - 1 = 17.\n" + "The answer is 18." in engine.scored
    assert chat + "The answer is 18." in engine.scored
    # each row's text after all its steps is scored first (the others then read its prefix from a cache)
    assert all(
        t.endswith(x["steps"][-1] + "\n" + "The answer is 18.") for t, x in zip(engine.scored[:3], (w, r, f)))


def test_the_closing_token_is_scored_so_1_is_not_12():
    """Gold "1" must not score well where the solution heads to "12": the closing "." is part of the target."""
    def heads_to_12(ctx, tok):  # after "... is 1", "2" is likely and "." unlikely
        return -5.0 if tok == "." and ctx.endswith(" 1") else -0.1
    stage, engine = gain_stage(ScriptedEngine(scorer=heads_to_12, tokenizer=lambda t: [
        m.span() for m in __import__("re").finditer(r" ?\d|[^\d\s ]+| +|\s", t)]))
    (r,), _ = stage.process([trow("a", ["So 6 + 6 = 12."], answer="1")])
    assert r["lh_answer_tokens"] == 2 and r["lh_value"] == [pytest.approx(-5.1)]


def test_rows_without_answer_upstream_errors_and_engine_failures():
    stage, _ = gain_stage(ScriptedEngine(max_len=60))
    long = trow("long", ["word " * 80 + "= 18.", "The answer is 18."])
    rows, counters = stage.process([trow("na", ["x = 1."], answer=None), trow("e", ["x = 1."], error="rollout: boom"),
                                    long])
    na, up, lg = rows
    assert na["lh_status"] == "no_answer" and na["lh_first_error"] is None and counters["no_answer"] == 1
    assert up["error"] == "rollout: boom" and up["lh_status"] is None and up["lh_value"] is None
    assert lg["error"].startswith("likelihood-label: engine: prompt too long") and lg["lh_value"] is None
    assert type(lg["error"]).__name__ == "RowError"


def test_lh_step_columns_are_per_step_columns():
    from stepkit.stages.likelihood import COLUMNS

    assert {"lh_value", "lh_gain", "lh_reward", "lh_q", "lh_label"} == {c.name for c in COLUMNS if c.per_step}


# --- implicit-prm with two scripted models, exactly ------------------------------------------------------

class Counted:
    """Engine factories that record how many of the two models are loaded at once."""

    def __init__(self):
        self.live, self.max_live, self.loads = 0, 0, []

    def spec(self, name, scorer, tokenizer=scripted_tokens):
        counter = self

        class Tracked(ScriptedEngine):
            def close(self):
                counter.live -= 1

        def build():
            counter.live += 1
            counter.max_live = max(counter.max_live, counter.live)
            counter.loads.append(name)
            return Tracked(scorer=scorer, tokenizer=tokenizer, model=name)

        return EngineSpec("scripted", name, factory=build)


def test_implicit_prm_rewards_q_and_the_two_models_never_loaded_at_once():
    c = Counted()
    policy = c.spec("pi", lambda ctx, tok: -4.0 if "oops" in tok else -1.0)
    ref = c.spec("ref", lambda ctx, tok: -2.0)
    stage = LikelihoodStage(LikelihoodConfig(method="implicit-prm", reference_model="ref", beta=0.5), policy,
                            SAMPLING, reference=ref)
    stage.open()
    row = trow("w", ["6 + 12 = 18", "oops oops", "so 17"], correct=False)
    (r,), counters = stage.process([row])
    # scripted tokens: "6"," +"," 12"," ="," 18" (5); "oops"," oops" (2); "so"," 17" (2); log-ratio per token:
    # +1 (-1 vs -2), or -2 for an "oops" token (-4 vs -2); times beta 0.5
    assert r["lh_reward"] == [2.5, -2.0, 1.0] and r["lh_q"] == [2.5, 0.5, 1.5]
    assert r["lh_first_error"] == 1  # q never below 0.0; incorrect: the lowest reward
    assert r["lh_value"] is None and r["lh_status"] == "ok" and counters["texts"] == 2
    assert c.max_live == 1 and c.loads == ["pi", "ref"]
    stage.process([trow("x", ["1 + 1 = 2"], answer="2", correct=True)])  # the loaded model scores first
    assert c.loads == ["pi", "ref", "pi"] and c.max_live == 1
    stage.close()
    assert c.live == 0


def test_implicit_prm_refuses_two_tokenizers():
    c = Counted()
    stage = LikelihoodStage(LikelihoodConfig(method="implicit-prm", reference_model="ref"),
                            c.spec("pi", lambda ctx, tok: -1.0), SAMPLING,
                            reference=c.spec("ref", lambda ctx, tok: -1.0,
                                             tokenizer=lambda t: [(i, i + 1) for i in range(len(t))]))
    stage.open()
    with pytest.raises(ConfigError, match="tokenise row 'w' differently"):
        stage.process([trow("w", ["6 + 12 = 18"])])


@pytest.mark.parametrize("kw,why", [
    ({"method": "implicit-prm"}, "needs --reference-model"),
    ({"reference_model": "x"}, "is for --method implicit-prm"),
    ({"threshold": -1.0, "calibrate": "x.parquet"}, "not both"),
    ({"method": "implicit-prm", "reference_model": "x", "beta": 0.0}, "beta"),
])
def test_config_errors(kw, why):
    with pytest.raises(ConfigError, match=why):
        LikelihoodConfig(**kw)


# --- the openai engine's scoring path, against a fake server ---------------------------------------------

def test_openai_scoring_sends_token_ids_and_reads_echo_logprobs():
    from stepkit.engines.base import make_engine
    from tests.servers import FakeServer

    with FakeServer() as fake, make_engine("openai", "smollm2-135m", base_url=fake.base_url) as eng:
        text = "Q: 6 + 12?\nThe answer is 18."
        (s,) = eng.score([ScoreRequest(text, ((text.index(" 18"), len(text)),))])
        body = [b for b in fake.bodies if b.get("echo")][0]
        assert body["max_tokens"] == 0 and body["logprobs"] == 0 and body["prompt"] == list(s.token_ids)
        assert s.error is None and all(x == -0.25 for x in s.logprobs[0]) and len(s.logprobs[0]) >= 2


@pytest.mark.parametrize("reply,why", [
    (lambda b: {"choices": []}, "0 choices"),
    (lambda b: {"choices": [{"index": 0, "text": ""}]}, "no logprobs"),
    (lambda b: {"choices": [{"index": 0, "logprobs": {"token_logprobs": [None, -1.0]}}]}, "prompt log-probs for"),
    (lambda b: {"choices": [{"index": 0, "logprobs": {"token_logprobs": [None] * len(b["prompt"])}}]},
     "no log-prob at prompt position 1"),
    (lambda b: {"choices": [{"index": 0, "prompt_token_ids": [1] * len(b["prompt"]),
                             "logprobs": {"token_logprobs": [None] + [-1.0] * (len(b["prompt"]) - 1)}}]},
     "other prompt token ids"),
    (lambda b: {"choices": [{"index": 0, "logprobs": {"token_logprobs": [None]}},
                            {"index": 1, "logprobs": {"token_logprobs": [None]}}]}, "2 choices"),
])
def test_openai_scoring_malformed_replies_are_errors_never_results(reply, why):
    from stepkit.engines.base import make_engine
    from stepkit.engines.openai_engine import EngineUnavailable
    from tests.servers import FakeServer

    with FakeServer(score_reply=reply) as fake, make_engine("openai", "smollm2-135m", base_url=fake.base_url) as eng:
        with pytest.raises(EngineUnavailable, match=why):
            text = "Q: 6 + 12?\nThe answer is 18."
            eng.score([ScoreRequest(text, ((text.index(" 18"), len(text)),))])


def test_openai_scoring_rejected_text_fails_alone():
    from stepkit.engines.base import make_engine
    from tests.servers import FakeServer

    with FakeServer(reject=lambda p: isinstance(p, list) and len(p) > 20) as fake, \
            make_engine("openai", "smollm2-135m", base_url=fake.base_url) as eng:
        a, b = "Q: 1?\nA: 2.", "Q: " + "1 " * 40 + "?\nA: 2."
        short, long = eng.score([ScoreRequest(a, ((len(a) - 3, len(a)),)), ScoreRequest(b, ((len(b) - 3, len(b)),))])
        assert short.error is None and long.error.startswith("HTTP 400")
        assert isinstance(long, Scored) and long.logprobs == ()


# --- the CLI: labelling, calibration, stats, show, eval ---------------------------------------------------

@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    out = tmp_path_factory.mktemp("pb") / "pb.parquet"
    run("ingest", "processbench", DATA / "processbench" / "gsm8k.json", out, "--sample", 16, "--seed", 1)
    return out


def label(inp, out, *extra, check=True):
    return run("likelihood-label", inp, out, "--engine", "scripted", "--model", "scripted:echo", "--no-progress",
               *extra, check=check)


def test_cli_label_calibrate_stats_show_eval(pb, tmp_path):
    tune, held = tmp_path / "tune.parquet", tmp_path / "held.parquet"
    label(pb, tune, "--chunk-size", 5)
    rows = pq.read_table(tune).to_pylist()
    assert len(rows) == 16 and all(r["lh_status"] == "ok" and len(r["lh_gain"]) == len(r["steps"]) for r in rows)
    m = read_manifest(tune)
    assert m["config"]["threshold"] == DEFAULT_THRESHOLD["answer-gain"] and m["config"]["answer_scaffold"]["version"] == "likelihood-answer-v1"
    assert m["counts"]["texts"] == sum(len(r["steps"]) + 1 for r in rows)
    assert m["counts"]["scored_tokens"] == sum(r["lh_scored_tokens"] for r in rows) > 0
    p = label(pb, held, "--calibrate", tune)
    m2 = read_manifest(held)
    cal = m2["provenance"]["calibration"]
    want = calibrate_threshold(rows, "answer-gain", "reference_first_error")
    assert m2["config"]["threshold"] == cal["threshold"] == want["threshold"] and cal["rows"] == 16
    assert m2["config"]["calibration"]["sha256"] == cal["sha256"]
    stats = run("stats", held).stdout
    assert "prompt tokens scored" in stats and "prefix cache" in stats and "calibrated on" in stats
    assert "bundled SmolLM2-135M" not in stats  # (a scripted engine's labels: no note about the bundled model)
    show = run("show", held, "--index", 0).stdout
    assert "lh gain" in show and "first error" in show
    rep = run("eval", "processbench", held, "--pred", "lh_first_error", "--json", tmp_path / "f1.json")
    assert "gsm8k" in rep.stdout and json.loads((tmp_path / "f1.json").read_text())
    assert p.returncode == 0


def test_cli_calibration_shard_must_match_the_run(pb, tmp_path):
    tune = tmp_path / "tune.parquet"
    label(pb, tune)
    p = run("likelihood-label", pb, tmp_path / "o.parquet", "--engine", "scripted", "--model", "scripted:flat",
            "--calibrate", tune, check=False)
    assert p.returncode == 1 and "labelled with another engine" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = label(pb, tmp_path / "o2.parquet", "--calibrate", pb, check=False)
    assert p.returncode == 1 and "column 'lh_gain'" in p.stderr and "run likelihood-label on it first" in p.stderr
    p = label(pb, tmp_path / "o3.parquet", "--calibrate", tmp_path / "missing.parquet", check=False)
    assert p.returncode == 1 and "no such file" in p.stderr


def test_cli_implicit_prm_with_scripted_models(pb, tmp_path):
    out = tmp_path / "ip.parquet"
    label(pb, out, "--method", "implicit-prm", "--reference-model", "scripted:flat", "--beta", "2")
    rows = pq.read_table(out).to_pylist()
    for r in rows:
        assert len(r["lh_reward"]) == len(r["steps"]) and r["lh_q"][-1] == pytest.approx(sum(r["lh_reward"]), rel=1e-5)
    m = read_manifest(out)
    assert m["config"]["beta"] == 2.0 and m["config"]["reference_model"]["model"] == "scripted:flat"


def test_cli_bad_step_separator_is_one_line(tmp_path):
    schema = extend_schema(TRAJECTORY_SCHEMA, REFERENCE_FIELDS)
    rows = [{**trow("a", ["x = 18."]), "step_separator": None}]
    src = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), src)
    p = label(src, tmp_path / "o.parquet", check=False)
    assert p.returncode == 1 and "row 0" in p.stderr and "step_separator" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


# --- regressions from a breaking session --------------------------------------------------------------

def test_a_step_whose_only_token_spans_into_the_next_is_a_row_error_not_a_stop():
    stage = LikelihoodStage(LikelihoodConfig(method="implicit-prm", reference_model="scripted:flat"),
                            EngineSpec.of(ScriptedEngine()), SAMPLING, reference=EngineSpec.of(ScriptedEngine(
                                scorer=lambda c, t: -2.0)))
    stage.open()
    (bad, ok), _ = stage.process([trow("b", ["abc", "def"], sep=""), trow("o", ["abc", "def"], sep="\n")])
    assert bad["error"].startswith("likelihood-label: engine: no token belongs") and bad["lh_reward"] is None
    assert ok["error"] is None and ok["lh_status"] == "ok"


def test_trimmed_whitespace_offsets_are_covered():
    """Tokenizers that leave a token's leading space out of its offsets (or report it zero-width)."""
    text = "ab cd e"
    assert assign_tokens([(0, 2), (3, 5), (6, 7)], [(2, 7)], text) == [[1, 2]]
    assert assign_tokens([(0, 2), (2, 2), (3, 5), (6, 7)], [(2, 7)], text) == [[1, 2, 3]]
    with pytest.raises(StepkitError, match="do not cover"):  # a hole over a letter is never whitespace
        assign_tokens([(0, 2), (4, 5), (6, 7)], [(2, 7)], text)


@pytest.fixture(scope="module")
def labelled(pb, tmp_path_factory):
    out = tmp_path_factory.mktemp("lab") / "tune.parquet"
    label(pb, out)
    return out


def _with_column(src, dst, name, array):
    import shutil

    t = pq.read_table(src)
    pq.write_table(t.set_column(t.schema.get_field_index(name), name, array), dst)
    shutil.copy(src.with_name(src.stem + ".manifest.json"), dst.with_name(dst.stem + ".manifest.json"))


@pytest.mark.parametrize("column,make,why", [
    ("reference_first_error", lambda v, n: pa.array([float("nan")] + [float(x) for x in v[1:]]), "expected int"),
    ("reference_first_error", lambda v, n: pa.array([[x] for x in v]), "expected int"),
    ("reference_first_error", lambda v, n: pa.array([str(x) for x in v]), "expected int"),
    ("reference_first_error", lambda v, n: pa.array([n[0] + 5] + v[1:], pa.int32()), "outside -1.."),
    ("lh_gain", lambda v, n: pa.array([str(x) for x in v]), "expected list<float>"),
    ("lh_gain", lambda v, n: pa.array([[float("nan")] * len(v[0])] + v[1:], pa.list_(pa.float32())), "finite"),
    ("lh_gain", lambda v, n: pa.array([v[0][:-1]] + v[1:], pa.list_(pa.float32())), "finite values"),
])
def test_calibration_shard_bad_values_are_one_line(labelled, tmp_path, pb, column, make, why):
    t = pq.read_table(labelled)
    values, steps = t.column(column).to_pylist(), [len(s) for s in t.column("steps").to_pylist()]
    bad = tmp_path / "bad.parquet"
    _with_column(labelled, bad, column, make(values, steps))
    p = label(pb, tmp_path / "o.parquet", "--calibrate", bad, check=False)
    assert p.returncode == 1 and why in p.stderr and f"column '{column}'" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_calibrate_on_out_is_refused(labelled, pb, tmp_path):
    p = label(pb, labelled, "--calibrate", labelled, check=False)
    assert p.returncode == 2 and "is (inside) OUT" in p.stderr


def test_reference_model_and_templates_checked_before_any_work(pb, tmp_path):
    p = label(pb, tmp_path / "o.parquet", "--method", "implicit-prm", "--reference-model", "nonsense", check=False)
    assert p.returncode == 1 and "--reference-model nonsense" in p.stderr and not (tmp_path / "o.parquet.parts").exists()
    p = label(pb, tmp_path / "o.parquet", "--method", "implicit-prm", "--reference-model", "scripted:nope",
              check=False)
    assert p.returncode == 1 and "unknown scripted model" in p.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("user: [unclosed\n")
    p = label(pb, tmp_path / "o.parquet", "--template", bad, check=False)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1 and "line 2" in p.stderr


@pytest.mark.parametrize("kw,why", [({"beta": 3.0}, "--beta is for"), ({"calibrate_col": "x"}, "--calibrate-col is for")])
def test_options_that_do_not_apply_are_refused(kw, why):
    with pytest.raises(ConfigError, match=why):
        LikelihoodConfig(**kw)


def test_implicit_prm_needs_no_reference_answer(tmp_path):
    schema = TRAJECTORY_SCHEMA.remove(TRAJECTORY_SCHEMA.get_field_index("reference_answer"))
    src = tmp_path / "noref.parquet"
    rows = [{k: v for k, v in trow("a", ["6 + 12 = 18", "so 18"]).items() if k != "reference_answer"}]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), src)
    label(src, tmp_path / "o.parquet", "--method", "implicit-prm", "--reference-model", "scripted:flat")
    (r,) = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert r["lh_status"] == "ok" and len(r["lh_q"]) == 2


def test_implicit_prm_provenance_when_nothing_was_loaded():
    stage = LikelihoodStage(LikelihoodConfig(method="implicit-prm", reference_model="scripted:flat"),
                            EngineSpec("scripted", "scripted:echo"), SAMPLING)
    prov = stage.provenance()  # every chunk resumed: no model loaded in this run
    assert prov["engine"]["model"] == "scripted:echo" and prov["reference_engine"]["model"] == "scripted:flat"
    assert "every chunk was resumed" in prov["engine"]["note"]


def test_kill_mid_run_then_resume_gives_identical_output(pb, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    full, part = tmp_path / "full.parquet", tmp_path / "part.parquet"
    label(pb, full, "--chunk-size", 2)
    env = {**os.environ, "STEPKIT_SCRIPTED_DELAY": "0.05"}
    proc = subprocess.Popen([sys.executable, "-m", "stepkit.cli", "likelihood-label", pb, part, "--engine",
                             "scripted", "--model", "scripted:echo", "--no-progress", "--chunk-size", "2"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = tmp_path / "part.parquet.parts"
    deadline = time.time() + 60
    while time.time() < deadline and len(list(parts.glob("part-*.parquet"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not part.exists() and len(list(parts.glob("part-*.parquet"))) >= 2
    label(pb, part, "--chunk-size", 2)
    assert read_manifest(part)["run"]["resumed_chunks"] >= 2
    cols = [c for c in pq.read_schema(full).names]
    assert pq.read_table(part).select(cols).equals(pq.read_table(full).select(cols))


def test_export_refuses_log_probabilities_as_hard_labels(labelled, tmp_path):
    p = run("export", labelled, tmp_path / "ds", "--format", "trl", "--labels", "lh_value", check=False)
    assert p.returncode == 1 and "log-probabilities" in p.stderr and "lh_label" in p.stderr
    run("export", labelled, tmp_path / "ds2", "--format", "trl", "--labels", "lh_label")
    run("export", labelled, tmp_path / "ds3", "--format", "trl", "--labels", "lh_gain", "--soft")


def test_stats_on_a_folder_of_both_methods_shows_both(pb, tmp_path):
    folder = tmp_path / "both"
    folder.mkdir()
    label(pb, folder / "a.parquet")
    label(pb, folder / "b.parquet", "--method", "implicit-prm", "--reference-model", "scripted:flat")
    out = run("stats", folder).stdout
    assert "lh_value and lh_gain" in out and "lh_reward and lh_q" in out and "answer-gain + implicit-prm" in out
    m = read_manifest(folder / "b.parquet")
    assert m["run"]["tokens_this_run"] == m["counts"]["scored_tokens"]  # both models' tokens


@pytest.mark.parametrize("reference", ["scripted:echo", "{folder}"])
def test_implicit_prm_against_itself_is_refused(pb, tmp_path, reference):
    """Issue 25 item 5: implicit-prm with the policy as its own reference gave rewards of exactly 0 on every
    step (measured with the bundled model); the command refuses it in one line, before any model loads. The
    same folder named two ways is one model too (a registry name and its prepared folder)."""
    from stepkit.models import model_dir

    policy = "scripted:echo" if reference.startswith("scripted") else "smollm2-135m"
    engine = "scripted" if policy.startswith("scripted") else "vllm"
    ref = reference.format(folder=model_dir("smollm2-135m"))
    p = run("likelihood-label", pb, tmp_path / "o.parquet", "--engine", engine, "--model", policy, "--method",
            "implicit-prm", "--reference-model", ref, "--no-progress", check=False)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "is the policy model itself" in p.stderr and not (tmp_path / "o.parquet.parts").exists()
