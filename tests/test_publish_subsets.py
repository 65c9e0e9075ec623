"""publish --config NAME: two subsets of one repository on the local Hub server (tests/hub_server.py), published
one after the other, racing (a commit that lands between another publish's read of the head and its commit)
and as two concurrent processes: both subsets load afterwards with their own splits and features."""

from __future__ import annotations

import subprocess
import sys

import datasets
import pytest
import yaml
from huggingface_hub import snapshot_download

from stepkit.errors import ConfigError
from stepkit.stages import card_merge
from stepkit.stages.export import ExportConfig, export, read_export_manifest
from stepkit.stages.publish import PublishConfig, publish
from tests.conftest import DATA
from tests.hub_server import FakeHub, hub_env
from tests.test_export_text import ok

TOKEN = "hf_test"
REPO = "stepkit-org/processbench-prm"
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A gsm8k export (trl, 4 real ProcessBench gsm8k rows, hard labels) and a math export (processbench
    format, 6 real ProcessBench math rows, train/test split): two subsets with different features."""
    d = tmp_path_factory.mktemp("subsets")
    ok("ingest", "processbench", DATA / "processbench" / "gsm8k.json", d / "g.parquet", "--limit", "4")
    ok("ingest", "processbench", DATA / "processbench" / "math.json", d / "m.parquet", "--limit", "6")
    export(d / "g.parquet", d / "gsm8k", ExportConfig(labels="reference_first_error"))
    export(d / "m.parquet", d / "math", ExportConfig(format="processbench", labels="reference_first_error",
                                                     test_size=2))
    return d / "gsm8k", d / "math"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    with FakeHub(tokens={TOKEN}) as hub:
        hub.env = hub_env(monkeypatch, hub, tmp_path / "hf-home")
        yield hub


def cfg(config, **kw):
    return PublishConfig(**{"repo_id": REPO, "retry_wait": 0.0, "config": config, **kw})


def rows(folder):
    return {s: i["rows"] for s, i in read_export_manifest(folder)["splits"].items()}


def check_both_load(hub, tmp_path, exports):
    """Download the repository and load each subset as a Hub user would: its own splits, rows and features."""
    local = snapshot_download(REPO, repo_type="dataset", local_dir=tmp_path / "download")
    g = datasets.load_dataset(local, "gsm8k", cache_dir=str(tmp_path / "cache"))
    m = datasets.load_dataset(local, "math", cache_dir=str(tmp_path / "cache"))
    assert {s: d.num_rows for s, d in g.items()} == rows(exports[0]) == {"train": 4}
    assert {s: d.num_rows for s, d in m.items()} == rows(exports[1]) and set(m) == {"train", "test"}
    assert set(g["train"].features) == {"id", "prompt", "completions", "labels"}
    assert set(m["train"].features) == {"id", "generator", "problem", "steps", "final_answer_correct", "label"}
    meta = yaml.safe_load(hub.files(REPO)["README.md"].decode().split("---\n")[1])
    assert [c["config_name"] for c in meta["configs"]] == ["gsm8k", "math"]
    assert [i["config_name"] for i in meta["dataset_info"]] == ["gsm8k", "math"]
    files = hub.files(REPO)
    assert any(f.startswith("data/gsm8k/train-") for f in files) and any(f.startswith("data/math/test-") for f in files)
    return meta


def test_two_subsets_one_after_the_other_both_load(hub, exports, tmp_path):
    gsm8k, math = exports
    publish(gsm8k, cfg("gsm8k"))
    publish(math, cfg("math"))
    meta = check_both_load(hub, tmp_path / "a", exports)
    card = hub.files(REPO)["README.md"].decode()
    assert card.count("<!-- stepkit:config gsm8k -->") == 1 and card.count("<!-- stepkit:config math -->") == 1
    assert 'load_dataset("stepkit-org/processbench-prm", "math")' in card
    assert meta["pretty_name"] == "processbench-prm"
    # republishing one subset keeps the other, its files and its card section as they were
    before = {f: b for f, b in hub.files(REPO).items() if "math" in f}
    export(gsm8k.parent / "g.parquet", gsm8k, ExportConfig(labels="reference_first_error", rows_per_file=2),
           force=True)
    publish(gsm8k, cfg("gsm8k", pretty_name="ProcessBench PRM"))
    assert {f: b for f, b in hub.files(REPO).items() if "math" in f} == before
    assert len([f for f in hub.files(REPO) if f.startswith("data/gsm8k/")]) == 2
    meta = check_both_load(hub, tmp_path / "b", exports)
    assert meta["pretty_name"] == "ProcessBench PRM"


def test_a_commit_that_lands_first_is_merged_not_lost(hub, exports, tmp_path, monkeypatch):
    """The math publish reads the head, then the gsm8k publish commits before it: its commit names the head it
    read, gets HTTP 412, and is planned again on the new head, with one line saying so."""
    gsm8k, math = exports
    real_merge, calls = card_merge.merge, []

    def merge_after_a_rival_commit(existing, new, name, pretty):
        calls.append(name)
        if name == "math" and calls.count("math") == 2:  # the first merge with the head read (the first one is the local card's)
            publish(gsm8k, cfg("gsm8k"))  # lands between math's read of the head and its commit
        return real_merge(existing, new, name, pretty)

    monkeypatch.setattr(card_merge, "merge", merge_after_a_rival_commit)
    lines = []
    publish(math, cfg("math"), log=lines.append)
    assert hub.count("commit", status=412) == 1 and hub.count("commit", status=200) == 2
    assert len(lines) == 1 and "moved on" in lines[0] and "merging the card with the new head" in lines[0]
    check_both_load(hub, tmp_path, exports)


def test_two_concurrent_publish_processes_both_survive(hub, exports, tmp_path):
    gsm8k, math = exports
    procs = [subprocess.Popen([sys.executable, "-m", "stepkit.cli", "publish", str(folder), "--repo-id", REPO,
                               "--config", name, "--retry-wait", "0.2"], env=hub.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for folder, name in ((gsm8k, "gsm8k"), (math, "math"))]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all("published" in err for _, err in outs)
    check_both_load(hub, tmp_path, exports)


def test_a_subset_name_is_checked():
    with pytest.raises(ConfigError, match="--config 'a/b'"):
        cfg("a/b")
