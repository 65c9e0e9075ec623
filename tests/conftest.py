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
