"""stepkit: build step-labeled datasets for process reward models (PRMs).

Stages (each a CLI command reading and writing Parquet shards): ingest, rollout, mc-label, mcts-label,
judge, clue, filter, export, publish; eval, stats and show read them.
See README.md (using it) and docs/architecture.md (how it is built).
"""

__version__ = "0.1.0"

# vLLM's CPU build logs "Triton is installed, but doesn't include CPU backend" at import, in the command's
# process and again in each engine process it spawns (they re-import this package first); it is true of
# every CPU install and nothing to act on. The logger is vLLM's own, so its other messages are untouched.
import logging as _logging  # noqa: E402
import os as _os  # noqa: E402

if _os.environ.get("VLLM_LOGGING_LEVEL", "ERROR").upper() not in ("INFO", "DEBUG"):  # asked for the engine's logs
    _logging.getLogger("vllm.triton_utils.importing").setLevel(_logging.ERROR)
