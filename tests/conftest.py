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
    """One AnswerChecker (math-verify in a spawn process pool) for the whole session; its pool is the one
    lent to in-process commands (:mod:`tests.shared_engines`)."""
    from tests import shared_engines

    with shared_engines._lent_checker_class()() as c:
        yield c


@pytest.fixture
def vllm_engine():
    """The session's loaded vLLM engine (the bundled model, seed 0), the same one in-process commands
    borrow (asked for each test: it is loaded again if a test with other options closed it). Never close it:
    a test that needs its own engine process is marked ``own_engine``."""
    from tests import shared_engines

    engine = shared_engines.vllm_engine("smollm2-135m", seed=0)
    engine.reset_prefix_cache()  # no blocks an earlier test computed
    return engine


@pytest.fixture(scope="session")
def vllm_server_url():
    """The session's real vLLM server for the bundled model (``tests.servers.ServerURL``: a base URL with
    ``.kill()``/``.restart()``); the session's offline engine is closed before it starts."""
    from tests import shared_engines

    return shared_engines.vllm_server()


ENGINE_MARKERS = {
    "closes_engine": "closes the session's engine (runs after every test that borrows it)",
    "other_engine": "loads an engine with other options than the session's default (runs after the tests "
                    "that share the default)",
    "own_engine": "starts a vLLM engine in another process (a subprocess, a Ray actor); the session's engine "
                  "and server are closed first (runs last)",
    "no_vllm": "marked engine (slow, needs the model's files: make test-fast skips it) but loads no vLLM engine: "
               "runs among the tests without an engine (the other part of tests/run_parts.py)",
}


def pytest_addoption(parser):
    parser.addoption("--part", choices=("all", "engine", "other"), default="all",
                     help="run only the tests that use a real engine (engine), only the others (other), or all: "
                          "tests/run_parts.py runs the two parts side by side, one per core")


def pytest_configure(config):
    for name, text in ENGINE_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def _engine_group(item) -> int:
    """Where a test runs: 0 no engine; 1 borrows the session's engine; 2 closes it; 3 another engine;
    4 the session's server; 5 an engine of its own."""
    if item.get_closest_marker("no_vllm"):
        return 0
    if item.get_closest_marker("own_engine"):
        return 5
    if "vllm_server_url" in item.fixturenames:
        return 4
    if item.get_closest_marker("other_engine"):
        return 3
    if item.get_closest_marker("closes_engine"):
        return 2
    return 1 if item.get_closest_marker("engine") or "vllm_engine" in item.fixturenames else 0


def pytest_collection_modifyitems(session, config, items):
    """Loading a CPU engine costs ~45 s and two may not fit in memory together, so the engine tests run
    after all others, in the order of :func:`_engine_group` (stable within a group): the tests that borrow
    the session's engine one after another, so it loads once, then the server's, then those that start
    their own. Module-scoped fixtures of a module whose tests land in two groups are built twice; what an
    engine builds is session-scoped. ``--part engine`` keeps groups 1-5, ``--part other`` group 0."""
    items.sort(key=_engine_group)
    part = config.getoption("--part")
    if part != "all":
        keep = [(_engine_group(it) > 0) == (part == "engine") for it in items]
        config.hook.pytest_deselected(items=[it for it, k in zip(items, keep) if not k])
        items[:] = [it for it, k in zip(items, keep) if k]


_ENGINE_LOCK = []


@pytest.fixture(autouse=True)
def _one_engine_at_a_time(request):
    """Two CPU engines may not fit in memory together: before a test that starts its own, close the
    session's engine and server. With ``STEPKIT_TEST_ENGINE_LOCK=FILE`` set (several checkouts testing on one
    machine), the session takes an exclusive ``flock`` on FILE before its first engine test and keeps it."""
    lock = os.environ.get("STEPKIT_TEST_ENGINE_LOCK")
    if lock and not _ENGINE_LOCK and _engine_group(request.node):
        import fcntl

        f = open(lock, "a")  # noqa: SIM115 - held until the session ends
        fcntl.flock(f, fcntl.LOCK_EX)
        _ENGINE_LOCK.append(f)
    if request.node.get_closest_marker("own_engine"):
        from tests import shared_engines

        shared_engines.release()


def pytest_sessionfinish(session, exitstatus):
    from tests import shared_engines

    if shared_engines.loads:
        print(f"\nvLLM engine loads in this session's own process: {len(shared_engines.loads)}")
        for key in shared_engines.loads:  # which options cost a load (a test group out of order shows here)
            print(f"  {key}")
    shared_engines.close_all()


class CliResult:
    """What a run of the command line gave: ``returncode``, ``stdout``, ``stderr`` (as
    :class:`subprocess.CompletedProcess` names them, so a test reads either kind the same way)."""

    def __init__(self, args, returncode: int, stdout: str, stderr: str):
        self.args, self.returncode, self.stdout, self.stderr = args, returncode, stdout, stderr


def run_cli(*args, check: bool = True) -> CliResult:
    """Run ``stepkit ARGS`` in this process (click's ``CliRunner``), as a fresh process would run it: its
    own stdout and stderr, exit status 1 and the traceback on stderr for an uncaught exception, the
    once-per-process warnings reset. The session's answer checker and its loaded vLLM engine are lent to
    the command (:mod:`tests.shared_engines`), so a command pays for neither's start; both outlive it.
    Raise with its stderr when it fails and ``check``. Use :func:`run_cli_process` for what needs a
    process of its own (signals, kills, import weight, the environment)."""
    import traceback

    from click.testing import CliRunner

    from stepkit import shards
    from stepkit.cli import main
    from tests import shared_engines

    shards._WARNED_UNFINISHED.clear()
    argv = [str(a) for a in args]
    with shared_engines.lent():
        r = CliRunner().invoke(main, argv, catch_exceptions=True)
    code, stderr = r.exit_code, r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        code = 1
        stderr += "".join(traceback.format_exception(r.exception))
    if check and code:
        raise AssertionError(stderr)
    return CliResult(["stepkit", *argv], code, r.stdout, stderr)


def run_cli_process(*args, check: bool = True, **kwargs):
    """Run ``python -m stepkit.cli ARGS`` in a subprocess (``subprocess.run`` keywords pass through);
    raise with its stderr when it fails and ``check``."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "stepkit.cli", *map(str, args)], capture_output=True, text=True,
                       **kwargs)
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
def solutions_160(tmp_path_factory):
    """The GPT-3 solutions of the first 40 GSM8K test problems (160 rows), one shard for the session: the
    chunks-in-flight tests need several chunks of 16 (their runs use a fresh answer checker, as a CLI run)."""
    from stepkit.grading.verify import AnswerChecker, checker_settings
    from stepkit.stages.ingest import IngestOptions, ingest

    path = tmp_path_factory.mktemp("solutions-160") / "solutions.parquet"
    with AnswerChecker() as c:
        ingest("gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", path, IngestOptions(limit=40),
               c, checker_settings())
    return path


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
