"""Exhaustive mc-label with per-request seeds (``--per-request-seed`` to a GPU server; the vllm engine on GPU
seeds requests the same way) gives the same rows after a resume and whatever ``--chunks-in-flight`` is.

Request ``k`` of a chunk carries ``seed_index`` k (``stepkit.engines.base.Request``), so it is sent with
``seed + k`` as when a chunk was one engine call. Before, each submitted request took the engine's running
count of submitted requests: a rerun that resumed after a kill sampled every later chunk with other seeds
(112 of 160 rows differed) and the window changed the rows (found by a breaking helper, 2026-12-07).

The fake server answers with the gold answer when ``(seed + choice index) % 3 == 0``, else a wrong one, so
the rows show which seeds were sent.
"""

from __future__ import annotations

import signal
import subprocess

import pyarrow.parquet as pq
import pytest

from stepkit.shards import read_rows
from tests.faults.common import ENV, command, committed, stepkit, wait_for_parts
from tests.servers import FakeServer


@pytest.fixture
def seeded_server(solutions_160):
    golds = {r["prompt"]: r["reference_answer"] for r in read_rows(solutions_160)}

    def mangle(hit, body, reply):
        gold = next((g for p, g in golds.items() if p in body.get("prompt", "")), "0")
        seed = body.get("seed")
        for c in reply["choices"]:
            right = seed is None or (seed + c["index"]) % 3 == 0
            c["text"] = f" so.\nThe answer is {gold if right else '99999'}."
        return reply

    with FakeServer(mangle=mangle, delay=0.01) as fake:
        yield fake


def args(solutions_160, out, fake, *extra):
    return ["mc-label", solutions_160, out, "--engine", "openai", "--model", "smollm2-135m", "-k", "2", "--no-progress",
            "--per-request-seed", "--base-url", fake.base_url, "--chunk-size", "16", *extra]


def test_a_resumed_run_gives_the_rows_of_an_uninterrupted_one(solutions_160, seeded_server, tmp_path):
    whole, resumed = tmp_path / "whole.parquet", tmp_path / "resumed.parquet"
    stepkit(*args(solutions_160, whole, seeded_server, "--chunks-in-flight", "1"))
    proc = subprocess.Popen(command(*args(solutions_160, resumed, seeded_server, "--chunks-in-flight", "1")), env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_parts(resumed, 3, proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert 3 <= len(committed(resumed)) < 10
    stepkit(*args(solutions_160, resumed, seeded_server, "--chunks-in-flight", "1"))
    assert pq.read_table(resumed).to_pylist() == pq.read_table(whole).to_pylist()


def test_chunks_in_flight_never_changes_the_rows(solutions_160, seeded_server, tmp_path):
    one, window = tmp_path / "one.parquet", tmp_path / "window.parquet"
    stepkit(*args(solutions_160, one, seeded_server, "--chunks-in-flight", "1"))
    stepkit(*args(solutions_160, window, seeded_server))
    assert pq.read_table(window).to_pylist() == pq.read_table(one).to_pylist()
