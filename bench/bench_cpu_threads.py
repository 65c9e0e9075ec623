"""How many cores vLLM's CPU backend computes on: its default against every core, measured in one run.

vLLM's CPU backend (``VLLM_CPU_OMP_THREADS_BIND=auto``) binds its compute threads to all cores but one and
reserves that one for its scheduler process; on a 2-core machine that is one core. The alternative binds
them to every core of this process's CPU set (``VLLM_CPU_OMP_THREADS_BIND=0,1`` here). For each setting, in
its own process (the variable is read when the engine starts), this measures on the bundled model:

* plain ``LLM.generate``: 64 prompts x 128 tokens, tokens/s;
* ``mc-label`` on 8 real GSM8K solutions, K=4, 192 tokens (generation and the answer checker's 2 worker
  processes competing for the cores), wall seconds and generated tokens/s;
* ``likelihood-label`` on 30 ProcessBench rows, prompt tokens scored per second.

    python bench/bench_cpu_threads.py [--data ../shared/data] [--json report.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {"vllm default (auto)": "auto", "every core": ",".join(map(str, sorted(os.sched_getaffinity(0))))}


def child(data: str, work: str) -> dict:
    """Run in a subprocess: load the engine once, measure the three workloads."""
    from stepkit.engines.base import EngineSpec, Request, SamplingConfig
    from stepkit.engines.vllm_engine import VLLMEngine
    from stepkit.grading.verify import AnswerChecker, checker_settings
    from stepkit.runner import run_stage
    from stepkit.stages.ingest import IngestOptions, ingest
    from stepkit.stages.likelihood import LikelihoodConfig, LikelihoodStage
    from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage

    work = Path(work)
    out: dict = {"VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")}
    with AnswerChecker() as checker:
        sols, pb = work / "sols.parquet", work / "pb.parquet"
        ingest("gsm8k-solutions", Path(data) / "gsm8k" / "example_model_solutions.jsonl", sols,
               IngestOptions(limit=4, generators=("175b_verification", "6b_finetuning")), checker, checker_settings())
        ingest("processbench", Path(data) / "processbench" / "gsm8k.json", pb, IngestOptions(limit=30), checker,
               checker_settings())
        engine = VLLMEngine("smollm2-135m")
        out["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
        prompts = [engine.render_chat([{"role": "user", "content": f"Count from {i} to {i + 50}, one per line."}])
                   for i in range(64)]
        sampling = SamplingConfig(temperature=0.8, max_tokens=128, seed=0)
        engine.generate([Request(prompts[0])], sampling)  # warm-up
        t0, before = time.perf_counter(), engine.stats.generated_tokens
        engine.generate([Request(p) for p in prompts], sampling)
        secs = time.perf_counter() - t0
        out["generate_tok_s"] = round((engine.stats.generated_tokens - before) / secs, 1)

        spec = EngineSpec("vllm", "smollm2-135m", factory=lambda: _Borrowed(engine))  # the stages must not close it
        from stepkit.prompts import DEFAULT_STOP

        mc = MCLabelStage(MCLabelConfig(continuations=4), spec, SamplingConfig(max_tokens=192, seed=0, stop=DEFAULT_STOP),
                          checker_factory=lambda: _Borrowed(checker))
        t0, before = time.perf_counter(), engine.stats.generated_tokens
        run_stage(mc, sols, work / "mc.parquet", progress=False, force=True)
        secs = time.perf_counter() - t0
        out["mc_label_seconds"] = round(secs, 1)
        out["mc_label_tok_s"] = round((engine.stats.generated_tokens - before) / secs, 1)

        lh = LikelihoodStage(LikelihoodConfig(), spec, SamplingConfig(temperature=0, max_tokens=1))
        t0, before = time.perf_counter(), engine.stats.scored_tokens
        run_stage(lh, pb, work / "lh.parquet", progress=False, force=True)
        secs = time.perf_counter() - t0
        out["likelihood_scored_tok_s"] = round((engine.stats.scored_tokens - before) / secs, 1)
        engine.close()
    return out


class _Borrowed:
    """The benchmark's engine or answer checker lent to a stage (the stage's close() must not stop it)."""

    def __init__(self, checker):
        self._c = checker

    def __getattr__(self, name):
        return getattr(self._c, name)

    def close(self):
        pass


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.data, a.child)))
        return {}
    report = {}
    for name, bind in SETTINGS.items():
        env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": bind}
        with tempfile.TemporaryDirectory() as work:
            p = subprocess.run([sys.executable, __file__, "--data", a.data, "--child", work], env=env,
                               capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(f"{name}: failed\n{p.stderr[-3000:]}")
        report[name] = json.loads(p.stdout.strip().splitlines()[-1])
        r = report[name]
        print(f"{name:30s} bind={r['VLLM_CPU_OMP_THREADS_BIND']}: generate {r['generate_tok_s']} tok/s; mc-label "
              f"{r['mc_label_seconds']} s ({r['mc_label_tok_s']} tok/s); likelihood-label {r['likelihood_scored_tok_s']} "
              f"scored tok/s", flush=True)
    base, ours = report["vllm default (auto)"], report["every core"]
    report["ratios"] = {k: round(ours[k] / base[k], 3) for k in ("generate_tok_s", "mc_label_tok_s",
                                                                  "likelihood_scored_tok_s")}
    print("every core / vLLM default:", report["ratios"])
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
