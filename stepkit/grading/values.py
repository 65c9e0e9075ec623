"""Answer values as text: source scalars (JSON, Parquet) to answer strings, huge integers, short quotes.

This module is light (no sympy, no math-verify), so ``ingest`` can convert the values it reads before
any answer checker starts.

Huge integers: Python refuses to convert between ``int`` and ``str`` beyond 4,300 digits by default
(``sys.set_int_max_str_digits``, a guard against quadratic-time conversions), and sympy's parser converts
every integer it reads, so a 5,000-digit gold answer "parsed only as text". The checker raises the limit
to ``BIG_INT_DIGITS`` while it parses and compares (``big_int_strings``); ``json_integer`` keeps a longer
JSON integer literal as its digits, which is what an answer is to stepkit anyway.
"""

from __future__ import annotations

import math
import sys
import threading
from contextlib import contextmanager
from decimal import Decimal

# The answer checker converts integers of up to this many digits (Python's own default limit is 4,300).
# Conversion is quadratic on Python 3.11: 100,000 digits take about 0.03 s, 1,000,000 about 3 s.
BIG_INT_DIGITS = 100_000
# Longest quote of a value in a message.
QUOTE_CHARS = 60

_limit_lock = threading.Lock()
_limit_users = 0
_limit_saved = 0


def quote(value: object, limit: int = QUOTE_CHARS) -> str:
    """``repr`` of ``str(value)`` for a one-line message, cut to ``limit`` characters with an ellipsis and
    the full length: ``'77777…' (5,000 characters)``. Values of at most ``limit`` characters are quoted
    whole. Never raises."""
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text):,} characters)"


@contextmanager
def big_int_strings():
    """Allow ``int``/``str`` conversions of up to ``BIG_INT_DIGITS`` digits while the block runs.

    The limit is process-wide (``sys.set_int_max_str_digits``), so the raise is counted: nested and
    concurrent blocks (several threads) share it, and the last one to leave restores the previous limit.
    A limit already higher (or 0, unlimited) is left alone. Other threads of the process see the raised
    limit meanwhile.
    """
    global _limit_users, _limit_saved
    with _limit_lock:
        if _limit_users == 0:
            _limit_saved = sys.get_int_max_str_digits()
            if 0 < _limit_saved < BIG_INT_DIGITS:
                sys.set_int_max_str_digits(BIG_INT_DIGITS)
        _limit_users += 1
    try:
        yield
    finally:
        with _limit_lock:
            _limit_users -= 1
            if _limit_users == 0:
                sys.set_int_max_str_digits(_limit_saved)


def json_integer(digits: str) -> int | str:
    """``parse_int`` hook for ``json.loads``: an integer literal as an ``int``, or, when it has more digits
    than Python's default int-string limit (4,300, ``sys.int_info.default_max_str_digits``), its digits as
    a ``str``, where ``json`` itself would raise ``ValueError``. Answers are text to stepkit, so a huge gold
    answer keeps its value, and no later ``str()`` of the value can fail. Never raises for digits.
    """
    if len(digits.lstrip("-")) > sys.int_info.default_max_str_digits:
        return digits
    return int(digits)


def answer_text(value: object, *, gold: bool = False) -> str | None:
    """A source value (a JSON or Parquet scalar) as answer text.

    ``None`` stays ``None`` and a string is kept as it is. An integer is written in full; a float in
    positional notation, never with an exponent (``1e-07`` would read as e - 7 to the checker), from its
    shortest repr: ``0.0000001``, ``2.5``, ``100000000000000000000``.

    Args:
        value: the value read from the file.
        gold: the value is a gold (reference) answer: a non-finite number is refused. JSON has no NaN or
            Infinity, but Python's ``json`` reads them, and pandas writes NaN for a missing float; as gold
            they were stored as the text ``'NaN'``, which math-verify parses as the product ``N*a*N``.
    Returns:
        The text, or None for None.
    Raises:
        ValueError: (one line) a bool, a value that is neither a string nor a number, or, with ``gold``,
            NaN or an infinity.
    """
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a string or number, found {type(value).__name__}")
    if isinstance(value, int):
        with big_int_strings():
            return str(value)
    if gold and not math.isfinite(value):
        name = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
        raise ValueError(f"{name} is not a gold answer (a number that is not finite); give the answer as text, "
                         "or null when there is none")
    return format(Decimal(repr(value)).normalize(), "f")
