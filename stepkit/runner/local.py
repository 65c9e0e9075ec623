"""The local executor (every shard in this process), :func:`make_executor` and :func:`run_stage`, the
runner's entry point."""

from __future__ import annotations

import os

from stepkit.runner.executor import Executor
from stepkit.runner.options import ExecutorOptions, RunOptions
from stepkit.runner.plan import ShardResult
from stepkit.runner.shard import run_shard
from stepkit.stage import Stage


def make_executor(opts: ExecutorOptions) -> Executor:
    """The executor ``opts`` names (Ray is imported only when a Ray executor runs).

    Raises:
        ConfigError: see :class:`ExecutorOptions`.
    """
    if opts.executor == "local":
        return LocalExecutor()
    from stepkit.runner.ray_executor import RayExecutor

    return RayExecutor(address=opts.ray_address, cpus_per_shard=opts.cpus_per_shard,
                       gpus_per_shard=opts.gpus_per_shard, max_retries=opts.shard_retries)


class LocalExecutor(Executor):
    """Every shard in this process: the stage (its model) is opened once, if any shard has work."""

    def run(self, stage, plans, opts, console=None):
        results = []
        opened = False
        try:
            for plan in plans:
                if plan.status == "up to date":
                    results.append(ShardResult(plan.input, plan.output, "up to date", rows=plan.done_rows))
                    continue
                results.append(run_shard(stage, plan, opts, console, open_stage=not opened))
                opened = True
        finally:
            if opened:
                stage.close()
        return results


def run_stage(stage: Stage, in_path: str | os.PathLike, out_path: str | os.PathLike, *,
              chunk_size: int | None = None, force: bool = False, rank: int | str = 0, world_size: int | None = None,
              max_error_rate: float = 0.05, progress: bool = True, console=None,
              executor: Executor | None = None, chunks_in_flight: int | None = None) -> list[ShardResult]:
    """Run ``stage`` over the shards of ``in_path`` (this rank's share; ``rank="auto"``: from the
    environment, :func:`rank_from_environment`) into ``out_path``: :func:`plan_run`, then ``executor``
    (default :class:`LocalExecutor`), through :meth:`Executor.plan_and_run`.

    Returns one :class:`ShardResult` per shard handled by this rank, in shard order. With the
    :class:`~stepkit.runner.ray_executor.RayExecutor`, a shard that fails while planned on its actor (bad input)
    or running is one of them (status ``failed``, its one-line ``error``) and the other shards finish.

    Raises:
        InputError: unreadable input, missing column, bad rows (before any generation; with the Ray
            executor only for what the driver checks: IN, side inputs).
        ConfigError: the configuration differs from a finished or partial run and ``force`` is off.
        StepkitError: the error rate of a shard exceeds ``max_error_rate`` (its parts are kept, so a
            rerun with a higher threshold finishes without generating again); with the local executor.
    """
    opts = RunOptions(chunk_size=chunk_size, force=force, rank=rank, world_size=world_size,
                      max_error_rate=max_error_rate, progress=progress,
                      chunks_in_flight=chunks_in_flight)
    return (executor or LocalExecutor()).plan_and_run(stage, in_path, out_path, opts, console)

