"""Benchmark: the same continuation requests through the `openai` engine (a real OpenAI-compatible vLLM
server on 127.0.0.1) and the offline `vllm` engine, in one run.

The request set is mc-label's exhaustive set for 16 real GSM8K solutions (K continuations of every step
prefix). Both engines stay loaded; the sides alternate (openai, offline, offline, openai) and each side's
prefix cache is reset before it runs. Prints the generated tokens/s of each engine and their ratio
(target: openai within 1.3x of offline on this machine). Ratios, never absolute claims.

Usage: python bench/bench_engines.py [--solutions 16] [--k 4] [--max-tokens 128] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # lets the server's prefix cache be reset between sides
DATA = Path(os.environ.get("STEPKIT_DATA", ROOT.parent / "shared" / "data"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--solutions", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()

    from stepkit.engines.base import Request, SamplingConfig
    from stepkit.engines.openai_engine import OpenAIEngine
    from stepkit.engines.vllm_engine import VLLMEngine
    from stepkit.grading.verify import AnswerChecker, checker_settings
    from stepkit.models import resolve_model
    from stepkit.prompts import DEFAULT_STOP, render_continuation
    from stepkit.shards import read_rows
    from stepkit.stages.ingest import IngestOptions, ingest
    from tests.servers import vllm_server

    tmp = Path(tempfile.mkdtemp(prefix="stepkit-bench-"))
    with AnswerChecker() as checker:
        ingest("gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", tmp / "sol.parquet",
               IngestOptions(limit=args.solutions, generators=("175b_verification",)), checker, checker_settings())
    rows = read_rows(tmp / "sol.parquet")
    sampling = SamplingConfig(temperature=0.8, max_tokens=args.max_tokens, stop=DEFAULT_STOP)

    with vllm_server(resolve_model("smollm2-135m")) as url:
        print(f"server ready in {url.server.start_seconds[-1]:.0f} s")
        remote = OpenAIEngine("smollm2-135m", base_url=url, concurrency=args.concurrency)
        t0 = time.perf_counter()
        local = VLLMEngine("smollm2-135m", seed=0)
        print(f"offline engine loaded in {time.perf_counter() - t0:.0f} s")
        requests = [Request(render_continuation(local, r["prompt"], r["steps"], r["step_separator"], i), args.k)
                    for r in rows for i in range(len(r["steps"]))]
        assert all(render_continuation(remote, r["prompt"], r["steps"], r["step_separator"], 0)
                   == render_continuation(local, r["prompt"], r["steps"], r["step_separator"], 0) for r in rows)

        def side(name):
            eng = remote if name == "openai" else local
            if not eng.reset_prefix_cache():
                print(f"warning: could not reset the {name} prefix cache")
            tok0 = eng.stats.generated_tokens
            t = time.perf_counter()
            eng.generate(requests, sampling)
            return time.perf_counter() - t, eng.stats.generated_tokens - tok0

        res = {"openai": [], "offline": []}
        for name in ("openai", "offline", "offline", "openai"):
            dt, tok = side(name)
            res[name].append((dt, tok))
            print(f"{name:8s} {dt:7.1f} s  {tok:6d} tokens  {tok / dt:6.1f} tok/s")
        tps = {k: sum(t for _, t in v) / sum(d for d, _ in v) for k, v in res.items()}
        print()
        print(f"requests: {len(requests)} x {args.k} continuations, max_tokens {args.max_tokens}, "
              f"openai concurrency {args.concurrency}, retries {remote.stats.extra.get('retries', 0)}")
        print(f"tokens/s: offline {tps['offline']:.1f}, openai {tps['openai']:.1f}; "
              f"offline / openai = {tps['offline'] / tps['openai']:.3f} (target <= 1.3)")
        remote.close()
        local.close()


if __name__ == "__main__":
    main()
