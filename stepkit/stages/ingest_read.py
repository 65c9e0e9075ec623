"""Reading ``ingest``'s source files, once, and checking the fields of their records.

:class:`Source` reads FILE exactly once (a pipe such as ``<(zcat x.gz)`` or a named FIFO works) as a stream
of JSON Lines, a JSON list (ProcessBench), either of the two (conversations) or a Parquet file, and keeps
the sha256 of exactly the bytes read and the first :data:`HEAD_BYTES` of them (to tell which format the
file looks like). Every JSON document goes through one decoder (:data:`_JSON`, integers by
:func:`stepkit.grading.values.json_integer`).

Every refusal is one :class:`~stepkit.errors.InputError` naming the file, the row (0-based: the line of a
JSON Lines file, the element of a JSON list, the row of a Parquet file) and, where there is one, the column:
invalid UTF-8 (with its byte offset), JSON that ``json`` refuses (bad syntax, an integer of more than 4,300
digits, nesting deeper than the recursion limit), a lone UTF-16 surrogate. The validators (:func:`need`,
:func:`need_text`, :func:`need_id`, :func:`optional`, :func:`unique`, :func:`steps_list`,
:func:`scalar_text`) refuse a missing, null, blank or mistyped field the same way. A :class:`FormatError`
is an error about the file's layout, to which ``ingest`` adds the format the file looks like.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from stepkit.errors import InputError, parse_failure
from stepkit.grading.values import answer_text, json_integer

HEAD_BYTES = 1 << 16  # how much of FILE is kept to tell which format it looks like


class FormatError(InputError):
    """An error about the file's layout (a missing key, not a list, not Parquet): :func:`ingest` adds the
    format the file looks like when it is another one."""


# A \u escape of a UTF-16 surrogate: only these can give a string that is not encodable as UTF-8.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_JSON = json.JSONDecoder(parse_int=json_integer)  # the one decoder of JSON Lines rows and JSON list elements


def names(obj: dict, limit: int = 30) -> str:
    """The first ``limit`` keys of ``obj``, comma-separated (for "the row has: ..." messages)."""
    keys = [str(k) for k in list(obj)[:limit]]
    return ", ".join(keys) + (", ..." if len(obj) > limit else "")


def json_type(value: Any) -> str:
    """What ``value`` is, in JSON's words ("an object", "a list", "true/false", ...)."""
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number")


def _check_encodable(obj: Any, path: Path, row: int) -> None:
    """Raise InputError for the first string of ``obj`` with a lone surrogate (``"\\ud800"`` in JSON), which
    no UTF-8 file can hold, naming its top-level key as the column."""
    stack: list[tuple[Any, Any]] = [(obj, None)]
    while stack:
        value, column = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InputError(path, f"a lone surrogate \\u{ord(value[e.start]):04x} in a string (not encodable "
                                       "as UTF-8)", row=row, column=column) from None
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((k, column))
                stack.append((v, k if column is None else column))
        elif isinstance(value, list):
            stack.extend((v, column) for v in value)


def _loads(text: str, path: Path, row: int) -> Any:
    """``json.loads(text)``, every refusal an InputError naming ``path`` and ``row``."""
    try:
        obj = _JSON.decode(text)
    except json.JSONDecodeError as e:  # on the first line, perhaps not JSON Lines at all
        raise (FormatError if row == 0 else InputError)(path, f"not valid JSON ({e.msg} at character {e.pos})",
                                                        row=row) from None
    except (ValueError, RecursionError) as e:  # an integer over the digit limit, nesting too deep
        raise InputError(path, f"not valid JSON ({parse_failure(e)})", row=row) from None
    if _SURROGATE_ESCAPE.search(text):
        _check_encodable(obj, path, row)
    return obj


def read_jsonl(path: Path, digest=None, head: bytearray | None = None) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_index, object)`` for each non-blank line of a JSON Lines file, reading it once.

    ``digest`` (a :mod:`hashlib` object) is updated with every byte read, so once the iterator is exhausted
    it is the file's hash (a pipe can be read only once); ``head`` receives the first ``HEAD_BYTES``.

    Raises:
        InputError: the file cannot be read; a line is not UTF-8 (naming its byte in the line and in the
            file), not valid JSON, not an object, or holds a lone surrogate; always naming file and row.
    """
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from None
    with f:
        yield from jsonl_records(f, path, digest, head)


def jsonl_records(f: BinaryIO, path: Path, digest=None, head: bytearray | None = None) -> Iterator[tuple[int, dict]]:
    """:func:`read_jsonl` on an open binary stream ``f`` (bytes already read once, e.g. ``io.BytesIO``);
    ``path`` names the file in errors."""
    i, offset = -1, 0
    while True:
        try:
            raw = f.readline()
        except OSError as e:
            raise InputError(path, f"cannot read after row {i} ({e.strerror or e})") from None
        if not raw:
            break
        i += 1
        if digest is not None:
            digest.update(raw)
        if head is not None and len(head) < HEAD_BYTES:
            head += raw[:HEAD_BYTES - len(head)]
        start, offset = offset, offset + len(raw)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:  # on the first line, perhaps a binary file
            where = f"at byte {e.start} of the row, byte {start + e.start} of the file"
            raise (FormatError if i == 0 else InputError)(
                path, f"not UTF-8 text ({e.reason} 0x{raw[e.start]:02x} {where})", row=i) from None
        if i == 0:
            line = line.removeprefix("\ufeff")  # a byte order mark
        if not line.strip():
            continue
        obj = _loads(line, path, i)
        if not isinstance(obj, dict):
            raise FormatError(path, f"expected a JSON object, found {json_type(obj)}", row=i)
        yield i, obj


def json_list(text: str, path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(index, element)`` of the JSON list ``text``, parsing one element at a time so that any
    refusal (bad syntax, an integer over the digit limit, deep nesting, a lone surrogate) names its row."""
    i = _JSON_SPACE.match(text).end()
    if not text.startswith("[", i):
        raise FormatError(path, "expected a JSON list of ProcessBench rows")

    def where(pos: int) -> str:
        line = text.count("\n", 0, pos) + 1
        return f"line {line}, character {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"

    i = _JSON_SPACE.match(text, i + 1).end()
    row = 0
    if text.startswith("]", i):
        end = i
    else:
        while True:
            try:
                obj, end = _JSON.raw_decode(text, i)
            except json.JSONDecodeError as e:
                raise InputError(path, f"not valid JSON ({e.msg} at {where(e.pos)})", row=row) from None
            except (ValueError, RecursionError) as e:
                raise InputError(path, f"not valid JSON ({parse_failure(e)})", row=row) from None
            if _SURROGATE_ESCAPE.search(text, i, end):
                _check_encodable(obj, path, row)
            yield row, obj
            i = _JSON_SPACE.match(text, end).end()
            if text.startswith(",", i):
                i, row = _JSON_SPACE.match(text, i + 1).end(), row + 1
                continue
            if text.startswith("]", i):
                end = i
                break
            raise InputError(path, f"not valid JSON (expected ',' or ']' after the row, at {where(i)})", row=row)
    rest = _JSON_SPACE.match(text, end + 1).end()
    if rest < len(text):
        raise InputError(path, f"not valid JSON (extra data after the list, at {where(rest)})")


def _row_at(prefix: str, path: Path) -> int | None:
    """The row of a JSON list that ``prefix`` (the text before some position) ends in."""
    try:
        for _ in json_list(prefix, path):
            pass
    except InputError as e:
        return e.row
    return None


class Source:
    """FILE, read once (it may be a pipe) by one of the methods below.

    After a read, ``sha256`` is the hash of exactly the bytes read and ``head`` holds their first
    :data:`HEAD_BYTES` (read by a failed read too, as far as it got).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.sha256: str | None = None
        self.head = bytearray()

    def jsonl(self) -> list[tuple[int, dict]]:
        """Every record of FILE as JSON Lines: ``(line index, object)`` (see :func:`read_jsonl`)."""
        digest = hashlib.sha256()
        items = list(read_jsonl(self.path, digest, self.head))
        self.sha256 = digest.hexdigest()
        return items

    def whole(self) -> bytes:
        """All bytes of FILE.

        Raises:
            InputError: FILE cannot be read.
        """
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise InputError(self.path, f"cannot read ({e.strerror or e})") from None
        self.sha256, self.head = hashlib.sha256(data).hexdigest(), bytearray(data[:HEAD_BYTES])
        return data

    def text(self, data: bytes | None = None) -> str:
        """``data`` (FILE's bytes; default: :meth:`whole`) as UTF-8 text, a byte-order mark dropped.

        Raises:
            InputError: not UTF-8, naming the byte and the JSON list row it falls in.
        """
        data = self.whole() if data is None else data
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(self.path, f"not UTF-8 text ({e.reason} 0x{data[e.start]:02x} at byte {e.start} of the "
                                        "file)", row=_row_at(data[:e.start].decode("utf-8"), self.path)) from None
        return text.removeprefix("\ufeff")

    def json_list(self) -> list[tuple[int, Any]]:
        """Every element of FILE as one JSON list: ``(index, element)`` (see :func:`json_list`)."""
        return list(json_list(self.text(), self.path))

    def json_records(self) -> list[tuple[int, Any]]:
        """FILE as a JSON list when it starts with ``[`` (after a byte-order mark and space), else as JSON Lines."""
        data = self.whole()
        if data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
            return list(json_list(self.text(data), self.path))
        return list(jsonl_records(io.BytesIO(data), self.path))

    def parquet(self) -> tuple[list[tuple[int, dict]], list[str]]:
        """Every row of FILE as Parquet, ``(row index, row)``, and its column names.

        Raises:
            FormatError: not a readable Parquet file (a damaged footer, column names not UTF-8, ...).
            InputError: damaged pages, text that is not UTF-8 (naming the row after which reading failed).
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        data = self.whole()
        try:
            pf = pq.ParquetFile(pa.BufferReader(data))
        except (pa.ArrowException, OSError, ValueError) as e:
            raise FormatError(self.path, f"not a readable Parquet file ({parse_failure(e)})") from None
        rows: list[dict] = []
        try:
            for batch in pf.iter_batches(batch_size=1024):
                rows.extend(batch.to_pylist())
        except (pa.ArrowException, OSError, ValueError) as e:
            raise InputError(self.path, f"cannot read rows after row {len(rows)} ({parse_failure(e)})") from None
        return list(enumerate(rows)), list(pf.schema_arrow.names)


# ---- the fields of a record -----------------------------------------------------------------------------

def need(obj: dict, key: str, path: Path, row: int, types: type | tuple = object, flag: str | None = None,
         column: str | None = None) -> Any:
    """``obj[key]``, raising InputError (file, row, column) when missing, null or not of ``types``; a missing
    key's message lists the keys the row has (and the option that named it). A bool is not an int here."""
    column = key if column is None else column
    if key not in obj:
        raise FormatError(path, f"missing ({f'named by {flag}; ' if flag else ''}the row has: {names(obj)})",
                          row=row, column=column)
    value = obj[key]
    if value is None:
        raise InputError(path, "null", row=row, column=column)
    allowed = types if isinstance(types, tuple) else (types,)
    bad_bool = isinstance(value, bool) and bool not in allowed and (int in allowed or float in allowed)
    if not isinstance(value, allowed) or bad_bool:
        want = " or ".join(t.__name__ for t in allowed)
        raise InputError(path, f"expected {want}, found {type(value).__name__} {value!r:.40}", row=row, column=column)
    return value


def need_text(obj: dict, key: str, path: Path, row: int, flag: str | None = None) -> str:
    """``obj[key]`` as a string that is not blank (a prompt: later stages refuse an empty one)."""
    value = need(obj, key, path, row, str, flag)
    if not value.strip():
        raise InputError(path, "empty", row=row, column=key)
    return value


def need_id(obj: dict, key: str, path: Path, row: int, flag: str | None = None) -> str:
    """``obj[key]`` (a string or an integer) as a non-empty string id."""
    value = str(need(obj, key, path, row, (str, int), flag))
    if not value.strip():
        raise InputError(path, "empty", row=row, column=key)
    return value


def optional(obj: dict, key: str, path: Path, row: int, flag: str) -> Any:
    """``obj[key]`` where null means "none"; a row without the key at all is bad input."""
    if key not in obj:
        raise FormatError(path, f"missing (named by {flag}; the row has: {names(obj)})", row=row, column=key)
    return obj[key]


def unique(ids: dict[str, int], value: str, path: Path, row: int, column: str | None) -> None:
    """Record ``value`` as the id of ``row``; raise InputError when an earlier row has it."""
    if value in ids:
        raise InputError(path, f"duplicate id {value!r} (also row {ids[value]})", row=row, column=column)
    ids[value] = row


def steps_list(value: Any, path: Path, row: int, column: str) -> list[str]:
    """A non-empty list of non-empty strings (stripped), else InputError naming file, row and column."""
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise InputError(path, "expected a list of strings", row=row, column=column)
    steps = [x.strip() for x in value]
    if not steps or not all(steps):
        raise InputError(path, "empty steps" if not steps else f"step {steps.index('')} is empty", row=row, column=column)
    return steps


def scalar_text(value: Any, path: Path, row: int, column: str, gold: bool = False) -> str | None:
    """An answer value as text (:func:`stepkit.grading.values.answer_text`: strings as they are, numbers
    without exponent notation; with ``gold``, NaN/Infinity refused), else InputError."""
    if isinstance(value, (bool, list, dict)):
        raise InputError(path, f"expected a string or number, found {json_type(value)}", row=row, column=column)
    try:
        return answer_text(value, gold=gold)
    except ValueError as e:
        raise InputError(path, str(e), row=row, column=column) from None
