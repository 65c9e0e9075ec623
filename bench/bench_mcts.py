"""Benchmark: labelled steps per 1,000 continuations and engine fullness of mc-label (exhaustive, binary)
and mcts-label, on the same real solutions with one engine, in one run.

* Labelled steps: steps that get a label (a known or inferred value; the last step, whose value is the
  graded outcome itself, is not counted), per 1,000 continuations sampled. mcts-label is seeded with the
  same solutions and also labels the new rollouts of its trees.
* Engine fullness: generated tokens/s of binary mc-label and of mcts-label as a ratio to exhaustive
  mc-label's (one engine call per chunk, the engine as full as it gets). Both searches submit their next
  request when an answer arrives (the engine's asynchronous path), so the ratio shows whether the engine
  stays full while searches wait on each other (target >= 0.8).
* mcts-label's selections are one at a time per problem by default (the paper's order): with few
  problems the last, longest searches run nearly alone. ``--parallel-selections`` lets a problem's
  search work on several selections at once; its run is shown beside the default one.
* Together vs one at a time: mcts-label over all problems in one chunk, against one problem per chunk
  (each problem's search alone on the engine): the tokens/s ratio (sampled amounts differ run to run).
* Chunks: ``--chunk-size`` (default: every solution in one chunk; 0: each stage's own default, so a
  shard of 16 solutions is 2 mcts-label chunks) and ``--chunks-in-flight`` (the runner's window; left
  to the runner when not given, and not passed at all to a stepkit that has no such option, so the same
  script measures main before chunks overlapped).
* In flight: a sampler reads the engine's unfinished requests every 50 ms; each run prints their mean
  per tenth of its wall time and the share of its time below half of its peak (the tail).

Prints ratios measured in this run, never absolute claims.

Usage: python bench/bench_mcts.py [--solutions 16] [--k 4] [--max-tokens 128] [--search-limit 8] [--budget 48]
       [--parallel 8] [--chunk-size N] [--chunks-in-flight W] [--runs exhaustive,binary,mcts,mcts1,mcts-parallel]
"""

from __future__ import annotations

import argparse
import inspect
import os
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DATA = Path(os.environ.get("STEPKIT_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def labelled_steps(rows, label_col: str) -> int:
    """Steps with a non-null label, the last step of each row (its outcome) not counted."""
    return sum(sum(v is not None for v in (r.get(label_col) or [])[:-1]) for r in rows)


class InFlight:
    """Samples ``count()`` (the engine's unfinished requests) every ``every`` s in a thread while entered."""

    def __init__(self, count, every: float = 0.05):
        self.count, self.every, self.samples = count, every, []

    def __enter__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.every):
            try:
                self.samples.append(self.count())
            except Exception:  # noqa: BLE001 - a read racing the engine loop: skip the sample
                pass

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def trace(self) -> str:
        """Mean in flight per tenth of the run, the peak, and the share of samples below half the peak."""
        s = self.samples
        if not s:
            return "in flight: no samples"
        tenths = [s[len(s) * k // 10:max(len(s) * (k + 1) // 10, len(s) * k // 10 + 1)] for k in range(10)]
        peak = max(s)
        tail = sum(x < peak / 2 for x in s) / len(s)
        return (f"in flight per tenth: {' '.join(f'{sum(t) / len(t):.1f}' for t in tenths)}; peak {peak}; "
                f"below half the peak {tail:.0%} of the run")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--solutions", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--search-limit", type=int, default=8)
    ap.add_argument("--budget", type=int, default=48, help="mcts-label continuations per problem")
    ap.add_argument("--parallel", type=int, default=8, help="--parallel-selections of the second mcts-label run")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--chunk-size", type=int, default=None,
                    help="rows per chunk (default: all solutions in one chunk; 0: each stage's own default)")
    ap.add_argument("--chunks-in-flight", type=int, default=None, help="the runner's window (default: the runner's)")
    ap.add_argument("--runs", default="exhaustive,binary,mcts,mcts1,mcts-parallel")
    args = ap.parse_args()
    runs = set(args.runs.split(","))

    from stepkit.engines.base import EngineSpec, SamplingConfig
    from stepkit.engines.vllm_engine import VLLMEngine
    from stepkit.grading.verify import AnswerChecker, checker_settings
    from stepkit.prompts import DEFAULT_STOP
    from stepkit.runner import run_stage
    from stepkit.shards import read_manifest, read_rows
    from stepkit.stages.ingest import IngestOptions, ingest
    from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage
    from stepkit.stages.mcts_label import MCTSConfig, MCTSLabelStage

    tmp = Path(tempfile.mkdtemp(prefix="stepkit-bench-mcts-"))
    sol = tmp / "solutions.parquet"
    checker = AnswerChecker()
    ingest("gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", sol,
           IngestOptions(limit=args.solutions, generators=("175b_verification",)), checker, checker_settings())
    n = len(read_rows(sol))
    engine = VLLMEngine(args.model, seed=0)
    spec = EngineSpec.of(engine)
    sampling = SamplingConfig(temperature=0.8, top_p=1.0, max_tokens=args.max_tokens, stop=DEFAULT_STOP)

    class Shared:  # the engine and checker outlive each run
        def close(self):
            pass

    class MC(Shared, MCLabelStage):
        pass

    class MCTS(Shared, MCTSLabelStage):
        pass

    window = {}
    if args.chunks_in_flight is not None and "chunks_in_flight" in inspect.signature(run_stage).parameters:
        window = {"chunks_in_flight": args.chunks_in_flight}
    chunk = n if args.chunk_size is None else (args.chunk_size or None)
    unfinished = engine.llm.llm_engine.get_num_unfinished_requests
    print(f"chunk size {chunk or 'each stage default'}, "
          f"chunks in flight {window.get('chunks_in_flight', 'runner default' if 'chunks_in_flight' in inspect.signature(run_stage).parameters else 'none (one chunk at a time)')}")

    def measure(name, stage, chunk_size, label_col):
        engine.reset_prefix_cache()
        tok0, t = engine.stats.generated_tokens, time.perf_counter()
        out = tmp / f"{name}.parquet"
        with InFlight(unfinished) as flight:
            (res,) = run_stage(stage, sol, out, chunk_size=chunk_size, progress=False, **window)
        dt, toks = time.perf_counter() - t, engine.stats.generated_tokens - tok0
        cont = read_manifest(out)["counts"]["continuations"]
        steps = labelled_steps(read_rows(out), label_col)
        print(f"{name:22s} {dt:7.1f} s {toks:7d} tokens {toks / dt:7.1f} tok/s {cont:6d} continuations "
              f"{steps:5d} labelled steps ({1000 * steps / cont:6.1f} per 1,000 continuations), {res.chunks} chunks")
        print(f"{'':22s} {flight.trace()}")
        return {"seconds": dt, "tps": toks / dt, "cont": cont, "steps": steps}

    mcts = MCTSConfig(continuations=args.k, search_limit=args.search_limit, rollout_budget=args.budget)
    par = MCTSConfig(continuations=args.k, search_limit=args.search_limit, rollout_budget=args.budget,
                     parallel_selections=args.parallel)
    todo = {
        "exhaustive": lambda: measure("mc-label exhaustive", MC(MCLabelConfig(continuations=args.k), spec, sampling,
                                                                lambda: checker), chunk, "mc_label"),
        "binary": lambda: measure("mc-label binary", MC(MCLabelConfig(continuations=args.k, mode="binary"), spec,
                                                        sampling, lambda: checker), chunk, "mc_label"),
        "mcts": lambda: measure("mcts-label together", MCTS(mcts, spec, sampling, lambda: checker), chunk, "mcts_label"),
        "mcts1": lambda: measure("mcts-label one by one", MCTS(mcts, spec, sampling, lambda: checker), 1, "mcts_label"),
        "mcts-parallel": lambda: measure(f"mcts-label parallel {args.parallel}", MCTS(par, spec, sampling,
                                                                                      lambda: checker), chunk,
                                         "mcts_label"),
    }
    res = {k: run() for k, run in todo.items() if k in runs | {"exhaustive"}}
    ex = res["exhaustive"]
    print()
    print(f"solutions: {n}, K = {args.k}, max_tokens {args.max_tokens}; mcts-label: search limit "
          f"{args.search_limit}, budget {args.budget} continuations per problem")
    print("labelled steps per 1,000 continuations: " + ", ".join(
        f"{k} {1000 * v['steps'] / v['cont']:.1f}" for k, v in res.items() if k != "mcts1"))
    print("generated tokens/s ratio to exhaustive mc-label: " + ", ".join(
        f"{k} {v['tps'] / ex['tps']:.2f}" for k, v in res.items() if k not in ("exhaustive", "mcts1"))
        + " (targets: mcts >= 0.9, binary >= 0.95)")
    if "mcts" in res and "mcts1" in res:
        print(f"mcts-label all problems together vs one at a time: tokens/s x{res['mcts']['tps'] / res['mcts1']['tps']:.2f}, "
              f"wall time x{res['mcts1']['seconds'] / res['mcts']['seconds']:.2f} "
              f"({res['mcts']['cont']} vs {res['mcts1']['cont']} continuations)")
    checker.close()
    engine.close()


if __name__ == "__main__":
    main()
