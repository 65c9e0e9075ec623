"""A write that fails (a full disk, a read-only folder) in export, publish and report: one line naming the file
and the OS reason, exit 1, no traceback, an earlier good OUT as it was and no staging folder left (breaking run
E10); two of them writing one OUT at once: the second refused (E8). Tests run as root, which chmod does not stop,
so the failures are injected: the write raises the OSError the kernel gives (ENOSPC, EROFS)."""

from __future__ import annotations

import errno
import hashlib
import os
import pathlib
import shutil

import pytest

from stepkit.runner import OutputLock
from tests.conftest import run_cli
from tests.test_export import labelled, write

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")
FULL = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
READ_ONLY = OSError(errno.EROFS, os.strerror(errno.EROFS))


def tree(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(folder):
    """Staging folders, temporary files and lock files beside or in ``folder``."""
    return sorted(p.name for p in [*folder.parent.iterdir(), *(folder.rglob("*") if folder.is_dir() else [])]
                  if ".tmp-" in p.name or ".publish-" in p.name or ".old-" in p.name or p.name.endswith(".lock"))


def one_error_line(r, start, reason):
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(f"error: {start}") and lines[0].endswith(reason), r.stderr
    return lines[0]


@pytest.fixture
def shard(tmp_path):
    return write(tmp_path / "in.parquet", labelled(4))


def _datasets_wraps(*a, **k):
    from datasets.exceptions import DatasetGenerationError

    try:
        raise FULL
    except OSError as e:
        raise DatasetGenerationError("An error occurred while generating the dataset") from e


EXPORT_FAULTS = {  # where the write fails -> the file the line names (relative to OUT)
    "data file": ("stepkit.stages.export.write_table", FULL, "data/train-00000.parquet", "No space left on device"),
    "manifest": ("stepkit.stages.export.write_json", FULL, "stepkit.manifest.json", "No space left on device"),
    "datasets cache (wrapped)": ("datasets.load_dataset", None, ".cache", "No space left on device"),
    "read-only folder": ("pathlib.Path.mkdir", READ_ONLY, "data", "Read-only file system"),
}


@pytest.mark.parametrize("where", EXPORT_FAULTS)
def test_export_write_failure_is_one_line_and_keeps_the_earlier_export(tmp_path, shard, monkeypatch, where):
    target, error, named, reason = EXPORT_FAULTS[where]
    out = tmp_path / "ds"
    run_cli("export", shard, out, "--labels", "mc_value")
    before = tree(out)
    if error is None:
        monkeypatch.setattr("datasets.load_dataset", _datasets_wraps)
    elif target == "pathlib.Path.mkdir":
        real = pathlib.Path.mkdir
        monkeypatch.setattr(pathlib.Path, "mkdir", lambda self, *a, **k: (_ for _ in ()).throw(
            OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))) if ".tmp-" in str(self) else real(self, *a, **k))
    else:
        monkeypatch.setattr(target, lambda *a, **k: (_ for _ in ()).throw(error))
    for args in (["--force", "--seed", "1"], []):  # onto the earlier export, and into a new OUT
        dest = out if args else tmp_path / "new"
        r = run_cli("export", shard, dest, "--labels", "mc_value", *args, check=False)
        line = one_error_line(r, "export: cannot write ", reason)
        shown = line.removeprefix("error: export: cannot write ").rsplit(": ", 1)[0]
        assert shown == str((dest / named) if named else dest), line  # the user's OUT, not the staging folder
    assert tree(out) == before
    assert not (tmp_path / "new").exists()
    assert leftovers(out) == []


def test_a_failed_swap_puts_the_earlier_export_back(tmp_path, shard, monkeypatch):
    out = tmp_path / "ds"
    run_cli("export", shard, out, "--labels", "mc_value")
    before = tree(out)
    real = pathlib.Path.rename

    def rename(self, target):  # the old contents moved aside, then the new ones cannot be moved in
        if ".tmp-" in str(self) and pathlib.Path(target).parent == out:
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(self))
        return real(self, target)

    monkeypatch.setattr(pathlib.Path, "rename", rename)
    r = run_cli("export", shard, out, "--labels", "mc_value", "--force", "--seed", "1", check=False)
    one_error_line(r, "export: cannot write ", "Input/output error")
    assert tree(out) == before and leftovers(out) == []


@pytest.fixture
def exported(tmp_path, shard):
    out = tmp_path / "ds"
    run_cli("export", shard, out, "--labels", "mc_value")
    run_cli("publish", out, "--dry-run")  # an earlier card, figures and report
    return out


def _savefig_full(*a, **k):
    raise FULL


PUBLISH_FAULTS = {
    "figure": (lambda mp: mp.setattr("matplotlib.figure.Figure.savefig", _savefig_full), "images"),
    "card": (lambda mp: _fail_write_text(mp, "README.md"), "README.md"),
    "report page": (lambda mp: _fail_write_text(mp, ".report.html.tmp-"), "report.html"),
    "datasets cache (wrapped)": (lambda mp: mp.setattr("datasets.load_dataset", _datasets_wraps), ".cache"),
    "copy into FOLDER": (lambda mp: _fail_copy(mp), "README.md"),
}


def _fail_write_text(mp, name):
    real = pathlib.Path.write_text

    def write_text(self, *a, **k):
        if self.name.startswith(name):
            raise FULL
        return real(self, *a, **k)

    mp.setattr(pathlib.Path, "write_text", write_text)


def _fail_copy(mp):
    real = shutil.copy2
    mp.setattr(shutil, "copy2", lambda src, dst, **k: (_ for _ in ()).throw(FULL) if ".tmp-" in str(dst)
               else real(src, dst, **k))


@pytest.mark.parametrize("where", PUBLISH_FAULTS)
def test_publish_write_failure_is_one_line_and_keeps_the_earlier_card(exported, monkeypatch, where):
    inject, named = PUBLISH_FAULTS[where]
    before = tree(exported)
    inject(monkeypatch)
    r = run_cli("publish", exported, "--dry-run", check=False)
    line = one_error_line(r, "publish: cannot write ", "No space left on device")
    assert line == f"error: publish: cannot write {exported / named}: No space left on device"
    assert "datasets cannot load" not in r.stderr  # a full disk is not bad data
    assert tree(exported) == before and leftovers(exported) == []


def test_report_write_failure_is_one_line(tmp_path, shard, monkeypatch):
    out = tmp_path / "r.html"
    _fail_write_text(monkeypatch, ".r.html.tmp-")
    r = run_cli("report", shard, "-o", out, check=False)
    assert one_error_line(r, "report: ", "No space left on device") == \
        f"error: report: cannot write {out}: No space left on device"
    assert not out.exists() and leftovers(out) == []


def test_a_read_only_folder_refuses_the_lock_in_one_line(tmp_path, shard, monkeypatch):
    real = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: (_ for _ in ()).throw(READ_ONLY) if str(p).endswith(".lock")
                        else real(p, *a, **k))
    r = run_cli("export", shard, tmp_path / "ds", "--labels", "mc_value", check=False)
    assert one_error_line(r, "", "") == f"error: {tmp_path / 'ds'}: cannot write in {tmp_path} (Read-only file system)"


@pytest.mark.parametrize("command", ["export", "publish", "report"])
def test_a_second_writer_of_one_out_is_refused_naming_the_first(tmp_path, shard, command):
    out = tmp_path / ("r.html" if command == "report" else "ds")
    if command == "publish":
        run_cli("export", shard, out, "--labels", "mc_value")
    args = {"export": ["export", shard, out, "--labels", "mc_value"], "publish": ["publish", out, "--dry-run"],
            "report": ["report", shard, "-o", out]}[command]
    with OutputLock(out):  # another stepkit process is writing OUT
        r = run_cli(*args, check=False)
    line = one_error_line(r, "", "wait for it or stop it")
    assert line.startswith(f"error: {out.name}: another stepkit run is writing this output (pid {os.getpid()}, "), line
    if command == "export":
        assert not out.exists()
    run_cli(*args)  # the lock released: it runs
