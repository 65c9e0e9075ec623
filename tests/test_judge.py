"""judge: verdict parsing (every judge_parse case and its kind of fault), voting, retries, the stage with
the scripted engine, and the CLI on real ProcessBench rows."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from stepkit.engines.base import Completion, EngineSpec, SamplingConfig
from stepkit.engines.scripted import ScriptedEngine, judge_policy
from stepkit.errors import ConfigError
from stepkit.grading.verdicts import (
    VerdictParseError,
    first_error_of,
    parse_first_error,
    parse_label,
    parse_step_verdicts,
    vote_first_error,
    vote_steps,
)
from stepkit.prompts import judge_template, load_template, render_judge
from stepkit.shards import read_manifest
from stepkit.stages.judge import JudgeConfig, JudgeStage
from tests.conftest import DATA, assert_linear, load_cases
from tests.conftest import run_cli as run

JUDGE_CASES = sorted(c["id"] for c in load_cases().values() if c["stage"] == "judge_parse")


# --- every judge_parse case -------------------------------------------------------------------------

def test_every_judge_parse_case_has_a_test():
    assert JUDGE_CASES == ["judge-grade-letter-unanchored", "judge-verdict-first-match"]


def test_case_final_verdict_not_first_match(cases):
    c = cases["judge-verdict-first-match"]
    got = parse_label(c["input"]["judge_output"], c["input"]["labels"])
    assert got == c["expected"]["verdict"] != c["expected"]["observed"]
    # longest label first: "NOT SUCCESS" alone is never read as "SUCCESS", in any label order
    assert parse_label("NOT SUCCESS", ["SUCCESS", "NOT SUCCESS"]) == "NOT SUCCESS"
    assert parse_label("NOT SUCCESS", ["NOT SUCCESS", "SUCCESS"]) == "NOT SUCCESS"


def test_case_grade_letter_anchored(cases):
    c = cases["judge-grade-letter-unanchored"]
    got = parse_label(c["input"]["judge_output"], c["input"]["grades"])
    assert got == c["expected"]["grade"] != c["expected"]["observed_loose_scan"]
    with pytest.raises(VerdictParseError):
        parse_label(c["input"]["unparseable_output"], c["input"]["grades"])


@pytest.mark.parametrize("text,labels,want", [
    # the verdict on the line of the last marker wins, even when the reply rambles on afterwards
    ("Final verdict: NOT SUCCESS.\nAt first I was going to answer SUCCESS.", ["SUCCESS", "NOT SUCCESS"], "NOT SUCCESS"),
    ("Final verdict:\n\n**NOT SUCCESS**", ["SUCCESS", "NOT SUCCESS"], "NOT SUCCESS"),
    ("Is the grade A or B? After review, it's B", ["A", "B"], "B"),   # a question is no verdict marker
    ("Verdict: incorrect", ["correct", "incorrect"], "incorrect"),
    ("It looks correct at first, but the sum is off. Final answer: incorrect", ["correct", "incorrect"], "incorrect"),
    ("the grade is: A", ["A", "B"], "A"),
    ("A careful look shows the work holds. Grade: B", ["A", "B"], "B"),
    ("success", ["SUCCESS", "NOT SUCCESS"], "SUCCESS"),   # words ignore case, letters do not
])
def test_parse_label_variants(text, labels, want):
    assert parse_label(text, labels) == want


@pytest.mark.parametrize("text,labels", [
    ("UNSUCCESSFUL attempt", ["SUCCESS", "NOT SUCCESS"]),     # a label inside a word is not a verdict
    ("As a judge I am unsure.", ["A", "B"]),                   # 'a' is not grade 'A'
    ("", ["A", "B"]),
    ("Final verdict: correct? No, incorrect", ["correct", "incorrect"]),      # two verdicts: ambiguous
    ("Final verdict: NOT correct", ["correct", "incorrect"]),                # negated
    ("Final verdict: The answer is not a SUCCESS.", ["SUCCESS", "NOT SUCCESS"]),
    ("The step is correct. Final verdict:", ["correct", "incorrect"]),        # marker with nothing after it
    ("Grade: A-", ["A", "B"]), ("Grade: B+", ["A", "B"]),                      # modified grades are neither
    ("I would not say SUCCESS", ["SUCCESS", "NOT SUCCESS"]),
])
def test_parse_label_failures(text, labels):
    with pytest.raises(VerdictParseError):
        parse_label(text, labels)


@pytest.mark.parametrize("text,m,want", [
    ("Paragraph 1 already says \\boxed{18}? No. The earliest error is in paragraph 2.\n\\boxed{2}", 4, 2),
    ("All steps hold.\n\\boxed{-1}", 3, -1),
    ("\\boxed{ $1$ }", 3, 1),
    ("\\boxed{\\text{0}}", 3, 0),
    ("first \\boxed{0} then on reflection \\boxed{1}", 2, 1),
    ("\\boxed{\u22121}", 3, -1),                          # Unicode minus
    ("\\boxed{\\text{Paragraph 2}}", 3, 2),
    ("\\boxed{\\textit{2}}", 3, 2), ("\\boxed{\\displaystyle 2}", 3, 2), ("\\boxed{\\(2\\)}", 3, 2),
    ("**Final answer: \\boxed{2}**", 3, 2),
])
def test_parse_first_error_reads_the_last_box(text, m, want):
    assert parse_first_error(text, m) == want


@pytest.mark.parametrize("text,want", [
    ("Earliest error: \\boxed{2}. The solution's answer \\boxed{18} is wrong.", 2),  # quote after, out of range
    ("The solution ends with \\boxed{3}. Paragraph 1 is wrong: \\boxed{1}", 1),       # quote before
    ("The first error is paragraph 3: \\boxed{3}", 3),        # the index equals the answer: the only box
])
def test_quoted_answers_are_not_verdicts(text, want):
    quotes = ("3", "18") if "18" not in text else ("18",)
    assert parse_first_error(text, 4, quotes=quotes) == want


def test_ambiguous_quote_is_a_parse_failure():
    with pytest.raises(VerdictParseError, match="ambiguous"):
        parse_first_error("Earliest error: \\boxed{2}. So the solution's answer \\boxed{3} is wrong.", 4, quotes=("3",))


@pytest.mark.parametrize("text,m,why", [
    ("The earliest error is paragraph 2.", 4, "no \\boxed"),
    ("\\boxed{7}", 4, "outside -1..3"),
    ("\\boxed{-2}", 4, "outside"),
    ("\\boxed{2.5}", 4, "not a step index"),
    ("\\boxed{paragraph two}", 4, "not a step index"),
    ("the answer is \\boxed{", 4, "no \\boxed"),   # unclosed (cut off)
    ("\\boxed{" + "9" * 5000 + "}", 4, "not a step index"),  # no int() of a huge digit string
    ("\\boxed{\uff12}", 4, "not a step index"),             # ASCII digits only
])
def test_parse_first_error_failures(text, m, why):
    with pytest.raises(VerdictParseError, match=why.replace("\\", "\\\\").replace(".", r"\.")):
        parse_first_error(text, m)


def test_parse_step_verdicts_final_block_and_longest_word():
    text = ("Paragraph 0: correct, 3*4 = 12.\nParagraph 1: correct at first sight...\n"
            "Wait, 12 + 5 is 17, not 18.\n\nParagraph 0: correct\n**Paragraph 1:** incorrect\n- Paragraph 2: Incorrect")
    assert parse_step_verdicts(text, 3) == [True, False, False]


@pytest.mark.parametrize("text,want", [
    ("1. Paragraph 0: correct\n2. Paragraph 1: _incorrect_", [True, False]),
    ("| Paragraph 0 | correct |\n| Paragraph 1 | `incorrect` |", [True, False]),
    ("Paragraph 0 \u2014 correct\nParagraph 1 \u2013 \"incorrect\"", [True, False]),
    ("Step 0: correct\nStep 1: incorrect", [True, False]),
    # Paragraph lines win over Step lines; a zero-padded index is no verdict line
    ("Paragraph 0: correct\nParagraph 1: incorrect\nStep 1: correct (the arithmetic)\nParagraph 01: correct", [True, False]),
])
def test_parse_step_verdicts_formats(text, want):
    assert parse_step_verdicts(text, 2) == want


@pytest.mark.parametrize("make", [
    lambda n: "Paragraph 0:" + " " * n + "x", lambda n: "*" * n, lambda n: "Paragraph 0: correct\n" * (n // 21),
    lambda n: "\\boxed{" * (n // 7), lambda n: "Final verdict: " + "A " * (n // 2), lambda n: "\\boxed{" + "9" * n + "}",
], ids=["spaces", "stars", "many lines", "open boxes", "many labels", "long box"])
def test_parsers_are_linear_on_adversarial_replies(make):
    def parse_all(text):  # quadratic per-step parsing took hours on 1 MB
        for f in (lambda: parse_step_verdicts(text, 1), lambda: parse_first_error(text, 1),
                  lambda: parse_label(text, ["A", "B"])):
            try:
                f()
            except VerdictParseError:
                pass

    assert_linear(parse_all, make)


@pytest.mark.parametrize("text,m,why", [
    ("Paragraph 0: correct\nParagraph 1: correct", 3, "2 of 3 steps"),
    ("Paragraph 0: correct\nParagraph 1: correct\nParagraph 2: incorrect", 2, "paragraph 2 but"),
    ("Everything is correct.", 2, "no verdict"),
    ("Paragraph 0: the sum is correct", 1, "no verdict"),  # a verdict must follow the label directly
    ("Paragraph 0: correct\nParagraph 1: correct? No \u2014 incorrect", 2, "ambiguous"),
    ("Paragraph 0: correct\nParagraph 1: correct calculation but wrong conclusion, so incorrect", 2, "ambiguous"),
    ("Paragraph 0: correct\nParagraph 1: correct-ish", 2, "1 of 2"),
    ("Paragraph 0: not correct", 1, "no verdict"),
    ("Paragraph " + "1" * 5000 + ": correct", 1, "no verdict"),
])
def test_parse_step_verdicts_failures(text, m, why):
    with pytest.raises(VerdictParseError, match=why):
        parse_step_verdicts(text, m)


def test_votes():
    assert vote_first_error([2, 2, -1]) == (2, False)
    assert vote_first_error([-1, 3, 1]) == (1, True)      # a tie resolves to the earliest error
    assert vote_first_error([-1, -1, 0, 0]) == (0, True)
    assert vote_steps([[True, True], [True, False]]) == ([True, False], [2, 1], [False, True])
    assert first_error_of([True, None, False]) is None and first_error_of([True, True]) == -1


# --- the stage with the scripted engine -------------------------------------------------------------

def row(rid="r0", steps=("Add 3 and 4 to get 7.", "Double it: {14}.", "The answer is 14."), **kw):
    return {"id": rid, "problem_id": "p", "prompt": "What is 2*(3+4)? {steps}", "steps": list(steps),
            "error": None, **kw}


def judge_stage(policy=judge_policy, mode="first-error", votes=1, retries=2, temperature=0.7, max_tokens=64):
    engine = ScriptedEngine(policy, "scripted:judge")
    stage = JudgeStage(JudgeConfig(mode=mode, votes=votes, retries=retries), EngineSpec.of(engine),
                       SamplingConfig(temperature=temperature, max_tokens=max_tokens))
    stage.open()
    return stage, engine


def test_prompt_tags_steps_and_keeps_text():
    stage, engine = judge_stage()
    p = render_judge(engine, stage.template, "What is {steps}?", ["a {x}", "b"])
    assert "What is {steps}?" in p and "<paragraph_0>\na {x}\n</paragraph_0>\n\n<paragraph_1>\nb\n</paragraph_1>" in p
    assert "from 0 to 1" in p and "2 paragraphs" in p


def test_first_error_votes_and_tie():
    stage, _ = judge_stage(votes=3)
    (r,), counters = stage.process([row()])
    # scripted judge: sample j names paragraph (j % 4) - 1 -> votes -1, 0, 1: a three-way tie
    assert r["judge_votes"] == [-1, 0, 1] and r["judge_tie"] is True
    assert r["judge_first_error"] == 0 and r["judge_label"] == [False, False, False]
    assert r["judge_correct_votes"] == [2, 1, 1] and r["judge_valid_votes"] == 3  # votes -1, 0, 1
    assert r["judge_status"] == "ok" and len(r["judge_replies"]) == 3 and counters["ties"] == 1


def test_first_error_single_vote():
    stage, _ = judge_stage(votes=1)
    (r,), _ = stage.process([row()])
    assert r["judge_first_error"] == -1 and r["judge_label"] == [True, True, True] and r["judge_tie"] is False


def test_per_step_votes():
    stage, _ = judge_stage(mode="per-step", votes=2)
    (r,), _ = stage.process([row()])
    # sample 0: all correct; sample 1: first error at paragraph 0 -> 1 of 2 correct votes per step: ties
    assert r["judge_correct_votes"] == [1, 1, 1] and r["judge_tie"] is True
    assert r["judge_label"] == [False, False, False] and r["judge_first_error"] == 0
    assert r["judge_votes"] == [-1, 0]


def flaky(bad_first: int, bad="I think it is fine overall.", truncated=False):
    """A judge whose first ``bad_first`` replies per prompt state no verdict."""
    seen = {}

    def policy(prompt, j, n):
        seen[prompt] = seen.get(prompt, 0) + 1
        if seen[prompt] <= bad_first:
            return Completion(bad + " \\boxed{1}" if truncated else bad, "length" if truncated else "stop", 5)
        return "Paragraph 1 is wrong.\n\\boxed{1}"
    return policy


def test_parse_failures_are_retried():
    stage, engine = judge_stage(flaky(2), votes=2, retries=2)
    (r,), counters = stage.process([row()])
    assert r["judge_status"] == "ok" and r["judge_first_error"] == 1 and r["judge_valid_votes"] == 2
    assert r["judge_parse_failures"] == 2 and "no verdict" in r["judge_parse_error"]
    assert [q.n for q in engine.calls] == [2, 2] and counters["retry_replies"] == 2


def test_retry_rounds_get_other_seeds():
    seeds = []

    class Recording(ScriptedEngine):
        def generate(self, requests, sampling):
            seeds.append(sampling.seed)
            return super().generate(requests, sampling)

    engine = Recording(flaky(99), "scripted:judge")
    stage = JudgeStage(JudgeConfig(votes=1, retries=2), EngineSpec.of(engine), SamplingConfig(seed=5))
    stage.open()
    stage.process([row()])
    assert len(set(seeds)) == 3 and seeds[0] == 5  # GPU per-request seeds are seed + index: vary per round


def test_unparseable_row_is_a_parse_failure_never_a_verdict():
    stage, engine = judge_stage(flaky(99), votes=2, retries=2)
    (r,), counters = stage.process([row()])
    assert r["judge_status"] == "parse_failure" and r["judge_first_error"] is None and r["judge_label"] is None
    assert r["judge_parse_failures"] == 6 and len(r["judge_replies"]) == 6 and r["error"] is None
    assert counters["parse_failure_rows"] == 1 and len(engine.calls) == 3


def test_truncated_reply_is_not_read():
    stage, _ = judge_stage(flaky(99, truncated=True), votes=1, retries=0)
    (r,), _ = stage.process([row()])
    assert r["judge_status"] == "parse_failure" and "max_tokens" in r["judge_parse_error"]


def test_no_retry_at_temperature_zero():
    stage, engine = judge_stage(flaky(99), votes=1, retries=3, temperature=0)
    (r,), _ = stage.process([row()])
    assert len(engine.calls) == 1 and r["judge_status"] == "parse_failure"


def test_engine_error_and_upstream_error():
    stage, _ = judge_stage(lambda p, j, n: Completion("prompt too long", "error", 0))
    (a, b), counters = stage.process([row("a"), row("b", error="rollout: engine: boom")])
    assert a["error"] == "judge: engine: prompt too long" and a["judge_status"] is None
    assert b["error"] == "rollout: engine: boom" and b["judge_replies"] is None


def test_template_mode_must_match(tmp_path):
    with pytest.raises(ConfigError, match="mode"):
        JudgeStage(JudgeConfig(mode="per-step", retries=0), EngineSpec("scripted", "scripted:judge"), SamplingConfig(),
                   judge_template("first-error"))
    bad = tmp_path / "t.yaml"
    bad.write_text("version: x\nmode: first-error\nuser: 'Judge {problem}'\n")
    with pytest.raises(Exception, match=r"needs the \{steps\} slot"):
        load_template(bad)


@pytest.mark.parametrize("body, why", [("version: " + "1" * 5000 + "\n", "an integer of more than 4300 digits"),
                                       ("user: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply")])
def test_template_yaml_that_the_parser_refuses_is_a_config_error(tmp_path, body, why):
    t = tmp_path / "t.yaml"
    t.write_text(body)
    with pytest.raises(ConfigError, match=rf"t.yaml: not a readable YAML template \({why}\)"):
        load_template(t)


# --- CLI on real ProcessBench rows (scripted judge: fast) -------------------------------------------

@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    out = tmp_path_factory.mktemp("pb") / "pb.parquet"
    run("ingest", "processbench", DATA / "processbench" / "gsm8k.json", out, "--limit", 12)
    return out


def test_cli_judge_then_eval(pb, tmp_path):
    out = tmp_path / "judged.parquet"
    run("judge", pb, out, "--engine", "scripted", "--model", "scripted:judge", "--votes", 3, "--no-progress",
        "--chunk-size", 5)
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 12
    for r in rows:
        assert r["judge_status"] == "ok" and len(r["judge_label"]) == len(r["steps"]) == len(r["judge_correct_votes"])
    m = read_manifest(out)
    assert m["config"]["prompt_template"]["version"] == "judge-first-error-v2"
    assert m["config"]["prompt_template"]["hash"] == judge_template("first-error").hash()
    assert m["counts"]["replies"] == 36
    p = run("eval", "processbench", out, "--pred", "judge_first_error", "--json", tmp_path / "f1.json")
    assert "gsm8k" in p.stdout and "F1" in p.stdout
    rep = json.loads((tmp_path / "f1.json").read_text())
    assert rep["splits"]["gsm8k"]["rows"] == 12 and rep["splits"]["gsm8k"]["missing"] == 0
    p = run("eval", "agreement", out, "--a", "judge_first_error", "--b", "reference_first_error")
    assert "same first error" in p.stdout
    # same command again: up to date; another template: refused without --force
    assert "up to date" in run("judge", pb, out, "--engine", "scripted", "--model", "scripted:judge", "--votes", 3,
                               "--no-progress", "--chunk-size", 5).stderr
    p = run("judge", pb, out, "--engine", "scripted", "--model", "scripted:judge", "--votes", 2, "--no-progress",
            "--chunk-size", 5, check=False)
    assert p.returncode == 1 and "votes 3 -> 2" in p.stderr


def test_cli_judge_bad_input(pb, tmp_path):
    import pyarrow as pa

    t = pq.read_table(pb)
    nosteps = tmp_path / "nosteps.parquet"
    pq.write_table(t.drop(["steps"]), nosteps)
    p = run("judge", nosteps, tmp_path / "o.parquet", "--engine", "scripted", "--model", "scripted:judge", check=False)
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0 and "column 'steps': missing column" in p.stderr
    steps = t.column("steps").to_pylist()
    steps[4] = []
    empty = tmp_path / "empty.parquet"
    pq.write_table(t.set_column(t.schema.get_field_index("steps"), "steps", pa.array(steps, t.schema.field("steps").type)), empty)
    p = run("judge", empty, tmp_path / "o.parquet", "--engine", "scripted", "--model", "scripted:judge", check=False)
    assert p.returncode == 1 and "row 4, column 'steps': steps is an empty list" in p.stderr
    p = run("judge", pb, tmp_path / "o.parquet", "--engine", "scripted", "--model", "scripted:judge",
            "--votes", 3, "--temperature", 0, check=False)
    assert p.returncode == 2 and "--votes > 1 needs --temperature > 0" in p.stderr
    tmpl = tmp_path / "t.yaml"
    tmpl.write_text("version: x\nmode: per-step\nuser: '{problem} {steps}'\n")
    p = run("judge", pb, tmp_path / "o.parquet", "--engine", "scripted", "--model", "scripted:judge",
            "--template", tmpl, "--mode", "first-error", check=False)
    assert p.returncode == 2 and "is for mode 'per-step'" in p.stderr
    assert not (tmp_path / "o.parquet").exists()


def test_cli_judge_custom_template_hash_in_manifest(pb, tmp_path):
    tmpl = tmp_path / "t.yaml"
    tmpl.write_text("version: mine-v1\nmode: per-step\nuser: |-\n  {problem}\n  {steps}\n"
                    "  End with lines 'Paragraph k: correct' or incorrect.\n")
    out = tmp_path / "j.parquet"
    run("judge", pb, out, "--engine", "scripted", "--model", "scripted:judge", "--mode", "per-step",
        "--template", tmpl, "--no-progress")
    m = read_manifest(out)
    assert m["config"]["prompt_template"] == {"version": "mine-v1", "hash": load_template(tmpl).hash()}
    assert all(r["judge_status"] == "ok" for r in pq.read_table(out).to_pylist())


def test_quoted_solution_answer_in_the_stage():
    steps = ["3 + 4 = 7.", "7 * 2 = 14.", "So the answer is \\boxed{2}."]
    replies = iter(["Paragraph 0 is wrong: \\boxed{0}. The solution's \\boxed{2} is wrong.",
                    "The solution's answer \\boxed{2} is wrong; the first error is in paragraph 1.\n\\boxed{1}"])
    stage, _ = judge_stage(lambda p, j, n: next(replies), votes=1, retries=1)
    (r,), _ = stage.process([row(steps=steps)])
    # reply 1: \boxed{0} then a quote that is a valid different index -> ambiguous; reply 2: the quote comes first
    assert r["judge_parse_failures"] == 1 and "ambiguous" in r["judge_parse_error"] and r["judge_first_error"] == 1


def test_duplicate_id_after_an_upstream_error_is_refused(pb, tmp_path):
    import pyarrow as pa

    t = pq.read_table(pb)
    ids = t.column("id").to_pylist()
    ids[3] = ids[2]
    errs = [None] * t.num_rows
    errs[2] = "rollout: engine: boom"
    t = t.set_column(t.schema.get_field_index("id"), "id", pa.array(ids, pa.string()))
    t = t.set_column(t.schema.get_field_index("error"), "error", pa.array(errs, pa.string()))
    dup = tmp_path / "dup.parquet"
    pq.write_table(t, dup)
    p = run("judge", dup, tmp_path / "o.parquet", "--engine", "scripted", "--model", "scripted:judge", check=False)
    assert p.returncode == 1 and "row 3, column 'id': duplicate value" in p.stderr


def test_unwritable_output_and_bad_template_are_one_line(pb, tmp_path):
    p = run("judge", pb, "/proc/stepkit-out.parquet", "--engine", "scripted", "--model", "scripted:judge", check=False)
    assert p.returncode == 1 and p.stderr.startswith("error: ") and p.stderr.count("\n") == 1
    for body in ("version: x\nmode: first-error\nsystem: 123\nuser: '{problem} {steps}'\n", b"\xff\xfe bad"):
        tmpl = tmp_path / "t.yaml"
        tmpl.write_bytes(body if isinstance(body, bytes) else body.encode())
        p = run("judge", pb, tmp_path / "o.parquet", "--engine", "scripted", "--model", "scripted:judge",
                "--template", tmpl, check=False)
        assert p.returncode == 1 and p.stderr.startswith("error: ") and p.stderr.count("\n") == 1, p.stderr
