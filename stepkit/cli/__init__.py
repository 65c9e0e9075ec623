"""The ``stepkit`` command line: a thin click layer over the stages, one module per command.

``COMMANDS`` is the one registry: a command's module is imported only when that command runs (or its
``--help`` is shown), so ``stepkit --help`` imports no pyarrow, torch or vLLM (click's lazy group,
vLLM's ``entrypoints/cli/``). A command module defines ``command`` (a click command or group) and,
for a stage that writes columns, ``VIEW`` (a :class:`stepkit.views.StageView` for ``stats``/``show``).
Every :class:`stepkit.errors.StepkitError` becomes one ``error: ...`` line on stderr and exit status 1;
SIGTERM and Ctrl-C unwind the command (lock released, engine processes shut down) and end with one
``error: ... stopped by SIGTERM ...`` line and exit status 128 + the signal's number. ``--verbose`` shows the
engine's own logs.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading

import click

from stepkit import __version__

# name -> (module, one-line summary for `stepkit --help`). Adding a command is one line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "ingest": ("stepkit.cli.ingest", "Convert FILE (format FORMAT) into a Parquet shard OUT."),
    "rollout": ("stepkit.cli.rollout", "Sample N solutions per problem of PROBLEMS into OUT."),
    "mc-label": ("stepkit.cli.mc_label", "Monte Carlo value of every step prefix (Math-Shepherd / OmegaPRM)."),
    "mcts-label": ("stepkit.cli.mcts_label", "OmegaPRM tree search: step values, rollout trees, preference pairs."),
    "judge": ("stepkit.cli.judge", "LLM-as-judge step labels (ProcessBench critic prompt, majority vote)."),
    "likelihood-label": ("stepkit.cli.likelihood", "Step rewards from log-probabilities (answer gain, implicit PRM); no sampling."),
    "clue": ("stepkit.cli.clue", "Answer-backtracked clues (ABSeeker): recover per problem, score each step."),
    "check-steps": ("stepkit.cli.check_steps", "Check each step's mathematics with sympy (no model): claims held, failed, not parsed."),
    "filter": ("stepkit.cli.filter", "Keep rows that pass rules (consensus, PROF, values, steps); cut steps."),
    "export": ("stepkit.cli.export", "Write labelled rows as a Hub-layout dataset (TRL, Math-Shepherd, ProcessBench, messages, DPO)."),
    "publish": ("stepkit.cli.publish", "Publish an export folder to the Hugging Face Hub: card, figures, one commit."),
    "train-prm": ("stepkit.cli.train_prm", "Train a step-level PRM (token classification) from a stepwise-supervision dataset."),
    "prm-label": ("stepkit.cli.prm_label", "Score every step with a trained PRM (token classification, Qwen PRM, Math-Shepherd)."),
    "eval": ("stepkit.cli.evaluate", "Score step labels: ProcessBench F1, agreement of two labelers."),
    "stats": ("stepkit.cli.stats", "Summary of a shard: rows, steps, outcomes, each stage's figures."),
    "show": ("stepkit.cli.show", "Show one trajectory: each step with every stage's labels."),
    "report": ("stepkit.cli.report", "One self-contained HTML page over labelled shards or an export: summary, rows, steps."),
    "models": ("stepkit.cli.models", "Bundled models (real weights shipped in a package; no downloads)."),
}


def load_command_module(name: str):
    """The module of command ``name`` (imported on first use)."""
    return importlib.import_module(COMMANDS[name][0])


def stage_views() -> list:
    """Every registered command's :class:`~stepkit.views.StageView`, in registry order."""
    views = (getattr(load_command_module(name), "VIEW", None) for name in COMMANDS)
    return [v for v in views if v is not None]


class _LazyGroup(click.Group):
    """Loads a command's module only when it is called; turns StepkitError into one clear line."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        return load_command_module(name).command

    def format_commands(self, ctx, formatter):
        """The command list from the registry's summaries, without importing any command module."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, summary) for name, (_, summary) in COMMANDS.items()])

    def invoke(self, ctx):
        from stepkit.errors import Interrupted, StepkitError

        if ctx.params.get("verbose"):  # before the command's module loads (it imports the engine modules)
            show_engine_logs()
        previous = _stop_on_signals()
        try:
            return super().invoke(ctx)
        except StepkitError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM, after every cleanup (lock, engine processes) ran
            signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
            click.echo(f"error: {e if isinstance(e, Interrupted) else 'stopped by SIGINT'}", err=True)
            sys.exit(128 + signum)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _stop_on_signals() -> dict:
    """Make SIGTERM (and SIGINT) raise :class:`~stepkit.errors.Interrupted` in the main thread, so a
    stopped command unwinds like Ctrl-C: the output lock is released, the engine's and the answer
    checker's processes are shut down, temporary files are removed. A second signal during that cleanup
    acts at once (the default action). Returns the handlers it replaced."""
    from stepkit.errors import Interrupted

    def stop(signum, frame):
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        raise Interrupted(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():  # (signal handlers live in the main thread)
        for s in (signal.SIGINT, signal.SIGTERM):
            previous[s] = signal.signal(s, stop)
    return previous


def show_engine_logs() -> None:
    """``--verbose``: let the engine log as it does by itself. Sets ``VLLM_LOGGING_LEVEL=INFO`` (before vLLM
    is imported; the engine processes it spawns inherit it, and :mod:`stepkit.engines.vllm_engine` then
    quiets neither torch's notes nor its deprecation warnings) and undoes the quieting of vLLM's Triton
    notice that importing :mod:`stepkit` applied."""
    import logging

    os.environ["VLLM_LOGGING_LEVEL"] = "INFO"
    logging.getLogger("vllm.triton_utils.importing").setLevel(logging.NOTSET)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="stepkit")
@click.option("--verbose", "-v", is_flag=True, help="Show the engine's own logs (vLLM at INFO, torch's notes and "
              "warnings); by default a command shows stepkit's progress, summary and errors only.")
def main(verbose: bool = False):  # (--verbose acts in _LazyGroup.invoke, before the command's module loads)
    """Build step-labeled datasets for process reward models (PRMs).

    Stages read and write Parquet shards: ingest -> rollout -> mc-label / mcts-label / judge -> filter ->
    export -> publish; eval, stats and show read any of them.
    """
