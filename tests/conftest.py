"""Shared fixtures: paths to ../shared (real data, cases), one answer checker per session."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DATA = SHARED / "data"
CASES_FILE = SHARED / "cases" / "cases.jsonl"

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def load_cases() -> dict[str, dict]:
    return {c["id"]: c for c in map(json.loads, CASES_FILE.read_text().splitlines()) if c}


@pytest.fixture(scope="session")
def cases() -> dict[str, dict]:
    """Case id -> case, from ../shared/cases/cases.jsonl."""
    return load_cases()


@pytest.fixture(scope="session")
def checker():
    """One AnswerChecker (math-verify in a spawn process pool) for the whole session."""
    from stepkit.grading.verify import AnswerChecker

    with AnswerChecker() as c:
        yield c


def run_cli(*args, check: bool = True):
    """Run ``python -m stepkit.cli ARGS`` in a subprocess; raise with its stderr when it fails and ``check``."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "stepkit.cli", *map(str, args)], capture_output=True, text=True)
    if check and p.returncode:
        raise AssertionError(p.stderr)
    return p


def assert_linear(fn, make_text, n: int = 16_000, factor: int = 16) -> None:
    """Check that ``fn(make_text(n))`` scales linearly, not by wall-clock budget: the best of three runs
    at ``factor * n`` characters must stay within ``4 * factor`` times the best at ``n``, plus 0.5 s of
    slack for a busy machine. A quadratic step grows ``factor ** 2`` times and fails."""
    import time

    def best(text):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn(text)
            times.append(time.perf_counter() - t0)
        return min(times)

    small, big = best(make_text(n)), best(make_text(n * factor))
    assert big <= 4 * factor * small + 0.5, f"{n * factor} chars took {big:.3f} s, {n} chars {small:.4f} s"


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray instance for the whole session (the Ray executor's tests join it with --ray-address):
    2 CPUs, a 200 MB object store, on 127.0.0.1 only. Ray's dashboard process is started because the state
    API (``ray.util.state``, which the real-engine test uses to find its actor and its runs) is served by it;
    its web frontend is not used. Yields the address; shut down at the end of the session."""
    import logging

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # bind 127.0.0.1, not the machine's address
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # (ray.init turns it off too; never any traffic out)
    import ray

    ctx = ray.init(num_cpus=2, object_store_memory=200 * 1024**2, include_dashboard=True,
                   logging_level=logging.ERROR)
    try:
        yield ctx.address_info["gcs_address"]
    finally:
        ray.shutdown()
