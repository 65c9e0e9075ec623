"""Runs of every stage on the asynchronous path (rollout, mc-label binary, mcts-label, judge, clue recover,
clue score) on real rows with deterministic scripted policies, several chunks each, as JSON-able outputs
(rows, side tables, manifest counts): what ``tests/test_chunk_window.py`` compares with the same runs made
on main before chunks overlapped (``tests/data/chunk_window_main.json``).

``python -m tests.window_cases OUT.json`` writes that file (it was written by main at 5b80432, before the
runner kept several chunks in flight). The policies depend on the prompt and the sample's index only, so
a run gives the same rows whatever order the answers come in (:class:`OrderFree`) and however many chunks
are in flight.
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import sys
import tempfile
import time
import zlib
from pathlib import Path

from stepkit.engines.base import Completion, EngineSpec, SamplingConfig
from stepkit.engines.scripted import ScriptedEngine, clues_policy, judge_policy

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


class OrderFree(ScriptedEngine):
    """The scripted engine answering submitted requests from worker threads after random delays, so they
    finish out of order (as vLLM's and a server's do)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.pool, self.rng = concurrent.futures.ThreadPoolExecutor(8), random.Random(0)

    def submit(self, request, sampling):
        delay = self.rng.random() * 0.01
        return self.pool.submit(lambda: (time.sleep(delay), self.generate([request], sampling)[0])[1])

    def submit_each(self, request, sampling):
        """Each sample after a random delay of its own, so a request's samples finish out of order too."""
        samples = self.generate([request], sampling)[0]
        return [self.pool.submit(lambda c=c, d=self.rng.random() * 0.01: (time.sleep(d), c)[1]) for c in samples]

    def close(self):
        self.pool.shutdown(wait=True)


def _h(*parts) -> int:
    return zlib.crc32("\x00".join(map(str, parts)).encode())


class GoldPolicy:
    """Solutions and continuations that reach the problem's gold answer with a chance falling with the
    prefix's depth (a hash of the prompt and the sample's index decides), now and then cut off by
    ``max_tokens``; steps vary with the hash, so trees branch."""

    def __init__(self, golds: dict[str, str]):
        self.golds = golds

    def __call__(self, prompt: str, j: int, n: int):
        gold = next((g for p, g in self.golds.items() if p in prompt), "0")
        after = prompt.rsplit("<|assistant|>\n", 1)[-1]
        depth = len([s for s in after.split("\n") if s.strip()])
        h = _h(prompt, j)
        if h % 13 == 0:
            return Completion("and then", "length", 2)
        right = h % 100 < max(10, 70 - 12 * depth)
        steps = [f"Step {depth + s}: work {(h >> (4 * s)) % 3}." for s in range(1 + h % 3)]
        answer = gold if right else f"{gold}1"
        return "\n".join(steps + [f"The answer is {answer}."])


def flaky_judge(prompt: str, j: int, n: int) -> str:
    """:func:`judge_policy`, with a reply that does not parse for a quarter of the (prompt, sample) pairs."""
    return "I am not sure." if _h(prompt, j) % 4 == 0 else judge_policy(prompt, j, n)


def inputs(tmp: Path) -> dict[str, Path]:
    """The input shards, from the real GSM8K and ProcessBench files."""
    from stepkit.grading.verify import AnswerChecker, checker_settings
    from stepkit.stages.ingest import IngestOptions, ingest

    out = {"solutions": tmp / "solutions.parquet", "problems": tmp / "problems.parquet", "pb": tmp / "pb.parquet"}
    with AnswerChecker() as checker:
        ingest("gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", out["solutions"],
               IngestOptions(limit=6), checker, checker_settings())
        ingest("gsm8k", DATA / "gsm8k" / "test.jsonl", out["problems"], IngestOptions(limit=8), checker,
               checker_settings())
        ingest("processbench", DATA / "processbench" / "gsm8k.json", out["pb"], IngestOptions(limit=8), checker,
               checker_settings())
    return out


def _golds(path: Path) -> dict[str, str]:
    from stepkit.shards import read_rows

    return {r["prompt"]: r["reference_answer"] for r in read_rows(path)}


SAMPLING = SamplingConfig(temperature=0.8, max_tokens=64)
CASES = ("rollout", "mc-label-binary", "mc-label-exhaustive", "mcts-label", "judge", "clue-recover", "clue-score")


def build(case: str, tmp: Path, work: Path, shards: dict[str, Path], engine_cls, checker):
    """``(stage, IN, chunk size)`` of one case, its side outputs in ``work``; its engine an ``engine_cls``
    (ScriptedEngine or OrderFree)."""
    from stepkit.stages.clue_recover import ClueRecoverConfig, ClueRecoverStage
    from stepkit.stages.clue_score import ClueScoreConfig, ClueScoreStage
    from stepkit.stages.judge import JudgeConfig, JudgeStage
    from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage
    from stepkit.stages.mcts_label import MCTSConfig, MCTSLabelStage
    from stepkit.stages.rollout import RolloutConfig, RolloutStage

    def spec(policy, model):
        return EngineSpec.of(engine_cls(policy, model))

    sol, probs, pb = shards["solutions"], shards["problems"], shards["pb"]
    if case == "rollout":
        return RolloutStage(RolloutConfig(samples=3), spec(GoldPolicy(_golds(probs)), "scripted:gold"), SAMPLING,
                            checker_factory=lambda: checker), probs, 2
    if case.startswith("mc-label"):
        mode = case.rsplit("-", 1)[1]
        return MCLabelStage(MCLabelConfig(continuations=4, mode=mode), spec(GoldPolicy(_golds(sol)), "scripted:gold"),
                            SAMPLING, lambda: checker), sol, 3
    if case == "mcts-label":
        cfg = MCTSConfig(continuations=4, search_limit=4, rollout_budget=40, tree_out=str(work / "tree.parquet"),
                         pairs_out=str(work / "pairs.parquet"))
        return MCTSLabelStage(cfg, spec(GoldPolicy(_golds(sol)), "scripted:gold"), SAMPLING, lambda: checker), sol, 1
    if case == "judge":
        return JudgeStage(JudgeConfig(votes=3, retries=2), spec(flaky_judge, "scripted:judge"), SAMPLING), pb, 2
    if case == "clue-recover":
        return ClueRecoverStage(ClueRecoverConfig(retries=2), spec(clues_policy, "scripted:clues"), SAMPLING), pb, 2
    if case == "clue-score":
        clues = tmp / "clues.parquet"
        if not clues.exists():
            from stepkit.runner import run_stage

            recover = ClueRecoverStage(ClueRecoverConfig(retries=2), EngineSpec.of(ScriptedEngine(clues_policy,
                                       "scripted:clues")), SAMPLING)
            run_stage(recover, pb, clues, progress=False)
        return ClueScoreStage(ClueScoreConfig(clues=str(clues), match="llm"), spec(clues_policy, "scripted:clues"),
                              SAMPLING, checker_factory=lambda: checker), pb, 2
    raise KeyError(case)


def _plain(rows: list[dict]) -> list[dict]:
    return json.loads(json.dumps(rows, default=str))


def run_case(case: str, tmp: Path, shards: dict[str, Path], engine_cls, checker, **run_kw) -> dict:
    """One case's output: ``{"rows": [...], "sides": {name: [...]}, "counts": {...}, "chunks": n}``."""
    from stepkit.runner import run_stage
    from stepkit.shards import read_manifest, read_rows

    work = tmp / f"{case}-{engine_cls.__name__}-{'-'.join(f'{k}{v}' for k, v in run_kw.items())}"
    work.mkdir()
    stage, src, chunk = build(case, tmp, work, shards, engine_cls, checker)
    out = work / "out.parquet"
    (res,) = run_stage(stage, src, out, chunk_size=chunk, progress=False, max_error_rate=1.0, **run_kw)
    sides = {name: _plain(read_rows(s.path)) for name, s in stage.side_outputs().items()}
    counts = read_manifest(out)["counts"]
    return {"rows": _plain(read_rows(out)), "sides": sides, "counts": counts, "chunks": res.chunks}


def main() -> None:
    from stepkit.grading.verify import AnswerChecker

    tmp = Path(tempfile.mkdtemp(prefix="stepkit-window-"))
    shards = inputs(tmp)
    with AnswerChecker() as checker:
        doc = {case: run_case(case, tmp, shards, ScriptedEngine, checker) for case in CASES}
    Path(sys.argv[1]).write_text(json.dumps(doc, indent=0, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
