"""The columns stepkit wrote before column declarations travelled in the shard (stepkit 0.1.0 up to the
change that added :mod:`stepkit.columns`), frozen: how a shard written then is still read right.

Never add a column here: a stage declares its columns in its own module and they carry their meaning in the
shard. This table only stands in for the field metadata old shards lack, and keeps the meaning those
readers gave them then (``export``'s "no labels" statuses were ``no_signal``, ``ungraded`` and ``parse_failure``
for every stage).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

LEGACY_DOC = "(declared before column metadata; see docs/architecture.md)"


def _c(name: str, type_: pa.DataType, **meaning) -> tuple[str, pa.DataType, dict[str, Any]]:
    return name, type_, meaning


LEGACY_COLUMNS: dict[str, tuple[pa.DataType, dict[str, Any]]] = {name: (type_, meaning) for name, type_, meaning in [
    # core (stepkit.schema)
    _c('steps', pa.list_(pa.string()), per_step=True),
    # rollout
    _c('rollout_finish_reason', pa.string()),
    _c('rollout_prompt_tokens', pa.int32()),
    _c('rollout_completion_tokens', pa.int32()),
    # mc-label
    _c('mc_rollouts', pa.list_(pa.int32()), per_step=True),
    _c('mc_successes', pa.list_(pa.int32()), per_step=True),
    _c('mc_truncated', pa.list_(pa.int32()), per_step=True),
    _c('mc_value', pa.list_(pa.float32()), per_step=True, role='value', scale='unit', status='mc_status'),
    _c('mc_label', pa.list_(pa.bool_()), per_step=True, role='label', status='mc_status'),
    _c('mc_estimated', pa.list_(pa.bool_()), per_step=True),
    _c('mc_progress', pa.list_(pa.float32()), per_step=True, role='value', scale='difference', status='mc_status'),
    _c('mc_value_start', pa.float32()),
    _c('mc_first_error', pa.int32(), role='first_error', status='mc_status'),
    _c('mc_status', pa.string(), role='status', no_labels=('no_signal', 'ungraded', 'parse_failure')),
    # judge
    _c('judge_label', pa.list_(pa.bool_()), per_step=True, role='label', status='judge_status'),
    _c('judge_first_error', pa.int32(), role='first_error', status='judge_status'),
    _c('judge_votes', pa.list_(pa.int32())),
    _c('judge_correct_votes', pa.list_(pa.int32()), per_step=True),
    _c('judge_tie', pa.bool_()),
    _c('judge_valid_votes', pa.int32()),
    _c('judge_parse_failures', pa.int32()),
    _c('judge_parse_error', pa.string()),
    _c('judge_replies', pa.list_(pa.string())),
    _c('judge_status', pa.string(), role='status', no_labels=('no_signal', 'ungraded', 'parse_failure')),
    _c('judge_score', pa.list_(pa.float32()), per_step=True, role='value', scale='score', range=(0.0, 10.0), status='judge_status'),
    # likelihood-label
    _c('lh_value', pa.list_(pa.float32()), per_step=True, role='value', scale='nats', status='lh_status'),
    _c('lh_value_start', pa.float32()),
    _c('lh_gain', pa.list_(pa.float32()), per_step=True, role='value', scale='nats', status='lh_status'),
    _c('lh_reward', pa.list_(pa.float32()), per_step=True, role='value', scale='nats', status='lh_status'),
    _c('lh_q', pa.list_(pa.float32()), per_step=True, role='value', scale='nats', status='lh_status'),
    _c('lh_first_error', pa.int32(), role='first_error', status='lh_status'),
    _c('lh_label', pa.list_(pa.bool_()), per_step=True, role='label', status='lh_status'),
    _c('lh_answer_tokens', pa.int32()),
    _c('lh_scored_tokens', pa.int32()),
    _c('lh_status', pa.string(), role='status', no_labels=('no_signal', 'ungraded', 'parse_failure')),
    # mcts-label
    _c('mcts_value', pa.list_(pa.float32()), per_step=True, role='value', scale='unit', status='mcts_status'),
    _c('mcts_rollouts', pa.list_(pa.int32()), per_step=True),
    _c('mcts_successes', pa.list_(pa.int32()), per_step=True),
    _c('mcts_visits', pa.list_(pa.int32()), per_step=True),
    _c('mcts_label', pa.list_(pa.bool_()), per_step=True, role='label', status='mcts_status'),
    _c('mcts_node_id', pa.list_(pa.string()), per_step=True),
    _c('mcts_first_error', pa.int32(), role='first_error', status='mcts_status'),
    _c('mcts_status', pa.string(), role='status', no_labels=('no_signal', 'ungraded', 'parse_failure')),
    # clue recover
    _c('clue_texts', pa.list_(pa.string())),
    _c('clue_values', pa.list_(pa.string())),
    _c('clue_depends', pa.list_(pa.list_(pa.int32()))),
    _c('clue_kinds', pa.list_(pa.string())),
    _c('clue_status', pa.string(), role='status', no_labels=('no_signal', 'ungraded', 'parse_failure')),
    _c('clue_parse_failures', pa.int32()),
    _c('clue_parse_error', pa.string()),
    _c('clue_replies', pa.list_(pa.string())),
    # clue score
    _c('clue_hits', pa.list_(pa.list_(pa.int32())), per_step=True),
    _c('clue_false_claims', pa.list_(pa.int32()), per_step=True),
    _c('clue_score', pa.list_(pa.float32()), per_step=True, role='value', scale='score', range=(0.0, 2.0), status='clue_status'),
    _c('clue_label', pa.list_(pa.bool_()), per_step=True, role='label', status='clue_status'),
    _c('clue_coverage', pa.float32()),
    _c('clue_first_error', pa.int32(), role='first_error', status='clue_status'),
    _c('clue_verdicts', pa.list_(pa.int32())),
    _c('clue_verdict_failures', pa.int32()),
    # filter
    _c('filter_reason', pa.string()),
    _c('filter_rule', pa.string()),
    _c('filter_steps_before', pa.int32()),
    _c('filter_kept_steps', pa.int32()),
    _c('filter_cut_by', pa.string()),
    # ingest
    _c('reference_first_error', pa.int32(), role='first_error'),
    _c('source_outcome_correct', pa.bool_()),
    _c('reference_status', pa.string()),
    _c('reference_labels', pa.list_(pa.bool_()), per_step=True, role='label'),
    _c('reference_solution', pa.string()),
    # ingest messages
    _c('step_observations', pa.list_(pa.string()), per_step=True),
    _c('prompt_messages', pa.string()),
    _c('step_messages', pa.list_(pa.string()), per_step=True),
    _c('reference_actions', pa.list_(pa.string())),
    _c('source_reward', pa.float64()),
]}
"""Column name → its frozen declaration: (type, keyword arguments of :class:`stepkit.columns.Column`), for
fields without stepkit metadata (plain data here, so this module imports nothing of stepkit's)."""
