"""stepkit clue: reference clues, step reading and arithmetic claims on real GSM8K rows, the score rule,
recovery and LLM verdicts with the scripted engine, and the CLI on real ProcessBench / GSM8K rows."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.engines.scripted import ScriptedEngine, clues_policy
from stepkit.grading.answers import extract_gsm8k_reference, strip_calculator_annotations
from stepkit.grading.clues import Clue, claim_holds, read_step, reference_clues
from stepkit.stages.clue import (
    SCORE_COLUMNS,
    ClueParseError,
    ClueRecoverConfig,
    ClueRecoverStage,
    ClueScoreConfig,
    ClueScoreStage,
    clue_columns,
    parse_clues,
)
from tests.conftest import DATA
from tests.conftest import run_cli as run


def _record(name: str, i: int) -> dict:
    """Record ``i`` of a real GSM8K JSON Lines file in ``../shared/data/gsm8k``."""
    with open(DATA / "gsm8k" / name) as f:
        for k, line in enumerate(f):
            if k == i:
                return json.loads(line)
    raise IndexError(i)


def gsm8k(i: int) -> dict:
    return _record("test.jsonl", i)


def solutions(i: int) -> dict:
    return _record("example_model_solutions.jsonl", i)


# --- reference clues: exactly the annotated intermediate values ------------------------------------------

def test_reference_clues_are_the_annotated_values():
    g = gsm8k(2)  # Josh flips a house: four annotations, 70000 the answer
    clues = reference_clues(g["answer"], extract_gsm8k_reference(g["answer"]))
    assert [c.value for c in clues] == ["130000", "120000", "200000", "70000"]
    assert clues[2].depends_on == (1,) and clues[3].depends_on == (0, 2)  # 120000+80000, 200000-130000
    assert "<<" not in clues[0].text and "80,000+50,000" in clues[0].text


def test_reference_clues_every_annotation_of_the_first_100_problems():
    import re

    for i in range(100):
        g = gsm8k(i)
        want = [m.group(1).strip() for m in re.finditer(r"<<[^<>=]*=([^<>]*)>>", g["answer"])]
        got = [c.value for c in reference_clues(g["answer"])]
        if want:
            assert got == want, i
        ans = reference_clues(g["answer"], extract_gsm8k_reference(g["answer"]))
        assert ans[-1].value.replace(",", "") == extract_gsm8k_reference(g["answer"]) or \
            float(ans[-1].value) == float(extract_gsm8k_reference(g["answer"])), i


# --- reading steps and checking arithmetic -------------------------------------------------------------

@pytest.mark.parametrize("step,computed,ok", [
    ("She makes 9 * 2 = $18 every day.", ["18"], [True]),
    (r"Since there were 18 flamingos, \(1/3 \times 18 = 6\) flamingos are taken back.", ["6"], [True]),
    (r"The total is \( \frac{3}{4} \times 100 = 75 \).", ["75"], [True]),
    ("The cost came to 80,000+50,000=$130,000", ["130000"], [True]),
    ("So she has 16 - 3 = 12 eggs left.", ["12"], [False]),
    ("He needs 7/2 = 4 boxes.", ["4"], [True]),  # a whole result may be rounded up or down
    ("Each gets 100/3 = 33.33 dollars.", ["33.33"], [True]),
    ("Each gets 100/3 = 33.4 dollars.", ["33.4"], [False]),
    ("x + 5 - 5 = 27 - 5, so x = 22.", ["22"], []),  # a side that runs on into words is no claim
    (r"we can write the equation: \( 28 = 2 \times 2f \).", [], []),
    (r"The answer is \(\boxed{30}\).", ["30"], []),
])
def test_read_step(step, computed, ok):
    got = read_step(step)
    assert got.computed == computed
    assert [claim_holds(c) for c in got.claims] == ok


def test_false_arithmetic_claim_in_a_real_gpt3_solution_is_flagged():
    # GSM8K example solutions, problem 0, 175b_finetuning: "she bakes 4 - 2 = 2" is true arithmetic, but
    # the 6b_verification solution writes no false claim either; a real false claim comes from ProcessBench
    rows = json.loads((DATA / "processbench" / "gsm8k.json").read_text())
    flagged = [(r["id"], s) for r in rows for s, st in enumerate(r["steps"])
               if any(not claim_holds(c) for c in read_step(st).claims)]
    assert flagged, "ProcessBench gsm8k has steps with false arithmetic"
    rid, s = flagged[0]
    step = next(r for r in rows if r["id"] == rid)["steps"][s]
    bad = [c for c in read_step(step).claims if not claim_holds(c)]
    assert bad and all(c.left != c.right for c in bad)


# --- the score rule on real GSM8K rows -------------------------------------------------------------------

def score_stage(checker, match="numeric", policy=clues_policy, **kw):
    engine = ScriptedEngine(policy, "scripted:clues") if match != "numeric" else None
    stage = ClueScoreStage(ClueScoreConfig(clues="unused.parquet", match=match, **kw),
                           EngineSpec.of(engine) if engine else None, SamplingConfig(temperature=0.7, max_tokens=64),
                           checker_factory=lambda: checker)
    stage.open()
    return stage


def traj(prompt, steps, final, clues, rid="r"):
    return {"id": rid, "problem_id": "p", "prompt": prompt, "steps": steps, "final_answer": final, "error": None,
            "_clues": {**clue_columns(clues), "clue_status": "ok"}}


def test_correct_solution_covers_every_clue(checker):
    g = gsm8k(2)
    clues = reference_clues(g["answer"], "70000")
    steps = [strip_calculator_annotations(x) for x in g["answer"].splitlines() if not x.startswith("####")]
    (r,), _ = score_stage(checker).process([traj(g["question"], steps, "70000", clues)])
    assert r["clue_coverage"] == 1.0 and r["clue_first_error"] == -1 and all(r["clue_label"])
    assert r["clue_hits"] == [[0], [1], [2], [3]] and r["clue_score"] == [1.5, 1.5, 1.5, 1.5]


def test_incorrect_solution_sharing_two_computations_gets_exactly_those(checker):
    # GSM8K test 2 (Josh's house), written wrong from the third computation on: the value is 150% *more*
    # than the price, so 80,000 + 120,000 = 200,000; this solution adds the repairs instead.
    g = gsm8k(2)
    clues = reference_clues(g["answer"], "70000")
    steps = ["The cost of the house and repairs came out to 80,000+50,000=$130,000",
             "He increased the value of the house by 80,000*1.5=120,000",
             "So the new value of the house is 120,000+50,000=$170,000",
             "So he made a profit of 170,000-130,000=$40,000"]
    (r,), _ = score_stage(checker).process([traj(g["question"], steps, "40000", clues)])
    assert r["clue_hits"] == [[0], [1], [], []]
    assert r["clue_coverage"] == 0.5 and r["clue_first_error"] == 2
    assert r["clue_label"] == [True, True, False, False] and r["clue_score"] == [1.5, 1.5, 0.0, 0.0]


def test_real_gpt3_solution_with_a_false_claim(checker):
    # example_model_solutions, problem 0 (Janet's ducks): 6b_finetuning writes 16 - 3 = 13 (true), then
    # 13 * 2 = 26 (true) but never subtracts the muffin eggs: first error at its first step (13 is no clue)
    s = solutions(0)
    g = gsm8k(0)
    clues = reference_clues(g["answer"], "18")
    steps = [strip_calculator_annotations(x) for x in s["6b_finetuning"]["solution"].splitlines()]
    (r,), _ = score_stage(checker).process([traj(s["question"], steps, "26", clues)])
    assert r["clue_first_error"] == 0 and r["clue_coverage"] == 0.0
    false = traj(g["question"], ["Janet sells 16 - 3 - 4 = 8 duck eggs a day.", "She makes 8 * 2 = $16 every day."],
                 "16", clues)
    (r,), _ = score_stage(checker).process([false])
    assert r["clue_false_claims"] == [1, 0] and r["clue_first_error"] == 0 and r["clue_score"][0] == 0.0


def test_checker_equivalence_of_formatted_numbers(checker):
    clues = [Clue("price", "1200"), Clue("share", "0.75"), Clue("The answer is 1200", "1200")]
    steps = ["The price is $1,200.", "A share of 3/4 of it.", "So 1200.00 in all."]
    (r,), _ = score_stage(checker).process([traj("What is the price of 1 item?", steps, "1200", clues)])
    assert r["clue_hits"] == [[0, 2], [1], []] and r["clue_coverage"] == 1.0


def test_no_clues_is_a_status_not_a_label(checker):
    row = traj("q", ["a step"], None, [])
    row["_clues"] = {"clue_texts": None, "clue_values": None, "clue_status": "parse_failure"}
    (r,), c = score_stage(checker).process([row])
    # the scored row carries the clue row's status (why there are no clues), and no label
    assert r["clue_status"] == "parse_failure" and r["clue_first_error"] is None and c["no_clues"] == 1


def test_per_step_columns_are_declared():
    assert {"clue_hits", "clue_score", "clue_label", "clue_false_claims"} == {c.name for c in SCORE_COLUMNS if c.per_step}


# --- LLM paths with the scripted stand-in -----------------------------------------------------------------

def test_parse_clues():
    got = parse_clues("Thinking.\nCLUE 1: a || value: 1 || uses: none\nCLUE 1: eggs sold || value: $1,200 || uses: none\n"
                      "CLUE 2: money || value: none || uses: 1")
    assert [(c.text, c.value, c.depends_on) for c in got] == [("eggs sold", "1200", ()), ("money", None, (0,))]
    for bad in ("no list here", "CLUE 2: x", "CLUE 1: a || uses: 1", "CLUE 1: a\nCLUE 3: b"):
        with pytest.raises(ClueParseError):
            parse_clues(bad)
    with pytest.raises(ClueParseError):
        parse_clues("CLUE 1: a || value: 1", "length")


def recover_stage(policy=clues_policy, retries=2):
    engine = ScriptedEngine(policy, "scripted:clues")
    stage = ClueRecoverStage(ClueRecoverConfig(retries=retries), EngineSpec.of(engine),
                             SamplingConfig(temperature=0.7, max_tokens=256))
    stage.open()
    return stage, engine


def problem_row(i, **kw):
    g = gsm8k(i)
    return {"problem_id": f"gsm8k-test-{i}", "prompt": g["question"], "reference_answer": extract_gsm8k_reference(g["answer"]),
            "reference_solution": g["answer"], "error": None, **kw}


def test_recover_with_a_model_and_a_recorded_parse_failure():
    stage, engine = recover_stage()
    rows = [problem_row(2), problem_row(0, reference_solution=None)]
    stage.validate(rows, "p.parquet", 0)
    out, c = stage.process(rows)
    assert out[0]["clue_status"] == "ok" and out[0]["clue_values"] == ["130000", "120000", "200000", "70000"]
    assert out[0]["clue_depends"][3] == [0, 2]
    # no reference solution: the stand-in states no clue; 1 + 2 retries, all recorded, never an empty list
    assert out[1]["clue_status"] == "parse_failure" and out[1]["clue_texts"] is None
    assert out[1]["clue_parse_failures"] == 3 == len(out[1]["clue_replies"]) and c["parse_failure_rows"] == 1


def test_recover_retry_succeeds():
    calls = []

    def flaky(prompt, j, n):
        calls.append(prompt)
        return "no list" if len(calls) == 1 else clues_policy(prompt, j, n)

    stage, _ = recover_stage(flaky)
    rows = [problem_row(1)]
    stage.validate(rows, "p.parquet", 0)
    (r,), c = stage.process(rows)
    assert r["clue_status"] == "ok" and r["clue_parse_failures"] == 1 and len(r["clue_replies"]) == 2
    assert r["clue_values"] == ["1", "3"]


def test_score_llm_verdicts_and_failures(checker):
    g = gsm8k(2)
    clues = reference_clues(g["answer"], "70000") + [Clue("the house is a good investment")]
    clues = [clues[0], clues[4], clues[1], clues[2], clues[3]]  # a non-numeric clue in the middle
    steps = [strip_calculator_annotations(x) for x in g["answer"].splitlines() if not x.startswith("####")]
    (r,), c = score_stage(checker, match="both").process([traj(g["question"], steps, "70000", clues)])
    # the stand-in cannot judge a clue with no number: 3 replies, all failures, never a verdict
    assert r["clue_verdicts"] == [0, None, 1, 2, 3] and r["clue_verdict_failures"] == 3 == c["verdict_failures"]
    assert r["clue_coverage"] == 1.0  # of the 4 clues checked
    (r,), c = score_stage(checker, match="llm").process([traj(g["question"], steps, "70000", clues)])
    assert r["clue_verdicts"] == [0, None, 1, 2, 3] and c["verdicts"] == 4


# --- the CLI on real data ---------------------------------------------------------------------------------

def test_cli_processbench_pipeline(tmp_path):
    pb, clues, out = tmp_path / "pb.parquet", tmp_path / "clues.parquet", tmp_path / "scored.parquet"
    run("ingest", "processbench", DATA / "processbench" / "gsm8k.json", pb, "--limit", 40)
    sols = [r["reference_solution"] for r in pq.read_table(pb).to_pylist()]
    assert all(sols) and sum("<<" in s for s in sols) >= 35  # the GSM8K test solution, annotated (a few are bare)
    run("clue", "recover", pb, clues, "--from-reference", "--no-progress")
    crows = pq.read_table(clues).to_pylist()
    assert len(crows) == len({r["problem_id"] for r in pq.read_table(pb).to_pylist()})
    assert all(r["clue_status"] in ("ok", "no_reference") for r in crows)
    run("clue", "score", pb, out, "--clues", clues, "--no-progress")
    rows = pq.read_table(out).to_pylist()
    assert all(len(r["clue_score"]) == len(r["steps"]) for r in rows if r["clue_status"] == "ok")
    ev = run("eval", "processbench", out, "--pred", "clue_first_error")
    assert "gsm8k" in ev.stdout
    st = run("stats", out)
    assert "coverage (correct outcome)" in st.stdout
    sh = run("show", out, "--index", 0)
    assert "clue hits" in sh.stdout
    p = run("clue", "score", pb, tmp_path / "x.parquet", "--clues", clues, "--match", "llm", check=False)
    assert p.returncode == 2 and "needs --model" in p.stderr


def test_cli_recover_with_scripted_model(tmp_path):
    probs, clues = tmp_path / "probs.parquet", tmp_path / "clues.parquet"
    run("ingest", "gsm8k", DATA / "gsm8k" / "test.jsonl", probs, "--limit", 3)
    run("clue", "recover", probs, clues, "--engine", "scripted", "--model", "scripted:clues", "--no-progress")
    rows = pq.read_table(clues).to_pylist()
    assert [r["clue_status"] for r in rows] == ["ok"] * 3 and rows[1]["clue_values"] == ["1", "3"]
    st = run("stats", clues)
    assert "clues per problem" in st.stdout


def test_clue_shards_that_are_not_clue_shards_are_one_line(tmp_path, checker):
    """A wrong --clues shard is refused before scoring (case from a breaking session: a problems shard as
    --clues scored every row no_clues and exited 0; unequal clue lists gave wrong verdicts)."""
    from stepkit.errors import InputError
    from stepkit.stages.clue import check_clue_rows
    from tests.conftest import run_cli

    good = {"problem_id": "p", "clue_texts": ["a", "The answer is 5"], "clue_values": ["2", "5"],
            "clue_depends": [[], [0]], "clue_status": "ok", "error": None}
    check_clue_rows([good], "c.parquet", 0)
    for change, col, msg in [({"clue_values": ["2"]}, "clue_values", "1 entries for 2 clue texts"),
                             ({"clue_depends": [[], [1]]}, "clue_depends", "only earlier clues"),
                             ({"clue_values": ["abc", "5"]}, "clue_values", "not a number"),
                             ({"clue_status": "bogus"}, "clue_status", "not a clue status"),
                             ({"clue_texts": []}, "clue_texts", "non-empty list")]:
        with pytest.raises(InputError, match=rf"c.parquet: row 3, column '{col}': .*{msg}"):
            check_clue_rows([{**good, **change}], "c.parquet", 3)
    probs = tmp_path / "probs.parquet"
    run_cli("ingest", "gsm8k", DATA / "gsm8k" / "test.jsonl", probs, "--limit", "2")
    sols = tmp_path / "sols.parquet"
    run_cli("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", sols, "--limit", "2")
    p = run_cli("clue", "score", sols, tmp_path / "o.parquet", "--clues", probs, check=False)
    assert p.returncode == 1 and "column 'clue_texts': missing column" in p.stderr
    assert p.stderr.count("\n") == 1


def test_cli_math_rows_without_a_gold_answer_or_with_a_digitless_one(tmp_path):
    """Real ProcessBench math rows (issue 23): math-499's problem has no gold answer (a status, no_answer,
    never a row error against --max-error-rate: 412 of 1000 math rows are so), math-502's gold answer is
    ``\\pi``: `clue score` takes `clue recover --from-reference`'s own answer clue, and the row, whose final
    answer is ``\\pi``, reaches it (no first error, as its human label)."""
    from stepkit.errors import InputError
    from stepkit.stages.clue import check_clue_rows

    row = {"problem_id": "p", "clue_texts": ["a", "The answer is (E)"], "clue_values": ["2", "\\text{(E)}"],
           "clue_depends": [[], [0]], "clue_status": "ok", "error": None}
    check_clue_rows([row], "c.parquet", 0)  # the answer clue as written (math-324's gold answer)
    with pytest.raises(InputError, match="clue 0: .* not a number written as text"):
        check_clue_rows([{**row, "clue_values": ["\\text{(E)}", "2"]}], "c.parquet", 0)
    pb, clues, out = tmp_path / "pb.parquet", tmp_path / "clues.parquet", tmp_path / "scored.parquet"
    run("ingest", "processbench", DATA / "processbench" / "math.json", pb, "--skip", 499, "--limit", 4)
    run("clue", "recover", pb, clues, "--from-reference", "--no-progress")
    by_status = {r["reference_answer"]: r for r in pq.read_table(clues).to_pylist()}
    assert by_status[None]["clue_status"] == "no_answer" and by_status[None]["error"] is None
    assert by_status["\\pi"]["clue_status"] == "ok" and by_status["\\pi"]["clue_values"][-1] == "\\pi"
    run("clue", "score", pb, out, "--clues", clues, "--no-progress")
    rows = {r["id"]: r for r in pq.read_table(out).to_pylist()}
    assert rows["math-499"]["clue_status"] == "no_answer" and rows["math-499"]["clue_first_error"] is None
    assert rows["math-499"]["error"] is None
    assert rows["math-502"]["clue_status"] == "ok" and rows["math-502"]["clue_first_error"] == -1


def test_math500_reference_solutions_are_clue_sources(tmp_path):
    """A ProcessBench math row whose problem is in MATH-500 gets its LaTeX solution as reference_solution;
    `clue recover --from-reference` takes the solution's intermediate results as clues, the answer last
    (issue 23). math-1: the MATH-500 solution establishes 92/585 on the way to 1 \\pm \\sqrt{19}."""
    from stepkit.grading.solution_clues import solution_clues

    with open(DATA / "math500" / "test.jsonl") as f:
        m500 = [json.loads(line) for line, _ in zip(f, range(4))]
    assert [c.value for c in solution_clues(m500[0]["solution"], m500[0]["answer"])] == [
        "3", "\\left( 3, \\frac{\\pi}{2} \\right)"]  # r = \sqrt{0^2 + 3^2} = 3, then the answer
    assert [c.value for c in solution_clues(m500[3]["solution"], m500[3]["answer"])][-1] == "9"
    pb, clues, out = tmp_path / "pb.parquet", tmp_path / "clues.parquet", tmp_path / "scored.parquet"
    run("ingest", "processbench", DATA / "processbench" / "math.json", pb, "--skip", 1, "--limit", 1)
    (row,) = pq.read_table(pb).to_pylist()
    assert row["reference_solution"].startswith("Multiplying out each numerator")
    run("clue", "recover", pb, clues, "--from-reference", "--no-progress")
    (c,) = pq.read_table(clues).to_pylist()
    assert c["clue_status"] == "ok" and c["clue_values"][0] == "92/585" and c["clue_values"][-1] == "1 \\pm \\sqrt{19}"
    run("clue", "score", pb, out, "--clues", clues, "--no-progress")
    (s,) = pq.read_table(out).to_pylist()
    assert s["clue_status"] == "ok" and 0 in s["clue_hits"][0]  # the solution's first step states 92/585
