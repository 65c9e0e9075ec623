"""stepkit report: the page's data on real ProcessBench rows (labelled by the scripted judge and by clue, flagged
by filter), τ-bench conversations and an mcts-label tree, the escaping of text, and the page itself in a real
headless Chromium (Debian's ``chromium``, driven by Playwright's Python API; ``make setup`` installs both): no
console error, no request but the file, filters that give the counts computed here from the shard, a row's
step labels as in the shard, and injection strings shown as text."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from stepkit.stages.report import ReportConfig, build, script_json, write_report
from tests.conftest import DATA, ROOT

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
INJECTIONS = ["<script>window.__pwned = 1</script>", "</div></td></tr></table><b id=\"pwn\">x</b>",
              "{{ 7*7 }} {{DATA}} {{JS}} {% if 1 %}", "[bold red]rich[/bold red] [link=https://x.invalid]y[/link]",
              "<img src=x onerror=\"window.__pwned = 2\">", "</script><script>window.__pwned = 3</script>",
              "<!-- \u2028 &amp; &lt;",
              "$\\href{javascript:window.__pwned=4}{x}$ \\(\\htmlId{pwn}{x}\\) $<img src=x onerror='window.__pwned=5'>$"]


def cli(*args):
    from stepkit.cli import main

    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output[-3000:]
    return r


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """16 real ProcessBench (GSM8K) rows: scripted judge, clue (from the reference solution), then
    ``filter --flag-only`` (consensus of the two)."""
    d = tmp_path_factory.mktemp("report")
    pb = d / "pb.parquet"
    cli("ingest", "processbench", DATA / "processbench" / "gsm8k.json", pb, "--sample", 16, "--seed", 3)
    cli("judge", pb, d / "j.parquet", "--engine", "scripted", "--model", "scripted:judge", "--no-progress")
    cli("clue", "recover", pb, d / "c.parquet", "--from-reference", "--no-progress")
    cli("clue", "score", d / "j.parquet", d / "s.parquet", "--clues", d / "c.parquet", "--no-progress")
    cli("filter", d / "s.parquet", d / "f.parquet", "--rule", "consensus:judge_label,clue_label", "--flag-only",
        "--no-progress")
    return d


@pytest.fixture(scope="module")
def labelled(shards):
    return shards / "f.parquet"


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make setup` (it installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def open_page(browser, path: Path, width=1300, height=900):
    """The page, loaded; with ``page.problems`` (console errors, page errors) and ``page.requests``."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.problems, page.requests = [], []
    page.on("console", lambda m: page.problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.problems.append(str(e)))
    page.on("request", lambda r: page.requests.append(r.url))
    page.goto(path.resolve().as_uri())
    page.wait_for_function("() => document.body.dataset.ready === '1'", timeout=10_000)
    return page


def count(page) -> int:
    page.wait_for_function("() => !document.body.dataset.pending")
    return int(page.get_attribute("#count", "data-count"))


def report(tmp_path, inputs, **kw) -> Path:
    out = tmp_path / "report.html"
    write_report([str(p) for p in inputs], ReportConfig(out=str(out), **kw))
    return out


# ---------------------------------------------------------------------------------------------- the data

def test_script_json_escapes_every_way_out_of_the_script_element():
    doc = {"t": INJECTIONS}
    s = script_json(doc)
    assert not re.search(r"[<>&\u2028\u2029]", s)
    assert json.loads(s) == doc


def test_labellers_are_found_from_declared_meaning(labelled):
    doc = build([str(labelled)], ReportConfig())
    rows = pq.read_table(labelled).to_pylist()
    labs = {lab["key"]: lab for lab in doc["labellers"]}
    assert list(labs) == ["reference", "judge", "clue"]  # human first; mc, lh, mcts absent
    assert labs["reference"]["human"] and labs["reference"]["first_error"] == "reference_first_error"
    assert labs["clue"] | {} == {**labs["clue"], "status": "clue_status", "labels": ["clue_label"],
                                 "values": ["clue_score"], "first_error": "clue_first_error"}
    assert labs["clue"]["scales"]["clue_score"] == ["score", 0.0, 2.0]
    s = doc["summary"]["clue"]
    assert s["rows"] == sum(r["clue_status"] == "ok" for r in rows)
    steps = [x for r in rows for x in r["clue_label"]]
    assert s["balance"]["clue_label"] == {"true": steps.count(True), "false": steps.count(False), "null": 0}
    assert sum(s["first_error"].values()) == len(rows)
    assert s["first_error"].get("1", 0) == sum(r["clue_first_error"] == 1 for r in rows)
    at0 = [r["clue_score"][0] for r in rows]
    assert s["by_position"]["clue_score"][0] == [0, round(sum(at0) / len(at0), 4), len(at0)]
    assert doc["filter_reasons"] == {k: sum((r["filter_reason"] or "kept") == k for r in rows)
                                     for k in {r["filter_reason"] or "kept" for r in rows}}
    r0 = next(r for r in doc["rows"] if r["id"] == rows[0]["id"])
    assert r0["c"]["clue_label"] == rows[0]["clue_label"] and r0["fe"]["reference"] == rows[0]["reference_first_error"]


def test_a_sample_is_carried_and_said_and_the_summary_covers_every_row(labelled, tmp_path):
    full, part = build([str(labelled)], ReportConfig()), build([str(labelled)], ReportConfig(sample=5, seed=1))
    assert (full["carried"], full["sampled"]) == (16, False) and (part["carried"], part["sampled"]) == (5, True)
    assert part["summary"] == full["summary"]
    assert [r["i"] for r in part["rows"]] == sorted(r["i"] for r in part["rows"])  # file order kept
    assert build([str(labelled)], ReportConfig(sample=5, all=True))["carried"] == 16


def test_an_export_folder_reads_through_its_format(shards, tmp_path):
    cli("export", shards / "s.parquet", tmp_path / "ds", "--format", "trl", "--labels", "clue_label")
    doc = build([str(tmp_path / "ds")], ReportConfig())
    (lab,) = doc["labellers"]
    assert lab["key"] == "export" and "clue_label" in lab["title"] and lab["labels"] == ["export_label"]
    exported = {r["id"]: r for f in (tmp_path / "ds" / "data").glob("*.parquet") for r in pq.read_table(f).to_pylist()}
    assert {r["id"]: r["c"]["export_label"] for r in doc["rows"]} == {k: r["labels"] for k, r in exported.items()}
    cli("export", shards / "s.parquet", tmp_path / "pbx", "--format", "processbench", "--labels", "clue_first_error")
    doc = build([str(tmp_path / "pbx")], ReportConfig())
    rows = pq.read_table(shards / "s.parquet").to_pylist()
    assert {r["id"]: r["fe"]["export"] for r in doc["rows"]} == {r["id"]: r["clue_first_error"] for r in rows}


def test_bad_input_is_one_line(tmp_path, labelled):
    from stepkit.cli import main

    pq.write_table(pa.table({"problem_id": ["p"], "prompt": ["x"]}), tmp_path / "problems.parquet")
    r = CliRunner().invoke(main, ["report", str(tmp_path / "problems.parquet"), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 1 and "holds problems, not trajectories" in r.output  # (issue 25, D12)
    pq.write_table(pa.table({"id": ["a"], "prompt": ["x"]}), tmp_path / "nosteps.parquet")
    r = CliRunner().invoke(main, ["report", str(tmp_path / "nosteps.parquet"), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 1 and "has no 'steps' column" in r.output
    r = CliRunner().invoke(main, ["report", str(labelled), "-o", str(tmp_path / "r.txt")])
    assert r.exit_code == 1 and "the report is an .html file" in r.output


def test_typeset_without_katex_is_one_line(labelled, tmp_path, monkeypatch):
    from stepkit.cli import main

    monkeypatch.setenv("STEPKIT_KATEX", str(tmp_path / "no-katex"))
    r = CliRunner().invoke(main, ["report", str(labelled), "--typeset", "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 1 and "--typeset:" in r.output and "libjs-katex" in r.output
    assert not (tmp_path / "r.html").exists()


def test_report_help_loads_no_heavy_module():
    from tests.test_import_weight import loaded

    got = loaded("from stepkit.cli import main\ntry:\n    main(['report', '--help'])\nexcept SystemExit as e:\n"
                 "    out = e.code")
    assert got == {"heavy": [], "out": 0}


# ---------------------------------------------------------------------------------------------- in Chromium

def test_the_page_filters_and_shows_the_shards_labels(browser, labelled, tmp_path):
    rows = pq.read_table(labelled).to_pylist()
    out = report(tmp_path, [labelled], page_size=5, title="ProcessBench gsm8k, 16 rows: scripted judge and clue")
    assert cli("report", labelled, "-o", tmp_path / "cli.html").output.startswith(f"wrote {tmp_path / 'cli.html'}")
    page = open_page(browser, out)
    assert page.problems == [] and page.requests == [out.resolve().as_uri()]
    assert page.get_attribute("#sample-note", "data-sampled") == "0"
    assert sorted(page.eval_on_selector_all("[data-labeller]", "es => es.map(e => e.dataset.labeller)")) == \
        ["clue", "judge", "reference"]
    assert count(page) == 16 and page.inner_text("#page") == "page 1 of 4"
    assert page.locator("#rows-table tbody tr").count() == 5
    page.click("#next")
    assert page.inner_text("#page") == "page 2 of 4"

    page.select_option("#outcome", "incorrect")
    assert count(page) == sum(r["outcome_correct"] is False for r in rows)
    page.select_option("#outcome", "")
    page.select_option("#status", json.dumps(["clue", "ok"], separators=(",", ":")))
    assert count(page) == sum(r["clue_status"] == "ok" for r in rows)
    page.select_option("#status", "")
    page.select_option("#dis-a", "reference")
    page.select_option("#dis-b", "clue")
    page.select_option("#dis-mode", "ne")
    differ = sum(r["reference_first_error"] != r["clue_first_error"] for r in rows)
    assert 0 < count(page) == differ < 16
    page.select_option("#dis-mode", "eq")
    assert count(page) == 16 - differ
    page.select_option("#dis-mode", "")
    fes = [{r["reference_first_error"], r["judge_first_error"], r["clue_first_error"]} - {None} for r in rows]
    page.select_option("#split", "some")
    assert 0 < count(page) == sum(len(f) >= 2 for f in fes)
    page.select_option("#split", "none")
    assert count(page) == sum(len(f) == 1 for f in fes)
    page.select_option("#split", "")
    page.select_option("#reason", "consensus")
    assert 0 < count(page) == sum(r["filter_reason"] == "consensus" for r in rows)
    page.select_option("#reason", "")
    step = rows[5]["steps"][1]
    page.fill("#search", step[:40].upper())
    assert count(page) == sum(any(step[:40].lower() in s.lower() for s in r["steps"]) for r in rows) >= 1
    page.fill("#search", "")
    assert count(page) == 16

    r = rows[5]
    page.fill("#search", r["id"])
    count(page)
    page.click(f"#rows-table tbody tr[data-id='{r['id']}']")
    assert page.inner_text("#row h2") == r["id"]
    labels = page.eval_on_selector_all("#steps td[data-col=clue_label]", "es => es.map(e => e.textContent)")
    assert labels == ["✓" if x else "✗ wrong" for x in r["clue_label"]]
    scores = page.eval_on_selector_all("#steps td[data-col=clue_score]", "es => es.map(e => Number(e.textContent))")
    assert scores == pytest.approx(r["clue_score"], abs=5e-4)
    human = page.eval_on_selector_all("#steps td[data-col=reference_first_error]", "es => es.map(e => e.textContent)")
    fe = r["reference_first_error"]
    assert human == ["✓" if fe == -1 or k < fe else "✗ first error" if k == fe else "(after)" for k in range(len(r["steps"]))]
    texts = page.eval_on_selector_all("#steps td.step", "es => es.map(e => e.textContent)")
    assert texts == r["steps"]
    assert page.problems == []
    shot = tmp_path / "report.png"
    page.fill("#search", "")
    assert count(page) == 16
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("STEPKIT_UPDATE_SCREENSHOT"):  # the README's picture: STEPKIT_UPDATE_SCREENSHOT=1 pytest ...
        (ROOT / "docs" / "images").mkdir(exist_ok=True)
        (ROOT / "docs" / "images" / "report.png").write_bytes(shot.read_bytes())
    page.close()


def test_injection_strings_render_as_text(browser, labelled, tmp_path):
    t = pq.read_table(labelled)
    n = t.num_rows

    def replaced(name, first):
        col = t.column(name).to_pylist()
        col[0] = first
        return t.set_column(t.schema.get_field_index(name), t.schema.field(name), pa.array(col, t.schema.field(name).type))

    t = replaced("id", INJECTIONS[0])
    prompt = INJECTIONS[1] + INJECTIONS[4] + INJECTIONS[3] + INJECTIONS[6] + INJECTIONS[7]
    t = replaced("prompt", prompt)
    steps = [INJECTIONS[k % len(INJECTIONS)] for k in range(len(t.column("steps")[0]))]  # (as many as labels)
    t = replaced("steps", steps)
    t = replaced("generator", INJECTIONS[5])
    t = replaced("filter_reason", INJECTIONS[2])
    path = tmp_path / "inj.parquet"
    pq.write_table(t, path)
    out = report(tmp_path, [path])
    text = out.read_text()
    for s in INJECTIONS:  # markup never reaches the file as markup; {{DATA}} and {{JS}} are not filled in
        assert (s not in text) if "<" in s else (s in text)
    assert text.count("<script") == 2 and text.count("</script>") == 2
    page = open_page(browser, out)
    assert page.problems == [] and page.evaluate("window.__pwned") is None
    assert page.locator("#pwn").count() == 0 and page.locator("img").count() == 0
    assert page.locator("script").count() == 2
    assert page.inner_text("#row h2") == INJECTIONS[0]
    assert page.text_content("#row .prompt") == prompt
    assert page.eval_on_selector_all("#steps td.step", "es => es.map(e => e.textContent)")[: len(steps)] == steps
    assert INJECTIONS[5] in page.text_content("#row .rowhead")
    page.select_option("#reason", INJECTIONS[2])
    assert count(page) == 1
    page.fill("#search", "{{ 7*7 }}")
    assert count(page) == 1 and n > 1
    assert page.title() == "inj.parquet · stepkit report"
    page.close()
    page = open_page(browser, report(tmp_path, [path], typeset=True))  # KaTeX reads the TeX, trusts none of it
    assert page.locator("#row .prompt .katex").count() >= 2
    assert page.problems == [] and page.evaluate("window.__pwned") is None
    assert page.locator("#pwn").count() == 0 and page.locator("img").count() == 0 and page.locator("a").count() == 0
    page.close()


def test_conversations_are_drawn_message_by_message(browser, tmp_path):
    tau = tmp_path / "tau.parquet"
    cli("ingest", "messages", DATA / "tau-bench" / "gpt-4o-airline.json", tau, "--limit", 3)
    cli("clue", "recover", tau, tmp_path / "clues.parquet", "--from-actions", "--no-progress")
    cli("clue", "score", tau, tmp_path / "scored.parquet", "--clues", tmp_path / "clues.parquet", "--no-progress")
    r = pq.read_table(tmp_path / "scored.parquet").to_pylist()[0]
    msgs = [*json.loads(r["prompt_messages"]), *(m for t in r["step_messages"] for m in json.loads(t))]
    page = open_page(browser, report(tmp_path, [tmp_path / "scored.parquet"]))
    assert page.problems == []
    assert page.locator("#row .msg").count() == len(msgs)
    roles = page.eval_on_selector_all("#row .msg .role", "es => es.map(e => e.textContent.split(/[ :]/)[0])")
    assert roles == [m["role"] for m in msgs]
    assert page.locator("#row .call").count() == sum(len(m.get("tool_calls") or []) for m in msgs)
    long_tools = sum(m["role"] == "tool" and len(m.get("content") or "") > 300 for m in msgs)
    assert long_tools and page.locator("#row .msg.tool details").count() == long_tools
    turns = page.eval_on_selector_all("#row .turn [data-col=clue_label]", "es => es.map(e => e.textContent)")
    assert turns == [f"clue_label {'✓' if x else '✗ wrong'}" for x in r["clue_label"]]
    page.close()


def test_an_mcts_tree_is_drawn_with_the_rows_path(browser, shards, tmp_path, checker):
    from stepkit.engines.base import EngineSpec, SamplingConfig
    from stepkit.engines.scripted import ScriptedEngine
    from stepkit.runner import run_stage
    from stepkit.stages.mcts_label import MCTSConfig, MCTSLabelStage

    seeds = tmp_path / "seeds.parquet"
    t = pq.read_table(shards / "pb.parquet")
    pq.write_table(t.slice(0, 2), seeds)
    rows = t.slice(0, 2).to_pylist()

    def policy(prompt, j, n):  # continuations succeed half the time from a prefix before the human first error
        r = next(r for r in rows if r["prompt"] in prompt)
        done = prompt.split("<|assistant|>\n", 1)[1]
        k = sum(1 for s in r["steps"] if s in done)
        fe = r["reference_first_error"]
        ok = (fe == -1 or k <= fe) and j % 2 == 0
        return f"We go on from step {k} (way {j}).\nThen one more step.\nThe answer is {r['reference_answer'] if ok else '-7'}."

    cfg = MCTSConfig(continuations=4, search_limit=3, tree_out=str(tmp_path / "tree.parquet"))
    stage = MCTSLabelStage(cfg, EngineSpec.of(ScriptedEngine(policy, "scripted:report")), SamplingConfig(max_tokens=64),
                           lambda: checker)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:  # (asyncio.run, away from the loop of Playwright's sync API)
        pool.submit(run_stage, stage, seeds, tmp_path / "m.parquet", progress=False).result()
    nodes = pq.read_table(tmp_path / "tree.parquet").to_pylist()
    out_rows = pq.read_table(tmp_path / "m.parquet").to_pylist()
    row = next(r for r in out_rows if r["id"] == rows[0]["id"])
    tree = [n for n in nodes if n["problem_id"] == row["problem_id"]]
    assert len(tree) > 2
    page = open_page(browser, report(tmp_path, [tmp_path / "m.parquet"]))  # the tree found from the manifest
    assert page.problems == []
    page.click(f"#rows-table tbody tr[data-id='{row['id']}']")
    assert page.locator("#tree g[data-node]").count() == len(tree)
    marked = page.eval_on_selector_all("#tree g[data-node] circle[stroke-width='3']",
                                       "es => es.map(e => e.parentNode.dataset.node)")
    root = next(n["node_id"] for n in tree if n["parent_id"] is None).rsplit("/", 1)[-1]
    assert sorted(marked) == sorted({root, *(x.rsplit("/", 1)[-1] for x in row["mcts_node_id"] if x)})
    page.close()


def test_latex_is_typeset_by_the_local_katex_only_when_asked(browser, labelled, tmp_path):
    rows = pq.read_table(labelled).to_pylist()
    r = next(r for r in rows if any("\\(" in x or "\\[" in x for x in r["steps"]))
    assert "KaTeX_AMS" not in report(tmp_path, [labelled]).read_text()  # no KaTeX without --typeset
    out = report(tmp_path, [labelled], typeset=True)
    assert out.stat().st_size < 2e6
    page = open_page(browser, out)
    assert page.problems == [] and all(u.startswith("data:") for u in page.requests[1:])  # fonts inline
    page.fill("#search", r["id"])
    count(page)
    page.click(f"#rows-table tbody tr[data-id='{r['id']}']")
    assert page.locator("#steps td.step .katex").count() > 0
    page.uncheck("#typeset")
    assert page.locator("#steps .katex").count() == 0
    assert page.eval_on_selector_all("#steps td.step", "es => es.map(e => e.textContent)") == r["steps"]
    assert page.problems == []
    page.close()
