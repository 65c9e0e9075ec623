"""An OpenAI-compatible server that answers malformed JSON, an empty ``choices``, fewer choices than ``n``, or
choices out of order: a retry or a per-request error, never a result attached to the wrong request. A server
that goes away mid-run: one line, whole chunks kept, and the rerun resumes once it is back."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pyarrow.parquet as pq
import pytest

from stepkit.engines.base import Request, SamplingConfig
from stepkit.engines.openai_engine import OpenAIEngine
from tests.faults.common import ENV, command, committed, manifest, one_error_line, rows_lost, stepkit, wait_for_parts
from tests.servers import FakeServer

SAMPLED = SamplingConfig(temperature=1.0, max_tokens=8)
N = 3


def malformed(body, reply):
    return b'{"object": "text_completion", "choices": [{"index": 0, "te'  # a cut-off body


def not_a_completion(body, reply):
    return [reply]  # JSON, but a list


def empty(body, reply):
    return {**reply, "choices": []}


def fewer(body, reply):
    return {**reply, "choices": reply["choices"][:1]}


def shuffled(body, reply):
    choices = reply["choices"][::-1]
    return {**reply, "choices": choices[1:] + choices[:1] if len(choices) > 2 else choices}


def bad_index(body, reply):  # index fields permuted into a repeat and an out-of-range one
    if len(reply["choices"]) < 2:
        return None
    return {**reply, "choices": [{**c, "index": k} for c, k in zip(reply["choices"], [1, 1, 7, 0, 2])]}


class Once:
    """A ``FakeServer`` mangle: each distinct request (prompt, n) gets ``fault(body, reply)`` the first time it
    is sent, a clean answer when it is sent again (``always``: every time)."""

    def __init__(self, fault, always: bool = False):
        self.fault, self.always, self.seen, self.lock, self.applied = fault, always, set(), threading.Lock(), 0

    def __call__(self, hit, body, reply):
        with self.lock:
            key = (body["prompt"], body["n"])
            if key in self.seen and not self.always:
                return None
            self.seen.add(key)
            self.applied += 1
        return self.fault(body, reply)


FAULTS = {
    "malformed JSON (a cut-off body)": (malformed, "retried"),
    "JSON that is not a completion (a list)": (not_a_completion, "retried"),
    "empty `choices`": (empty, "asked again (follow-up request)"),
    "fewer choices than `n` (always 1)": (fewer, "the rest asked for by follow-up requests"),
    "choices out of order": (shuffled, "put in `index` order"),
    "`index` fields permuted into a repeat and an out-of-range value": (bad_index, "refused and retried"),
}


def lost_or_misattached(requests, results) -> int:
    """Requests whose result is not exactly ``n`` completions answering that request's own prompt."""
    bad = 0
    for r, comps in zip(requests, results, strict=True):
        texts = [c.text for c in comps]
        if len(comps) != r.n or not all(t.startswith(f"<{r.prompt[-12:]}|") for t in texts):
            bad += 1
    return bad


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_misbehaving_server_is_retried_never_misattached(fault, fault_table):
    mangle, did = FAULTS[fault]
    requests = [Request(f"prompt number {i:03d}", n=N) for i in range(8)]
    once = Once(mangle, always=mangle is fewer)
    with FakeServer(models=("fake-model",), mangle=once) as fake, \
            OpenAIEngine("fake-model", fake.base_url, concurrency=4, max_retries=1) as eng:
        results = eng.generate(requests, SAMPLED)
        retries, hits = eng.stats.extra["retries"], fake.hits["/v1/completions"]
    lost = lost_or_misattached(requests, results)
    assert lost == 0 and once.applied >= len(requests)
    assert all(c.finish_reason == "stop" for comps in results for c in comps)
    if mangle is not fewer and mangle is not empty:  # one answer per request: each sample in its own slot
        assert all([c.text for c in comps] == [f"<{r.prompt[-12:]}|{j}>" for j in range(N)]
                   for r, comps in zip(requests, results))
    assert hits == len(requests) if mangle is shuffled else hits > len(requests)
    assert retries == (len(requests) if mangle in (malformed, not_a_completion, bad_index) else 0)
    fault_table.add(f"OpenAI server answers {fault}", did, lost,
                    f"8 requests x n={N}: {hits} HTTP requests, {retries} retries, 0 results misattached")


def test_a_server_that_never_gives_all_choices_is_a_per_request_error(fault_table):
    requests = [Request(f"prompt number {i:03d}", n=N) for i in range(4)]

    def starve(body, reply):  # prompt 2 never gets a choice
        return {**reply, "choices": []} if body["prompt"].endswith("002") else None

    with FakeServer(models=("fake-model",), mangle=Once(starve, always=True)) as fake, \
            OpenAIEngine("fake-model", fake.base_url) as eng:
        results = eng.generate(requests, SAMPLED)
    assert [c.finish_reason for c in results[2]] == ["error"] * N
    assert results[2][0].error == "the server returned 0 of 3 completions after 3 follow-up requests"
    assert all(c.finish_reason == "stop" and c.text.startswith(f"<{r.prompt[-12:]}|")
               for i, (r, comps) in enumerate(zip(requests, results)) if i != 2 for c in comps)
    lost = sum(len(comps) != r.n for r, comps in zip(requests, results, strict=True))  # no result at all
    assert lost == 0
    fault_table.add("OpenAI server never returns a choice for one prompt",
                    "after 3 follow-ups, that request's samples are error completions (a stage keeps its row "
                    "with an `error`); the other requests unaffected", lost,
                    f"{fake.hits['/v1/completions']} HTTP requests for 4 prompts")


def test_mc_label_through_a_misbehaving_server(solutions, tmp_path, fault_table):
    """Every fault at once, through a whole mc-label run: then garbage only, which stops the run with one line
    (nothing of the chunk in flight is committed); the rerun against a healthy server resumes."""
    faults = [malformed, empty, fewer, shuffled, bad_index, not_a_completion]
    state = {"garbage": False, "faulted": 0}

    def cycle(body, reply):  # each distinct request (prompt, n) gets the next fault once, then a clean answer
        if state["garbage"]:
            return b"<html>502 Bad Gateway</html>"
        state["faulted"] += 1
        return faults[state["faulted"] % len(faults)](body, reply)

    once = Once(cycle)

    def mangle(hit, body, reply):
        return b"<html>502 Bad Gateway</html>" if state["garbage"] else once(hit, body, reply)

    out = tmp_path / "lab.parquet"
    args = ["mc-label", solutions, out, "--engine", "openai", "--model", "smollm2-135m", "-k", "2", "--chunk-size",
            "1", "--chunks-in-flight", "1", "--max-retries", "1", "--no-progress"]  # (the garbage lands mid-run)
    with FakeServer(mangle=mangle, delay=0.02) as fake:
        proc = subprocess.Popen(command(*args, "--base-url", fake.base_url), env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            wait_for_parts(out, 4, proc)
            state["garbage"] = True
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        line = one_error_line(proc)
        assert line.startswith(f"error: the server at {fake.base_url} answered a completions request with something "
                               "that is not a completion (") and "after 1 retries; restart it and rerun" in line
        kept = len(committed(out))
        state["garbage"] = False
        t0 = time.monotonic()
        stepkit(*args, "--base-url", fake.base_url)
        seconds = time.monotonic() - t0
    m = manifest(out)
    assert m["run"]["resumed_chunks"] == kept and m["counts"]["errors"] == 0
    rows = pq.read_table(out).to_pylist()
    assert all(r["mc_status"] is not None and r["error"] is None for r in rows)
    lost = rows_lost(solutions, out)
    assert lost == 0
    assert state["faulted"] >= 12
    fault_table.add("mc-label through a server cycling all six faults above, then answering only garbage",
                    "faults recovered (no row error); garbage: retried, then one line `... not a completion ... "
                    "restart it and rerun`, chunk in flight not committed; the rerun resumed", lost,
                    f"{kept} of 12 chunks kept, rerun {seconds:.0f} s; {json.dumps(m['provenance']['engine']['retries'])} "
                    "retries in the rerun")


def test_a_server_gone_mid_run_is_one_line_and_the_rerun_resumes_once_it_is_back(solutions, tmp_path, fault_table):
    """The server stops listening while `stepkit mc-label` runs (as a killed server: connections refused): the
    command gives up after its retries with one line naming the server, exit 1, and keeps only whole
    committed chunks; restarted on the same port, the same command resumes them and labels the rest."""
    out = tmp_path / "lab.parquet"
    args = ["mc-label", solutions, out, "--engine", "openai", "--model", "smollm2-135m", "-k", "2", "--chunk-size",
            "1", "--chunks-in-flight", "1", "--max-retries", "1", "--no-progress"]  # (the garbage lands mid-run)
    fake = FakeServer(delay=0.05).start()
    try:
        proc = subprocess.Popen(command(*args, "--base-url", fake.base_url), env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            wait_for_parts(out, 2, proc)
            fake.stop()
            proc.wait(timeout=300)  # gives up after its retries
        finally:
            if proc.poll() is None:
                proc.kill()
        line = one_error_line(proc)
        assert proc.returncode == 1 and f"the server at {fake.base_url}" in line
        assert "rerun the same command to resume" in line
        kept = committed(out)
        assert not out.exists() and 2 <= len(kept) < 12
        kept_rows = [r for part in kept for r in pq.read_table(part).to_pylist()]
        fake.start()
        stepkit(*args, "--base-url", fake.base_url)
    finally:
        fake.stop()
    m = manifest(out)
    assert m["run"]["resumed_chunks"] == len(kept) and m["counts"]["errors"] == 0
    rows = pq.read_table(out).to_pylist()
    assert rows[:len(kept_rows)] == kept_rows  # committed chunks were not redone
    lost = rows_lost(solutions, out)
    assert lost == 0
    fault_table.add("the server stops listening mid mc-label run, then comes back on the same port",
                    "one line naming the server after its retries, exit 1; the rerun resumed the committed chunks",
                    lost, f"{len(kept)} chunks kept")
