"""A Ctrl-C (SIGINT) that lands while a stage on the asynchronous path sends a burst of requests stops the run.

Each answered request used to reach the event loop through ``call_soon_threadsafe`` (``asyncio.wrap_future``),
one byte in the loop's self-pipe each; hundreds answered in one loop iteration (a chunk's continuation
requests, several chunks in flight) filled it, and the loop learns of a signal through that pipe: Python
printed "Exception ignored when trying to write to the signal wakeup fd: BlockingIOError" and the run went on
to its end (exit 0 after 17 s where one chunk at a time stopped in 0.25 s; found by a breaking helper,
2026-12-07). ``stepkit.aio.awaitable`` keeps at most one wake-up pending per loop.
"""

from __future__ import annotations

import os
import signal

import pytest

from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.engines.scripted import ScriptedEngine
from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage


class InterruptedMidBurst(ScriptedEngine):
    """The scripted engine (5 ms a request, as STEPKIT_SCRIPTED_DELAY=0.005), which sends this process SIGINT
    once, as its ``at``-th request is sent (the user's Ctrl-C, mid-run)."""

    def __init__(self, at: int):
        super().__init__(delay=0.005)
        self.at, self.sent = at, 0

    def generate(self, requests, sampling):  # (submit goes through generate too: one request a call)
        out = []
        for r in requests:
            self.sent += 1
            if self.sent == self.at:
                os.kill(os.getpid(), signal.SIGINT)
            out += super().generate([r], sampling)
        return out


@pytest.mark.parametrize("window", [1, None], ids=["one-chunk", "default-window"])
def test_ctrl_c_mid_burst_stops_the_run(solutions_160, tmp_path, window):
    from stepkit.grading.verify import AnswerChecker
    from stepkit.runner import run_stage

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    engine = InterruptedMidBurst(at=400)
    with AnswerChecker() as checker:  # a fresh one: gold answers not yet validated, as in a CLI run
        stage = MCLabelStage(MCLabelConfig(continuations=4), EngineSpec.of(engine),
                             SamplingConfig(temperature=0.8, max_tokens=64), lambda: checker)
        kw = {} if window is None else {"chunks_in_flight": window}
        with pytest.raises(KeyboardInterrupt):
            run_stage(stage, solutions_160, tmp_path / "out.parquet", chunk_size=16, progress=False,
                      max_error_rate=1.0, **kw)
    assert engine.sent < 696  # stopped before every request of the 160 rows was sent (696 in all)
