r"""Clues backtracked from an agent task's gold actions, and which turns of a conversation earn them.

Method: ABSeeker's answer-backtracked clues ("Training Long-Horizon Search Agents via Answer-Backtracked
Credit Assignment") with the gold tool calls in place of the verified answer, as τ-bench's tasks give
them (Yao et al. 2024): the end state any successful conversation reaches is the gold state-changing
calls, and each such call needs argument values the agent must first obtain.

Clues (:func:`action_clues`), in gold order, each call's value clues before it:

* a **value** clue for each argument value of a state-changing gold call that looks like an identifier
  (:data:`IDENTIFIER`: a reservation id, a flight number, a payment id, a user id; letters *and* digits,
  4+ characters; a value already listed is not repeated);
* a **call** clue for each state-changing gold call (its canonical JSON,
  :func:`stepkit.conversations.canonical_action`), depending on its value clues.

A tool is *read-only* when its name matches :data:`READ_ONLY_TOOLS` (``get_``/``search_``/``list_`` ...,
``calculate``, ``think``, ``transfer_``: a hand-off changes no database); every other call changes state.

Turns (:func:`match_turns`): a value clue is *obtained* by the first turn whose observation (a tool result
or the user's reply) contains the value as a whole word; a value the prompt already holds is *given*
(not checked for that row). A call clue is earned by the first turn that makes that call
(:func:`covers`: the same tool, and every argument value of the gold call at the same place in the
made call; extra arguments and free text, a string with a space such as a transfer summary, are not
compared) and whose tool result is not an error. A turn *contradicts* once per state-changing call it
makes that covers no gold call, unless its tool result is an error (``Error...``: nothing changed). A
conversation that does not make every gold state-changing call does not reach the goal: its last turn
contradicts (as a math solution that misses the answer, ``stepkit.stages.clue``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from stepkit.conversations import canonical_action, message_text, tool_calls

READ_ONLY_TOOLS = r"^(?:get|search|list|find|lookup|read|fetch|query|transfer)_|^(?:calculate|think)$"
"""Default pattern of tools that change no state (the others do). ``transfer_*`` is here: a hand-off to a
human changes no database, and τ-bench's reward compares the database (and the outputs)."""
IDENTIFIER = re.compile(r"^(?=[^\s]*[0-9])(?=[^\s]*[A-Za-z])[A-Za-z0-9_\-]{4,}$")
"""An argument value that must be obtained: letters and digits, no spaces, 4+ characters."""
KINDS = ("call", "value")


@dataclass(frozen=True)
class ActionClue:
    """One clue: ``kind`` ``call`` (``value`` = canonical JSON of the call) or ``value`` (the literal)."""

    kind: str
    text: str
    value: str
    depends_on: tuple[int, ...] = ()


def read_only(name: str, pattern: str = READ_ONLY_TOOLS) -> bool:
    """Whether tool ``name`` only reads (matches ``pattern``)."""
    return re.search(pattern, name) is not None


def _leaves(value, path: str):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    elif isinstance(value, str):
        yield path, value


def action_clues(actions: list[str], pattern: str = READ_ONLY_TOOLS) -> list[ActionClue]:
    """The clues of a task's gold actions (canonical JSON strings, ``reference_actions``).

    Raises:
        ValueError: an action that is not ``{"name": ..., "arguments": {...}}`` JSON.
    """
    clues: list[ActionClue] = []
    seen: dict[str, int] = {}
    for a in actions:
        call = json.loads(a)
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(
                call.get("arguments"), dict):
            raise ValueError(f"not a gold action {{name, arguments}}: {a[:60]}")
        if read_only(call["name"], pattern):
            continue
        deps = []
        for path, v in _leaves(call["arguments"], ""):
            if IDENTIFIER.match(v):
                if v not in seen:
                    seen[v] = len(clues)
                    clues.append(ActionClue("value", f"obtain {v} ({call['name']} argument {path})", v))
                deps.append(seen[v])
        text = f"call {call['name']}({json.dumps(call['arguments'], ensure_ascii=False)})"
        clues.append(ActionClue("call", text, canonical_action(call["name"], call["arguments"]),
                                tuple(sorted(set(deps)))))
    return clues


def _scalars(value, path: str = ""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _scalars(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _scalars(v, f"{path}[{i}]")
    elif not (isinstance(value, str) and re.search(r"\s", value)):  # free text is never compared
        yield path, value


def covers(made: dict, gold: dict) -> bool:
    """Whether the call ``made`` (``{"name", "arguments"}``) does what gold call ``gold`` asks: the same
    name, and each non-free-text argument value of ``gold`` equal at the same path in ``made``."""
    if made.get("name") != gold.get("name"):
        return False
    have = dict(_scalars(made.get("arguments") or {}))
    return all(p in have and _same(have[p], v) for p, v in _scalars(gold.get("arguments") or {}))


def _same(a, b) -> bool:
    """JSON scalars equal (``1 == 1.0``; a bool equals only a bool)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def turn_calls(step_message: str) -> list[tuple[dict, bool]]:
    """The calls of a turn from its ``step_messages`` entry: ``({"name", "arguments"}, failed)``, failed
    when the call's tool result starts with ``Error`` (τ-bench's tools answer a refused call so)."""
    msgs = json.loads(step_message)
    if not isinstance(msgs, list) or not msgs or not isinstance(msgs[0], dict):
        raise ValueError("a step_messages entry is the JSON list of the turn's messages")
    results = {m.get("tool_call_id"): message_text(m) for m in msgs[1:] if m.get("role") == "tool"}
    ids = [c.get("id") for c in msgs[0].get("tool_calls") or []]
    return [({"name": n, "arguments": a}, results.get(i, "").lstrip().lower().startswith("error"))
            for (n, a), i in zip(tool_calls(msgs[0]), ids)]


def _word(value: str) -> re.Pattern:
    return re.compile(r"(?<![A-Za-z0-9_])" + re.escape(value) + r"(?![A-Za-z0-9_])")


@dataclass
class TurnMatch:
    """Per turn: ``hits`` (clue indices first earned there), ``contradicted`` (count); per clue
    ``first`` (the turn that earns it, -1 none, None given by the prompt); ``reached`` (every call made)."""

    hits: list[list[int]]
    contradicted: list[int]
    first: list[int | None]
    reached: bool


def match_turns(kinds: list[str], values: list[str], prompt: str, step_messages: list[str],
                observations: list[str], pattern: str = READ_ONLY_TOOLS) -> TurnMatch:
    """Which turns earn and contradict the clues (rules in the module docstring).

    Args:
        kinds, values: the clue row's ``clue_kinds``/``clue_values`` (K entries).
        prompt: the row's rendered prompt; step_messages, observations: its per-turn columns (M entries).

    Raises:
        ValueError: a clue kind other than call/value, or a ``step_messages`` entry that is not the JSON
            list of a turn's messages.
    """
    n = len(step_messages)
    calls = [turn_calls(s) for s in step_messages]
    gold = [json.loads(v) for k, v in zip(kinds, values) if k == "call"]
    first: list[int | None] = [-1] * len(values)
    for c, (kind, v) in enumerate(zip(kinds, values)):
        if kind == "value":
            word = _word(v)
            if word.search(prompt):
                first[c] = None
                continue
            first[c] = next((s for s in range(n) if word.search(observations[s] or "")), -1)
        elif kind == "call":
            want = json.loads(v)
            first[c] = next((s for s in range(n) if any(covers(a, want) and not bad for a, bad in calls[s])), -1)
        else:
            raise ValueError(f"unknown clue kind {kind!r} (expected {', '.join(KINDS)})")
    hits = [[c for c, s0 in enumerate(first) if s0 == s] for s in range(n)]
    contradicted = [sum(1 for a, bad in calls[s] if not bad and not read_only(a["name"], pattern)
                        and not any(covers(a, g) for g in gold)) for s in range(n)]
    reached = all(first[c] is not None and first[c] >= 0 for c, k in enumerate(kinds) if k == "call")
    if not reached:
        contradicted[n - 1] += 1
    return TurnMatch(hits, contradicted, first, reached)
