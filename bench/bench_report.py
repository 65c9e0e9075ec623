"""``stepkit report`` on a 50,000-row shard: seconds to write the page, its size, and how soon it is
interactive in a real headless Chromium (Debian's ``chromium`` driven by Playwright, as in tests/test_report.py).

The shard: every ProcessBench row (gsm8k 400 + math 1,000, real steps and human first errors) labelled with
no model (``judge --engine scripted --model scripted:judge``; the gsm8k rows also ``clue recover
--from-reference`` + ``clue score``, then ``filter --flag-only --rule consensus:judge_label,clue_label``; the math
rows, which have no annotated reference solution, ``filter --flag-only --rule steps:1-12``); the 1,400 rows are repeated with new ids and
problem ids up to ``--rows``. Measured, for the default page (a 2,000-row sample) and for ``--all``:

* ``write_s``: ``write_report`` wall time (read, summary over every row, sample, HTML), in this process;
* ``mb``: the file's size;
* ``ready_ms``: from navigation to the script's last line (``document.body.dataset.ready``), read from the
  page's own ``performance.now()``; ``filter_ms``: a status filter's change handler (filter and redraw), timed
  in the page; ``search_ms``: a text search, from the Python call to the updated count, less the page's 120 ms
  typing pause.

Bounds (issue 27): written in under 10 s, under 20 MB, interactive in under 2 s; the script exits 1 when the
default page misses one.

    python bench/bench_report.py [--data ../shared/data] [--work out/bench/report] [--rows 50000] [--json F]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def cli(*args):
    subprocess.run([sys.executable, "-m", "stepkit.cli", *map(str, args)], check=True, capture_output=True, text=True)


def labelled(data: Path, work: Path) -> Path:
    """The 1,400 ProcessBench rows, labelled without a model (see the module docstring)."""
    out = work / "flagged.parquet"
    if out.exists():
        return out
    for split in ("gsm8k", "math"):
        cli("ingest", "processbench", data / "processbench" / f"{split}.json", work / "pb" / f"{split}.parquet")
    cli("judge", work / "pb", work / "judged", "--engine", "scripted", "--model", "scripted:judge", "--no-progress")
    cli("clue", "recover", work / "pb" / "gsm8k.parquet", work / "clues.parquet", "--from-reference", "--no-progress")
    cli("clue", "score", work / "judged" / "gsm8k.parquet", work / "scored" / "gsm8k.parquet", "--clues",
        work / "clues.parquet", "--no-progress")
    cli("filter", work / "scored" / "gsm8k.parquet", work / "flagged" / "gsm8k.parquet", "--rule",
        "consensus:judge_label,clue_label", "--flag-only", "--no-progress")
    cli("filter", work / "judged" / "math.parquet", work / "flagged" / "math.parquet", "--rule", "steps:1-12",
        "--flag-only", "--no-progress")
    tables = [pq.read_table(p) for p in sorted((work / "flagged").glob("*.parquet"))]
    pq.write_table(pa.concat_tables(tables, promote_options="default"), out)
    return out


def tiled(base: Path, rows: int, out: Path) -> Path:
    """``base`` repeated to ``rows`` rows, ids and problem ids made unique (``<id>~<k>``)."""
    t = pq.read_table(base)
    reps = []
    for k in range(-(-rows // t.num_rows)):
        c = t
        for name in ("id", "problem_id"):
            i = c.schema.get_field_index(name)
            c = c.set_column(i, c.schema.field(name), pa.array([f"{x}~{k}" for x in c.column(name).to_pylist()]))
        reps.append(c)
    pq.write_table(pa.concat_tables(reps).slice(0, rows), out)
    return out


def in_browser(path: Path) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = b.new_page(viewport={"width": 1300, "height": 900})
        problems = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        t0 = time.perf_counter()
        page.goto(path.resolve().as_uri())
        page.wait_for_function("() => document.body.dataset.ready === '1'", timeout=60_000)
        wall = time.perf_counter() - t0
        ready = float(page.get_attribute("body", "data-ready-ms"))
        status = page.eval_on_selector_all("#status option", "es => es.map(e => e.value)")[1]
        filt = page.evaluate("""(v) => {  // the change handler filters and redraws synchronously
            const el = document.getElementById("status"), t = performance.now();
            el.value = v;
            el.dispatchEvent(new Event("change"));
            return (performance.now() - t) / 1000;
        }""", status)
        t0 = time.perf_counter()
        page.fill("#search", "total weight")
        page.wait_for_function("() => !document.body.dataset.pending")
        search = time.perf_counter() - t0 - 0.12  # less the page's typing pause
        count = int(page.get_attribute("#count", "data-count"))
        b.close()
    return {"ready_ms": round(ready), "load_wall_s": round(wall, 2), "filter_ms": round(1000 * filt),
            "search_ms": round(1000 * search), "search_matches": count, "console_errors": problems}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--work", default="out/bench/report")
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    big = tiled(labelled(Path(a.data), work), a.rows, work / f"rows-{a.rows}.parquet")
    from stepkit.stages.report import ReportConfig, write_report

    result: dict = {"rows": a.rows, "shard_mb": round(big.stat().st_size / 1e6, 1)}
    for name, kw in (("default", {}), ("all", {"all": True})):
        out = work / f"report-{name}.html"
        w = write_report([str(big)], ReportConfig(out=str(out), **kw))
        result[name] = {"carried": w["carried"], "write_s": round(w["seconds"], 2), "mb": round(w["bytes"] / 1e6, 1),
                        **in_browser(out)}
        print(f"{name:8s} rows carried {w['carried']:6d}  written {w['seconds']:.2f} s  {w['bytes'] / 1e6:.1f} MB  "
              f"ready {result[name]['ready_ms']} ms  filter {result[name]['filter_ms']} ms  "
              f"search {result[name]['search_ms']} ms  console errors {len(result[name]['console_errors'])}")
    d = result["default"]
    result["ok"] = d["write_s"] < 10 and d["mb"] < 20 and d["ready_ms"] < 2000 and not d["console_errors"]
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    print("within the bounds (10 s, 20 MB, 2 s)" if result["ok"] else "OUT OF BOUNDS", json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
