"""The executor interface: something that runs planned shards (local: :mod:`stepkit.runner.local`;
Ray: :mod:`stepkit.runner.ray_executor`)."""

from __future__ import annotations

import os

from stepkit.runner.options import RunOptions
from stepkit.runner.plan import ShardPlan, ShardResult, plan_run
from stepkit.stage import Stage


class Executor:
    """Runs planned shards. :class:`LocalExecutor` runs them here, one after another; a distributed
    executor (:class:`stepkit.runner.ray_executor.RayExecutor`) runs them on Ray actors that each keep the stage
    open for their shards, through the same :func:`run_shard`. :func:`make_executor` builds the one :class:`ExecutorOptions` names."""

    def run(self, stage: Stage, plans: list[ShardPlan], opts: RunOptions, console=None) -> list[ShardResult]:
        """Run ``plans`` (from :func:`plan_run`) and return one :class:`ShardResult` per plan, in plan order."""
        raise NotImplementedError

    def plan_and_run(self, stage: Stage, in_path: str | os.PathLike, out_path: str | os.PathLike, opts: RunOptions,
                     console=None) -> list[ShardResult]:
        """:func:`plan_run`, then :meth:`run` (a distributed executor plans each shard where it runs it)."""
        return self.run(stage, plan_run(stage, in_path, out_path, opts), opts, console)

