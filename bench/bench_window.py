"""Benchmark (no model): requests in flight across chunks, with one chunk at a time against a window of chunks.

A stand-in engine answers each submitted request after a latency that grows with the number of samples
(``--latency`` s per sample, from its own threads, as many at once as are submitted: an engine whose batch
never fills), so the only thing that keeps it from being full is the stage and the runner. mcts-label (the
paper's order, one selection at a time per problem) and binary mc-label run over real GSM8K model solutions
(a deterministic policy reaches the gold answer with a chance falling with depth), with ``--chunks-in-flight``
1 (each chunk a barrier, as on main) and then the window. Printed per run: wall seconds, the mean requests
in flight, their mean per tenth of the run, and the share of the run below half of the peak (the tail).
The rows of every run are checked to be the same.

Prints what was measured in this run, never absolute claims.

Usage: python bench/bench_window.py [--solutions 64] [--windows 1,4,8] [--latency 0.004]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.window_cases import DATA, GoldPolicy  # noqa: E402 - the repository's root first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--solutions", type=int, default=64)
    ap.add_argument("--windows", default="1,4,8")
    ap.add_argument("--latency", type=float, default=0.004, help="seconds per sample of a request")
    args = ap.parse_args()

    from stepkit.engines.base import EngineSpec, SamplingConfig
    from stepkit.engines.scripted import ScriptedEngine
    from stepkit.grading.verify import AnswerChecker, checker_settings
    from stepkit.runner import run_stage
    from stepkit.shards import read_rows
    from stepkit.stages.ingest import IngestOptions, ingest
    from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage
    from stepkit.stages.mcts_label import MCTSConfig, MCTSLabelStage

    class Timed(ScriptedEngine):
        """Answers each request after ``latency * n`` s from a thread of its own; counts what is in flight."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.pool = concurrent.futures.ThreadPoolExecutor(256)
            self.lock, self.in_flight = threading.Lock(), 0

        def submit(self, request, sampling):
            with self.lock:
                self.in_flight += 1

            def answer():
                time.sleep(args.latency * request.n)
                try:
                    return self.generate([request], sampling)[0]
                finally:
                    with self.lock:
                        self.in_flight -= 1

            return self.pool.submit(answer)

        def close(self):
            pass

    tmp = Path(tempfile.mkdtemp(prefix="stepkit-bench-window-"))
    sol = tmp / "solutions.parquet"
    checker = AnswerChecker()
    ingest("gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", sol,
           IngestOptions(limit=args.solutions, generators=("175b_verification",)), checker, checker_settings())
    golds = {r["prompt"]: r["reference_answer"] for r in read_rows(sol)}
    n = len(golds)
    sampling = SamplingConfig(temperature=0.8, max_tokens=128)

    def measure(name, make, window):
        engine = Timed(GoldPolicy(golds), "scripted:gold")
        stage = make(EngineSpec.of(engine))
        samples, stop = [], threading.Event()

        def sample():
            while not stop.wait(0.01):
                samples.append(engine.in_flight)

        t = threading.Thread(target=sample, daemon=True)
        out = tmp / f"{name}-{window}.parquet"
        t0 = time.perf_counter()
        t.start()
        (res,) = run_stage(stage, sol, out, progress=False, chunks_in_flight=window)
        stop.set()
        t.join()
        dt = time.perf_counter() - t0
        peak = max(samples)
        tenths = [samples[len(samples) * k // 10:max(len(samples) * (k + 1) // 10, len(samples) * k // 10 + 1)]
                  for k in range(10)]
        print(f"{name:16s} window {window}: {res.chunks} chunks, {dt:6.2f} s, mean in flight "
              f"{sum(samples) / len(samples):5.1f}, peak {peak}, below half the peak {sum(x < peak / 2 for x in samples) / len(samples):4.0%} "
              f"of the run; per tenth: {' '.join(f'{sum(x) / len(x):.0f}' for x in tenths)}")
        return dt, read_rows(out)

    stages = {
        "mcts-label": lambda spec: MCTSLabelStage(MCTSConfig(continuations=4, search_limit=8, rollout_budget=48), spec,
                                                  sampling, lambda: checker),
        "mc-label binary": lambda spec: MCLabelStage(MCLabelConfig(continuations=4, mode="binary"), spec, sampling,
                                                     lambda: checker),
    }
    windows = [int(w) for w in args.windows.split(",")]
    print(f"{n} problems (real GSM8K solutions), {args.latency * 1000:.0f} ms per sample, each stage's default chunk size")
    for name, make in stages.items():
        runs = {w: measure(name, make, w) for w in windows}
        base = runs[windows[0]]
        assert all(rows == base[1] for _, rows in runs.values()), f"{name}: rows differ between windows"
        print(f"{name:16s} wall time window {windows[0]} / window w: " + ", ".join(
            f"w={w} x{base[0] / dt:.2f}" for w, (dt, _) in runs.items() if w != windows[0]) + " (rows identical)")
    checker.close()


if __name__ == "__main__":
    main()
