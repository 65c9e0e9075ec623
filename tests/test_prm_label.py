"""prm-label with scripted engines on real ProcessBench gsm8k rows: the texts each kind builds, the positions it
reads, the scores and first errors it derives, calibration, the errors it refuses with. (The real engines:
tests/test_prm_label_engine.py.)"""

from __future__ import annotations

import json
import math
import re

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import stepkit.cli as cli
from stepkit.engines.base import EngineSpec
from stepkit.engines.scripted import ScriptedEngine
from stepkit.errors import ConfigError
from stepkit.runner import run_stage
from stepkit.stages.prm_label import PRMLabelConfig, PRMLabelStage
from stepkit.stepwise import encode_text
from tests.conftest import DATA

TAG = " ки"


def invoke(*args, code=0):
    r = CliRunner().invoke(cli.main, [str(a) for a in args])
    assert r.exit_code == code, r.output + (r.stderr if r.stderr_bytes else "")
    return r


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    out = tmp_path_factory.mktemp("pb") / "pb.parquet"
    invoke("ingest", "processbench", DATA / "processbench" / "gsm8k.json", out, "--skip", 197, "--limit", 6)  # 3 + 3
    return out


@pytest.fixture(scope="module")
def rows(pb):
    return pq.read_table(pb).to_pylist()


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def gold_scorer(rows):
    """log P(token | context) for the math-shepherd continuations: '+' likely (-0.2) and '-' unlikely (-2.2) before
    the row's human first error, the reverse from it on; every other token -1.0."""
    gold = {r["prompt"]: r["reference_first_error"] for r in rows}

    def scorer(context, token):
        if token not in ("+", "-") or not context.endswith(TAG):
            return -1.0
        prompt = next(p for p in gold if context.startswith(p + " "))
        k = context.count(TAG) - 1
        ok = gold[prompt] == -1 or k < gold[prompt]
        return -0.2 if (token == "+") == ok else -2.2

    return scorer


@pytest.fixture(scope="module")
def shepherd(pb, rows, tmp_path_factory):
    engine = ScriptedEngine(scorer=gold_scorer(rows))
    out = tmp_path_factory.mktemp("ms") / "ms.parquet"
    stage = PRMLabelStage(PRMLabelConfig(kind="math-shepherd"), EngineSpec.of(engine), None)
    run_stage(stage, pb, out, progress=False)
    return out, engine


def test_math_shepherd_reads_p_plus_against_p_minus_after_each_tag(shepherd, rows, pb, tmp_path):
    out, engine = shepherd
    got = pq.read_table(out).to_pylist()
    for r, g in zip(rows, got):
        assert g["prm_status"] == "ok" and g["error"] is None
        want = [sigmoid(2.0) if r["reference_first_error"] == -1 or k < r["reference_first_error"] else sigmoid(-2.0)
                for k in range(len(r["steps"]))]
        assert g["prm_score"] == pytest.approx(want, abs=1e-6)
        assert g["prm_first_error"] == r["reference_first_error"]
        assert g["prm_label"] == [s >= 0.5 for s in g["prm_score"]]
    # the texts are export --format math-shepherd's input, cut after each tag, with '+' or '-' after it
    invoke("export", pb, tmp_path / "ms", "--format", "math-shepherd", "--labels", "reference_first_error",
           "--step-separator", "\\n", "--separator-in-step", "rejoin")  # (row 0's steps hold no newline)
    inputs = {r["id"]: r["input"] for r in pq.read_table(next((tmp_path / "ms" / "data").glob("*.parquet"))).to_pylist()}
    r0 = rows[0]
    mine = sorted((t for t in engine.scored if t.startswith(r0["prompt"] + " ")), key=len)
    assert len(mine) == 2 * len(r0["steps"])
    assert mine[-1][:-1] == inputs[r0["id"]] and {mine[-1][-1], mine[-2][-1]} == {"+", "-"}
    cuts = [m.start() + len(TAG) for m in re.finditer(re.escape(TAG), inputs[r0["id"]])]
    assert sorted({t[:-1] for t in mine}, key=len) == [inputs[r0["id"]][:c] for c in cuts]


def test_eval_processbench_reads_prm_first_error(shepherd):
    from stepkit.stages.evaluate import processbench_report

    out, _ = shepherd
    s = processbench_report(out, "prm_first_error")["splits"]["gsm8k"]
    assert s["f1"] == 1.0 and s["rows"] == 6
    r = invoke("eval", "processbench", out, "--pred", "prm_first_error")
    assert "prm_first_error" in r.output
    stats = invoke("stats", out).output
    assert "prm_score by step position" in stats and "math-shepherd" in stats


def test_calibration_picks_the_threshold_from_a_labelled_shard(shepherd, pb, tmp_path):
    out, _ = shepherd
    engine = ScriptedEngine(scorer=gold_scorer(pq.read_table(pb).to_pylist()))
    stage = PRMLabelStage(PRMLabelConfig(kind="math-shepherd", calibrate=str(out)), EngineSpec.of(engine), None)
    assert sigmoid(-2.0) < stage.threshold < sigmoid(2.0) and stage.calibration["f1"] == 1.0
    run_stage(stage, pb, tmp_path / "cal.parquet", progress=False)
    m = json.loads((tmp_path / "cal.manifest.json").read_text())
    assert m["config"]["calibration"]["column"] == "reference_first_error"
    assert m["provenance"]["calibration"]["rows"] == 6
    other = PRMLabelConfig(kind="math-shepherd", calibrate=str(out), good_token="good")
    with pytest.raises(Exception, match="labelled with another layout"):
        PRMLabelStage(other, EngineSpec.of(engine), None)


def test_token_classification_reads_the_last_token_of_each_step_and_separator(pb, rows, tmp_path):
    """The scripted classifier's class-1 logit at position j is j / 100, so each score says which position was
    read; every read token is the separator's last, and the text up to it is the prompt and steps so far."""
    engine = ScriptedEngine(classifier=lambda toks: [[0.0, j / 100] for j in range(len(toks))])
    prm = {"step_separator": "\n\n", "bos_token_id": None, "correct_label": 1, "layout": "stepwise-v1"}
    stage = PRMLabelStage(PRMLabelConfig(threshold=0.9), EngineSpec.of(engine),
                          None, model_config=({"architectures": ["LlamaForTokenClassification"]}, prm))
    assert stage.kind == "token-classification"
    run_stage(stage, pb, tmp_path / "tc.parquet", progress=False)
    got = pq.read_table(tmp_path / "tc.parquet").to_pylist()
    for r, g, text in zip(rows, got, engine.scored):
        read = [round(100 * math.log(s / (1 - s))) for s in g["prm_score"]]
        toks = [text[a:b] for a, b in engine.tokenizer(text)]
        enc = encode_text(lambda s: engine.tokenize_offsets(s)[0], r["prompt"], r["steps"], "\n\n")
        assert read == enc.positions
        for i, p in enumerate(read):
            assert "".join(toks[:p + 1]) == r["prompt"] + "\n\n" + "".join(s + "\n\n" for s in r["steps"][:i + 1])
        assert g["prm_first_error"] == next((i for i, s in enumerate(g["prm_score"]) if s < 0.9), -1)
    m = json.loads((tmp_path / "tc.manifest.json").read_text())
    assert m["config"]["layout"]["step_separator"] == "\n\n" and m["config"]["threshold"] == 0.9


def qwen_tokens(text):
    return [m.span() for m in re.finditer(r"<extra_0>| ?\w+| ?[^\w\s<]+|<|\s+", text)]


def test_qwen_prm_reads_the_reward_head_at_each_extra_0_tag(pb, rows, tmp_path):
    def classifier(toks):  # the k-th tag's class-1 logit is k - 2
        out, k = [], 0
        for t in toks:
            out.append([0.0, float(k - 2)] if t == "<extra_0>" else [5.0, -5.0])
            k += t == "<extra_0>"
        return out

    engine = ScriptedEngine(classifier=classifier, tokenizer=qwen_tokens)
    stage = PRMLabelStage(PRMLabelConfig(), EngineSpec.of(engine), None,
                          model_config=({"architectures": ["Qwen2ForProcessRewardModel"]}, None))
    run_stage(stage, pb, tmp_path / "q.parquet", progress=False)
    got = pq.read_table(tmp_path / "q.parquet").to_pylist()
    for r, g, text in zip(rows, got, engine.scored):
        assert g["prm_score"] == pytest.approx([sigmoid(k - 2) for k in range(len(r["steps"]))], abs=1e-6)
        assert g["prm_first_error"] == 0  # sigmoid(-2) < 0.5
        assert text == engine.render_chat([{"role": "system", "content": "Please reason step by step, and put your "
                                            "final answer within \\boxed{}."}, {"role": "user", "content": r["prompt"]}]) \
            + "<extra_0>".join(r["steps"]) + "<extra_0>"


def test_the_kind_comes_from_the_config_and_an_unsupported_model_is_one_line(pb, tmp_path):
    for arch, kind in (("LlamaForTokenClassification", "token-classification"),
                       ("Qwen2ForProcessRewardModel", "qwen-prm"), ("LlamaForCausalLM", "math-shepherd")):
        folder = tmp_path / arch
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"architectures": [arch]}))
        assert PRMLabelStage(PRMLabelConfig(), EngineSpec("vllm", str(folder)), None).kind == kind
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"]}))
    r = invoke("prm-label", pb, tmp_path / "o.parquet", "--model", bert, code=1)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: --model {bert}: BertForMaskedLM is no PRM")
    assert "*ForTokenClassification" in r.stderr and "Qwen2ForProcessRewardModel" in r.stderr
    r = invoke("prm-label", pb, tmp_path / "o.parquet", "--model", tmp_path / "LlamaForCausalLM", "--kind",
               "token-classification", code=1)
    assert "is a math-shepherd model (LlamaForCausalLM)" in r.stderr
    r = invoke("prm-label", pb, tmp_path / "o.parquet", "--model", "m", "--engine", "openai", "--base-url",
               "http://127.0.0.1:9", "--kind", "qwen-prm", code=1)
    assert r.stderr.strip() == "error: --kind qwen-prm is read by vLLM's pooling runner: use --engine vllm"
    with pytest.raises(ConfigError, match="give --kind"):
        PRMLabelStage(PRMLabelConfig(), EngineSpec("scripted", "scripted:echo"), None)


def test_a_good_token_that_merges_with_the_tag_is_refused_before_any_row(pb, tmp_path):
    engine = ScriptedEngine()
    stage = PRMLabelStage(PRMLabelConfig(kind="math-shepherd", good_token="yes"), EngineSpec.of(engine), None)
    with pytest.raises(ConfigError, match="--good-token 'yes': not one token after the step tag"):
        run_stage(stage, pb, tmp_path / "x.parquet", progress=False)
