"""Helpers of the fault suite: running stepkit (optionally with a fault injected), waiting for committed
parts, and counting rows lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from tests.conftest import ROOT

MC_LABEL = ["--engine", "scripted", "--model", "scripted:echo", "-k", "2", "--no-progress", "--chunk-size", "1",
            "--chunks-in-flight", "1"]
"""mc-label with the scripted engine, one row per chunk and one chunk at a time (so a fault lands between
commits; a fault with several chunks in flight is ``test_window_resume.py``'s)."""

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def command(*args, inject: str | None = None) -> list[str]:
    """``python -m stepkit.cli ARGS``, or through ``tests.faults.inject`` with the fault ``inject``."""
    head = [sys.executable, "-m", "tests.faults.inject", inject, "--"] if inject else [sys.executable, "-m",
                                                                                       "stepkit.cli"]
    return [*head, *map(str, args)]


def stepkit(*args, inject: str | None = None, env: dict | None = None, check: bool = True,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """Run stepkit to its end; raise with its stderr when it fails and ``check``."""
    p = subprocess.run(command(*args, inject=inject), capture_output=True, text=True, cwd=ROOT,
                       env={**ENV, **(env or {})}, timeout=timeout)
    if check and p.returncode:
        raise AssertionError(f"stepkit {args} failed ({p.returncode}):\n{p.stderr}")
    return p


def start(*args, delay: float = 0.1, env: dict | None = None) -> subprocess.Popen:
    """Start stepkit in its own session (process group), the scripted engine slowed by ``delay`` s per
    request; stderr is kept in a pipe."""
    return subprocess.Popen(command(*args), cwd=ROOT, env={**ENV, "STEPKIT_SCRIPTED_DELAY": str(delay), **(env or {})},
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def parts_of(out: Path) -> Path:
    return out.with_name(out.name + ".parts")


def committed(out: Path) -> list[Path]:
    """The committed rows parts of OUT's parts folder."""
    return sorted(parts_of(out).glob("part-*.parquet"))


def wait_for_parts(out: Path, n: int, proc: subprocess.Popen | None = None, timeout: float = 120) -> None:
    """Wait until ``n`` chunks of OUT are committed (fails if ``proc`` ends first)."""
    deadline = time.time() + timeout
    while len(committed(out)) < n:
        assert proc is None or proc.poll() is None, f"the run ended early: {proc.stderr.read() if proc.stderr else ''}"
        assert time.time() < deadline, f"{n} parts of {out} not committed within {timeout} s"
        time.sleep(0.02)


def ids(path: Path, column: str = "id") -> list:
    return pq.read_table(path, columns=[column]).column(column).to_pylist()


def rows_lost(inp: Path, out: Path, column: str = "id") -> int:
    """Rows of IN whose ``column`` value is missing from OUT (after the rerun); OUT must not repeat one."""
    got = ids(out, column)
    assert column != "id" or len(got) == len(set(got)), f"{out} repeats an id"
    return len(set(ids(inp, column)) - set(got))


def one_error_line(p) -> str:
    """The single ``error: ...`` line a failed command printed (and nothing else, no traceback)."""
    stderr = p.stderr if isinstance(p.stderr, str) else p.stderr.read()
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert p.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def manifest(out: Path) -> dict:
    return json.loads(out.with_name(out.stem + ".manifest.json").read_text())


def log_events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (parts_of(out) / "log.jsonl").read_text().splitlines()]
