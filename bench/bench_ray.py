"""``--executor ray`` against ``--executor local``: wall time of the same ``mc-label`` run on the same 4 shards,
in one run of this script, with the bundled model (vLLM on CPU).

Both are the ``stepkit`` command as a user runs it. ``local`` loads the engine once and labels the shards one
after another; ``ray`` starts a local Ray instance (the default of ``--ray-address``) and runs the shards on a
pool of Ray actors with ``--cpus-per-shard 2``, so on a 2-core machine one actor (never two engines at once),
which builds its engine once and labels all 4 shards with it. So the difference is Ray's start-up, the
actor's start and the shards' round trips; the labelling itself (``seconds (this run)`` in each shard's
manifest, which starts after the engine is loaded) is the same work. The script prints both wall times,
their ratio, the labelling seconds of each, and what is left: the engine load plus, for ray, Ray's overhead.

    python bench/bench_ray.py [--data ../shared/data] [--work out/bench/ray] [--rows-per-shard 4] [-k 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

STEPKIT = [sys.executable, "-m", "stepkit.cli"]


def stepkit(*args) -> float:
    """Run one stepkit command; its wall seconds (raises with its stderr when it fails)."""
    t0 = time.perf_counter()
    p = subprocess.run([*STEPKIT, *map(str, args)], capture_output=True, text=True,
                       env={**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR")})
    if p.returncode:
        raise SystemExit(f"stepkit {' '.join(map(str, args[:3]))} failed:\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0


def labelling_seconds(folder: Path) -> float:
    """Seconds spent inside the runner on the shards of ``folder`` (after each engine was loaded)."""
    return sum(json.loads(m.read_text())["run"]["seconds_this_run"] for m in folder.glob("*.manifest.json"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    ap.add_argument("--work", default="out/bench/ray")
    ap.add_argument("--rows-per-shard", type=int, default=4, help="real GSM8K solutions per shard (4 shards)")
    ap.add_argument("-k", "--continuations", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    shards = work / "in"
    shards.mkdir(parents=True)
    n = 4 * args.rows_per_shard
    stepkit("ingest", "gsm8k-solutions", Path(args.data) / "gsm8k" / "example_model_solutions.jsonl",
            work / "all.parquet", "--limit", (n + 3) // 4)  # 4 generators' solutions per problem
    table = pq.read_table(work / "all.parquet").slice(0, n)
    for i in range(4):
        pq.write_table(table.slice(i * args.rows_per_shard, args.rows_per_shard), shards / f"s{i}.parquet")
    common = ["--model", "smollm2-135m", "-k", args.continuations, "--max-tokens", args.max_tokens, "--no-progress"]

    local = stepkit("mc-label", shards, work / "local", *common)
    ray = stepkit("mc-label", shards, work / "ray", *common, "--executor", "ray", "--cpus-per-shard", "2")
    lab_local, lab_ray = labelling_seconds(work / "local"), labelling_seconds(work / "ray")
    figures = {"shards": 4, "rows": n, "continuations": args.continuations, "max_tokens": args.max_tokens,
               "local_seconds": round(local, 1), "ray_seconds": round(ray, 1), "ratio_ray_to_local": round(ray / local, 3),
               "local_labelling_seconds": round(lab_local, 1), "ray_labelling_seconds": round(lab_ray, 1),
               "local_other_seconds": round(local - lab_local, 1), "ray_other_seconds": round(ray - lab_ray, 1)}
    print(f"mc-label, 4 shards x {args.rows_per_shard} real GSM8K solutions, K={args.continuations}, "
          f"max_tokens={args.max_tokens}, smollm2-135m on CPU ({os.cpu_count()} cores)")
    print(f"  --executor local        {local:7.1f} s   (labelling {lab_local:6.1f} s, engine load + start-up "
          f"{local - lab_local:5.1f} s)")
    print(f"  --executor ray (local)  {ray:7.1f} s   (labelling {lab_ray:6.1f} s, Ray start-up + actor + engine load "
          f"{ray - lab_ray:5.1f} s)")
    print(f"  ratio ray / local       {ray / local:7.3f}   (target <= 1.15)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
