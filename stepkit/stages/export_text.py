"""The text layouts of ``stepkit export``: Math-Shepherd's tagged steps, the step separator, and the pairs'
prompt/step joins.

**Math-Shepherd** (Wang et al. 2024, "Math-Shepherd: Verify and Reinforce LLMs Step-by-step without Human
Annotations"; the released ``peiyi9979/Math-Shepherd`` rows): ``input`` is the problem, a space, then one
line per step, ``Step k: <step> ки`` (k from 1), the lines joined by ``\\n``; ``label`` is the same text with
``+`` (correct) or ``-`` (wrong) in place of each ``ки``; ``task`` is ``GSM8K`` or ``MATH``. The numbers are
the export's: a step's own leading marker (``Step N:``, ``### Step N:``, ``**Step N:**``, any N, repeated) is
the source's numbering, not the step's content, and is removed before the export writes ``Step k:``, so a line
never holds two markers (ProcessBench's steps carry such markers numbered from an intro step: ``Step 1: …``
as step 2; breaking run 3, N13 wrote ``Step 2: Step 1: …``); the markers renumbered are counted
(``step_markers_renumbered``). TRL's converter of that dataset (``examples/datasets/math_shepherd.py``: ``ки``
replaced by ``ⶻ``, whose positions in ``input`` read as ``+``/``-`` in ``label``, then the text before the
first tag split once at ``Step 1:``, else ``step 1:``, else ``?``) reads every ``ки`` and every ``ⶻ`` as a tag
and needs exactly one ``Step 1:`` before the first tag, so a problem or step holding either (:data:`TAGS`),
a problem holding ``Step 1:``, or a first step holding ``Step 1:`` inside its text (``… ### Step 1: Square
both sides``) is refused in one line; a problem that starts with one of the converter's listed
annotation-error openings (it drops their first label and keeps step 1 in the prompt) is counted
(``CONVERTER_SKIPS``).

**Step separator**: how a row's steps are joined into text (``step_separator``, design.md). An export has
one: ``--step-separator``, else the rows' own when every row states the same one (a folder whose rows
disagree is refused in one line), else the format's (``\\n``). A step that contains the separator would
read as two steps to anything that splits the joined text (a PRM scored at each separator, ProcessBench's
evaluation, TRL's trainers that join ``completions`` with their ``step_separator``): it is refused
(``--separator-in-step error``) or rejoined, each separator inside it replaced by a space
(``--separator-in-step rejoin``, counted).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from stepkit.errors import ConfigError, InputError

TAG = "ки"  # Math-Shepherd's step tag (after a space)
TAGS = (TAG, "ⶻ")  # what TRL's converter reads as a tag: ки, and the character it puts in ки's place first
LABEL_TAGS = {True: "+", False: "-"}
TASKS = ("GSM8K", "MATH")  # the task values of the released Math-Shepherd rows
_MARKER = re.compile(r"\s*(?:#{1,6}\s*)?(?:\*\*)?Step\s+(\d+)\s*:(?:\*\*)?\s*", re.IGNORECASE)
"""A step's own leading step marker: ``Step 3:``, ``step 3 :``, ``### Step 3:``, ``**Step 3:**``."""
CONVERTER_SKIPS = ("Mr. Rocky", "Parker", "What is the smallest positive", " The Myth", "Let $\\mathbf{a}$",
                   "Find the arithmetic", "Determine an ordered pair", "Determine the ordered pair",
                   "At the Quill and Scroll stationery", "Round to the nearest", r"Calculate $\sqrt{10p}",
                   r"Simplify $\sqrt{28x}")
"""Openings of a problem that TRL's Math-Shepherd converter treats as annotation errors of the released
rows (it drops the first label and leaves step 1 inside the prompt)."""
DEFAULT_SEPARATOR = "\n"
ESCAPES = {"\\n": "\n", "\\t": "\t", "\\r": "\r", "\\\\": "\\"}


def unescape(text: str) -> str:
    """``--step-separator`` as typed in a shell: ``\\n``, ``\\t``, ``\\r`` and ``\\\\`` read as the characters."""
    return re.sub(r"\\[ntr\\]", lambda m: ESCAPES[m.group(0)], text)


def shown(sep: str | None) -> str:
    """A separator as a Python literal (``'\\n\\n'``), for one-line messages and the card."""
    return "none" if sep is None else repr(sep)


def task_of(source: str | None, shard_hint: str | None) -> str | None:
    """``GSM8K`` or ``MATH`` from a row's ``source`` (``gsm8k/test/3``, ``processbench/math/12``), else from
    its shard's ingest input (``.../math500/test.jsonl``: a generic jsonl ingest names rows by file name);
    None when neither says."""
    for text in (source, shard_hint):
        s = (text or "").lower()
        if "gsm8k" in s:
            return "GSM8K"
        if re.search(r"(?<![a-z])math", s):
            return "MATH"
    return None


def ingest_input(manifest: dict | None) -> str | None:
    """The path the first stage (``ingest``) of a shard's lineage read, or None."""
    while isinstance(manifest, dict):
        src = manifest.get("input") or {}
        if manifest.get("stage") == "ingest":
            return src.get("path")
        manifest = src.get("manifest")
    return None


def numbered(k: int, step: str, counts: Counter | None = None) -> str:
    """``Step k: <step>`` (k 1-based): the step's own leading markers (:data:`_MARKER`, any number, however
    many) removed first, so the line holds one marker, the export's; a step whose own marker had another
    number than k is counted in ``counts["step_markers_renumbered"]``."""
    body, renumbered = step, False
    while m := _MARKER.match(body):
        renumbered = renumbered or int(m.group(1)) != k
        body = body[m.end():]
    if renumbered and counts is not None:
        counts["step_markers_renumbered"] += 1
    return f"Step {k}: {body.strip()}"


def shepherd_record(row: dict, steps: list[str], labels: list[bool], task: str, sep: str, path: Path,
                    i: int, counts: Counter) -> dict[str, Any]:
    """The Math-Shepherd record of one row (see the module docstring).

    Raises:
        InputError: ``ки`` or ``ⶻ`` in the problem or a step, ``Step 1:`` in the problem or inside the first
            step's text (file, row, column named).
    """
    prompt = row["prompt"].strip()
    for col, texts in (("prompt", [prompt]), ("steps", steps)):
        for tag in TAGS:
            k = next((j for j, t in enumerate(texts) if tag in t), None)
            if k is not None:
                where = "" if col == "prompt" else f" (step {k})"
                what = "Math-Shepherd's step tag" if tag == TAG else f"the character TRL's converter puts in {TAG!r}'s place"
                raise InputError(path, f"holds {tag!r}{where}: {what}, which the converter reads as a tag wherever it "
                                       "occurs, so the tags would not match the labels", row=i, column=col)
    if re.search(r"Step\s*1\s*:", prompt, re.IGNORECASE):
        raise InputError(path, "holds 'Step 1:': Math-Shepherd's first step marker, where TRL's converter splits the "
                               "problem from the steps", row=i, column="prompt")
    if prompt.startswith(CONVERTER_SKIPS):
        counts["converter_drops_first_step"] += 1
    lines = [numbered(k + 1, s, counts) for k, s in enumerate(steps)]
    if lines and "Step 1:" in lines[0][len("Step 1:"):]:
        raise InputError(path, "step 0 holds 'Step 1:' inside its text: TRL's Math-Shepherd converter splits the "
                               "problem from the first step at the one 'Step 1:' before the first tag, and cannot "
                               "read a row with two", row=i, column="steps")
    return {"id": row["id"], "input": prompt + " " + sep.join(f"{x} {TAG}" for x in lines),
            "label": prompt + " " + sep.join(f"{x} {LABEL_TAGS[bool(ok)]}" for x, ok in zip(lines, labels)),
            "task": task}


def resolve_separator(given: str | None, seen: Counter, fmt: str, in_path) -> tuple[str, str]:
    """``(separator, where it came from)``: ``option``, ``rows`` or ``format``.

    ``seen`` counts the rows' own ``step_separator`` values (None: a row or shard without one).

    Raises:
        ConfigError: no ``--step-separator`` and the rows state different separators (one line).
    """
    if given is not None:
        return given, "option"
    stated = {s: n for s, n in seen.items() if s is not None}
    if len(stated) > 1:
        parts = ", ".join(f"{shown(s)} in {n} row(s)" for s, n in sorted(stated.items(), key=lambda x: -x[1]))
        raise ConfigError(f"{in_path}: the rows' step separators disagree ({parts}); give --step-separator SEP to "
                          "join every row's steps with one (steps holding it are refused, or rejoined with "
                          "--separator-in-step rejoin)")
    if stated:
        return next(iter(stated)), "rows"
    return DEFAULT_SEPARATOR, "format"


LIST_FORMATS = ("trl", "processbench")  # the steps stay a list in the dataset; a reader joins them


def checked_steps(steps: list[str], sep: str, mode: str, path: Path, i: int, column: str,
                  counts: Counter, fmt: str = "math-shepherd") -> list[str]:
    """``steps`` with none holding ``sep``: refused (``mode == "error"``) or each ``sep`` inside a step replaced
    by a space (``rejoin``, counted in ``counts["steps_rejoined"]``). The refusal says who joins the steps:
    the export itself (text formats), or for a list format (:data:`LIST_FORMATS`) the trainer or evaluator
    that joins the list with the separator the export records.

    Raises:
        InputError: a step holds the separator and ``mode`` is ``error`` (file, row, column and step named).
    """
    out = list(steps)
    for k, s in enumerate(steps):
        if sep not in s.strip():
            continue
        if mode == "error":
            who = (f"--format {fmt} keeps the steps a list, but a reader that joins them with the separator this "
                   "export records (a trainer joining completions, a PRM scored at each separator) would read it as "
                   "two steps") if fmt in LIST_FORMATS else "joined into the text, it would read as two steps"
            raise InputError(path, f"step {k} holds the step separator {shown(sep)}: {who}; give another "
                                   "--step-separator, or --separator-in-step rejoin to replace it inside steps by a "
                                   "space", row=i, column=column)
        out[k] = re.sub(r"[ \t]*" + re.escape(sep) + r"[ \t]*", " ", s.strip())
        counts["steps_rejoined"] += 1
    return out


def pair_texts(row: dict, sep: str) -> tuple[str, str, str]:
    """``(prompt, chosen, rejected)`` of a preference pair: the problem and the shared prefix steps joined by
    the separator; each side's steps joined by it, *starting* with it, so ``prompt + chosen`` is the solution
    text as the steps' own separator joins it. The separator opens the completion, not ends the prompt, as
    TRL's trainers read a pair: the reward trainer tokenises ``prompt + chosen``, the DPO trainer checks that
    the prompt's tokens are a prefix of the tokens of ``prompt + chosen`` (a BPE tokeniser splits a trailing
    ``\n\n`` differently from one followed by text, and TRL then cuts it from the prompt with a warning)."""
    prompt = sep.join([row["prompt"].rstrip(), *(row.get("prefix_steps") or [])])
    return prompt, sep + sep.join(row["chosen"]), sep + sep.join(row["rejected"])


def check_separator_option(sep: str | None) -> None:
    """Raises ConfigError for an empty or blank-free-of-meaning separator."""
    if sep is not None and sep == "":
        raise ConfigError("--step-separator '': steps joined with nothing run into each other; give e.g. '\\n'")
