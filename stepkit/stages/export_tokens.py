"""Token lengths of exported rows, as a step-label trainer with a length limit sees them (``export --tokenizer M
--max-length N``).

A stepwise-supervision trainer (TRL's ``PRMTrainer`` up to trl 1.13.0, ``tokenize_row``; ``stepkit
train-prm``) tokenises the prompt and each step on its own, appends the separator's tokens to each step,
puts step i's label on the last token of its separator, and cuts the whole sequence to ``max_length``
tokens: a step whose separator ends beyond the limit loses its label, silently. This module counts, per
row, the tokens of ``prompt`` + each ``step + separator`` that way, and the labels such a cut drops (by
label value), so the manifest and the card can say it and ``--on-too-long`` can act on it: ``keep``
(report only), ``drop`` (leave such rows out, counted) or ``error`` (one line naming file and row).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stepkit.errors import ConfigError, InputError


def load_tokenizer(name: str):
    """A ``transformers`` tokenizer: a folder, a Hub id, or a stepkit registry model (``smollm2-135m``).

    Raises:
        ConfigError: it cannot be loaded (one line).
    """
    from stepkit.models import resolve_tokenizer

    path = resolve_tokenizer(name, "--tokenizer", hub=True)  # a wrong folder: one line naming it, not transformers'
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; one line here
        raise ConfigError(f"--tokenizer {name}: cannot load it ({type(e).__name__}: "
                          f"{(str(e).splitlines() or [''])[0][:160]})") from None


class TokenCounter:
    """Counts each exported row's tokens and the labels a ``max_length`` cut would drop."""

    def __init__(self, name: str, max_length: int | None, on_too_long: str):
        self.name, self.max_length, self.on_too_long = name, max_length, on_too_long
        self.tok = load_tokenizer(name)
        self.lengths: list[int] = []
        self.rows_over = 0
        self.dropped_rows = 0
        self.labels_cut = {"true": 0, "false": 0}

    def _n(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"])

    def check(self, prompt: str, steps: list[str], labels: list | None, sep: str, path: Path, i: int) -> bool:
        """Count one row; False when ``--on-too-long drop`` leaves it out.

        Raises:
            InputError: the row is longer than ``max_length`` and ``--on-too-long error``.
        """
        ends, total = [], self._n(prompt)
        for s in steps:
            total += self._n(s + sep)
            ends.append(total)
        self.lengths.append(total)
        if self.max_length is None or total <= self.max_length:
            return True
        self.rows_over += 1
        if self.on_too_long == "error":
            raise InputError(path, f"{total} tokens ({self.name}) over --max-length {self.max_length}: a trainer with "
                                   "that limit drops the labels of its last steps; use --on-too-long drop or keep",
                             row=i, column="steps")
        if self.on_too_long == "drop":
            self.dropped_rows += 1
            return False
        for end, lab in zip(ends, labels or []):
            if end > self.max_length:
                self.labels_cut["true" if (lab if isinstance(lab, bool) else lab > 0.5) else "false"] += 1
        return True

    def report(self) -> dict[str, Any]:
        """The manifest's ``token_lengths``: tokenizer, limit, rows, min / median / p95 / max tokens, rows over
        the limit, rows dropped, labels a trainer with the limit would cut (by value, kept rows only)."""
        xs = sorted(self.lengths)
        pick = (lambda q: xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]) if xs else (lambda q: None)
        return {"tokenizer": self.name, "max_length": self.max_length, "on_too_long": self.on_too_long,
                "rows": len(xs), "min": pick(0), "median": pick(0.5), "p95": pick(0.95), "max": pick(1),
                "rows_over": self.rows_over, "rows_dropped": self.dropped_rows, "labels_cut": self.labels_cut}
