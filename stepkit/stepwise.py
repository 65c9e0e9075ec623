"""Stepwise supervision as tokens: where a step's label sits, and what truncation drops.

The layout is the one a token-classification PRM is trained on by ``stepkit train-prm`` and read back with by
``stepkit prm-label`` (the same function builds both, so the positions cannot drift apart)::

    [bos] + prompt + sep + step_0 + sep + step_1 + sep + ... + step_{M-1} + sep

Each piece is tokenised on its own (``tokenize(text) -> ids``, no special tokens added), so no BPE token ever
spans the join of two steps and a step's last token is known exactly. The label of step ``i`` sits on the
**last token of ``step_i + sep``** (the separator's last token; the step's own last token when the separator
is empty), every other position is ``IGNORE`` (-100, the index PyTorch's cross-entropy skips). This is the
stepwise-supervision layout of TRL's former ``PRMTrainer`` (TRL <= 1.13.0, ``trl.experimental.prm``; removed in
TRL PR #7133) and of Math-Shepherd / PRM800K-style PRMs, with one change: the separator also follows the prompt,
so the first step's text never runs into the problem's.

Truncation (``max_length``, tokens) keeps the prompt and **whole steps from the start**: a step whose
``step + sep`` does not fit entirely is dropped with every step after it, and the labels those steps would have
trained are counted (``Encoded.dropped_labels``), never silently lost. A prompt that leaves no room for the
first step gives an example with no label (``kept_steps == 0``), which a trainer skips and counts.

``last_step_only`` (outcome supervision, the ORM baseline): only the last step's label is trained; when the
last step is cut, that one label is dropped (an earlier step never stands in for the outcome).

Pure functions over token ids; no tokenizer or torch is imported here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

IGNORE = -100
"""The label of a position that trains nothing (``torch.nn.CrossEntropyLoss(ignore_index=-100)``)."""


@dataclass(frozen=True)
class Encoded:
    """One example laid out as tokens.

    Attributes:
        input_ids: the token ids (length <= ``max_length`` when one was given).
        labels: one entry per token: ``IGNORE`` (-100) or the step's label (0/1 for hard labels, a float in
            [0, 1] for soft ones); None when the example was encoded without labels (inference).
        positions: the token position of each kept step's label (its ``step + sep``'s last token), one per kept
            step, ascending; also filled when no label is trained there (inference, ``last_step_only``).
        kept_steps: how many steps (from the first) fit.
        dropped_labels: labels that would have been trained but were cut by ``max_length``.
    """

    input_ids: list[int]
    labels: list[float] | None
    positions: list[int]
    kept_steps: int
    dropped_labels: int


def check_labels(labels: Sequence, n_steps: int) -> list[float]:
    """Step labels as numbers: bools (and 0/1 ints) as 0/1, floats as soft values in [0, 1].

    Raises:
        ValueError: a count other than ``n_steps``, a null, a non-finite value or one outside [0, 1].
    """
    if len(labels) != n_steps:
        raise ValueError(f"{len(labels)} labels for {n_steps} steps")
    out = []
    for k, v in enumerate(labels):
        if v is None:
            raise ValueError(f"label {k} is null")
        x = float(v)
        if not math.isfinite(x) or not 0.0 <= x <= 1.0:
            raise ValueError(f"label {k} is {v!r}: step labels are booleans or values in [0, 1]")
        out.append(x)
    return out


def encode(prompt_ids: Sequence[int], step_ids: Sequence[Sequence[int]], sep_ids: Sequence[int],
           labels: Sequence | None = None, *, max_length: int | None = None, last_step_only: bool = False,
           bos_id: int | None = None) -> Encoded:
    """Lay one example out as tokens (see the module docstring for the layout and the truncation rule).

    Args:
        prompt_ids: the prompt's token ids.
        step_ids: each step's token ids (tokenised alone).
        sep_ids: the step separator's token ids (may be empty only when no step is empty).
        labels: one per step (bool/0-1 for hard labels, floats in [0, 1] for soft ones), or None (inference).
        max_length: at most this many tokens (None: no limit).
        last_step_only: train the last step's label only (outcome supervision).
        bos_id: a token put before the prompt (None: nothing).

    Returns:
        An :class:`Encoded`; ``labels`` as floats (a hard label is 0.0 or 1.0).

    Raises:
        ValueError: no step, a step with no token and an empty separator (its label would have no position),
            ``max_length`` below 1, or bad labels (:func:`check_labels`).
    """
    if not step_ids:
        raise ValueError("an example needs at least one step")
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length {max_length}: at least 1 token")
    values = check_labels(labels, len(step_ids)) if labels is not None else None
    head = ([bos_id] if bos_id is not None else []) + list(prompt_ids) + list(sep_ids)
    ids = head[:max_length] if max_length is not None else list(head)
    positions: list[int] = []
    if max_length is None or len(head) <= max_length:
        for k, step in enumerate(step_ids):
            piece = list(step) + list(sep_ids)
            if not piece:
                raise ValueError(f"step {k} has no token and the separator is empty: its label has no position")
            if max_length is not None and len(ids) + len(piece) > max_length:
                break
            ids += piece
            positions.append(len(ids) - 1)
    kept = len(positions)
    trained = [len(step_ids) - 1] if last_step_only else list(range(len(step_ids)))
    dropped = sum(1 for k in trained if k >= kept)
    out_labels = None
    if values is not None:
        out_labels = [float(IGNORE)] * len(ids)
        for k in trained:
            if k < kept:
                out_labels[positions[k]] = values[k]
    return Encoded(ids, out_labels, positions, kept, dropped)


def encode_text(tokenize: Callable[[str], list[int]], prompt: str, steps: Sequence[str], separator: str,
                labels: Sequence | None = None, **kw) -> Encoded:
    """:func:`encode` from text: the prompt, each step and the separator tokenised on their own with
    ``tokenize`` (which must add no special tokens); ``kw`` as for :func:`encode`."""
    return encode(tokenize(prompt), [tokenize(s) for s in steps], tokenize(separator) if separator else [],
                  labels, **kw)
