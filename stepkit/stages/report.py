"""``stepkit report``: labelled shards or an export folder -> one self-contained HTML page.

The page (``stepkit/assets/report.html``, ``report.css``, ``report.js``, put together here) holds its data
and its script inline and loads nothing: no network, no server, so it opens from disk and from a Hub
repository's files alike. Its Content-Security-Policy (``default-src 'none'``) forbids any fetch.

* **Summary** per labeller present (:mod:`stepkit.stages.report_data`): rows with labels, statuses, label
  balance, first-error histogram, value by step position, drawn in the page (SVG) and given as numbers.
  The figures cover every row of IN, whatever the page carries.
* **Rows**: a table searchable by id and text, filterable by outcome, status (each labeller's status
  column, and row errors), labeller disagreement (first error of labeller A ≠ or = that of labeller B,
  the human ``reference_first_error`` among them; or: some labellers' first errors differ / all agree) and
  filter reason (``filter --flag-only`` / ``--dropped``
  rows), paged.
* **A row**: each step with every labeller's label and value beside it (colour and the number, readable
  without colour: ✓/✗, the value, and a mark on each labeller's first error), the human label where the
  row has one; LaTeX is shown as written, or typeset with ``--typeset`` by the machine's KaTeX (Debian's
  ``libjs-katex``) inlined into the page with its fonts (a checkbox shows the text as written again); no
  renderer is ever fetched. A conversation row
  (``ingest messages``) is drawn message by message: roles, tool calls with their arguments, tool results
  clipped (the whole text a click away); an ``mcts-label`` row with its problem's ``--tree-out`` nodes gets
  the tree drawn, the row's path marked.
* **Sample**: the page carries at most ``--sample`` rows (a uniform random sample with ``--seed``, in file
  order) unless ``--all``, and says which.

Text is data: every string reaches the page inside a JSON ``<script type="application/json">`` block with
``<``, ``>`` and ``&`` written as ``\\u003c`` / ``\\u003e`` / ``\\u0026`` (so no ``</script>`` can close it), and
the script puts it into the page as text nodes only (``textContent``, never ``innerHTML``).
"""

from __future__ import annotations

import html
import json
import math
import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from stepkit import __version__
from stepkit.conversations import ConversationError, message_text, tool_calls
from stepkit.errors import ConfigError
from stepkit.options import Config, opt

ASSETS = Path(__file__).resolve().parents[1] / "assets"
NODE_COLUMN = "mcts_node_id"  # (report_data.NODE_COLUMN, kept here so that --help imports no numpy)
CLIP = 4000  # characters of a message or tool result the page carries (its length is noted beyond that)


@dataclass(frozen=True)
class ReportConfig(Config):
    """``stepkit report`` options."""

    out: str = opt("report.html", "The HTML file to write.", short="-o")
    sample: int = opt(2000, "Rows the page carries at most (a uniform random sample; the summary covers every row).",
                      min=1, max=10_000_000)
    all: bool = opt(False, "Carry every row (the file grows with the shard: about 2 KB per ProcessBench row).")
    seed: int = opt(0, "Seed of the sample.", min=0)
    tree: tuple[str, ...] = opt((), "An mcts-label --tree-out file to draw (repeatable; those named in the "
                                "shards' manifests are found without it).", metavar="PATH")
    title: str | None = opt(None, "The page's title (default: the first IN's name).")
    page_size: int = opt(50, "Rows per page of the table.", min=5, max=1000)
    typeset: bool = opt(False, "Typeset LaTeX with the machine's KaTeX (Debian's libjs-katex, or the folder in "
                        "STEPKIT_KATEX), inlined into the page (about 0.7 MB): never fetched.")

    def __post_init__(self):
        super().__post_init__()
        if not self.out.endswith((".html", ".htm")):
            raise ConfigError(f"-o {self.out}: the report is an .html file")


def _num(x):
    """A JSON-safe number: floats rounded to 4 digits, non-finite as None."""
    if isinstance(x, float):
        return round(x, 4) if math.isfinite(x) else None
    return x


def _clip(text: str) -> str:
    return text if len(text) <= CLIP else f"{text[:CLIP]}… ({len(text)} chars)"


def _message(m: dict) -> dict:
    """A message as the page draws it: ``r`` role, ``t`` text, ``n`` tool name, ``calls`` ``[[name, args]]``."""
    try:
        text = message_text(m)
    except ConversationError:
        text = repr(m.get("content"))
    doc: dict[str, Any] = {"r": str(m.get("role")), "t": _clip(text)}
    if m.get("name") or m.get("tool_call_id"):
        doc["n"] = str(m.get("name") or m.get("tool_call_id"))
    if m.get("role") == "assistant":
        try:
            calls = tool_calls(m)
        except ConversationError as e:
            calls = [(f"(unreadable tool call: {e})", {})]
        if calls:
            doc["calls"] = [[name, _clip(json.dumps(args, ensure_ascii=False))] for name, args in calls]
    return doc


def _messages(text) -> list[dict]:
    try:
        v = json.loads(text) if text else []
    except (TypeError, ValueError):
        v = None
    if not isinstance(v, list):
        return [{"r": "?", "t": _clip(str(text)), "bad": True}]
    return [_message(m) if isinstance(m, dict) else {"r": "?", "t": _clip(repr(m)), "bad": True} for m in v]


def row_doc(r: dict, index: int, labs: list, fes: dict[str, list]) -> dict:
    """One row as the page's JSON (short keys; see ``report.js``); ``labs`` are
    :class:`~stepkit.stages.report_data.Labeller`, ``fes`` their first errors by row index."""
    doc: dict[str, Any] = {"i": index, "id": r.get("id"), "pid": r.get("problem_id"), "prompt": r.get("prompt") or "",
                           "steps": r.get("steps") or [], "oc": r.get("outcome_correct"), "final": r.get("final_answer"),
                           "ref": r.get("reference_answer"), "gen": r.get("generator"), "err": r.get("error"),
                           "fr": r.get("filter_reason"), "frule": r.get("filter_rule"), "st": {}, "fe": {}, "c": {}}
    for lab in labs:
        if lab.status:
            doc["st"][lab.key] = r.get(lab.status)
        doc["fe"][lab.key] = fes[lab.key][index]
        for c in (*lab.labels, *lab.values):
            v = r.get(c)
            if v is not None:
                doc["c"][c] = [_num(x) for x in v]
    if r.get("step_messages") is not None:
        doc["conv"] = {"prompt": _messages(r.get("prompt_messages")), "turns": [_messages(t) for t in r["step_messages"]]}
    if r.get(NODE_COLUMN) is not None:
        doc["nodes"] = [None if x is None else x.rsplit("/", 1)[-1] for x in r[NODE_COLUMN]]
    return doc


def script_json(doc: Any) -> str:
    """``doc`` as JSON that is safe inside a ``<script>`` element: ``<``, ``>``, ``&`` and the JavaScript
    line separators escaped, so no text can end the element or open a comment (HTML spec, "Restrictions
    for contents of script elements")."""
    s = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for a, b in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        s = s.replace(a, b)
    return s


def build(inputs: list[str | os.PathLike], cfg: ReportConfig) -> dict[str, Any]:
    """The page's data: summary, labellers, the carried rows, trees (see the module docstring).

    Raises:
        InputError: an IN that is no trajectory shard, folder or export (one line naming it).
    """
    from stepkit.stages import report_data  # (numpy and pyarrow.compute: not for --help)

    src = report_data.load(inputs)
    table = src.table
    labs = report_data.labellers(table, src.meanings, src.titles)
    fes = {lab.key: report_data.first_errors(table, lab) for lab in labs}
    n = table.num_rows
    if cfg.all or n <= cfg.sample:
        index = list(range(n))
    else:
        index = sorted(random.Random(cfg.seed).sample(range(n), cfg.sample))
    cols = [c for c in dict.fromkeys([*report_data.ROW_COLUMNS, *(c for lab in labs for c in (*lab.labels, *lab.values)),
                                      *(lab.status for lab in labs if lab.status)]) if c in table.column_names]
    carried = table.select(cols).take(pa.array(index, pa.int64())).to_pylist() if index else []
    rows = [row_doc(r, i, labs, fes) for r, i in zip(carried, index)]
    trees_paths = [*src.trees, *(Path(p) for p in cfg.tree)]
    problems = {r["pid"] for r in rows if "nodes" in r and r["pid"]}
    trees = report_data.read_trees(list(dict.fromkeys(trees_paths)), problems) if trees_paths and problems else {}
    reasons: dict[str, int] = {}
    if "filter_reason" in table.column_names:
        for k in table.column("filter_reason").to_pylist():
            reasons["kept" if k is None else k] = reasons.get("kept" if k is None else k, 0) + 1
    errors = sum(1 for e in table.column("error").to_pylist() if e) if "error" in table.column_names else 0
    return {
        "title": cfg.title or Path(str(inputs[0])).name, "stepkit_version": __version__,
        "created": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "inputs": src.inputs,
        "total_rows": n, "carried": len(rows), "sampled": len(rows) < n, "seed": cfg.seed, "page_size": cfg.page_size,
        "outcomes": _outcomes(table), "errors": errors, "filter_reasons": reasons,
        "labellers": [lab.doc() for lab in labs],
        "summary": {lab.key: report_data.summary(table, lab, fes[lab.key]) for lab in labs},
        "rows": rows, "trees": trees, "typeset": cfg.typeset,
    }


def _outcomes(table: pa.Table) -> dict[str, int]:
    if "outcome_correct" not in table.column_names:
        return {}
    vals = table.column("outcome_correct").to_pylist()
    return {"correct": sum(v is True for v in vals), "incorrect": sum(v is False for v in vals),
            "ungraded": sum(v is None for v in vals)}


KATEX = Path("/usr/share/javascript/katex")  # Debian's libjs-katex (its fonts: fonts-katex, linked from fonts/)


def katex_assets() -> tuple[str, str]:
    """``(script, style)`` of the machine's KaTeX (``$STEPKIT_KATEX`` or Debian's libjs-katex): ``katex.min.js``
    with its auto-render extension, and ``katex.min.css`` with its woff2 fonts as ``data:`` URLs (the woff
    and ttf fallbacks left out), so the page still loads nothing.

    Raises:
        ConfigError: KaTeX is not there (one line saying how to install it).
    """
    import base64

    folder = Path(os.environ.get("STEPKIT_KATEX") or KATEX)
    files = [folder / "katex.min.js", folder / "contrib" / "auto-render.js", folder / "katex.min.css"]
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise ConfigError(f"--typeset: {missing[0]} not found (apt-get install libjs-katex, or set STEPKIT_KATEX "
                          "to a KaTeX folder)")
    js = files[0].read_text() + "\n" + files[1].read_text()
    css = re.sub(r",\s*url\(fonts/[\w-]+\.(?:woff|ttf)\)\s*format\([\'\"](?:woff|truetype)[\'\"]\)", "", files[2].read_text())
    if re.search(r"url\(fonts/[\w-]+\.(?:woff|ttf)\)", css):
        raise ConfigError(f"--typeset: {files[2]}: its fonts are not listed as stepkit reads them (woff2 first)")

    def font(m):
        data = (folder / "fonts" / f"{m.group(1)}.woff2").read_bytes()
        return f"url(data:font/woff2;base64,{base64.b64encode(data).decode()})"

    return js, re.sub(r"url\(fonts/([\w-]+)\.woff2\)", font, css)


def render(doc: dict[str, Any]) -> str:
    """The HTML page of ``build``'s data: the template with the style, the data and the script inline (and
    KaTeX, when ``doc["typeset"]``)."""
    page = (ASSETS / "report.html").read_text()
    css = (ASSETS / "report.css").read_text()
    js = (ASSETS / "report.js").read_text()
    for name, text in (("report.css", css), ("report.js", js)):
        if "</" in text:  # (an asset that could close its own element)
            raise AssertionError(f"{name} holds '</'")
    katex_js, katex_css = katex_assets() if doc.get("typeset") else ("", "")
    if re.search(r"</(script|style)", katex_js + katex_css, re.IGNORECASE):
        raise ConfigError("--typeset: this KaTeX's files would close the page's script or style element")
    parts = {"TITLE": html.escape(f"{doc['title']} · stepkit report"), "CSS": css + katex_css, "DATA": script_json(doc),
             "JS": js, "KATEX": f"<script>\n{katex_js}\n</script>" if katex_js else ""}
    # one pass: the data is never rescanned for placeholders
    return re.sub(r"\{\{(TITLE|CSS|DATA|JS|KATEX)\}\}", lambda m: parts[m.group(1)], page)


def write_report(inputs: list[str | os.PathLike], cfg: ReportConfig, guard=None) -> dict[str, Any]:
    """Build the page of ``inputs`` and write it to ``cfg.out`` atomically (temporary file + rename), holding
    the output lock of ``cfg.out`` (a second report to the same file at once is refused); returns
    ``{"path", "bytes", "rows", "carried", "labellers", "seconds"}``. ``guard`` (a
    :class:`stepkit.shards.Writing`) words a write failure, by default as ``report: cannot write OUT: REASON``.

    Raises:
        InputError: see :func:`build`.
        StepkitError: the file cannot be written (one line naming it and the reason).
    """
    from stepkit.runner.parts import OutputLock
    from stepkit.shards import Writing

    t0 = time.perf_counter()
    if cfg.typeset:
        katex_assets()  # (missing KaTeX is one line before any row is read)
    doc = build(inputs, cfg)
    text = render(doc)
    out = Path(cfg.out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    guard = guard or Writing("report", out)
    with guard:
        guard.target = out
        out.parent.mkdir(parents=True, exist_ok=True)
        with OutputLock(out):
            try:
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, out)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        guard.target = None
    return {"path": str(out), "bytes": out.stat().st_size, "rows": doc["total_rows"], "carried": doc["carried"],
            "labellers": [lab["title"] for lab in doc["labellers"]], "seconds": time.perf_counter() - t0}
