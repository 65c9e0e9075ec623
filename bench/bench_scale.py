"""Scale benchmark: how the time and memory of each command grow with the rows, on the scripted engine.

Real solutions: every GSM8K model solution of ``gsm8k/example_model_solutions.jsonl`` (1,319 problems x 4
generators = 5,276 rows, gold answers from ``gsm8k/test.jsonl``), repeated with new ids (and new problem
ids) until each size is reached. Each size goes through

    ingest jsonl -> mc-label -k 2 (scripted engine) -> filter -> export --format trl -> stats

each command a subprocess of its own (``python -m stepkit.cli``, progress off), timed by wall clock and
measured by the child's own peak RSS (``os.wait4``: ``ru_maxrss`` of that child only). Prints, per command
and size, seconds, seconds per 10k rows and peak RSS; then the slopes (least squares over the sizes:
seconds per 10k added rows, MB per 10k added rows) and the ratios the issue checks (time per 10k rows at
the largest size over the smallest; peak RSS largest over smallest).

    python bench/bench_scale.py [--data ../shared/data] [--sizes 5000,20000,50000] [--work DIR] [--json F]

Figures are one run on whatever machine runs it (the load average is printed): ratios within the run,
never absolute claims.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("STEPKIT_DATA", ROOT.parent / "shared" / "data"))
GENERATORS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")
FILTER_RULES = ("status:mc_status!=no_signal", "steps:2-", "truncate-after-first-error:mc_first_error")
COMMANDS = ("ingest", "mc-label", "filter", "export", "stats")


def real_solutions(data: Path) -> list[dict]:
    """The GSM8K model solutions as jsonl records: prompt, steps (one string, a step per line), reference.

    Raises:
        SystemExit: a data file is missing or a problem has no ``#### N`` gold answer (one line naming it).
    """
    sols, gold = data / "gsm8k" / "example_model_solutions.jsonl", data / "gsm8k" / "test.jsonl"
    for p in (sols, gold):
        if not p.exists():
            sys.exit(f"{p}: no such file (give --data, the folder with gsm8k/)")
    answers = {}
    for i, line in enumerate(gold.read_text().splitlines()):
        rec = json.loads(line)
        m = re.search(r"####\s*(.+)\s*$", rec["answer"])
        if not m:
            sys.exit(f"{gold}: row {i}: no '#### N' answer")
        answers[rec["question"]] = m.group(1).strip()
    out = []
    for i, line in enumerate(sols.read_text().splitlines()):
        rec = json.loads(line)
        for g in GENERATORS:
            if isinstance(rec.get(g), dict) and rec[g].get("solution"):
                out.append({"problem": i, "generator": g, "prompt": rec["question"],
                            "steps": rec[g]["solution"], "reference": answers.get(rec["question"])})
    return out


def write_input(base: list[dict], n: int, path: Path) -> None:
    """``n`` records: ``base`` repeated, copy ``c`` with ids ``c<c>-<problem>-<generator>``."""
    with path.open("w") as f:
        for k in range(n):
            c, r = divmod(k, len(base))
            b = base[r]
            f.write(json.dumps({"id": f"c{c}-{b['problem']}-{b['generator']}", "problem_id": f"c{c}-{b['problem']}",
                                "prompt": b["prompt"], "steps": b["steps"], "reference": b["reference"]}) + "\n")


def measure(argv: list[str], log: Path) -> tuple[float, float]:
    """Run ``python -m stepkit.cli *argv``; return (wall seconds, the child's peak RSS in MB).

    Raises:
        SystemExit: the command failed (its output is in ``log``, whose tail is printed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with log.open("w") as out:
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "stepkit.cli", *argv], stdout=out, stderr=subprocess.STDOUT,
                             env=env, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        secs = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        sys.exit(f"stepkit {' '.join(argv)} failed ({p.returncode}):\n{log.read_text()[-3000:]}")
    return secs, usage.ru_maxrss / 1024  # Linux: kilobytes


def run_size(n: int, base: list[dict], work: Path) -> dict[str, tuple[float, float]]:
    d = work / f"n{n}"
    d.mkdir(parents=True, exist_ok=True)
    src = d / "solutions.jsonl"
    write_input(base, n, src)
    steps = [
        ("ingest", ["ingest", "jsonl", str(src), str(d / "sols.parquet"), "--id-col", "id", "--prompt-col", "prompt",
                    "--steps-col", "steps", "--split", "newline", "--reference-col", "reference",
                    "--problem-id-col", "problem_id"]),
        ("mc-label", ["mc-label", str(d / "sols.parquet"), str(d / "mc.parquet"), "--engine", "scripted",
                      "--model", "scripted:echo", "-k", "2", "--no-progress", "--force"]),
        ("filter", ["filter", str(d / "mc.parquet"), str(d / "kept.parquet"), "--dropped", str(d / "dropped.parquet"),
                    *(a for r in FILTER_RULES for a in ("--rule", r)), "--no-progress", "--force"]),
        ("export", ["export", str(d / "kept.parquet"), str(d / "dataset"), "--format", "trl", "--labels", "mc_label",
                    "--force"]),
        ("stats", ["stats", str(d / "mc.parquet")]),
    ]
    out = {}
    for name, argv in steps:
        if name == "ingest":
            (d / "sols.parquet").unlink(missing_ok=True)
            (d / "sols.manifest.json").unlink(missing_ok=True)
        out[name] = measure(argv, d / f"{name}.log")
        print(f"  {n:>6} rows  {name:<9} {out[name][0]:7.1f} s  {out[name][1]:6.0f} MB", flush=True)
    return out


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--sizes", default="5000,20000,50000")
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "bench" / "scale")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    base = real_solutions(args.data)
    print(f"{len(base)} real GSM8K solutions, repeated with new ids to {', '.join(map(str, sizes))} rows; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    results = {n: run_size(n, base, args.work) for n in sizes}
    lo, hi = sizes[0], sizes[-1]
    print()
    head = f"{'command':<9}" + "".join(f"  {f'{n} rows: s, s/10k, MB':>26}" for n in sizes)
    print(head + f"  {'s per 10k rows added':>20}  {'MB per 10k added':>16}  {'s/10k ratio':>11}  {'RSS ratio':>9}")
    figs: dict = {"sizes": sizes, "loadavg": os.getloadavg(), "commands": {}}
    for c in COMMANDS:
        secs = [results[n][c][0] for n in sizes]
        rss = [results[n][c][1] for n in sizes]
        per10k = [s / n * 1e4 for s, n in zip(secs, sizes)]
        ts, ms = slope(sizes, secs) * 1e4, slope(sizes, rss) * 1e4
        cells = "".join(f"  {f'{s:.1f}, {p:.2f}, {m:.0f}':>26}" for s, p, m in zip(secs, per10k, rss))
        print(f"{c:<9}{cells}  {ts:>20.2f}  {ms:>16.1f}  {per10k[-1] / per10k[0]:>11.2f}  {rss[-1] / rss[0]:>9.2f}")
        figs["commands"][c] = {"seconds": secs, "seconds_per_10k": per10k, "peak_rss_mb": rss,
                               "slope_seconds_per_10k_rows": ts, "slope_mb_per_10k_rows": ms,
                               "per_10k_ratio": per10k[-1] / per10k[0], "rss_ratio": rss[-1] / rss[0]}
    print(f"(ratios: {hi} rows over {lo} rows; checks: s/10k ratio <= 1.2, RSS ratio <= 1.5 for filter, export, "
          f"stats; stats at {hi} rows under 5 s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figs, indent=2))


if __name__ == "__main__":
    main()
