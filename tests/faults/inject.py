"""``python -m tests.faults.inject FAULT -- ARGS``: run ``stepkit ARGS`` with one fault injected.

FAULT is ``enospc:NAME``: the write of the Parquet file whose name contains NAME (e.g. ``part-00004.parquet``)
writes its first row group, then fails with ``OSError(ENOSPC)``, as on a full disk.
"""

from __future__ import annotations

import errno
import os
import sys


def _enospc(name: str) -> None:
    import pyarrow.parquet as pq

    import stepkit.shards as shards

    class FullDisk(pq.ParquetWriter):
        def __init__(self, where, *args, **kwargs):
            super().__init__(where, *args, **kwargs)
            self.full = name in os.path.basename(str(where))

        def write_table(self, table, *args, **kwargs):
            super().write_table(table, *args, **kwargs)
            if self.full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    shards.pq.ParquetWriter = FullDisk  # (shards writes every part through pq.ParquetWriter)


def main(argv: list[str]) -> None:
    fault, sep, *args = argv
    assert sep == "--", "usage: python -m tests.faults.inject FAULT -- ARGS"
    kind, _, arg = fault.partition(":")
    if kind != "enospc":
        raise SystemExit(f"unknown fault {fault}")
    _enospc(arg)
    from stepkit.cli import main as stepkit

    stepkit(args, prog_name="stepkit")


if __name__ == "__main__":
    main(sys.argv[1:])
