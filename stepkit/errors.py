"""Errors that the CLI prints as one clear line and turns into a non-zero exit."""

# Every character str.splitlines() breaks a line at, written as its escape.
_LINE_BREAKS = str.maketrans({c: repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


def one_line(text: str) -> str:
    """``text`` with its line breaks escaped (``"a\\nb"``): a column name, key or value from the user's
    file quoted in a message must not break the message's one line."""
    return text.translate(_LINE_BREAKS)


class StepkitError(Exception):
    """A user-facing error: bad input, bad configuration, unreachable model.

    The CLI prints ``error: <message>`` (one line, no traceback) and exits with status 1.
    Messages name the file, and where known the row and column, e.g.
    ``traj.parquet: row 3, column 'steps': empty list``. The message is always one line: line breaks
    in it (from a column name or value it quotes) are escaped.
    """

    def __init__(self, message: object = "", *args):
        super().__init__(one_line(str(message)), *args)


class InputError(StepkitError):
    """Bad input data: unreadable file, missing column, wrong type, empty steps.

    Keeps ``path``, ``row``, ``column`` and ``detail`` (the message without its location), so a caller can
    add to the message or move it to another row.
    """

    def __init__(self, path, message, row=None, column=None):
        where = str(path)
        if row is not None:
            where += f": row {row}"
        if column is not None:
            where += f"{',' if row is not None else ':'} column '{column}'"
        super().__init__(f"{where}: {message}")
        self.path, self.row, self.column, self.detail = path, row, column, message


def parse_failure(e: BaseException) -> str:
    """Why a JSON or YAML parser (or the Parquet reader) refused a document, in words, for the parser errors
    that are not its own decode errors: Python's limit on digits of an integer (``ValueError``), nesting
    deeper than the interpreter's recursion limit (``RecursionError``); anything else by its first line (its
    type when it has no message)."""
    import sys

    if isinstance(e, RecursionError):
        return "nested too deeply"
    text = str(e)
    if isinstance(e, ValueError) and "integer string conversion" in text:
        return f"an integer of more than {sys.get_int_max_str_digits()} digits"
    return text.splitlines()[0] if text else type(e).__name__


class ConfigError(StepkitError):
    """A configuration problem: unknown model, changed configuration without --force, bad flag combination."""


class RowError(str):
    """A row this stage cannot label: ``row["error"] = RowError(stage.name, "why")`` reads
    ``"<stage>: why"`` and is counted against that stage's ``--max-error-rate``.

    Errors are attributed by type, not by text: an ``error`` that is a plain string was passed through
    from an earlier stage (and never counts here), one that is a :class:`RowError` was set by the stage
    now running. The reason ``stats`` counts by is the text before the next ``": "``, e.g.
    ``RowError("judge", "engine: HTTP 400: prompt too long")`` has reason ``engine``.
    """

    stage: str
    message: str

    def __new__(cls, stage: str, message: str):
        obj = super().__new__(cls, f"{stage}: {message}")
        obj.stage, obj.message = stage, str(message)
        return obj


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal: SIGINT (Ctrl-C) or SIGTERM (the CLI turns SIGTERM into this).

    A ``KeyboardInterrupt``, so every cleanup path (``finally``, ``except BaseException``) runs as for
    Ctrl-C and no ``except Exception`` swallows it. ``signum`` is the signal; ``str(e)`` is one line for the
    user (what was kept, how to resume); the CLI exits with status ``128 + signum``.
    """

    def __init__(self, signum: int, message: str = ""):
        import signal

        self.signum = signum
        name = signal.Signals(signum).name
        super().__init__(one_line(message or f"stopped by {name}"))
