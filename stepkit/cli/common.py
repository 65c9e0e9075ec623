"""Option groups and helpers shared by the command modules (engine, sampling, runner options).

Every option here is generated from a config dataclass (:mod:`stepkit.options`): the sampling options
from :class:`~stepkit.engines.base.SamplingConfig`, each engine's options from its ``Options``, the
runner's from :class:`~stepkit.runner.RunOptions`. This module imports no pyarrow, torch or vLLM.
"""

from __future__ import annotations

import dataclasses

import click

from stepkit.engines.base import ENGINES, EngineSpec, SamplingConfig, engine_class
from stepkit.options import click_options, from_params, given_on_command_line


def _run_options_class():
    from stepkit.runner import RunOptions

    return RunOptions


def _executor_options_class():
    from stepkit.runner import ExecutorOptions

    return ExecutorOptions


def runner_options(f):
    """Options every model stage shares: chunks, resume, sharding, error budget, progress, and where the
    shards run (``--executor local|ray`` with Ray's ``--ray-address``, ``--cpus-per-shard``,
    ``--gpus-per-shard``, ``--shard-retries``)."""
    return click_options(_run_options_class())(click_options(_executor_options_class())(f))


def runner_options_only(*names: str):
    """Some of the runner's options (a stage with no model has no use for ``--chunk-size`` or an error budget)."""
    return lambda f: click_options(_run_options_class(), only=names)(f)


def engine_options(f=None, *, temperature: float = 0.8, max_tokens: int = 256, samples: bool = True):
    """``--model``, ``--engine``, the sampling options and every engine's own options.

    Use as ``@engine_options`` or ``@engine_options(temperature=..., max_tokens=...)`` for a command's
    own defaults; ``samples=False`` (a command that only scores text) keeps ``--seed`` alone of the
    sampling options. :func:`engine_spec` refuses an option of another engine than the chosen one.
    """
    if f is None:
        return lambda g: engine_options(g, temperature=temperature, max_tokens=max_tokens, samples=samples)
    for name in reversed(list(ENGINES)):
        f = click_options(engine_class(name).Options)(f)
    f = click_options(SamplingConfig, defaults={"temperature": temperature, "max_tokens": max_tokens},
                      only=None if samples else ("seed",))(f)
    f = click.option("--engine", type=click.Choice(list(ENGINES)), default="vllm", show_default=True)(f)
    f = click.option("--model", "-m", required=True,
                     help="Bundled model name (smollm2-135m), a local model folder, or the served model name.")(f)
    return f


def engine_spec(kw: dict) -> EngineSpec:
    """The :class:`EngineSpec` the engine options in ``kw`` describe (nothing is loaded).

    Raises:
        click.UsageError: an option of another engine was given (it would be silently unused).
        ConfigError: a value the chosen engine refuses (e.g. ``--engine openai`` without ``--base-url``).
    """
    name = kw["engine"]
    ctx = click.get_current_context()
    if kw["model"].startswith("scripted") and name != "scripted":
        raise click.UsageError(f"--model {kw['model']} is a scripted stand-in: add --engine scripted")
    own = {f.name for f in dataclasses.fields(engine_class(name).Options)}
    for other in ENGINES:
        for f in dataclasses.fields(engine_class(other).Options):
            if f.name not in own and f.name in kw and given_on_command_line(ctx, f.name):
                flag = next(p.opts[0] for p in ctx.command.params if p.name == f.name)
                raise click.UsageError(f"{flag} is an option of --engine {other}; this run uses --engine {name}")
    options = {k: kw[k] for k in own if k in kw}
    return EngineSpec(name, kw["model"], kw["seed"], options)


def sampling(kw: dict, stop=(), **overrides) -> SamplingConfig:
    """The :class:`SamplingConfig` from the sampling options in ``kw`` with ``stop`` strings."""
    return from_params(SamplingConfig, kw, stop=tuple(stop), **overrides)


def run(stage, inp, out, kw: dict, title: str, shown=None) -> None:
    """Run ``stage`` with the runner and executor options in ``kw`` and print the summary table (the
    counters for which ``shown(name)`` is true; all by default).

    A shard that failed while the others ran on (``--executor ray``) is in the table with status
    ``failed``; its one-line error follows the table (``error: ...``), and the command exits with status 1.
    """
    from stepkit.runner import make_executor, run_stage

    opts = from_params(_run_options_class(), kw)
    executor = make_executor(from_params(_executor_options_class(), kw))
    results = run_stage(stage, inp, out, **{f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)},
                        executor=executor)
    if not results:
        click.echo(f"{title}: no shard for --rank {opts.rank} of --world-size {opts.world_size}; nothing to do",
                   err=True)
        return
    print_results(results, title, shown, getattr(stage, "tokens_kind", "generated"))
    failed = [r for r in results if r.status == "failed"]
    totals: dict[str, int] = {}
    for r in results:  # once per run, over the shards run now (an up-to-date shard reports no counters)
        if r.status != "failed":
            for k, v in r.counters.items():
                if isinstance(v, int):
                    totals[k] = totals.get(k, 0) + v
    for line in stage.run_warnings(totals):
        click.echo(f"warning: {line}", err=True)
    for r in failed:
        click.echo(f"error: {r.error}", err=True)
    if failed:
        raise click.exceptions.Exit(1)


def check_json_path(ctx, param, value):
    """--json must name a .json file that is none of a shard's own files (:func:`check_report_path`)."""
    if value is not None and not value.endswith(".json"):
        raise click.BadParameter(f"{value}: the report file must end in .json")
    if value is not None:
        check_report_path(value)
    return value


def check_report_path(path) -> None:
    """Refuse a report path that would write over a shard's own files: a Parquet shard, the manifest
    of an existing shard (``x.manifest.json`` beside ``x.parquet``, or any stepkit manifest), or a file
    in a run's ``.parts`` folder (``part-NNNNN.json``, ``run.json``).

    Raises:
        StepkitError: one line naming the path and whose file it is.
    """
    import json
    from pathlib import Path

    from stepkit.errors import StepkitError
    from stepkit.shards import resolve_path

    p = Path(path)
    real = resolve_path(p)
    parts = next((d for d in (real, *real.parents) if d.name.endswith(".parquet.parts")), None)
    if parts is not None:
        raise StepkitError(f"{p}: is inside the parts folder {parts} of a run; write the report elsewhere")
    for q in (p, real):
        shard = q.with_name(q.name.removesuffix(".manifest.json") + ".parquet")
        if q.name.endswith(".manifest.json") and shard.exists():
            raise StepkitError(f"{p}: is the manifest of the shard {shard}; write the report elsewhere")
    if real.is_file():
        try:
            with open(real, "rb") as f:
                head = f.read(4)
            doc = json.loads(real.read_text()) if head != b"PAR1" and real.stat().st_size < 1 << 24 else None
        except (OSError, ValueError):
            doc = None
        if head == b"PAR1":
            raise StepkitError(f"{p}: is a Parquet shard; write the report elsewhere")
        if isinstance(doc, dict) and "stage" in doc and "stepkit_version" in doc:
            raise StepkitError(f"{p}: is the manifest of a {doc['stage']} shard; write the report elsewhere")


def write_json_report(path, doc) -> None:
    """Write a report (refusing a shard's own files, :func:`check_report_path`); one clear line when the
    path cannot be written."""
    from pathlib import Path

    from stepkit.errors import StepkitError
    from stepkit.shards import write_json

    p = Path(path)
    check_report_path(p)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_json(p, doc)
    except OSError as e:
        raise StepkitError(f"{p}: cannot write the report ({e.strerror or e})") from None


def print_results(results, title: str, shown=None, tokens_kind: str = "generated") -> None:
    """Summary table at the end of a run: one column per shard, one row per figure (``tokens_kind``: what
    the stage's tokens are, ``generated`` or ``scored``); a failed shard shows its status only."""
    from rich.table import Table

    from stepkit.console import make_console

    t = Table(title=title)
    t.add_column("")
    for r in results:
        t.add_column(r.output.name, justify="right")
    rows = [("status", lambda r: r.status), ("rows", lambda r: r.rows), ("rows with error", lambda r: r.errors),
            ("chunks resumed / total", lambda r: f"{r.resumed_chunks}/{r.chunks}"),
            (f"tokens {tokens_kind} (this run)", lambda r: r.tokens),
            ("tokens/s", lambda r: f"{r.tokens / r.seconds:.0f}" if r.seconds > 0 and r.tokens else "-"),
            ("seconds loading (this run)", lambda r: f"{r.load_seconds:.1f}"),
            ("seconds labelling (this run)", lambda r: f"{r.seconds:.1f}")]
    if not any(r.tokens for r in results):  # a stage with no model (filter), or nothing left to do
        rows = [row for row in rows if not row[0].startswith("tokens")]
    if not any(r.load_seconds for r in results):  # nothing was loaded (no model, or already open)
        rows = [row for row in rows if row[0] != "seconds loading (this run)"]
    for k in sorted({k for r in results for k in r.counters if k != "errors" and (shown is None or shown(k))}):
        rows.append((k.replace("_", " "), lambda r, k=k: r.counters.get(k, "")))
    for name, fn in rows:  # a failed shard has its status only (its error line follows the table)
        t.add_row(name, *[str(fn(r)) if r.status != "failed" or name == "status" else "-" for r in results])
    make_console(stderr=True).print(t)


def check_calibrate(calibrate: str | None, out) -> None:
    """A ``--calibrate`` shard must not be OUT or inside it (it would be read while being written).

    Raises:
        click.UsageError: it is.
    """
    if calibrate:
        from pathlib import Path

        cal, target = Path(calibrate).resolve(), Path(out).resolve()
        if cal == target or cal.is_relative_to(target):
            raise click.UsageError(f"--calibrate {calibrate} is (inside) OUT: calibrate on another labelled shard")
