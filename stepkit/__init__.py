"""stepkit: build step-labeled datasets for process reward models (PRMs).

Stages (each a CLI command reading and writing Parquet shards): ingest, rollout, mc-label, stats, show.
See README.md (using it) and docs/architecture.md (how it is built).
"""

__version__ = "0.1.0"
