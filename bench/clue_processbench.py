"""Model-free label quality of ``clue_first_error`` on ProcessBench gsm8k, on a seeded half split.

Pipeline (all through the CLI, no model): ``ingest processbench`` (which attaches each row's GSM8K test
solution with its ``<<a=b>>`` annotations as ``reference_solution``) -> ``clue recover --from-reference``
-> ``clue score --match numeric`` -> ``eval processbench --pred clue_first_error`` on each half.

Split: a row is in the *tuning* half when ``int(sha256(id), 16) % 2 == 0``, else in the *held-out* half
(a fixed, stated split; no randomness). The first-error rule of ``stepkit.stages.clue`` was fixed looking
at the tuning half only; the held-out figure is the one to quote. A crude number-matching rule (first step
whose result is neither a reference intermediate value nor a problem number) reaches F1 46.6 on all rows.

    python bench/clue_processbench.py [--data ../shared/data] [--work /tmp/clue-pb] [--json report.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq


def cli(*args):
    subprocess.run([sys.executable, "-m", "stepkit.cli", *map(str, args)], check=True, capture_output=True, text=True)


def half_of(row_id: str) -> str:
    """``tune`` or ``heldout``: the stated split by the parity of sha256(id)."""
    return "tune" if int(hashlib.sha256(row_id.encode()).hexdigest(), 16) % 2 == 0 else "heldout"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--work", default="/tmp/clue-processbench")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    pb, clues, scored = work / "pb.parquet", work / "clues.parquet", work / "scored.parquet"
    cli("ingest", "processbench", Path(a.data) / "processbench" / "gsm8k.json", pb)
    cli("clue", "recover", pb, clues, "--from-reference", "--no-progress", "--force")
    cli("clue", "score", pb, scored, "--clues", clues, "--match", "numeric", "--no-progress", "--force")
    table = pq.read_table(scored)
    from stepkit.stages.evaluate import processbench_report

    report = {}
    for half in ("tune", "heldout"):
        keep = [half_of(i) == half for i in table.column("id").to_pylist()]
        path = work / f"scored-{half}.parquet"
        pq.write_table(table.filter(keep), path)
        s = processbench_report(path, "clue_first_error")["splits"]["gsm8k"]
        report[half] = {k: s[k] for k in ("rows", "n_erroneous", "n_correct", "acc_erroneous", "acc_correct", "f1",
                                          "missing", "f1_answered")}
        print(f"{half:8s} rows {s['rows']:3d}  acc erroneous {100 * s['acc_erroneous']:.1f}  acc correct "
              f"{100 * s['acc_correct']:.1f}  F1 {100 * s['f1']:.1f}  (missing {s['missing']}, F1 answered "
              f"{100 * s['f1_answered']:.1f})")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
