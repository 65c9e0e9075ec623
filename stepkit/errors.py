"""Errors that the CLI prints as one clear line and turns into a non-zero exit."""


class StepkitError(Exception):
    """A user-facing error: bad input, bad configuration, unreachable model.

    The CLI prints ``error: <message>`` (one line, no traceback) and exits with status 1.
    Messages name the file, and where known the row and column, e.g.
    ``traj.parquet: row 3, column 'steps': empty list``.
    """


class InputError(StepkitError):
    """Bad input data: unreadable file, missing column, wrong type, empty steps."""

    def __init__(self, path, message, row=None, column=None):
        where = str(path)
        if row is not None:
            where += f": row {row}"
        if column is not None:
            where += f"{',' if row is not None else ':'} column '{column}'"
        super().__init__(f"{where}: {message}")
        self.path, self.row, self.column = path, row, column


class ConfigError(StepkitError):
    """A configuration problem: unknown model, changed configuration without --force, bad flag combination."""
