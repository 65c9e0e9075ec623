"""Fixtures of the fault suite: real GSM8K solutions, and the fault table the tests fill.

``STEPKIT_FAULT_TABLE=PATH pytest tests/faults`` writes the table of the faults that ran (fault, what
stepkit did, rows lost, figures measured) to PATH as Markdown: that is how ``README.md``'s table was made.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import DATA
from tests.faults.common import stepkit

_ROWS: list[tuple[str, str, int, str]] = []


@pytest.fixture(scope="session")
def solutions(tmp_path_factory) -> Path:
    """12 real GSM8K model solutions (3 problems x 4 generators)."""
    out = tmp_path_factory.mktemp("sol") / "solutions.parquet"
    stepkit("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", out, "--limit", "3")
    return out


@pytest.fixture(scope="session")
def reference(solutions, tmp_path_factory) -> Path:
    """mc-label of ``solutions`` without any fault (chunks of one row): what every recovered run must equal."""
    from tests.faults.common import MC_LABEL

    out = tmp_path_factory.mktemp("ref") / "ref.parquet"
    stepkit("mc-label", solutions, out, *MC_LABEL)
    return out


class FaultTable:
    """Rows of the fault table: ``add(fault, what stepkit did, rows lost, figures)``."""

    def add(self, fault: str, did: str, lost: int, figures: str = "") -> None:
        _ROWS.append((fault, did, lost, figures))


@pytest.fixture
def fault_table() -> FaultTable:
    return FaultTable()


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("STEPKIT_FAULT_TABLE")
    if not path or not _ROWS:
        return
    lines = ["| fault | what stepkit did | rows lost | measured |", "|---|---|---|---|"]
    lines += [f"| {f} | {d} | {lost} | {fig} |" for f, d, lost, fig in _ROWS]
    Path(path).write_text("\n".join(lines) + "\n")
