"""Chunks in flight (issue 26, items 1 and 2): every stage on the asynchronous path gives the rows, side
tables and counts main gave before chunks overlapped (``tests/data/chunk_window_main.json``, written by
``python -m tests.window_cases`` at 5b80432), with one chunk in flight or several, on the scripted engine
and on its order-free form (answers out of order); the window is bounded and commits stay in order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepkit.engines.scripted import ScriptedEngine
from tests.window_cases import CASES, OrderFree, build, inputs, run_case

MAIN = json.loads((Path(__file__).parent / "data" / "chunk_window_main.json").read_text())


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("window")
    return tmp, inputs(tmp)


@pytest.mark.parametrize("engine_cls,window", [(ScriptedEngine, 1), (ScriptedEngine, 3), (OrderFree, 4)],
                         ids=["scripted-window1", "scripted-window3", "order-free-window4"])
@pytest.mark.parametrize("case", CASES)
def test_rows_are_mains_whatever_the_window_and_the_order_of_answers(case, engine_cls, window, shards, checker):
    tmp, paths = shards
    got = run_case(case, tmp, paths, engine_cls, checker, chunks_in_flight=window)
    want = MAIN[case]
    assert got["chunks"] == want["chunks"] > 1
    assert got["rows"] == want["rows"]
    assert got["sides"] == want["sides"]
    assert got["counts"] == want["counts"]


@pytest.fixture
def chunk_log(monkeypatch):
    """The runner's log events (``chunk_start``, ``chunk_commit``, ...) of the runs in this test, in order."""
    import stepkit.runner.shard as shard_mod

    events: list[dict] = []
    real = shard_mod._log

    def spy(parts, **event):
        events.append(event)
        real(parts, **event)

    monkeypatch.setattr(shard_mod, "_log", spy)
    return events


def most_in_flight(chunk_log: list[dict]) -> int:
    """The most chunks started and not yet committed at once, from a run's ``chunk_start``/``chunk_commit``
    log events."""
    open_, most = set(), 0
    for e in chunk_log:
        if e["event"] == "chunk_start":
            open_.add(e["chunk"])
            most = max(most, len(open_))
        elif e["event"] == "chunk_commit":
            open_.discard(e["chunk"])
    return most


@pytest.mark.parametrize("case", ["mc-label-binary", "mc-label-exhaustive", "mcts-label", "judge", "rollout"])
def test_the_window_holds_several_chunks_never_more_and_commits_in_order(case, shards, checker, tmp_path, chunk_log):
    """The next chunk's requests start before the previous chunk commits, at most ``chunks_in_flight``
    chunks are started and not committed, and chunks commit in index order."""
    from stepkit.runner import run_stage

    tmp, paths = shards
    stage, src, chunk = build(case, tmp, tmp_path, paths, OrderFree, checker)
    assert stage.asynchronous
    (res,) = run_stage(stage, src, tmp_path / "o.parquet", chunk_size=chunk, progress=False, max_error_rate=1.0,
                       chunks_in_flight=3)
    commits = [e["chunk"] for e in chunk_log if e["event"] == "chunk_commit"]
    assert commits == list(range(res.chunks)) and res.chunks >= 4
    most = most_in_flight(chunk_log)
    assert most == 3  # overlapping, and bounded by the window


def test_a_stage_off_the_asynchronous_path_runs_one_chunk_at_a_time(shards, checker, tmp_path, chunk_log):
    """A stage that is not asynchronous (clue score with numeric matching: no model, nothing awaited) runs
    each chunk to its commit before the next starts, whatever the window."""
    from stepkit.runner import run_stage
    from stepkit.stages.clue_score import ClueScoreConfig, ClueScoreStage

    tmp, paths = shards
    _, src, chunk = build("clue-score", tmp, tmp_path, paths, ScriptedEngine, checker)  # (writes the clues)
    stage = ClueScoreStage(ClueScoreConfig(clues=str(tmp / "clues.parquet"), match="numeric"), None, None,
                           checker_factory=lambda: checker)
    assert not stage.asynchronous
    (res,) = run_stage(stage, src, tmp_path / "o.parquet", chunk_size=chunk, progress=False, chunks_in_flight=4)
    kinds = [(e["event"], e["chunk"]) for e in chunk_log if e["event"] in ("chunk_start", "chunk_commit")]
    assert kinds == [(k, i) for i in range(res.chunks) for k in ("chunk_start", "chunk_commit")] and res.chunks > 1


def test_sample_parsed_keeps_every_completion_of_its_round_when_asked():
    """rollout and mc-label sample through :func:`stepkit.per_row.sample_parsed` with ``stop_on_error`` off:
    one request of ``want`` samples, every completion kept in order (an error one too, as the row's
    error), no retry round after an error; the default stops at the error."""
    import asyncio

    from stepkit.engines.base import Completion, SamplingConfig
    from stepkit.per_row import sample_parsed

    def policy(prompt, j, n):
        return Completion("boom", "error") if j == 1 else f"sample {j}"

    engine = ScriptedEngine(policy, "scripted:partial")
    sampling = SamplingConfig(temperature=0.8, max_tokens=8)
    kept = asyncio.run(sample_parsed(engine, "p", sampling, lambda c: c.text, "rollout", want=3, retries=2,
                                     stop_on_error=False))
    assert [c.finish_reason for c in kept.completions] == ["stop", "error", "stop"] and kept.received == 3
    assert kept.parsed == ["sample 0", "sample 2"] and str(kept.error) == "rollout: engine: boom"
    assert [r.n for r in engine.calls] == [3]  # no retry round after the error
    stopped = asyncio.run(sample_parsed(engine, "p", sampling, lambda c: c.text, "rollout", want=3))
    assert len(stopped.completions) == 2 and stopped.parsed == ["sample 0"] and stopped.error is not None


def test_a_chunk_that_cannot_be_read_stops_the_run_after_the_chunks_in_flight_before_it_commit(
        shards, checker, tmp_path, monkeypatch):
    """Bad input found as chunk 3 is read (a damaged page): chunks 0-2, in flight, still commit, as they
    would one at a time; the run stops with the InputError."""
    import stepkit.runner.shard as shard_mod
    from stepkit.errors import InputError
    from stepkit.runner import run_stage

    tmp, paths = shards
    stage, src, chunk = build("judge", tmp, tmp_path, paths, OrderFree, checker)
    real = shard_mod._uncommitted_chunks

    def damaged(*args):
        for item in real(*args):
            if item is not None and item[0] == 3:
                raise InputError(src, "damaged page", row=6, column="steps")
            yield item

    monkeypatch.setattr(shard_mod, "_uncommitted_chunks", damaged)
    out = tmp_path / "o.parquet"
    with pytest.raises(InputError, match="damaged page"):
        run_stage(stage, src, out, chunk_size=chunk, progress=False, chunks_in_flight=4)
    parts = sorted(p.name for p in (tmp_path / "o.parquet.parts").glob("part-*.parquet"))
    assert parts == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]


def test_the_default_window_is_counted_in_rows():
    """Without ``--chunks-in-flight`` the window holds about 128 rows' worth of chunks, at least 4 and at
    most 64: mcts-label's chunks of 8 problems 16, binary mc-label's of 16 rows 8, judge's of 32 rows 4."""
    from stepkit.runner.window import default_window

    assert [default_window(n) for n in (8, 16, 32, 64, 1, 1000)] == [16, 8, 4, 4, 64, 4]


@pytest.mark.parametrize("case", ["mcts-label", "mc-label-binary"])
def test_the_default_window_overlaps_as_many_chunks_as_it_holds(case, shards, checker, tmp_path, chunk_log):
    """A run with no window given keeps up to :func:`default_window` chunks started and not committed
    (here every chunk of the shard, as it has fewer), commits in order and gives main's rows."""
    from stepkit.runner import run_stage
    from stepkit.runner.window import default_window
    from stepkit.shards import read_rows

    tmp, paths = shards
    stage, src, chunk = build(case, tmp, tmp_path, paths, OrderFree, checker)
    (res,) = run_stage(stage, src, tmp_path / "o.parquet", chunk_size=chunk, progress=False, max_error_rate=1.0)
    commits = [e["chunk"] for e in chunk_log if e["event"] == "chunk_commit"]
    assert commits == list(range(res.chunks))
    most = most_in_flight(chunk_log)
    assert 4 < res.chunks <= default_window(chunk) and most == res.chunks
    assert json.loads(json.dumps(read_rows(tmp_path / "o.parquet"), default=str)) == MAIN[case]["rows"]


def test_checks_not_memoized_leave_the_event_loop_free(checker):
    """``acheck_many`` answers memoized pairs at once and waits on the pool for new ones from a worker
    thread: a coroutine keeps running meanwhile; results equal ``check_many``'s."""
    import asyncio

    pairs = [("1/2", "0.500000000007"), ("7", "8.00000000007"), ("3", None), ("1/3", "0.3333000007")]

    async def main():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.ensure_future(tick())
        got = await checker.acheck_many(pairs)
        t.cancel()
        return got, ticks

    got, ticks = asyncio.run(main())
    assert got == checker.check_many(pairs) == [False, False, False, False]
    assert ticks > 0  # the loop ran while the pool checked
    assert asyncio.run(checker.acheck_many([("1/2", "0.5000"), ("2", "2")])) == [True, True]
