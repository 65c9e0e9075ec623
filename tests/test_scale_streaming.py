"""filter, export and stats give the same output whether they hold a shard or stream it by record batch.

The reference is what these commands wrote before they streamed (main at 5b80432, holding each shard in
Python lists), recorded once in ``tests/golden/scale_streaming.json`` from a small real shard: 150 GSM8K
problems' model solutions (4 generators, 600 rows) through ``ingest gsm8k-solutions`` and ``mc-label -k 2``
on the scripted engine. Filter outputs are compared by content (rows, schema and column metadata; the
manifest holds a time), export by the sha256 of each data file (byte-identical), stats by its printed text
and figures. The streaming code runs with record batches far smaller than the shard (``STREAM_ROWS``
patched to 64) so every chunk boundary is crossed.

Rewrite the reference (only when an intended change of output is reviewed):
``PYTHONPATH=. python -m tests.test_scale_streaming --write``.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import DATA, run_cli

GOLDEN = Path(__file__).parent / "golden" / "scale_streaming.json"
SMALL_BATCH = 64

FILTERS = {  # name -> (rules, extra options): streaming rules, flag-only, and the whole-input ones
    "stream": (["status:mc_status!=no_signal", "steps:2-", "truncate-after-first-error:mc_first_error"], []),
    "flag": (["no-error", "min-value:mc_value>=0.4", "keep-correct-steps:mc_label"], ["--flag-only"]),
    "whole": (["status:mc_status=ok", "dedupe", "prof:mc_value"], ["--remove", "1"]),
}


def build_shard(work: Path) -> Path:
    """The real input shard (600 rows), labelled by the scripted engine."""
    sols, mc = work / "sols.parquet", work / "mc.parquet"
    run_cli("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", sols, "--limit", "150")
    run_cli("mc-label", sols, mc, "--engine", "scripted", "--model", "scripted:echo", "-k", "2", "--no-progress")
    return mc


def table_digest(path: Path) -> dict:
    """Rows, schema and column metadata of a Parquet file (not its manifest, which holds a time)."""
    t = pq.read_table(path)
    meta = {k.decode(): v.decode() for k, v in (t.schema.metadata or {}).items() if k != b"stepkit"}
    fields = [[f.name, str(f.type), {k.decode(): v.decode() for k, v in (f.metadata or {}).items()}]
              for f in t.schema]
    rows = json.dumps(t.to_pylist(), sort_keys=True, default=repr).encode()
    return {"rows": t.num_rows, "schema": fields, "metadata": meta, "sha256": hashlib.sha256(rows).hexdigest()}


def stats_text(shard: Path) -> tuple[str, dict]:
    from rich.console import Console

    from stepkit.cli import stage_views
    from stepkit.views import print_stats

    buf = io.StringIO()
    figs = print_stats(shard, stage_views(), console=Console(file=buf, width=140, color_system=None))
    text = buf.getvalue().replace(str(shard.parent), "<work>")  # (a title is centred: spaces stripped)
    return re.sub(r"(?m)^ +| +$", "", text), json.loads(json.dumps(figs, default=repr))


def outputs(work: Path) -> dict:
    """Everything the three commands write for the real shard, in comparable form."""
    mc = build_shard(work)
    got: dict = {"mc": table_digest(mc)}
    for name, (rules, extra) in FILTERS.items():
        out, dropped = work / f"{name}.parquet", work / f"{name}-dropped.parquet"
        args = ["filter", mc, out, *(a for r in rules for a in ("--rule", r)), *extra, "--no-progress"]
        if "--flag-only" not in extra:
            args += ["--dropped", dropped]
        run_cli(*args)
        got[f"filter-{name}"] = table_digest(out)
        if dropped.exists():
            got[f"filter-{name}-dropped"] = table_digest(dropped)
        manifest = json.loads((work / f"{name}.manifest.json").read_text())
        got[f"filter-{name}-counts"] = manifest["counts"]
    for name, (src, args) in {
            "trl": ("stream", ["--labels", "mc_label"]), "soft": ("stream", ["--labels", "mc_value", "--soft"]),
            "ps": ("whole", ["--format", "processbench", "--labels", "mc_first_error", "--test-size", "0.2"]),
            "flagged": ("flag", ["--labels", "mc_label"])}.items():
        run_cli("export", work / f"{src}.parquet", work / f"export-{name}", *args)
        m = json.loads((work / f"export-{name}" / "stepkit.manifest.json").read_text())
        got[f"export-{name}"] = {"splits": m["splits"], "counts": m["counts"]}
    for name in ("mc", "stream", "flag", "whole"):
        text, figs = stats_text(work / f"{name}.parquet")
        got[f"stats-{name}"] = {"text": text, "figs": figs}
    return got


@pytest.fixture(scope="module")
def current(tmp_path_factory, request):
    import stepkit.stages.filter as filter_stage
    import stepkit.views as views

    mp = pytest.MonkeyPatch()
    for mod in (filter_stage, views):
        if hasattr(mod, "STREAM_ROWS"):
            mp.setattr(mod, "STREAM_ROWS", SMALL_BATCH)
    request.addfinalizer(mp.undo)
    return outputs(tmp_path_factory.mktemp("scale"))


@pytest.mark.parametrize("key", json.loads(GOLDEN.read_text()).keys() if GOLDEN.exists() else [])
def test_same_output_as_before_streaming(current, key):
    want = json.loads(GOLDEN.read_text())[key]
    assert current[key] == want


def test_streaming_batches_are_smaller_than_the_shard(current):
    """The comparison above means something only if the shard spans many batches."""
    import stepkit.stages.filter as filter_stage
    import stepkit.views as views

    assert current["mc"]["rows"] > 4 * SMALL_BATCH
    assert filter_stage.STREAM_ROWS == SMALL_BATCH and views.STREAM_ROWS == SMALL_BATCH


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(outputs(Path(d)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
