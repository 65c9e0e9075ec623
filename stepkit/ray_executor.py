"""Ray scale-out: each planned shard is one Ray task running :func:`stepkit.runner.run_shard` (issue 12).

Scheduling shards onto machines, rerunning the work of a machine that died and the cluster's resources
belong to Ray (as in distilabel's ``RayPipeline``, datatrove's ``RayPipelineExecutor`` and
``ray.data.llm``); stepkit's part is that a shard is a unit of work Ray can run, retry and resume:

* The driver plans every shard as it does with ``--executor local`` (:func:`~stepkit.runner.plan_run`:
  bad input anywhere fails before any work), then submits one task per shard that is not up to date,
  reserving ``cpus_per_shard`` / ``gpus_per_shard``. The stage goes to the tasks un-opened (one copy in
  the object store) and each task opens it, so its engine is built on the GPUs Ray assigned that task
  (vLLM's tensor parallelism stays inside the task) and closed when the task ends.
* A task runs the shard exactly as the local executor does: under the lock on OUT, in chunks committed
  to ``OUT.parts``, with the manifest and per-row errors of :func:`~stepkit.runner.run_shard`. A task whose
  worker (or machine) dies is rerun by Ray up to ``max_retries`` times, and the rerun resumes from the
  chunks that shard committed, so no committed chunk is generated twice. The folders must be on storage
  every machine sees (README, "Running on a cluster").
* A shard that fails (a :class:`~stepkit.errors.StepkitError`: bad input found mid-read, its error budget
  exceeded, its OUT locked by another run; or its task failing for good) comes back as a
  :class:`~stepkit.runner.ShardResult` with status ``failed`` and its one-line error, while the other shards
  finish. Results are matched to shards by their output path (:func:`stepkit.matching.match_by_id`), never
  by the order tasks finish in.
* One progress view for all shards: tasks report rows and tokens to a small actor the driver reads.

Ray is imported only here, and only when a Ray executor runs (``stepkit[ray]`` installs it).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from contextlib import contextmanager
from typing import Any

from stepkit.errors import ConfigError, StepkitError, one_line
from stepkit.matching import match_by_id
from stepkit.runner import Executor, RunOptions, ShardPlan, ShardResult, Stage, run_shard

FORWARDED_ENV_PREFIXES = ("STEPKIT_", "VLLM_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")
"""Environment variables the tasks get from the command that started them (model cache, engine and
logging settings), whatever environment the Ray workers were started with."""

LOCAL_IP_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": a local instance binds 127.0.0.1 only


def import_ray():
    """The ``ray`` module.

    Raises:
        ConfigError: Ray is not installed (one line saying how to install it).
    """
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray, which is not installed: pip install 'stepkit[ray]'") from None
    return ray


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return one_line(text.splitlines()[0] if text else type(exc).__name__)


class _Board:
    """The progress of every shard, as its tasks report it (a Ray actor; one per run)."""

    def __init__(self):
        self.shards: dict[str, dict[str, Any]] = {}

    def start(self, key: str, pid: int) -> None:
        s = self.shards.setdefault(key, {"rows": 0, "tokens": 0, "earlier_tokens": 0, "attempts": 0})
        s["attempts"] += 1
        s["earlier_tokens"] += s["tokens"]  # tokens of a killed attempt were spent all the same
        s["tokens"], s["pid"] = 0, pid

    def progress(self, key: str, rows: int, tokens: int) -> None:
        s = self.shards[key]
        s["rows"], s["tokens"] = rows, tokens

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return self.shards


def _shard_task(stage: Stage, plan: ShardPlan, opts: RunOptions, board) -> ShardResult:
    """One shard in a Ray worker: open the stage here (its engine on this task's GPUs), run the shard, close.
    A StepkitError becomes a ``failed`` result, so one bad shard does not stop the others."""
    key = str(plan.output)
    report = None
    if board is not None:
        board.start.remote(key, os.getpid())

        def report(rows, tokens):
            board.progress.remote(key, rows, tokens)
    try:
        return run_shard(stage, plan, opts, None, open_stage=True, report=report)
    except StepkitError as e:
        return ShardResult(plan.input, plan.output, "failed", error=str(e))
    finally:
        stage.close()


class _ClusterProgress:
    """One rich progress bar over all shards: rows, tokens and tokens/s, shards done / running / failed."""

    def __init__(self, enabled: bool, console, label: str, plans: list[ShardPlan]):
        self.enabled, self.console, self.label = enabled, console, label
        self.total = sum(p.rows for p in plans)
        self.t0 = time.time()

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            from stepkit.views import make_console

            self.p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
                              TextColumn("{task.fields[tok]}"), TextColumn("{task.fields[shards]}"),
                              TimeElapsedColumn(), console=self.console or make_console(stderr=True), transient=False)
            self.p.__enter__()
            self.task = self.p.add_task(self.label, total=self.total, tok="", shards="")
        return self

    def update(self, board: dict, finished: dict[str, ShardResult], n_shards: int) -> None:
        if not self.enabled:
            return
        rows = sum(s["rows"] for k, s in board.items() if k not in finished)
        rows += sum(r.rows if r.status != "failed" else board.get(k, {}).get("rows", 0) for k, r in finished.items())
        tokens = sum(s["tokens"] + s["earlier_tokens"] for s in board.values())
        failed = sum(r.status == "failed" for r in finished.values())
        running = sum(1 for k in board if k not in finished)
        retried = sum(max(s["attempts"] - 1, 0) for s in board.values())
        dt = max(time.time() - self.t0, 1e-6)
        shards = (f"shards: {len(finished) - failed} done, {running} running, {failed} failed, "
                  f"{n_shards - len(finished) - running} waiting" + (f", {retried} retried" if retried else ""))
        self.p.update(self.task, completed=min(rows, self.total), shards=shards,
                      tok=f"{tokens} tok, {tokens / dt:.0f} tok/s" if tokens else "")

    def __exit__(self, *exc):
        if self.enabled:
            self.p.__exit__(*exc)


class RayExecutor(Executor):
    """Runs each planned shard as one Ray task (see the module docstring).

    Args:
        address: the Ray cluster to join: ``"auto"`` (``RAY_ADDRESS``, or the cluster ``ray start`` made on
            this machine) or ``"host:port"``; None starts a local Ray instance for this run (on 127.0.0.1
            only), shut down at the end. When this process is already connected to Ray, that
            connection is used as it is.
        cpus_per_shard / gpus_per_shard: what Ray reserves for each shard's task (fractions allowed).
        max_retries: how many times Ray reruns a task whose worker or machine died.
        poll_seconds: how often the progress view is refreshed.

    Raises:
        ConfigError: Ray is not installed.
    """

    def __init__(self, address: str | None = None, cpus_per_shard: float = 1.0, gpus_per_shard: float = 0.0,
                 max_retries: int = 3, poll_seconds: float = 0.5):
        if address is None:  # a local instance binds 127.0.0.1 only (Ray reads this when it is first imported)
            os.environ.setdefault(LOCAL_IP_ENV, "0")
        import_ray()  # before planning: a missing Ray is one line before any work
        self.address, self.cpus, self.gpus = address, cpus_per_shard, gpus_per_shard
        self.max_retries, self.poll = max_retries, poll_seconds

    def run(self, stage: Stage, plans: list[ShardPlan], opts: RunOptions, console=None) -> list[ShardResult]:
        """Run ``plans`` on the Ray cluster; one result per plan, in plan order.

        Raises:
            ConfigError: Ray is not installed, the cluster cannot be joined, the stage was opened already,
                ``--tensor-parallel-size`` exceeds ``gpus_per_shard``, or no machine of a local instance
                has the resources one shard asks for.
            StepkitError: a task's result matches no shard (an internal error).
        """
        done = {str(p.output): ShardResult(p.input, p.output, "up to date", rows=p.done_rows)
                for p in plans if p.status == "up to date"}
        todo = [p for p in plans if p.status != "up to date"]
        if todo:
            self._check_stage(stage)
            ray = import_ray()
            with self._connected(ray, console) as started:
                self._check_resources(ray, started, console)
                for r in self._run_tasks(ray, stage, todo, opts, console):
                    done[str(r.output)] = r
        return match_by_id([str(p.output) for p in plans], done.values(), lambda r: str(r.output), "shard result")

    def _check_stage(self, stage: Stage) -> None:
        if getattr(stage, "engine", None) is not None:
            raise ConfigError(f"{stage.name}: the stage is open already; the Ray executor sends it un-opened and "
                              "each shard's task builds its own engine")
        spec = getattr(stage, "engine_spec", None)
        tp = (spec.options.get("tensor_parallel_size") or 1) if spec is not None else 1
        if self.gpus and tp > self.gpus:
            raise ConfigError(f"--tensor-parallel-size {tp} needs {tp} GPUs per shard, but --gpus-per-shard is "
                              f"{self.gpus:g}")

    @contextmanager
    def _connected(self, ray, console):
        """Connected to Ray for the run; yields whether this run started the (local) instance."""
        if ray.is_initialized():
            yield False
            return
        # The workers' own output (vLLM's start-up notices, from processes stepkit cannot quiet) is shown only
        # when the engine's logs are asked for, as in a local run; otherwise it stays in Ray's log folder.
        verbose = os.environ.get("VLLM_LOGGING_LEVEL", "ERROR").upper() in ("INFO", "DEBUG")
        kwargs = {"logging_level": logging.INFO if verbose else logging.ERROR, "configure_logging": True,
                  "log_to_driver": verbose}
        try:
            if self.address is None:
                ray.init(address="local", include_dashboard=False, **kwargs)
            else:
                ray.init(address=self.address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = f"--ray-address {self.address}" if self.address else "a local Ray instance"
            raise ConfigError(f"{where}: cannot start or join Ray ({_first_line(e)})") from None
        try:
            yield self.address is None
        finally:
            ray.shutdown()

    def _check_resources(self, ray, started: bool, console) -> None:
        """Say what the run is on; refuse (a local instance) or warn (a cluster, which may grow) when no
        machine has what one shard asks for."""
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        fits = any(n.get("CPU", 0) >= self.cpus and n.get("GPU", 0) >= self.gpus for n in nodes)
        cpus, gpus = sum(n.get("CPU", 0) for n in nodes), sum(n.get("GPU", 0) for n in nodes)
        where = "a local Ray instance" if started else f"the Ray cluster at {ray.get_runtime_context().gcs_address}"
        _say(console, f"ray: {where}, {len(nodes)} machine(s), {cpus:g} CPUs, {gpus:g} GPUs; each shard "
                      f"{self.cpus:g} CPU(s), {self.gpus:g} GPU(s)")
        if not fits:
            msg = (f"no machine of {where} has {self.cpus:g} CPU(s) and {self.gpus:g} GPU(s) for one shard "
                   f"(--cpus-per-shard / --gpus-per-shard)")
            if started:
                raise ConfigError(msg)
            _say(console, f"warning: {msg}; the shards wait until such a machine joins")

    def _run_tasks(self, ray, stage: Stage, todo: list[ShardPlan], opts: RunOptions, console):
        """Submit one task per plan and yield each plan's result as its task finishes (in any order)."""
        env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
        options: dict[str, Any] = {"num_cpus": self.cpus, "num_gpus": self.gpus, "max_retries": self.max_retries,
                                   "retry_exceptions": False}
        if env:
            options["runtime_env"] = {"env_vars": env}
        # A GPU shard's worker exits after its task (Ray's own default for GPU functions), so the GPU memory
        # of its engine is given back before another shard's task gets that GPU.
        task = ray.remote(max_calls=1)(_shard_task) if self.gpus else ray.remote(_shard_task)
        board = ray.remote(num_cpus=0)(_Board).remote() if opts.progress else None
        task_opts = dataclasses.replace(opts, progress=False)  # the driver shows one view for all shards
        stage_ref = ray.put(stage)
        refs = {task.options(**options, name=f"stepkit {stage.name} {p.input.name}").remote(stage_ref, p, task_opts,
                                                                                             board): p
                for p in todo}
        pending, finished = list(refs), {}
        try:
            with _ClusterProgress(opts.progress, console, f"{stage.name} ({len(todo)} shards on ray)", todo) as view:
                while pending:
                    ready, pending = ray.wait(pending, num_returns=len(pending), timeout=self.poll)
                    for ref in ready:
                        plan = refs[ref]
                        result = self._result(ray, ref, plan)
                        if str(result.output) != str(plan.output):
                            raise StepkitError(f"internal error: the task of shard {plan.input} returned the result "
                                               f"of {result.output}")
                        finished[str(plan.output)] = result
                        yield result
                    if board is not None:
                        try:
                            view.update(ray.get(board.snapshot.remote(), timeout=60), finished, len(todo))
                        except ray.exceptions.RayError:  # its machine was lost: the view stops, not the run
                            board = None
        finally:
            for ref in pending:  # interrupted: stop the shards still running (committed chunks are kept)
                ray.cancel(ref, force=True)

    def _result(self, ray, ref, plan: ShardPlan) -> ShardResult:
        """The task's result, or a ``failed`` one saying why the task itself failed."""
        parts = plan.output.with_name(plan.output.name + ".parts")
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # an exception that is not a StepkitError: a bug
            cause = getattr(e, "cause", None) or e
            why = f"internal error in its task: {type(cause).__name__}: {_first_line(cause)}"
        except ray.exceptions.RayError as e:  # the worker or machine died more than max_retries times
            why = (f"its task failed {self.max_retries + 1} time(s) ({type(e).__name__}: {_first_line(e)}); "
                   f"committed chunks are kept in {parts}: run the same command again to resume")
        return ShardResult(plan.input, plan.output, "failed", error=one_line(f"{plan.input}: {why}"))


def _say(console, line: str) -> None:
    """One status line on stderr (through the run's console when there is one)."""
    if console is not None:
        console.print(line, markup=False, highlight=False)
    else:
        import click

        click.echo(line, err=True)

