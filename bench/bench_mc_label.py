"""Benchmark: `mc-label` against plain `vllm.LLM.generate` over the identical continuation requests.

Same engine instance, same run: the mc-label side goes through stepkit's runner (chunking, rendering,
grading with math-verify, Parquet output, manifest); the plain side hands the very same rendered prompts
and SamplingParams to `LLM.generate` and does nothing else. The prefix cache is reset before each side and
the sides alternate over two repetitions (A B, B A). Prints ratios measured in this run, never absolute
claims, plus the prefix-cache hit rate and continuations per solution in exhaustive vs binary mode.

Usage: python bench/bench_mc_label.py [--solutions 16] [--k 4] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DATA = Path(os.environ.get("STEPKIT_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--solutions", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args()

    from stepkit.engines.base import EngineSpec, Request, SamplingConfig
    from stepkit.engines.vllm_engine import VLLMEngine
    from stepkit.grading.verify import AnswerChecker, checker_settings
    from stepkit.prompts import DEFAULT_STOP, render_continuation
    from stepkit.runner import run_stage
    from stepkit.shards import read_manifest, read_rows
    from stepkit.stages.ingest import IngestOptions, ingest
    from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage

    tmp = Path(tempfile.mkdtemp(prefix="stepkit-bench-"))
    sol = tmp / "solutions.parquet"
    checker = AnswerChecker()
    ingest("gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", sol,
           IngestOptions(limit=args.solutions, generators=("175b_verification",)), checker, checker_settings())
    rows = read_rows(sol)

    t0 = time.perf_counter()
    engine = VLLMEngine(args.model, seed=0)
    print(f"engine loaded in {time.perf_counter() - t0:.0f} s ({engine.describe()['device']})")
    sampling = SamplingConfig(temperature=0.8, top_p=1.0, max_tokens=args.max_tokens, stop=DEFAULT_STOP)

    class SharedEngineStage(MCLabelStage):
        def close(self):  # the engine and checker outlive each run
            pass

    def stage(mode):
        return SharedEngineStage(MCLabelConfig(continuations=args.k, mode=mode), EngineSpec.of(engine), sampling,
                                 lambda: checker)

    # The exhaustive request set: K continuations of every prefix steps[:i], i = 0..M-1.
    requests = [Request(render_continuation(engine, r["prompt"], r["steps"], r["step_separator"], i), args.k)
                for r in rows for i in range(len(r["steps"]))]
    params = engine.sampling_params(sampling, n=args.k)

    def side_stepkit(rep):
        engine.reset_prefix_cache()
        q0, h0 = engine._read_prefix_counters()
        tok0 = engine.stats.generated_tokens
        t = time.perf_counter()
        run_stage(stage("exhaustive"), sol, tmp / f"labeled-{rep}.parquet", chunk_size=len(rows), progress=False)
        dt = time.perf_counter() - t
        q1, h1 = engine._read_prefix_counters()
        return dt, engine.stats.generated_tokens - tok0, (h1 - h0) / max(q1 - q0, 1)

    def side_plain(rep):
        engine.reset_prefix_cache()
        q0, h0 = engine._read_prefix_counters()
        t = time.perf_counter()
        outs = engine.llm.generate([r.prompt for r in requests], params, use_tqdm=False)
        dt = time.perf_counter() - t
        q1, h1 = engine._read_prefix_counters()
        return dt, sum(len(s.token_ids) for o in outs for s in o.outputs), (h1 - h0) / max(q1 - q0, 1)

    results = {"stepkit": [], "plain": []}
    for rep, order in enumerate([("stepkit", "plain"), ("plain", "stepkit")]):
        for side in order:
            r = (side_stepkit if side == "stepkit" else side_plain)(rep)
            results[side].append(r)
            print(f"rep {rep} {side:8s} {r[0]:7.1f} s  {r[1]:6d} tokens  {r[1] / r[0]:6.1f} tok/s  "
                  f"prefix-cache hit rate {r[2]:.2f}")

    # Binary mode: continuations per solution (its request set depends on the answers, so it is not timed
    # against the plain side).
    run_stage(stage("binary"), sol, tmp / "labeled-binary.parquet", chunk_size=len(rows), progress=False)
    ex = read_manifest(tmp / "labeled-0.parquet")["counts"]["continuations"]
    bi = read_manifest(tmp / "labeled-binary.parquet")["counts"]["continuations"]

    wall = {k: sum(x[0] for x in v) for k, v in results.items()}
    toks = {k: sum(x[1] for x in v) for k, v in results.items()}
    n = len(rows)
    print()
    print(f"solutions: {n}, steps: {sum(len(r['steps']) for r in rows)}, K = {args.k}, "
          f"continuation requests: {len(requests)} x {args.k}, max_tokens {args.max_tokens}")
    print(f"wall-time ratio mc-label / plain LLM.generate: {wall['stepkit'] / wall['plain']:.3f} "
          f"(target <= 1.10; per repetition: "
          f"{', '.join(f'{a[0] / b[0]:.3f}' for a, b in zip(results['stepkit'], results['plain']))})")
    print(f"per-token time ratio (sampled lengths differ between sides): "
          f"{(wall['stepkit'] / toks['stepkit']) / (wall['plain'] / toks['plain']):.3f}")
    print(f"prefix-cache hit rate: mc-label {sum(x[2] for x in results['stepkit']) / 2:.2f}, "
          f"plain {sum(x[2] for x in results['plain']) / 2:.2f}")
    print(f"continuations per solution: exhaustive {ex / n:.1f}, binary {bi / n:.1f} "
          f"(ratio {bi / ex:.2f})")
    checker.close()
    engine.close()


if __name__ == "__main__":
    main()
