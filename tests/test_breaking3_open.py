"""The three defects breaking run 3 left open (docs/breaking-2026-12-03.md, N11-N13), each as a class of fault,
on real ProcessBench gsm8k rows where the data has the case, in process."""

from __future__ import annotations

import io
import json
import math
import re

import pytest
from rich.console import Console

from stepkit.columns import fields
from stepkit.schema import REFERENCE_FIELDS, TRAJECTORY_SCHEMA, extend_schema
from stepkit.stages import likelihood, mc_label, prm_label
from tests.conftest import run_cli
from tests.test_export import labelled, write

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")


def stats(shard) -> tuple[str, dict]:
    """``stats``' printed text and figures (and the command's own stdout, which must agree)."""
    from stepkit.cli import stage_views
    from stepkit.views import print_stats

    buf = io.StringIO()
    figs = print_stats(shard, stage_views(), console=Console(file=buf, width=200, color_system=None))
    assert run_cli("stats", shard).stdout.count("n/a") == buf.getvalue().count("n/a")
    return " ".join(buf.getvalue().split()), figs  # (a long title wraps)


def no_nan(text: str, figs: dict) -> None:
    """Neither the text nor the figures hold NaN or inf: the figures are valid JSON (null for n/a)."""
    assert not re.search(r"\b(nan|inf)\b", text), text  # as Python prints them (titles say "NaN", "infinite")
    json.dumps(figs, allow_nan=False)  # ValueError on NaN/inf


def test_n11_stats_prints_n_a_with_its_count_for_every_undefined_statistic(tmp_path):
    """N11: a step position whose MC values are all NaN printed ``nan`` as its mean (and shares of 0.00 out of
    NaNs). Every statistic of stats that has no value to be computed from prints ``n/a (N values)``; NaN and
    inf are left out as filter leaves them out (as null), and counted; the figures say None, so they are JSON."""
    rows = labelled(4)
    for k, r in enumerate(rows):
        n = len(r["steps"])
        r["mc_status"] = "ok"
        r["mc_value"] = [math.nan] * n if k < 2 else [None] * n if k == 2 else [0.5, math.inf] + [1.0] * (n - 2)
    text, figs = stats(write(tmp_path / "mc.parquet", rows))  # mc-label's view streams the shard
    assert "n/a (0 values)" in text and "NaN or infinite value(s) left out" in text
    no_nan(text, figs)
    finite_at_0 = [r["mc_value"][0] for r in rows if r["mc_value"][0] is not None and math.isfinite(r["mc_value"][0])]
    assert figs["value_by_position"][0] == sum(finite_at_0) / len(finite_at_0) == 0.5
    assert figs["value_by_position"][1] is None  # NaN, NaN, inf: nothing to average
    assert figs["value_by_position_not_finite"] == sum(len(r["steps"]) - 1 for r in rows[:2]) + 1

    # every other view with a mean or a share, on one shard read whole (prm-label's and likelihood's views)
    schema = extend_schema(TRAJECTORY_SCHEMA, REFERENCE_FIELDS + fields(mc_label.COLUMNS) + fields(prm_label.COLUMNS)
                           + fields(likelihood.COLUMNS))
    for r in rows:
        n = len(r["steps"])
        r.update(prm_status="ok", prm_score=[math.nan] * n, prm_first_error=-1, lh_status="ok",
                 lh_value=[math.nan] * n, lh_gain=[-math.inf] + [math.nan] * (n - 1), lh_first_error=-1,
                 outcome_correct=None)  # no graded row: outcome accuracy is 0/0
    text, figs = stats(write(tmp_path / "all.parquet", rows, schema))
    no_nan(text, figs)
    assert "n/a (0/0)" in text and figs["outcome_accuracy"] is None
    assert figs["prm_score_by_position"][0] == {"n": 4, "values": 0, "mean": None, "share_below_threshold": None}
    assert figs["lh_value_by_position"][0]["lh_value"] is None and figs["lh_value_by_position"][0]["lh_gain_values"] == 0
    assert text.count("n/a (0 values)") >= 3 * max(len(r["steps"]) for r in rows)  # prm mean, share; lh means


def test_n11_filter_balance_and_distinct_share_of_nothing_are_n_a(tmp_path):
    """The same class in the counted statistics: a label balance with no labels before or after a filter, and
    a distinct share with no prefix of two continuations, print n/a with their count (they printed ``-``)."""
    rows = labelled(4)
    for r in rows:
        r.update(mc_status="ok", mc_label=None)  # no step labels: mc_label's balance is 0 true / 0 false
    src = write(tmp_path / "in.parquet", rows)
    run_cli("filter", src, tmp_path / "out.parquet", "--rule", "steps:1-", "--no-progress",
            "--dropped", tmp_path / "dropped.parquet")
    text, figs = stats(tmp_path / "out.parquet")
    no_nan(text, figs)
    assert "│ mc_label │ 0 -> 0 │ 0 -> 0 │ n/a (0 labels) -> n/a (0 labels) │" in text
    text, figs = stats(src)
    assert figs["distinct_share"] is None and "n/a (0 prefixes with two continuations or more)" in text


def one_error_line(r, option: str, path) -> str:
    """The command failed with one ``error:`` line naming ``option`` and ``path``, and no traceback."""
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option} {path}: "), r.stderr
    return lines[0]


MISSING = "no such folder (nor a bundled model name: smollm2-135m)"
NO_TOKENIZER = "not a tokenizer folder (none of tokenizer.json, tokenizer_config.json"
WRONG = {  # kind of wrong path -> what a model option says, what a tokenizer option says
    "missing": (MISSING, MISSING), "file": ("not a folder", "not a folder"),
    "empty": ("not a model folder (no config.json)", NO_TOKENIZER), "config-only": (NO_TOKENIZER, NO_TOKENIZER)}


def wrong_paths(tmp_path) -> dict[str, object]:
    """Kind -> a path wrong that way: missing, a file, an empty folder, a folder with a config and no tokenizer."""
    tmp_path.mkdir()
    paths = {k: tmp_path / k for k in WRONG}
    paths["file"].write_text("x")
    paths["empty"].mkdir()
    paths["config-only"].mkdir()
    (paths["config-only"] / "config.json").write_text("{}")
    return paths


def test_n12_a_wrong_model_or_tokenizer_path_is_one_line_naming_the_option(tmp_path):
    """N12: ``export --tokenizer /nonexistent`` said transformers' ``Repo id must use alphanumeric chars …``.
    Every option that names a local model or tokenizer folder is checked in one place
    (``stepkit.models.check_folder``, under ``resolve_model`` / ``resolve_tokenizer``) before transformers or
    vLLM reads it: export --tokenizer, train-prm --base-model, the vllm engine's --model (prm-label's too),
    likelihood-label --reference-model, the openai engine's --tokenizer. Nothing is written."""
    from stepkit.engines.base import EngineSpec
    from stepkit.engines.openai_chat import local_tokenizer_path
    from stepkit.engines.vllm_engine import VLLMEngine
    from stepkit.errors import ConfigError
    from stepkit.stages.likelihood import LikelihoodConfig, LikelihoodStage
    from stepkit.stages.prm_label import PRMLabelConfig, PRMLabelStage

    src = write(tmp_path / "in.parquet", labelled(2))
    run_cli("export", src, tmp_path / "ds", "--labels", "mc_label")
    line = one_error_line(run_cli("export", src, tmp_path / "x", "--labels", "mc_label", "--tokenizer",
                                  "/nonexistent", check=False), "--tokenizer", "/nonexistent")
    assert line.endswith(MISSING) and "Repo id" not in line
    engine_side = {  # (constructed in process: no engine is loaded, the path is refused first)
        "vllm engine": (lambda p: VLLMEngine(str(p)), "--model", 0),
        "prm-label": (lambda p: PRMLabelStage(PRMLabelConfig(), EngineSpec("vllm", str(p)), None), "--model", 0),
        "likelihood-label": (lambda p: LikelihoodStage(LikelihoodConfig(method="implicit-prm", reference_model=str(p)),
                                                       EngineSpec("vllm", "smollm2-135m"), None), "--reference-model", 0),
        "openai engine": (lambda p: local_tokenizer_path("m", str(p)), "--tokenizer", 1)}
    for kind, path in wrong_paths(tmp_path / "wrong").items():
        model_says, tokenizer_says = WRONG[kind]
        r = run_cli("export", src, tmp_path / "x", "--labels", "mc_label", "--tokenizer", path, check=False)
        assert tokenizer_says in one_error_line(r, "--tokenizer", path), kind
        r = run_cli("train-prm", tmp_path / "ds", tmp_path / "m", "--base-model", path, check=False)
        assert model_says in one_error_line(r, "--base-model", path), kind
        assert not (tmp_path / "x").exists() and not (tmp_path / "m" / "stepkit-prm.json").exists()
        for name, (make, option, is_tokenizer) in engine_side.items():
            if name == "prm-label" and kind == "config-only":
                continue  # prm-label reads the kind from config.json at once; its vllm engine refuses the folder
            with pytest.raises(ConfigError) as e:
                make(path)
            assert str(e.value).startswith(f"{option} {path}: ") and (model_says, tokenizer_says)[is_tokenizer] in \
                str(e.value), (name, kind, str(e.value))


def processbench_rows(split: str, ids: list[str]) -> list[dict]:
    """The ProcessBench rows ``ids`` of ``split`` as trajectory rows (real steps, the human first error)."""
    from tests.conftest import DATA

    data = {d["id"]: d for d in json.loads((DATA / "processbench" / f"{split}.json").read_text())}
    return [{"id": i, "problem_id": i, "prompt": data[i]["problem"], "steps": data[i]["steps"], "step_separator": "\n\n",
             "outcome_correct": data[i]["final_answer_correct"], "generator": data[i]["generator"],
             "source": f"processbench/{split}/{i}", "reference_first_error": data[i]["label"]} for i in ids]


def test_n13_math_shepherd_lines_hold_one_marker_the_exports(tmp_path):
    """N13: a step that starts with the source's own marker of another number (ProcessBench gsm8k-233: an intro
    step, then ``Step 1: Raymond had $21 initially.`` as step 2) was written ``Step 2: Step 1: …``. The step's
    own leading markers (any number, ``### Step N:`` and ``**Step N:**`` too) are removed before the export's
    ``Step k:``, and counted; TRL's converter reads the rows back with one marker per completion."""
    from stepkit.stages.export import ExportConfig, export
    from tests.test_export_text import load, trl_math_shepherd

    rows = processbench_rows("gsm8k", ["gsm8k-233", "gsm8k-0"]) + processbench_rows("math", ["math-3", "math-9"])
    assert rows[0]["steps"][1].startswith("Step 1: Raymond") and rows[3]["steps"][4].startswith("### Step 1: ")
    inp = write(tmp_path / "in.parquet", rows)
    m = export(inp, tmp_path / "ms", ExportConfig(format="math-shepherd", labels="reference_first_error",
                                                  separator_in_step="rejoin"))
    ms = load(tmp_path / "ms")
    marker = re.compile(r"(#+\s*)?(\*\*)?step\s+\d+\s*:", re.IGNORECASE)
    renumbered = 0
    for row, rec in zip(rows, ms):
        lines = rec["input"][len(row["prompt"].strip()) + 1:].split("\n")
        assert len(lines) == len(row["steps"]) == rec["input"].count("ки")
        for k, (line, step) in enumerate(zip(lines, row["steps"])):
            assert line.startswith(f"Step {k + 1}: ") and line.endswith(" ки")
            assert not marker.match(line[len(f"Step {k + 1}: "):]), line  # never a second marker at its head
            own = marker.match(step.strip())
            renumbered += bool(own) and int(re.search(r"\d+", own.group(0)).group(0)) != k + 1
        got = trl_math_shepherd(rec)
        k = row["reference_first_error"]
        assert got["labels"] == [k == -1 or i < k for i in range(len(row["steps"]))]
    assert ms[0]["input"].split("\n")[1] == "Step 2: Raymond had $21 initially. ки"
    assert "Step 5: Find the points of intersection" in ms[3]["input"]
    assert renumbered >= 4 and m["counts"]["step_markers_renumbered"] == renumbered


def test_n13_tag_characters_and_a_second_step_1_in_the_first_step_are_refused(tmp_path):
    """The same class: whatever TRL's converter reads as a tag (``ки``, and ``ⶻ``, which it puts in ``ки``'s place
    before finding the tags) inside a step would make an extra step whose labels do not match, and a ``Step 1:``
    inside the first step's text (ProcessBench math-59: ``… ### Step 1: Square Both Sides``) splits its prompt
    in three: each is one line naming file, row, column and step, nothing written."""
    from stepkit.errors import InputError
    from stepkit.stages.export import ExportConfig, export

    cfg = ExportConfig(format="math-shepherd", labels="reference_first_error", separator_in_step="rejoin")
    row = processbench_rows("gsm8k", ["gsm8k-0"])[0]
    for text, says in (("so x = 3 ки", "holds 'ки' (step 1)"), ("so x = 3 ⶻ", "holds 'ⶻ' (step 1): the character")):
        bad = write(tmp_path / "bad.parquet", [{**row, "steps": [row["steps"][0], text, *row["steps"][2:]]}])
        with pytest.raises(InputError, match=re.escape(f"row 0, column 'steps': {says}")):
            export(bad, tmp_path / "x", cfg)
        assert not (tmp_path / "x").exists()
    m59 = write(tmp_path / "m59.parquet", processbench_rows("math", ["math-59"]))
    with pytest.raises(InputError, match=r"row 0, column 'steps': step 0 holds 'Step 1:' inside its text"):
        export(m59, tmp_path / "x", cfg)
    assert not (tmp_path / "x").exists()


def test_n11_show_prints_n_a_for_a_step_value_that_is_not_a_number(tmp_path):
    """N11, the rest of its class: ``show`` printed ``nan`` in a step's cell (mc-label's value and progress,
    prm-label's score, likelihood-label's value and gain, a label column no view declares). Each cell says
    ``n/a (NaN)`` / ``n/a (inf)``, a null says ``-``, and a finite value prints as before."""
    schema = extend_schema(TRAJECTORY_SCHEMA, REFERENCE_FIELDS + fields(mc_label.COLUMNS) + fields(prm_label.COLUMNS)
                           + fields(likelihood.COLUMNS))
    rows = labelled(1)
    n = len(rows[0]["steps"])
    rows[0].update(mc_successes=[1] * n, mc_rollouts=[4] * n, mc_truncated=[0] * n)
    rows[0].update(mc_status="ok", mc_value=[math.nan] + [0.25] * (n - 1), mc_progress=[math.inf] + [0.0] * (n - 1),
                   prm_status="ok", prm_score=[math.nan] * (n - 1) + [0.875], prm_first_error=-1, lh_status="ok",
                   lh_value=[math.nan] * n, lh_gain=[-math.inf] + [0.5] * (n - 1), lh_first_error=-1)
    text = run_cli("show", write(tmp_path / "nan.parquet", rows, schema)).stdout
    assert not re.search(r"\bnan\b|(?<![(-])\binf\b", text), text  # (a narrow table wraps "n/a (inf)")
    assert text.count("(NaN)") == 1 + (n - 1) + n and text.count("(inf)") == 1 and text.count("(-inf)") == 1
    assert "0.875" in text and "0.25" in text  # finite values as before
