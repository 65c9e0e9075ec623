"""Ray scale-out: the planned shards run on a pool of Ray actors that each hold the opened stage (issue 12).

Scheduling onto machines, the processes that die with a machine and the cluster's resources belong to Ray
(as in distilabel's ``RayPipeline`` and ``ray.data.llm``, whose long-lived actors each hold an engine);
stepkit's part is that a shard is a unit of work an actor can run, and rerun and resume elsewhere:

* The driver checks the run as a whole (:func:`~stepkit.runner.prepare_run`: IN and OUT, side inputs)
  and each shard's outputs and status without reading its rows (:func:`~stepkit.runner.plan_shard` with
  ``read_rows=False``: up to date, or from another configuration, refused before any work), then starts
  ``min(shards with work, actors the cluster can hold)`` actors, each reserving ``cpus_per_shard`` /
  ``gpus_per_shard``. The stage goes to the actors un-opened (one copy in the object store); each actor
  opens it on its first shard, once that shard's lock is held, so its engine is built on the GPUs Ray
  assigned that actor (vLLM's tensor parallelism stays inside it), and keeps it open for every later
  shard, as :class:`~stepkit.runner.LocalExecutor` does for all of them. The driver hands the next
  waiting shard to whichever actor is free; an actor with nothing left closes its stage and is killed,
  so its GPU memory is given back.
* An actor first plans its shard in full (:func:`~stepkit.runner.plan_shard`: columns, every row,
  side-input joins), so a shard with bad input fails alone, then runs it exactly as the local executor
  does, through the same :func:`~stepkit.runner.run_shard`: under the lock on OUT, in chunks committed to
  ``OUT.parts``, with the manifest and per-row errors. When an actor's process (or machine) dies
  mid-shard, the driver starts a new actor and gives it that shard again, up to ``max_retries`` times per
  shard; the rerun resumes from the chunks the shard committed, so no committed chunk is generated twice.
  The folders must be on storage every machine sees (README, "Running on a cluster").
* A shard that fails (a :class:`~stepkit.errors.StepkitError`: bad input found by its plan or mid-read,
  its error budget exceeded, its OUT locked by another run, the stage failing to open; or its actor dying
  more than ``max_retries`` times) comes back as a :class:`~stepkit.runner.ShardResult` with status
  ``failed`` and its one-line error, while the other shards finish. Results are matched to shards by
  their output path (:func:`stepkit.matching.match_by_id`), never by the order they finish in.
* One progress view for all shards: actors report rows and tokens to a small actor the driver reads.

Ray is imported only here, and only when a Ray executor runs (``stepkit[ray]`` installs it).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import sys
import time
from collections import deque
from contextlib import contextmanager
from typing import Any

from stepkit.errors import ConfigError, StepkitError, one_line
from stepkit.matching import match_by_id
from stepkit.runner.executor import Executor
from stepkit.runner.options import RunOptions
from stepkit.runner.plan import RunSetup, ShardPlan, ShardResult, plan_shard, prepare_run
from stepkit.runner.shard import run_shard
from stepkit.stage import Stage

FORWARDED_ENV_PREFIXES = ("STEPKIT_", "VLLM_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")
"""Environment variables the actors get from the command that started them (model cache, engine and
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


class _ShardActor:
    """Runs shard after shard with one stage, opened on the first shard and kept open (a Ray actor).

    A :class:`~stepkit.errors.StepkitError` becomes a ``failed`` result, so one bad shard does not stop the
    others; the actor goes on with the next shard."""

    def __init__(self, stage: Stage, board, setup: RunSetup | None = None):
        self.stage, self.board, self.setup = stage, board, setup
        self.opened = self.tried = False

    def _open(self) -> None:
        """Open the stage, unless it is open already (run_shard calls this once it holds the shard's lock)."""
        if self.opened:
            return
        if self.tried:  # an earlier open failed part-way: release what it built before trying again
            self.stage.close()
        self.tried = True
        self.stage.open()
        self.opened = True

    def run(self, plan: ShardPlan, opts: RunOptions) -> ShardResult:
        key = str(plan.output)
        report = None
        if self.board is not None:
            self.board.start.remote(key, os.getpid())

            def report(rows, tokens):
                self.board.progress.remote(key, rows, tokens)
        try:
            if self.setup is not None:  # the driver's plan read no row: plan the shard in full here
                plan = plan_shard(self.stage, self.setup, plan.input, opts)
                if plan.status == "up to date":  # (finished by another run meanwhile)
                    return ShardResult(plan.input, plan.output, "up to date", rows=plan.done_rows)
            return run_shard(self.stage, plan, opts, None, open_stage=self._open, report=report)
        except StepkitError as e:
            return ShardResult(plan.input, plan.output, "failed", error=str(e))

    def close(self) -> None:
        if self.tried:
            self.stage.close()
        self.opened = self.tried = False


class _ClusterProgress:
    """One rich progress bar over all shards: rows, tokens and tokens/s, shards done / running / failed."""

    def __init__(self, enabled: bool, console, label: str, plans: list[ShardPlan]):
        self.enabled, self.console, self.label = enabled, console, label
        self.total = sum(p.rows for p in plans)
        self.t0 = time.time()

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            from stepkit.console import make_console

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
    """Runs the planned shards on a pool of Ray actors that each hold the opened stage (see the module
    docstring).

    Args:
        address: the Ray cluster to join: ``"auto"`` (``RAY_ADDRESS``, or the cluster ``ray start`` made on
            this machine) or ``"host:port"``; None starts a local Ray instance for this run (on 127.0.0.1
            only), shut down at the end. When this process is already connected to Ray, that
            connection is used as it is.
        cpus_per_shard / gpus_per_shard: what Ray reserves for each actor, which runs one shard at a time
            (fractions allowed).
        max_retries: how many times a shard is given to a new actor after its actor's process or machine died.
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
                has the resources one actor asks for.
            StepkitError: an actor's result matches no shard (an internal error).
        """
        return self._run(stage, plans, opts, console, None)

    def plan_and_run(self, stage: Stage, in_path, out_path, opts: RunOptions, console=None) -> list[ShardResult]:
        """Plan the run on the driver without reading any shard's rows (the run-wide checks and side inputs,
        and each shard's outputs, identity and status: up to date, or from another configuration, which is
        refused before any work), then run the shards on the actors, each planning its shard in full first
        (:func:`~stepkit.runner.plan_shard`): a shard with bad input (a bad row, a missing column) comes back
        ``failed`` with its one-line error while the other shards run.

        Raises:
            ConfigError, InputError: as :func:`~stepkit.runner.prepare_run` and the driver's plan of a shard.
            Otherwise as :meth:`run`.
        """
        setup = prepare_run(stage, in_path, out_path, opts)
        plans = [plan_shard(stage, setup, shard, opts, read_rows=False) for shard in setup.shards]
        return self._run(stage, plans, opts, console, setup)

    def _run(self, stage: Stage, plans: list[ShardPlan], opts: RunOptions, console,
             setup: RunSetup | None) -> list[ShardResult]:
        done = {str(p.output): ShardResult(p.input, p.output, "up to date", rows=p.done_rows)
                for p in plans if p.status == "up to date"}
        todo = [p for p in plans if p.status != "up to date"]
        if todo:
            self._check_stage(stage)
            ray = import_ray()
            with self._connected(ray, console) as started:
                n_actors = self._pool_size(ray, started, console, len(todo))
                for r in self._run_pool(ray, stage, todo, opts, console, n_actors, setup):
                    done[str(r.output)] = r
        return match_by_id([str(p.output) for p in plans], done.values(), lambda r: str(r.output), "shard result")

    def _check_stage(self, stage: Stage) -> None:
        if getattr(stage, "engine", None) is not None:
            raise ConfigError(f"{stage.name}: the stage is open already; the Ray executor sends it un-opened and "
                              "each actor builds its own engine")
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
        if self.address is not None:
            check_reachable(self.address)  # ray.init waits minutes for a cluster that is not there
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

    def _slots(self, node: dict) -> int:
        """How many actors of ``cpus_per_shard`` / ``gpus_per_shard`` one machine holds."""
        n = math.floor(node.get("CPU", 0) / self.cpus + 1e-9)
        if self.gpus:
            n = min(n, math.floor(node.get("GPU", 0) / self.gpus + 1e-9))
        return n

    def _pool_size(self, ray, started: bool, console, n_todo: int) -> int:
        """The number of actors: one per shard with work, at most what the machines hold now. Says what the
        run is on; refuses (a local instance) or warns (a cluster, which may grow) when no machine holds one."""
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        slots = sum(self._slots(n) for n in nodes)
        cpus, gpus = sum(n.get("CPU", 0) for n in nodes), sum(n.get("GPU", 0) for n in nodes)
        where = "a local Ray instance" if started else f"the Ray cluster at {ray.get_runtime_context().gcs_address}"
        n_actors = max(1, min(n_todo, slots))
        _say(console, f"ray: {where}, {len(nodes)} machine(s), {cpus:g} CPUs, {gpus:g} GPUs; {n_actors} actor(s) "
                      f"of {self.cpus:g} CPU(s), {self.gpus:g} GPU(s), each opening the stage once for its shards")
        if not slots:
            msg = (f"no machine of {where} has {self.cpus:g} CPU(s) and {self.gpus:g} GPU(s) for one shard "
                   f"(--cpus-per-shard / --gpus-per-shard)")
            if started:
                raise ConfigError(msg)
            _say(console, f"warning: {msg}; the shards wait until such a machine joins")
        return n_actors

    def _run_pool(self, ray, stage: Stage, todo: list[ShardPlan], opts: RunOptions, console, n_actors: int,
                  setup: RunSetup | None):
        """Run ``todo`` on ``n_actors`` actors, the next waiting shard to whichever actor is free; yield each
        plan's result as it finishes (in any order)."""
        env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
        # Ray restarts nothing itself: a dead actor is replaced here and its shard given to the new one, so
        # --shard-retries counts per shard and a new actor opens the stage afresh.
        options: dict[str, Any] = {"num_cpus": self.cpus, "num_gpus": self.gpus, "max_restarts": 0,
                                   "max_task_retries": 0}
        if env:
            options["runtime_env"] = {"env_vars": env}
        actor_cls = ray.remote(_ShardActor)
        board = ray.remote(num_cpus=0)(_Board).remote() if opts.progress else None
        task_opts = dataclasses.replace(opts, progress=False)  # the driver shows one view for all shards
        stage_ref, setup_ref = ray.put(stage), ray.put(setup)  # (one copy of each, whatever the number of actors)

        def new_actor():
            return actor_cls.options(**options).remote(stage_ref, board, setup_ref)

        waiting = deque(todo)
        attempts = {str(p.output): 0 for p in todo}
        idle = [new_actor() for _ in range(n_actors)]
        running: dict[Any, tuple[Any, ShardPlan]] = {}  # the ref of an actor's run -> (actor, plan)
        closing: list[tuple[Any, Any]] = []  # (actor, the ref of its close)
        finished: dict[str, ShardResult] = {}
        try:
            with _ClusterProgress(opts.progress, console, f"{stage.name} ({len(todo)} shards on ray)", todo) as view:
                while waiting or running:
                    while waiting and idle:
                        actor, plan = idle.pop(), waiting.popleft()
                        attempts[str(plan.output)] += 1
                        running[actor.run.remote(plan, task_opts)] = (actor, plan)
                    ready, _ = ray.wait(list(running), num_returns=len(running), timeout=self.poll)
                    for ref in ready:
                        actor, plan = running.pop(ref)
                        try:
                            result = ray.get(ref)
                        except _actor_deaths(ray) as e:  # its process, its worker or its machine died
                            ray.kill(actor, no_restart=True)
                            retry = attempts[str(plan.output)] <= self.max_retries
                            if retry:  # to a new actor, resuming from the committed chunks
                                waiting.appendleft(plan)
                            if waiting:
                                idle.append(new_actor())
                            if retry:
                                continue
                            result = self._lost(plan, e)
                        except ray.exceptions.RayTaskError as e:  # an exception that is not a StepkitError: a bug
                            idle.append(actor)
                            cause = getattr(e, "cause", None) or e
                            result = ShardResult(plan.input, plan.output, "failed", error=one_line(
                                f"{plan.input}: internal error in its actor: {type(cause).__name__}: "
                                f"{_first_line(cause)}"))
                        else:
                            idle.append(actor)
                        if str(result.output) != str(plan.output):
                            raise StepkitError(f"internal error: the actor running shard {plan.input} returned "
                                               f"the result of {result.output}")
                        finished[str(plan.output)] = result
                        yield result
                    if not waiting:  # nothing left for the idle actors: close their stages (GPU memory back)
                        closing += [(actor, actor.close.remote()) for actor in idle]
                        idle = []
                    if board is not None:
                        try:
                            view.update(ray.get(board.snapshot.remote(), timeout=60), finished, len(todo))
                        except ray.exceptions.RayError:  # its machine was lost: the view stops, not the run
                            board = None
        finally:
            # Interrupted: the shards still running stop (their committed chunks are kept). Then every
            # actor is killed once its stage is closed, so its process and GPU memory are given back.
            closing += [(actor, actor.close.remote()) for actor in idle]
            if closing:
                ray.wait([ref for _, ref in closing], num_returns=len(closing), timeout=120)
            for actor, _ in [*closing, *running.values()]:
                ray.kill(actor, no_restart=True)
            if board is not None:
                ray.kill(board, no_restart=True)

    def _lost(self, plan: ShardPlan, e: BaseException) -> ShardResult:
        """A ``failed`` result for a shard whose actor died more than ``max_retries`` times, saying how
        the last one died (:func:`death_kind`)."""
        parts = plan.output.with_name(plan.output.name + ".parts")
        why = (f"its actor died {self.max_retries + 1} time(s), the last {death_kind(e)} ({type(e).__name__}: "
               f"{_first_line(e)}); committed chunks are kept in {parts}: run the same command again to resume")
        return ShardResult(plan.input, plan.output, "failed", error=one_line(f"{plan.input}: {why}"))


CONNECT_TIMEOUT = 5.0
"""Seconds to wait for a TCP connection to the cluster's address before saying that nothing answers."""


def check_reachable(address: str, env=None) -> None:
    """Refuse, in one line and within :data:`CONNECT_TIMEOUT` seconds, a cluster address where nothing
    answers (``ray.init`` would wait minutes on it, printing nothing). ``address`` is ``host:port``,
    ``ray://host:port`` (Ray Client) or ``auto`` (then ``RAY_ADDRESS`` of ``env``, default the process's,
    is checked when set; else Ray finds the cluster ``ray start`` made on this machine itself).

    Raises:
        ConfigError: the address is malformed, or nothing accepts a connection there.
    """
    shown = f"--ray-address {address}"
    if address == "auto":
        address = (os.environ if env is None else env).get("RAY_ADDRESS", "")
        if not address or address == "auto":
            return
        shown += f" (RAY_ADDRESS={address})"
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{shown}: expected host:port, ray://host:port or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT):
            pass
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__).lower()
        raise ConfigError(f"{shown}: nothing answers at {host}:{port} ({why} after at most {CONNECT_TIMEOUT:g} s); "
                          f"start the cluster (`ray start --head`) or give its address") from None


_DEATHS = (  # Ray's exception -> how the actor died; every kind is retried the same way
    ("OutOfMemoryError", "killed by Ray's memory monitor (the machine ran low on memory)"),
    ("NodeDiedError", "with its machine"),
    ("LocalRayletDiedError", "with its machine's Ray process"),
    ("WorkerCrashedError", "in a crash of its worker process"),
    ("ObjectLostError", "with its result (lost with its machine)"),
    ("ActorUnavailableError", "unreachable"),
    ("RayActorError", "when its process exited"),
)


def _actor_deaths(ray) -> tuple[type[BaseException], ...]:
    """The exception classes of every way Ray reports that an actor's call will not return: its process
    killed or crashed (``RayActorError``, ``WorkerCrashedError``), killed by the memory monitor
    (``OutOfMemoryError``, which is no ``RayActorError``), its machine lost (``NodeDiedError``,
    ``LocalRayletDiedError``, ``ObjectLostError``). The names Ray does not have are skipped."""
    return tuple(c for name, _ in _DEATHS if isinstance(c := getattr(ray.exceptions, name, None), type))


def death_kind(e: BaseException) -> str:
    """How an actor died, from Ray's exception (its class or a base class's name): a few words."""
    names = {c.__name__ for c in type(e).__mro__}
    return next((kind for name, kind in _DEATHS if name in names), "of an unknown cause")


def _say(console, line: str) -> None:
    """One status line on stderr (through the run's console when there is one)."""
    if console is not None:
        console.print(line, markup=False, highlight=False)
    else:
        print(line, file=sys.stderr, flush=True)

