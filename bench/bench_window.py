"""Benchmark (no model): how full stepkit keeps an engine of fixed batch capacity, across chunks.

A stand-in engine models continuous batching: it decodes at most ``--slots`` sequences at once (vLLM's
running batch), each sample holding a slot for ``--step`` s per generated token (one decoding step per
token, its time independent of how many sequences share it), the rest waiting in a first-come queue. So
its generated tokens/s is ``slots / step`` exactly when every slot is busy, and falls with the slots left
idle: the only thing that can leave them idle is the stage and the runner not having requests out.
Each sample of a request finishes on its own (``submit_each``, as a sequence leaves vLLM's batch), so
a binary-search probe can be decided by its first correct sample.

On real GSM8K model solutions (a deterministic policy reaches the gold answer with a chance falling with
depth, ``tests.window_cases.GoldPolicy``), for each ``--solutions`` count: exhaustive mc-label with the
runner's default window (every request of a chunk sent at once, chunks overlapping: the engine as full as
it gets, the reference), then exhaustive mc-label with ``--chunks-in-flight`` 1 (each chunk a barrier, as
exhaustive mode ran before it joined the asynchronous path), mcts-label (the paper's order, one selection
at a time per problem) and binary mc-label, each of the last two with ``--chunks-in-flight`` 1 and with the
runner's default window. Printed per run: wall seconds, generated tokens/s, the busy
slots' mean per tenth of the run, and the share of the run with fewer than half the slots busy (the tail);
then each run's tokens/s as a ratio to exhaustive mc-label's (targets: mcts-label >= 0.9, binary mc-label
>= 0.95). The rows of the runs of one stage are checked to be the same whatever the window.

Then the slot-seconds each run left idle (``slots x wall - tokens x step``, exact in this engine) and what
that adds to the reference's: the end of every run leaves slots idle while its last samples finish (a
drain about one sample long, whatever the run's length), so a run with less work than the reference has a
lower ratio even when it leaves no more slots idle; printed beside it, the ratio a run of its tokens would
have with exactly the reference's idle slot-seconds.

Prints what was measured in this run, never absolute claims.

With ``--repeat N`` each measurement runs N times and the ratios are of the medians.

Usage: python bench/bench_window.py [--solutions 16,64] [--windows 1,default] [--slots 64] [--step 0.02] [--repeat 1]
       [--k K]   (K: default each stage's own, the paper's 8; the targets are for the defaults)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.window_cases import DATA, GoldPolicy  # noqa: E402 - the repository's root first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--solutions", default="16,64", help="problem counts, comma-separated")
    ap.add_argument("--windows", default="1,default", help="--chunks-in-flight values ('default': the runner's)")
    ap.add_argument("--slots", type=int, default=64, help="sequences the engine decodes at once")
    ap.add_argument("--step", type=float, default=0.02, help="seconds per decoding step (one token per sequence)")
    ap.add_argument("--k", type=int, default=None,
                    help="K, continuations per probe (default: both stages' own default, the paper's 8)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each measurement; ratios from their medians "
                    "(a 16-problem run lasts about a second: a loaded machine's stalls weigh on one run)")
    args = ap.parse_args()

    from stepkit.engines.base import EngineSpec, SamplingConfig
    from stepkit.engines.scripted import ScriptedEngine
    from stepkit.grading.verify import AnswerChecker, checker_settings
    from stepkit.runner import run_stage
    from stepkit.shards import read_rows
    from stepkit.stages.ingest import IngestOptions, ingest
    from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage
    from stepkit.stages.mcts_label import MCTSConfig, MCTSLabelStage

    if args.k is None:  # the targets are for each stage's defaults; the two agree (checked here)
        assert MCLabelConfig().continuations == MCTSConfig().continuations
        args.k = MCLabelConfig().continuations

    class Batched(ScriptedEngine):
        """The scripted policy's answers, each sample decoded in one of ``slots`` slots for ``step`` s per token."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.slots = concurrent.futures.ThreadPoolExecutor(args.slots)  # its queue: first come, first served
            self.lock, self.busy, self.requests = threading.Lock(), 0, 0

        def _decode(self, tokens: int) -> None:
            with self.lock:
                self.busy += 1
            time.sleep(args.step * tokens)
            with self.lock:
                self.busy -= 1

        def submit_each(self, request, sampling):  # each sample done when its own decoding is (as vLLM's)
            samples = super().generate([request], sampling)[0]  # the policy's answers (counts the tokens)
            parts = [concurrent.futures.Future() for _ in samples]
            left = [len(samples)]
            with self.lock:
                self.requests += 1

            def one_done(_, part, c):
                with self.lock:
                    left[0] -= 1
                    if left[0] == 0:
                        self.requests -= 1
                part.set_result(c)

            for part, c in zip(parts, samples):
                self.slots.submit(self._decode, max(1, c.num_tokens)).add_done_callback(
                    lambda f, part=part, c=c: one_done(f, part, c))
            return parts

        def submit(self, request, sampling):  # the whole request: done when its last sample is
            parts = self.submit_each(request, sampling)
            done: concurrent.futures.Future = concurrent.futures.Future()
            left = [len(parts)]
            lock = threading.Lock()

            def one(_):
                with lock:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    done.set_result([p.result() for p in parts])

            for p in parts:
                p.add_done_callback(one)
            return done

        def generate(self, requests, sampling):  # one engine call: every sample queued at once
            futures = [self.submit(r, sampling) for r in requests]
            return [f.result() for f in futures]

        def close(self):
            pass

    import inspect

    default_window = inspect.signature(run_stage).parameters["chunks_in_flight"].default
    windows = [default_window if w == "default" else int(w) for w in args.windows.split(",")]
    sampling = SamplingConfig(temperature=0.8, max_tokens=128)
    class Kept(AnswerChecker):
        """The one checker of every run: a stage's close leaves its pool running (a fresh pool would
        start, spawn and import sympy, inside the next run's timing)."""

        def close(self):
            pass

    tmp = Path(tempfile.mkdtemp(prefix="stepkit-bench-window-"))
    checker = Kept()
    print(f"engine: {args.slots} slots, {args.step * 1000:g} ms per decoding step ({args.slots / args.step:.0f} "
          f"tokens/s when full); K = {args.k}; each stage's default chunk size; window 'None': the runner's default")
    for n_sol in [int(s) for s in args.solutions.split(",")]:
        sol = tmp / f"solutions-{n_sol}.parquet"
        ingest("gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", sol,
               IngestOptions(limit=n_sol, generators=("175b_verification",)), checker, checker_settings())
        golds = {r["prompt"]: r["reference_answer"] for r in read_rows(sol)}

        def measure(name, make, window):
            """The median tokens/s and idle slot-seconds of ``--repeat`` runs (each printed), the generated
            tokens and the rows (both checked the same each time)."""
            got = [measure_once(name, make, window, rep) for rep in range(args.repeat)]
            assert all(g[2:] == got[0][2:] for g in got), f"{name}: rows or tokens differ between repeats"
            return (statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)) + got[0][2:]

        def measure_once(name, make, window, rep, golds=golds, sol=sol, n_sol=n_sol):
            engine = Batched(GoldPolicy(golds), "scripted:gold")
            stage = make(EngineSpec.of(engine))
            samples, stop = [], threading.Event()

            def sample():
                while not stop.wait(0.01):
                    samples.append(engine.busy)

            t = threading.Thread(target=sample, daemon=True)
            out = tmp / f"{name}-{n_sol}-{window}-{rep}.parquet"  # (a fresh OUT: an existing one would resume)
            t0 = time.perf_counter()
            t.start()
            (res,) = run_stage(stage, sol, out, progress=False, chunks_in_flight=window)
            stop.set()
            t.join()
            dt = time.perf_counter() - t0
            tokens = engine.stats.generated_tokens
            samples = samples or [0]
            tenths = [samples[len(samples) * k // 10:max(len(samples) * (k + 1) // 10, len(samples) * k // 10 + 1)]
                      for k in range(10)]
            tail = sum(x < args.slots / 2 for x in samples) / len(samples)
            print(f"  {name:16s} window {window}: {res.chunks:2d} chunks, {dt:6.2f} s, {tokens:6d} tokens, "
                  f"{tokens / dt:7.0f} tok/s ({tokens / dt * args.step / args.slots:.2f} of full); busy slots per tenth: {' '.join(f'{sum(x) / len(x):.0f}' for x in tenths)}; "
                  f"below half the slots {tail:4.0%} of the run")
            # Slot-seconds left idle: each generated token holds one slot for --step s, so exactly this.
            return tokens / dt, args.slots * dt - tokens * args.step, tokens, read_rows(out)

        def exhaustive(spec):
            return MCLabelStage(MCLabelConfig(continuations=args.k), spec, sampling, lambda: checker)

        stages = {
            "mcts-label": lambda spec: MCTSLabelStage(MCTSConfig(continuations=args.k, search_limit=8,
                                                                 rollout_budget=48), spec, sampling, lambda: checker),
            "mc-label binary": lambda spec: MCLabelStage(MCLabelConfig(continuations=args.k, mode="binary"), spec,
                                                         sampling, lambda: checker),
        }
        print(f"{len(golds)} problems (real GSM8K solutions)")
        ref, ref_idle, _, ref_rows = measure("mc-label exhaustive", exhaustive, default_window)
        one = measure("mc-label exhaustive", exhaustive, 1)
        assert one[-1] == ref_rows, "mc-label exhaustive: rows differ between windows"
        ratios = [f"mc-label exhaustive window 1 {one[0] / ref:.2f}"]
        idle = [f"mc-label exhaustive window 1 {one[1]:.1f} ({one[1] - ref_idle:+.1f})"]
        for name, make in stages.items():
            runs = {w: measure(name, make, w) for w in windows}
            base = runs[windows[0]][-1]
            assert all(run[-1] == base for run in runs.values()), f"{name}: rows differ between windows"
            ratios += [f"{name} window {w} {tps / ref:.2f}" for w, (tps, *_) in runs.items()]
            idle += [f"{name} window {w} {i:.1f} ({i - ref_idle:+.1f}; ratio with exactly exhaustive's idle "
                     f"slot-seconds {tokens / ((tokens * args.step + ref_idle) / args.slots) / ref:.2f})"
                     for w, (_, i, tokens, _) in runs.items()]
        print(f"  tokens/s ratio to exhaustive mc-label (window {default_window}), {len(golds)} problems: " + ", ".join(ratios)
              + " (targets: mcts-label >= 0.9, binary >= 0.95; rows identical across windows)")
        # What a run leaves idle beyond the reference's: the end of any run leaves slots idle while its
        # last samples finish (a drain of about one sample's length, the same whatever the run's length),
        # so a run with half the reference's work has a lower ratio at equal idle time.
        print(f"  idle slot-seconds (slots x wall - tokens x step), {len(golds)} problems: exhaustive mc-label "
              f"{ref_idle:.1f}; " + "; ".join(idle))
    AnswerChecker.close(checker)


if __name__ == "__main__":
    main()
