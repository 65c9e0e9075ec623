"""The one way stepkit makes a rich console (for tables, progress bars and status lines)."""

from __future__ import annotations

import sys

from rich.console import Console


def make_console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr); 120 columns when not writing to a terminal (rich would wrap
    at 80)."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 120)
