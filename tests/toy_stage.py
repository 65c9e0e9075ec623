"""A toy stage, wired as a new stage would be: this module (its stage, its command and its view) plus one
line in ``stepkit.cli.COMMANDS`` (tests/test_architecture.py adds it there). It has a side output and an
optional side input, so the runner's side tables can be tested on real shards with no model.

``toy-steps IN OUT --steps-out STEPS [--notes NOTES]``: for each trajectory row, ``toy_lengths`` (the
character count of each step) and ``toy_note`` (the row's note from the ``--notes`` side input, joined
by ``problem_id``); the side output holds one row per step (``id``, ``step_index``, ``length``).
``--delay`` or ``TOY_DELAY`` (seconds per chunk) slows it down so a test can kill it mid-shard.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import click
import pyarrow as pa

from stepkit.cli.common import run, runner_options
from stepkit.columns import Column
from stepkit.errors import RowError
from stepkit.options import Config, click_options, from_params, opt
from stepkit.stage import SideInput, SideOutput, Stage
from stepkit.views import StageView

COLUMNS = (Column("toy_lengths", pa.list_(pa.int32()), "characters in the step", per_step=True),
           Column("toy_note", pa.string(), "the row's note from the --notes side input"))
STEP_SCHEMA = pa.schema([pa.field("id", pa.string()), pa.field("step_index", pa.int32()),
                         pa.field("length", pa.int32())])


@dataclass(frozen=True)
class ToyConfig(Config):
    steps_out: str = opt(None, "Where the per-step side table goes.", identity=False)
    notes: str | None = opt(None, "A side input with problem_id and note columns.", identity=False)
    min_length: int = opt(0, "Steps shorter than this are a row error.", min=0)
    delay: float = opt(0.0, "Seconds per chunk (default: TOY_DELAY's).", min=0, identity=False)


class ToyStage(Stage):
    name = "toy-steps"
    required_columns = ("id", "problem_id", "steps")
    default_chunk_size = 2
    columns = COLUMNS

    def __init__(self, cfg: ToyConfig):
        self.cfg = cfg

    def side_outputs(self):
        return {"steps": SideOutput(Path(self.cfg.steps_out), STEP_SCHEMA)}

    def side_inputs(self):
        return {"notes": SideInput(Path(self.cfg.notes), key="problem_id")} if self.cfg.notes else {}

    def process(self, rows):
        time.sleep(self.cfg.delay or float(os.environ.get("TOY_DELAY", "0")))
        out, side = [], []
        for r in rows:
            if r.get("error"):  # failed upstream: passed through unchanged
                out.append({**r, "toy_lengths": None, "toy_note": None})
                continue
            lengths = [len(s) for s in r["steps"]]
            row = {**r, "toy_lengths": lengths, "toy_note": (r.get("_notes") or {}).get("note")}
            if min(lengths) < self.cfg.min_length:
                row["error"] = RowError(self.name, f"short step: {min(lengths)} characters")
            out.append(row)
            side += [{"id": r["id"], "step_index": i, "length": n} for i, n in enumerate(lengths)]
        return out, {"steps": sum(map(len, (r["steps"] for r in rows)))}, {"steps": side}


class CountingToyStage(ToyStage):
    """The toy stage, writing a line to ``log`` each time a process opens or closes it."""

    def __init__(self, cfg: ToyConfig, log: str):
        super().__init__(cfg)
        self.log = log

    def open(self):
        with open(self.log, "a") as f:
            f.write(f"open {os.getpid()}\n")

    def close(self):
        with open(self.log, "a") as f:
            f.write(f"close {os.getpid()}\n")


@click.command("toy-steps")
@click.argument("inp", metavar="IN", type=click.Path())
@click.argument("out", metavar="OUT", type=click.Path())
@click_options(ToyConfig)
@runner_options
def command(inp, out, **kw):
    """Step lengths of the trajectories in IN, and one side row per step."""
    run(ToyStage(from_params(ToyConfig, kw)), inp, out, kw, "toy-steps")


def _stats(rows, console, figs, shards):
    figs["toy_steps"] = sum(len(r["toy_lengths"] or []) for r in rows)
    console.print(f"toy: {figs['toy_steps']} step lengths")


VIEW = StageView(marker="toy_lengths", stats=_stats, step_columns=lambda row: [("chars", "right")],
                 step_cells=lambda row, s: ([row["toy_lengths"][s]], None))

if __name__ == "__main__":  # python -m tests.toy_stage ... (the test kills this process mid-shard)
    from stepkit.cli import COMMANDS, main

    COMMANDS["toy-steps"] = ("tests.toy_stage", "Step lengths (a toy stage).")
    main()
