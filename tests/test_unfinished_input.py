"""A folder IN that holds an unfinished run (a killed rank's ``*.parquet.parts``) is read with one warning line
by every command that reads folders (breaking run E3: export, filter, judge, likelihood-label and stats read
the finished half silently; only eval warned)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import stepkit.cli as cli
import stepkit.shards as shards
from tests.conftest import DATA, run_cli


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Two real GSM8K solution shards labelled by mc-label (scripted engine): ``a`` finished, ``b`` killed
    after its first committed chunk (left as its parts folder)."""
    root = tmp_path_factory.mktemp("unfinished")
    sol = root / "sol.parquet"
    run_cli("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", sol, "--limit", "2")
    t = pq.read_table(sol)
    (root / "in").mkdir()
    pq.write_table(t.slice(0, 4), root / "in" / "a.parquet")
    pq.write_table(t.slice(4, 4), root / "in" / "b.parquet")
    lab = root / "lab"
    run_cli("mc-label", root / "in", lab, "--engine", "scripted", "--model", "scripted:echo", "-k", "1",
            "--no-progress")
    # b's run "dies": its finished shard goes back to a parts folder holding what a killed run leaves
    (lab / "b.parquet").unlink()
    (lab / "b.parquet.parts").mkdir()
    return lab


@pytest.mark.parametrize("args", [
    ["stats", "{lab}"],
    ["export", "{lab}", "{tmp}/ds", "--labels", "mc_value"],
    ["filter", "{lab}", "{tmp}/kept", "--rule", "dedupe", "--dropped", "{tmp}/drop", "--no-progress"],
    ["judge", "{lab}", "{tmp}/judged", "--engine", "scripted", "--model", "scripted:judge", "--no-progress"],
    ["eval", "agreement", "{lab}", "--a", "mc_first_error", "--b", "mc_first_error"],
], ids=lambda a: a[0] if a[0] != "eval" else "eval")
def test_every_reader_warns_once(folder, tmp_path, monkeypatch, args):
    monkeypatch.setattr(shards, "_WARNED_UNFINISHED", set())
    r = CliRunner().invoke(cli.main, [a.format(lab=folder, tmp=tmp_path) for a in args])
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {folder}: 1 run(s) not finished (b.parquet.parts); their rows are not in the "
                        "folder, so only 1 finished shard(s) are read: rerun the stopped command first"]


def test_a_folder_with_only_an_unfinished_run_says_so(folder, tmp_path):
    (tmp_path / "x.parquet.parts").mkdir()
    r = CliRunner().invoke(cli.main, ["stats", str(tmp_path)])
    assert r.exit_code == 1
    assert r.stderr.strip() == f"error: {tmp_path}: folder holds no .parquet shards (only the unfinished run " \
                               "x.parquet.parts: finish it first)"


def test_an_unfinished_runs_parts_folder_given_as_in_is_refused(tmp_path):
    """Breaking run D6: ``filter X.parquet.parts ...`` read the committed chunks as a finished shard."""
    from stepkit.errors import InputError
    from stepkit.shards import list_shards

    parts = tmp_path / "un.parquet.parts"
    parts.mkdir()
    (parts / "run.json").write_text("{}")
    (parts / "part-00000.parquet").write_bytes(b"")
    with pytest.raises(InputError, match=r"un.parquet.parts: is the parts folder of a run of un.parquet that has not "
                                         "finished"):
        list_shards(parts)
