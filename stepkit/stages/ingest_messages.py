"""``ingest messages``: tool-calling conversations (OpenAI chat messages) into trajectory rows.

One row per conversation, rendered as :mod:`stepkit.conversations` documents: ``prompt`` (the messages
before the first assistant turn), ``steps`` (the assistant turns with their tool calls),
``step_observations`` (what came back after each turn), ``prompt_messages``/``step_messages`` (the
original messages, so a row gives back its conversation exactly), ``reference_actions`` (the gold tool
calls, canonical JSON), ``source_reward`` and ``outcome_correct`` (reward >= ``--success-threshold``).

Record keys (each a dotted path into the record; defaults fit τ-bench's trajectory files, Yao et al. 2024):
``--messages-col`` (``messages``, else ``traj``), ``--outcome-col`` (``reward``), ``--gold-col``
(``info.task.actions``: ``[{"name", "kwargs"}]``; ``{"name", "arguments"}`` and OpenAI ``tool_calls``
entries are read too), ``--problem-id-col`` (default ``task_id`` when the record has it, else the row id),
``--id-col`` (default ``id`` when present, else ``<problem id>-<trial>`` when the record has ``trial``,
else ``<file stem>-<index>``).

The file is a JSON list (τ-bench's files) or JSON Lines, read once (:class:`Messages`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepkit.conversations import (
    ConversationError,
    call_arguments,
    canonical_action,
    conversation_columns,
    message_text,
    parse_conversation,
)
from stepkit.errors import InputError
from stepkit.schema import MESSAGE_FIELDS, extend_schema
from stepkit.stages.ingest_formats import TRAJ_SCHEMA_WITH_REFS, IngestFormat

MESSAGES_SCHEMA = extend_schema(TRAJ_SCHEMA_WITH_REFS, MESSAGE_FIELDS)
_MISSING = object()


def dotted(obj: Any, path: str) -> Any:
    """``obj["a"]["b"]`` for ``path`` ``a.b`` (a key holding the dots itself is tried first); a missing
    key gives a sentinel that :func:`conversation_rows` reports."""
    if isinstance(obj, dict) and path in obj:
        return obj[path]
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


def gold_actions(value: Any, path: Path, row: int, column: str) -> list[str]:
    """Canonical JSON of each gold tool call (``{"name", "kwargs"|"arguments"}`` or an OpenAI
    ``tool_calls`` entry; arguments an object or a JSON string).

    Raises:
        InputError: not a list, or an entry without a name or with arguments that are not a JSON object.
    """
    if not isinstance(value, list):
        raise InputError(path, f"gold actions are a {type(value).__name__}, not a list", row=row, column=column)
    out = []
    for k, a in enumerate(value):
        if isinstance(a, dict) and "function" in a:
            call = a
        elif isinstance(a, dict):
            call = {"function": {"name": a.get("name"), "arguments": a.get("kwargs", a.get("arguments", {}))}}
        else:
            raise InputError(path, f"action {k} is a {type(a).__name__}, not an object", row=row, column=column)
        try:
            out.append(canonical_action(*call_arguments(call)))
        except ConversationError as e:
            raise InputError(path, f"action {k}: {e}", row=row, column=column) from None
    return out


def _text_id(value: Any, path: Path, row: int, column: str, obj: dict | None = None) -> str:
    if value is _MISSING:  # (breaking run E18: a mistyped --id-col printed the sentinel object)
        keys = f" (keys: {', '.join(map(str, obj))[:200]})" if obj else ""
        raise InputError(path, f"names no key of the record{keys}", row=row, column=column)
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise InputError(path, f"an id must be a non-empty string or an integer, found {value!r:.40}", row=row,
                         column=column)
    return str(value)


def conversation_rows(items: list[tuple[int, Any]], path: Path, opts, count: Callable[[str, int], None]) -> list[dict]:
    """The trajectory rows of ``(source index, record)`` pairs (see the module docstring); ``count`` adds
    to the manifest counters (turns, tool_calls, successes, actions).

    Raises:
        InputError: a record that is not an object; a missing messages key; a malformed conversation
            (naming the message index: unknown role, a tool result with no matching call id, arguments
            that are not JSON, ...); an outcome that is not a number; bad gold actions; a duplicate id.
    """
    rows, ids = [], {}
    found = {"outcome_col": False, "gold_col": False}  # a key given on the command line that no record has is a typo
    first_keys: list[str] = []
    for i, obj in items:
        if not isinstance(obj, dict):
            raise InputError(path, f"expected an object, found {type(obj).__name__}", row=i)
        first_keys = first_keys or [str(k) for k in obj]
        for name in found:
            found[name] = found[name] or dotted(obj, getattr(opts, name)) is not _MISSING
        key = opts.messages_col or next((k for k in ("messages", "traj") if k in obj), "messages")
        messages = dotted(obj, key)
        if messages is _MISSING:
            raise InputError(path, f"missing (the conversation; the record has: {', '.join(map(str, obj))[:200]})",
                             row=i, column=key)
        try:
            conv = parse_conversation(messages)
        except ConversationError as e:
            where = f"{key}[{e.index}]" if e.index is not None else key
            raise InputError(path, f"message {e.index}: {e}" if e.index is not None else str(e), row=i,
                             column=where) from None
        reward = dotted(obj, opts.outcome_col)
        if reward is _MISSING or reward is None:
            reward = None
        elif isinstance(reward, bool) or isinstance(reward, (int, float)):
            try:
                reward = float(reward)
            except OverflowError:  # an integer beyond any float
                reward = math.inf
            if not math.isfinite(reward):
                raise InputError(path, f"the outcome is {reward} (not a finite number)", row=i,
                                 column=opts.outcome_col)
        else:
            raise InputError(path, f"the outcome must be a number or a bool, found {reward!r:.40}", row=i,
                             column=opts.outcome_col)
        gold = dotted(obj, opts.gold_col)
        actions = None if gold is _MISSING or gold is None else gold_actions(gold, path, i, opts.gold_col)
        pid_key = opts.problem_id_col or ("task_id" if "task_id" in obj else None)
        pid = _text_id(dotted(obj, pid_key), path, i, pid_key, obj) if pid_key else None
        if opts.id_col:
            rid = _text_id(dotted(obj, opts.id_col), path, i, opts.id_col, obj)
        elif "id" in obj:
            rid = _text_id(obj["id"], path, i, "id")
        elif pid is not None and "trial" in obj:
            rid = f"{pid}-{_text_id(obj['trial'], path, i, 'trial')}"
        else:
            rid = f"{path.stem}-{i}"
        if rid in ids:
            raise InputError(path, f"id {rid!r} was already given to row {ids[rid]}", row=i,
                             column=opts.id_col or ("id" if "id" in obj else None))
        ids[rid] = i
        cols = conversation_columns(conv)
        if not any(message_text(m).strip() for m in conv.prompt):
            raise InputError(path, "no message with text before the first assistant turn (the prompt would be "
                                   "empty)", row=i, column=key)
        ok = None if reward is None else reward >= opts.success_threshold
        rows.append({"id": rid, "problem_id": pid or rid, "source": f"{path.name}/{i}", **cols,
                     "reference_answer": None, "final_answer": None, "outcome_correct": ok, "generator": "unknown",
                     "error": None, "reference_actions": actions, "source_reward": reward, "_row": i})
        count("turns", len(conv.turns))
        count("tool_calls", sum(len(t.message.get("tool_calls") or []) for t in conv.turns))
        count("successes", bool(ok))
        count("gold_actions", len(actions or []))
    _check_keys_found(found, opts, path, first_keys, bool(rows))
    return rows


def _check_keys_found(found: dict[str, bool], opts, path: Path, keys: list[str], any_rows: bool) -> None:
    """Refuse an ``--outcome-col`` / ``--gold-col`` other than its default that names a key no record has
    (breaking run E1: every outcome became null and every gold action vanished, exit 0). A default key no
    record has means the file has no outcomes or no gold actions: its rows are ungraded."""
    defaults = {f.name: f.default for f in dataclasses.fields(opts)}
    for name, seen in found.items():
        col = getattr(opts, name)
        if any_rows and not seen and col != defaults.get(name):
            raise InputError(path, f"--{name.replace('_', '-')} names no key of any record (keys: "
                                   f"{', '.join(keys)[:200]})", column=col)


class Messages(IngestFormat):
    """``messages``: tool-calling conversations (a JSON list or JSON Lines) -> one trajectory per conversation."""

    name = "messages"
    options = ("id_col", "problem_id_col", "messages_col", "outcome_col", "gold_col", "success_threshold")
    schema = MESSAGES_SCHEMA

    def rows(self):
        return conversation_rows(self.take(self.source.json_records()), self.path, self.opts, self.count)
