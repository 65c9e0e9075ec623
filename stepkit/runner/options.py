"""The runner's options: one run (``RunOptions``), the executor (``ExecutorOptions``), and this rank's
share of a folder from the environment (``--rank auto``: Slurm, torchrun, MPI)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from stepkit.errors import ConfigError, one_line
from stepkit.options import Config, flag_of, opt


@dataclass(frozen=True)
class RunOptions(Config):
    """How the runner runs a stage (none of these change the rows, except ``chunk_size``, which is part
    of the identity because it fixes which rows share an engine call; ``chunks_in_flight`` does not: a
    stage on the asynchronous path gives the same rows whatever order its answers come in, given samples
    that depend on the request alone: the scripted engine, or per-request seeds the stage numbers itself,
    as exhaustive mc-label does (binary mc-label's and mcts-label's requests are still numbered by the
    engine in the order they are sent, so on GPU their samples depend on timing, as every engine-seeded
    CPU sample does))."""

    chunk_size: int | None = opt(None, "Rows per committed chunk (resume granularity).", min=1)
    force: bool = opt(False, "Redo the output even if it exists from another configuration.")
    rank: int = opt(0, "This machine's index: takes sorted(shards)[rank::world_size]; auto: from "
                       "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT or RANK/WORLD_SIZE.", min=0, words=("auto",),
                    metavar="R|auto")
    world_size: int | None = opt(None, "How many machines split the folder of shards (default 1; with --rank "
                                       "auto, from the environment).", min=1)
    max_error_rate: float = opt(0.05, "Fail a shard when more than this share of rows has an error.", min=0, max=1)
    progress: bool = opt(True, "Show a progress bar.", flag="--progress/--no-progress")
    chunks_in_flight: int | None = opt(None, "Chunks a stage on the engine's asynchronous path runs at once (the "
                                          "next chunk's requests start while the last ones of the previous finish; "
                                          "commits stay in order, a killed run redoes at most these chunks) "
                                          "[default: enough chunks for 128 rows, at least 4 and at most 64].", min=1, max=1024)

    def __post_init__(self):
        super().__post_init__()
        if self.rank == "auto":
            rank, world = rank_from_environment(os.environ)
            if self.world_size is not None and self.world_size != world:
                raise ConfigError(f"--rank auto: the environment says {world} ranks, but --world-size is "
                                  f"{self.world_size}; leave --world-size out or make them agree")
            object.__setattr__(self, "rank", rank)
            object.__setattr__(self, "world_size", world)
        elif self.world_size is None:
            object.__setattr__(self, "world_size", 1)
        if self.rank >= self.world_size:
            raise ConfigError(f"need 0 <= rank < world-size, got --rank {self.rank} --world-size {self.world_size}")


def _env_int(env, name: str) -> int:
    value = env[name].strip()
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"--rank auto: {name}={one_line(value)!r:.40} is not an integer") from None


def rank_from_environment(env) -> tuple[int, int]:
    """``(rank, world_size)`` for ``--rank auto``, from a Slurm array job or a torchrun-style launcher.

    Slurm (``sbatch --array``): ``SLURM_ARRAY_TASK_ID`` and ``SLURM_ARRAY_TASK_COUNT``; when Slurm also sets
    ``SLURM_ARRAY_TASK_MIN`` / ``SLURM_ARRAY_TASK_STEP`` (an array such as ``1-8`` or ``0-15:2``), the rank
    is ``(ID - MIN) / STEP``, and the array must be one evenly stepped range (``--array=1,4,7`` is
    refused: it cannot be told apart from a range with gaps). torchrun / ``torch.distributed`` launchers:
    ``RANK`` and ``WORLD_SIZE``. When both are set they must agree.

    Args:
        env: the environment (``os.environ``).

    Raises:
        ConfigError: one line when neither pair is set, half of a pair is, a value is not an integer, or the
            values are inconsistent (rank outside ``0..count-1``, an uneven array, Slurm and torchrun differ).
    """
    found = {}
    slurm = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT")
    torch = ("RANK", "WORLD_SIZE")
    for pair in (slurm, torch):
        have = [n for n in pair if env.get(n, "").strip()]
        if len(have) == 1:
            missing = next(n for n in pair if n not in have)
            raise ConfigError(f"--rank auto: {have[0]} is set but {missing} is not")
        if have:
            found[pair] = (_env_int(env, pair[0]), _env_int(env, pair[1]))
    if not found:
        raise ConfigError("--rank auto: neither SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT (a Slurm array job) nor "
                          "RANK/WORLD_SIZE (torchrun) is set; give --rank R --world-size W")
    if slurm in found:
        task, count = found[slurm]
        if env.get("SLURM_ARRAY_TASK_MIN", "").strip():
            low = _env_int(env, "SLURM_ARRAY_TASK_MIN")
            step = _env_int(env, "SLURM_ARRAY_TASK_STEP") if env.get("SLURM_ARRAY_TASK_STEP", "").strip() else 1
            high = _env_int(env, "SLURM_ARRAY_TASK_MAX") if env.get("SLURM_ARRAY_TASK_MAX", "").strip() else None
            if step < 1 or (task - low) % step or (high is not None and (high - low) // step + 1 != count):
                raise ConfigError(f"--rank auto: the Slurm array (SLURM_ARRAY_TASK_MIN {low}, MAX {high}, STEP "
                                  f"{step}, COUNT {count}) is not one evenly stepped range of {count} tasks, so task "
                                  f"{task} has no rank; use --array=0-{count - 1} or give --rank R --world-size W")
            task = (task - low) // step
        found[slurm] = (task, count)
    if len(set(found.values())) > 1:
        (r1, w1), (r2, w2) = found[slurm], found[torch]
        raise ConfigError(f"--rank auto: Slurm says rank {r1} of {w1} (SLURM_ARRAY_TASK_ID/COUNT) but RANK/WORLD_SIZE "
                          f"say {r2} of {w2}; unset one of them or give --rank R --world-size W")
    pair, (rank, world) = next(iter(found.items()))  # (both agree when both are set)
    names = f"{pair[0]}/{pair[1]}"
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"--rank auto: {names} give rank {rank} of {world}; need 0 <= rank < world size >= 1")
    return rank, world


EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class ExecutorOptions(Config):
    """Where the planned shards run (none of these change the rows): ``local`` runs them one after another in
    this process (:class:`LocalExecutor`); ``ray`` runs them on a pool of Ray actors, each holding the opened
    stage (:class:`stepkit.runner.ray_executor.RayExecutor`), with the Ray options below.

    Raises:
        ConfigError: a Ray option given with ``executor="local"`` (it would be silently unused).
    """

    executor: str = opt("local", "Where shards run: local (one after another, here) or ray (on Ray actors that "
                                 "each open the stage once).", choices=EXECUTORS)
    ray_address: str | None = opt(None, "Ray cluster to join: auto (RAY_ADDRESS or the cluster `ray start` made "
                                        "here) or HOST:PORT; default: start a local Ray instance.", metavar="ADDRESS")
    cpus_per_shard: float = opt(1.0, "CPUs Ray reserves for each actor (one shard at a time).", min=0, min_open=True)
    gpus_per_shard: float = opt(0.0, "GPUs Ray reserves for each actor (one shard at a time); its engine is "
                                     "built on them (--tensor-parallel-size at most this).", min=0)
    shard_retries: int = opt(3, "Times a shard is given to a new actor after its actor's process or machine "
                                "died (the rerun resumes from the shard's committed chunks).", min=0)

    def __post_init__(self):
        super().__post_init__()
        if self.executor == "local":
            for f in dataclasses.fields(self):
                if f.name != "executor" and getattr(self, f.name) != f.default:
                    raise ConfigError(f"{flag_of(f)} is an option of --executor ray; this run uses --executor local")

