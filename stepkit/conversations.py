"""Tool-calling conversations as step records: parsing, checking and the documented text rendering.

Format: OpenAI chat messages (``{"role": "system"|"user"|"assistant"|"tool", "content": ...}``; an
assistant message may carry ``tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}]``
with ``arguments`` a JSON object written as a string; a ``tool`` message answers one call by its
``tool_call_id``), the format of the OpenAI Chat Completions API and of τ-bench's trajectories (Yao et al.
2024, *τ-bench*).

A conversation becomes one trajectory row (``ingest messages``):

* ``prompt_messages``: the messages before the first assistant turn (what the agent saw first);
* one **step** per assistant message (a turn: its text and its tool calls), and after it its
  **observation**: every message up to the next assistant turn (tool results, the next user message);
* ``step_messages[i]``: the original messages of step ``i`` (the assistant message, then its observation)
  as JSON, so ``prompt_messages + step_messages[0] + ...`` is the conversation exactly
  (:func:`row_messages`).

The text rendering (what engines and judges see) is, exactly:

* a system/user message: ``System: <content>`` / ``User: <content>``; a tool result:
  ``Tool (<name>): <content>``; messages of the prompt or of one observation joined by a blank line;
* a turn (``steps[i]``): its content, then one block per tool call, joined by newlines::

      <tool_call>
      {"name": "get_user_details", "arguments": {"user_id": "mia_li_3668"}}
      </tool_call>

  (the Hermes / Qwen tool-call format; arguments re-serialised with :func:`json.dumps`, keys in the order
  written, non-ASCII kept);
* the text of a conversation up to turn ``i`` (:func:`render_prefix`): the prompt, then for each earlier
  turn the turn and its observation, then turn ``i``, all joined by :data:`SEPARATOR`.

Gold actions (``reference_actions``) and the calls a turn makes compare as :func:`canonical_action` strings:
``{"arguments": {...}, "name": "..."}`` with sorted keys, so argument order does not matter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

SEPARATOR = "\n\n"
"""Between the prompt, turns and observations of a rendered conversation (rows' ``step_separator``)."""
ROLES = ("system", "user", "assistant", "tool")
_TITLES = {"system": "System", "user": "User"}


class ConversationError(ValueError):
    """A malformed conversation. ``index`` is the 0-based message index (None: the whole list);
    ``str(e)`` is the one-line reason."""

    def __init__(self, reason: str, index: int | None = None):
        super().__init__(reason)
        self.index = index


@dataclass
class Turn:
    """One assistant turn: the assistant message and the messages after it until the next turn."""

    message: dict
    observation: list[dict] = field(default_factory=list)


@dataclass
class Conversation:
    """A checked conversation: the prompt messages and the turns (at least one)."""

    prompt: list[dict]
    turns: list[Turn]


def message_text(m: dict, index: int | None = None) -> str:
    """The text of a message's ``content``: a string, null (empty), or a list of ``{"type": "text",
    "text": ...}`` parts (joined without separator).

    Raises:
        ConversationError: content of another type, or a part that is not text.
    """
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for p in c:
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise ConversationError("content part is not {'type': 'text', 'text': ...} (only text is kept)", index)
            parts.append(p["text"])
        return "".join(parts)
    raise ConversationError(f"content is a {type(c).__name__}, not a string, null or a list of text parts", index)


def call_arguments(call: dict, index: int | None = None) -> tuple[str, dict]:
    """``(name, arguments)`` of one entry of ``tool_calls`` (``arguments`` a JSON object as a string, or
    already an object).

    Raises:
        ConversationError: no function name, or arguments that are not a JSON object: not JSON (``NaN`` and
            ``Infinity`` are not JSON; nor an integer too long for Python), nested too deeply to read, or holding a lone UTF-16 surrogate
            (``"\\ud800"``: no UTF-8 text, so no shard could hold it).
    """
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ConversationError("tool call has no function name", index)
    args = fn.get("arguments", "{}")
    what = f"tool call {fn['name']}: arguments"
    if isinstance(args, str):
        try:
            args = json.loads(args, parse_constant=_not_json) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ConversationError(f"{what} are not JSON ({e.msg} at char {e.pos})", index) from None
        except ValueError as e:  # NaN (parse_constant), an integer of more than 4,300 digits
            raise ConversationError(f"{what} are not JSON ({str(e).split(';')[0]})", index) from None
        except RecursionError:
            raise ConversationError(f"{what} are nested too deeply to read", index) from None
        try:
            json.dumps(args, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ConversationError(f"{what} hold a lone UTF-16 surrogate (not UTF-8 text)", index) from None
    if not isinstance(args, dict):
        raise ConversationError(f"{what} are a JSON {type(args).__name__}, not an object", index)
    return fn["name"], args


def _not_json(constant: str):
    raise ValueError(f"{constant} is not a JSON value")


def tool_calls(m: dict, index: int | None = None) -> list[tuple[str, dict]]:
    """The ``(name, arguments)`` of each tool call of an assistant message (empty when it makes none)."""
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ConversationError("tool_calls is not a list", index)
    return [call_arguments(c, index) for c in calls]


def parse_conversation(messages: Any) -> Conversation:
    """Check ``messages`` and split them into prompt and turns (see the module docstring).

    Raises:
        ConversationError: not a list of objects; an unknown role; content of the wrong type; an assistant
            message with neither text nor a tool call; a tool call with no name or non-JSON arguments, or
            without an id, or with the id of another call of its turn; a tool result whose ``tool_call_id``
            matches no unanswered call of the latest turn (a result comes after the turn that made the call
            and before the next turn, as the Chat Completions API requires: else it would be read as the
            observation of the wrong turn); a tool result before the first turn; no assistant turn.
    """
    if not isinstance(messages, list):
        raise ConversationError(f"messages are a {type(messages).__name__}, not a list")
    prompt: list[dict] = []
    turns: list[Turn] = []
    open_calls: dict[str, str] = {}  # the latest turn's calls not answered yet
    earlier: dict[str, int] = {}  # unanswered calls of earlier turns: the message index of their turn
    turn_at = -1  # the message index of the latest turn
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ConversationError(f"message is a {type(m).__name__}, not an object", i)
        role = m.get("role")
        if role not in ROLES:
            raise ConversationError(f"unknown role {role!r} (expected {', '.join(ROLES)})", i)
        message_text(m, i)
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise ConversationError(f"name is a {type(m['name']).__name__}, not a string", i)
        if role == "assistant":
            calls = m.get("tool_calls") or []
            if not tool_calls(m, i) and not message_text(m, i).strip():
                raise ConversationError("assistant message with no text and no tool call (an empty turn)", i)
            earlier.update(dict.fromkeys(open_calls, turn_at))
            open_calls, turn_at = {}, i
            for c in calls:
                if not isinstance(c.get("id"), str) or not c["id"]:
                    raise ConversationError("tool call has no id (a tool result could not name it)", i)
                if c["id"] in open_calls:
                    raise ConversationError(f"two tool calls of the turn have id {c['id']!r} (a tool result "
                                            "could not tell which it answers)", i)
                open_calls[c["id"]] = c["function"]["name"]
            turns.append(Turn(m))
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                raise ConversationError(f"tool_call_id is a {type(call_id).__name__}, not the id of a call", i)
            if call_id not in open_calls and call_id in earlier:
                raise ConversationError(f"tool result for call id {call_id!r} of the turn at message "
                                        f"{earlier[call_id]}, after a later turn (message {turn_at}): a result "
                                        "must come before the next turn", i)
            if call_id not in open_calls:
                raise ConversationError(f"tool result for call id {call_id!r}, which no earlier assistant call "
                                        "left unanswered", i)
            del open_calls[call_id]
            turns[-1].observation.append(m)  # open_calls is empty before the first turn
        elif turns:
            turns[-1].observation.append(m)
        else:
            prompt.append(m)
    if not turns:
        raise ConversationError("no assistant message (a conversation needs at least one turn)")
    return Conversation(prompt, turns)


def _render(m: dict) -> str:
    if m["role"] == "tool":
        return f"Tool ({m.get('name') or 'tool'}): {message_text(m)}"
    return f"{_TITLES.get(m['role'], m['role'].title())}: {message_text(m)}"


def render_messages(messages: list[dict]) -> str:
    """Prompt or observation messages as text (``User: ...``, ``Tool (name): ...``, blank-line separated)."""
    return SEPARATOR.join(_render(m) for m in messages)


def render_turn(m: dict) -> str:
    """An assistant message as a step: its content, then a ``<tool_call>`` block per call."""
    parts = [message_text(m)] if message_text(m) else []
    for name, args in tool_calls(m):
        parts.append("<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
                     + "\n</tool_call>")
    return "\n".join(parts)


def canonical_action(name: str, arguments: dict) -> str:
    """A call as canonical JSON (sorted keys, no spaces, non-ASCII kept): equal calls, equal strings."""
    return json.dumps({"name": name, "arguments": arguments}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)


def turn_actions(step_message: str) -> list[str]:
    """The canonical calls (:func:`canonical_action`) of a turn from its ``step_messages`` entry."""
    msgs = json.loads(step_message)
    return [canonical_action(n, a) for n, a in tool_calls(msgs[0])]


def conversation_columns(conv: Conversation) -> dict[str, Any]:
    """The row columns of a conversation: ``prompt``, ``steps``, ``step_separator``,
    ``step_observations``, ``prompt_messages`` (JSON string), ``step_messages`` (list of JSON strings)."""
    dump = lambda x: json.dumps(x, ensure_ascii=False)  # noqa: E731
    return {"prompt": render_messages(conv.prompt), "steps": [render_turn(t.message) for t in conv.turns],
            "step_separator": SEPARATOR,
            "step_observations": [render_messages(t.observation) for t in conv.turns],
            "prompt_messages": dump(conv.prompt),
            "step_messages": [dump([t.message, *t.observation]) for t in conv.turns]}


def row_messages(row: dict) -> list[dict]:
    """The conversation of a row written by ``ingest messages`` (its messages, exactly as read).

    Raises:
        KeyError: the row has no ``prompt_messages``/``step_messages``.
    """
    out = list(json.loads(row["prompt_messages"]))
    for s in row["step_messages"]:
        out.extend(json.loads(s))
    return out


def render_prefix(prompt: str, steps: list[str], observations: list[str] | None, i: int) -> str:
    """The conversation's text through turn ``i`` (0-based, included): prompt, then each earlier turn and
    its non-empty observation, then turn ``i``, joined by :data:`SEPARATOR`."""
    parts = [prompt]
    for j in range(i):
        parts.append(steps[j])
        if observations and observations[j]:
            parts.append(observations[j])
    parts.append(steps[i])
    return SEPARATOR.join(parts)
