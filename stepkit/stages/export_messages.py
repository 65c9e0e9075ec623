"""``export --format messages``: tool-calling conversations with one label per assistant turn.

The rows come from ``stepkit ingest messages`` (:mod:`stepkit.conversations`): a row's conversation is
``prompt_messages`` followed by each ``step_messages`` entry (the assistant turn, then what came back), so
after ``filter`` cut a row it is the original conversation up to a turn boundary. One record per row:

* ``messages``: the conversation in the OpenAI chat format (the format of TRL's conversational datasets
  and of its tool-calling examples), each message a fixed struct so ``datasets`` loads it typed:
  ``role``, ``content`` (string, null allowed; a list of text parts is joined into one string),
  ``tool_calls`` (null, or a list of ``{id, type, function: {name, arguments}}`` with ``arguments`` the
  JSON object as a string, kept byte for byte when the source wrote a string), ``tool_call_id`` and
  ``name`` (null when the message has none). Other message keys are not kept: the manifest counts every
  non-null one left out (``counts.message_fields_dropped``, ``dropped_message_keys`` names them).
  Chat templates that expect ``arguments`` as an object (Qwen2.5's ``tojson``) need ``json.loads`` first.
* ``labels``: one per assistant message, in order, from ``--labels COL`` with the rules of every format
  (hard ``List(bool)``; ``--soft`` values as ``List(float32)``; hard labels from values keep the values as
  ``soft_labels``); ``turn_index[i]`` is the position in ``messages`` of the assistant message
  ``labels[i]`` belongs to.
* ``id``, ``problem_id``, ``outcome_correct`` and ``reward`` (the source's reward, ``source_reward``).

A trainer that imitates only good turns (WebSTAR's step-level filtering, He et al. 2025) masks the loss of
the assistant messages whose label is false; a process reward model reads a label at the end of each
assistant message.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa

from stepkit.conversations import ConversationError, message_text, parse_conversation
from stepkit.errors import InputError

NEEDS = "export --format messages needs rows from `stepkit ingest messages`"
MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
COLUMNS = ("prompt_messages", "step_messages")


def message_feature() -> dict:
    """The ``datasets`` feature of one message (a struct; every field nullable)."""
    from datasets import List, Value

    s = Value("string")
    call = {"id": s, "type": s, "function": {"name": s, "arguments": s}}
    return {"role": s, "content": s, "tool_calls": List(call), "tool_call_id": s, "name": s}


def features(soft: bool, kind: str | None) -> dict:
    """The features of a messages record (``kind`` is the label column's kind: ``bool``, ``float`` or
    ``index``; hard labels from values keep them as ``soft_labels``)."""
    from datasets import List, Value

    s = Value("string")
    f = {"id": s, "problem_id": s, "messages": List(message_feature()),
         "labels": List(Value("float32")) if soft else List(Value("bool")), "turn_index": List(Value("int32"))}
    if kind == "float" and not soft:
        f["soft_labels"] = List(Value("float32"))
    return {**f, "outcome_correct": Value("bool"), "reward": Value("float64")}


def check_schema(schema: pa.Schema, path: Path) -> None:
    """Raise :class:`InputError` when the shard lacks a column ``ingest messages`` writes."""
    for c in COLUMNS:
        if c not in schema.names:
            raise InputError(path, f"missing column: {NEEDS} (has: {', '.join(schema.names)})", column=c)


def _text(value, what: str):
    if value is not None and not isinstance(value, str):
        raise ConversationError(f"{what} is a {type(value).__name__}, not a string")
    return value


def _call(c: dict, dropped: Counter) -> dict:
    fn = c["function"]
    args = fn.get("arguments")
    if args is not None and not isinstance(args, str):  # an object: written as JSON text
        args = json.dumps(args, ensure_ascii=False)
    dropped.update(f"tool_calls.{k}" for k, v in c.items() if k not in ("id", "type", "function") and v is not None)
    dropped.update(f"tool_calls.function.{k}" for k, v in fn.items() if k not in ("name", "arguments") and v is not None)
    return {"id": c.get("id"), "type": _text(c.get("type"), "a tool call's type"),
            "function": {"name": fn.get("name"), "arguments": args}}


def export_message(m: dict, dropped: Counter) -> dict:
    """One message of a checked conversation (:func:`stepkit.conversations.parse_conversation`) as the fixed
    struct of the module docstring; adds the non-null keys it leaves out to ``dropped``.

    Raises:
        ConversationError: a ``name`` or a tool call's ``type`` that is not a string (the struct's field is).
    """
    calls = m.get("tool_calls")
    dropped.update(k for k, v in m.items() if k not in MESSAGE_KEYS and v is not None)
    return {"role": m["role"], "content": None if m.get("content") is None else message_text(m),
            "tool_calls": None if calls is None else [_call(c, dropped) for c in calls],
            "tool_call_id": m.get("tool_call_id"), "name": _text(m.get("name"), "name")}


def _json_list(text, path: Path, i: int, column: str) -> list:
    try:
        v = json.loads(text)
    except (TypeError, ValueError):
        raise InputError(path, f"not a JSON list of messages: {NEEDS}", row=i, column=column) from None
    if not isinstance(v, list) or not all(isinstance(m, dict) for m in v):
        raise InputError(path, f"not a JSON list of messages: {NEEDS}", row=i, column=column)
    return v


def conversation(row: dict, path: Path, i: int) -> tuple[list[dict], list[int]]:
    """The row's messages (as read) and the position of each turn's assistant message.

    Raises:
        InputError: a null or malformed ``prompt_messages`` / ``step_messages``, a ``step_messages`` entry
            that is not one assistant message followed by its observation, not as many entries as steps, or a
            conversation that is not valid (:func:`stepkit.conversations.parse_conversation`).
    """
    for c in COLUMNS:
        if row.get(c) is None:
            raise InputError(path, f"null: {NEEDS}", row=i, column=c)
    msgs = _json_list(row["prompt_messages"], path, i, "prompt_messages")
    turns: list[int] = []
    if len(row["step_messages"]) != len(row["steps"]):
        raise InputError(path, f"{len(row['step_messages'])} entries for {len(row['steps'])} steps", row=i,
                         column="step_messages")
    for k, text in enumerate(row["step_messages"]):
        entry = _json_list(text, path, i, "step_messages")
        roles = [m.get("role") for m in entry]
        if not roles or roles[0] != "assistant" or "assistant" in roles[1:]:
            raise InputError(path, f"entry {k} is not one assistant turn and its observation (roles: "
                                   f"{', '.join(map(str, roles)) or 'none'})", row=i, column="step_messages")
        turns.append(len(msgs))
        msgs.extend(entry)
    try:
        parse_conversation(msgs)
    except ConversationError as e:
        raise InputError(path, f"not a valid conversation: message {e.index}: {e}", row=i,
                         column="step_messages") from None
    return msgs, turns


def record(row: dict, labels: list, values: list | None, soft: bool, path: Path, i: int,
           dropped: Counter) -> dict:
    """The messages record of ``row`` given its labels (one per step, already checked) and, for hard labels
    from values, the values (``soft_labels``).

    Raises:
        InputError: as :func:`conversation`.
    """
    msgs, turns = conversation(row, path, i)
    out = []
    for k, m in enumerate(msgs):
        try:
            out.append(export_message(m, dropped))
        except ConversationError as e:
            raise InputError(path, f"message {k}: {e}", row=i, column="step_messages" if k >= turns[0] else
                             "prompt_messages") from None
    rec = {"id": row["id"], "problem_id": row.get("problem_id"), "messages": out, "labels": labels,
           "turn_index": turns}
    if values is not None and not soft:
        rec["soft_labels"] = values
    return {**rec, "outcome_correct": row.get("outcome_correct"), "reward": row.get("source_reward")}
