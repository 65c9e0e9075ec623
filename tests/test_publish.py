"""stepkit publish against a local Hub-compatible server (tests/hub_server.py) with the real huggingface_hub
client: card and features, download and load back, republish with another schema, retries (case
hub-parallel-commits-412), bad token, unreachable endpoint, dry run."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import datasets
import pytest
import yaml
from huggingface_hub import snapshot_download

from stepkit.errors import ConfigError, StepkitError
from stepkit.stages.export import ExportConfig, export
from stepkit.stages.publish import PublishConfig, publish
from tests.conftest import DATA, run_cli
from tests.hub_server import FakeHub, hub_env

TOKEN = "hf_test"
REPO = "stepkit-org/gsm8k-prm"
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """Real GSM8K model solutions -> scripted mc-label -> filter: a shard with a three-stage lineage."""
    d = tmp_path_factory.mktemp("pipeline")
    run_cli("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", d / "sol.parquet",
            "--limit", "6")
    run_cli("mc-label", d / "sol.parquet", d / "mc.parquet", "--engine", "scripted", "--model", "scripted:echo",
            "-k", "4", "--temperature", "0.6", "--no-progress")
    run_cli("filter", d / "mc.parquet", d / "kept.parquet", "--rule", "status:mc_status=ok", "--dropped",
            d / "dropped.parquet", "--no-progress")
    return d / "kept.parquet"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    with FakeHub(tokens={TOKEN}) as hub:
        hub.env = hub_env(monkeypatch, hub, tmp_path / "hf-home")
        yield hub


def cfg(**kw):
    return PublishConfig(**{"repo_id": REPO, "retry_wait": 0.0, **kw})


def tree_hashes(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def front_matter(text):
    return yaml.safe_load(text.split("---\n")[1])


def test_publish_then_download_and_load_with_the_declared_features(hub, labelled, tmp_path):
    folder = tmp_path / "export"
    export(labelled, folder, ExportConfig(labels="mc_value", rows_per_file=4))  # hard, value > 0
    report = publish(folder, cfg(private=True))
    files = hub.files(REPO)
    data = sorted(f for f in files if f.startswith("data/"))
    assert len(data) >= 2 and all(f.startswith("data/train-") for f in data)
    assert {"README.md", "images/value_by_step.png", "images/first_error_histogram.png", "report.html"} <= set(files)
    assert files["report.html"] == (folder / "report.html").read_bytes()
    assert "stepkit.manifest.json" not in files  # local paths stay local
    assert hub.repo(REPO).private and len([c for c in hub.commits(REPO) if c.title.startswith("stepkit")]) == 1
    assert report["commit"] == hub.repo(REPO).head.oid
    assert files["README.md"].decode() == (folder / "README.md").read_text()  # the local folder matches the Hub
    local = snapshot_download(REPO, repo_type="dataset", local_dir=tmp_path / "download")
    ds = datasets.load_dataset(local, cache_dir=str(tmp_path / "cache"))
    assert ds["train"].features["labels"] == datasets.List(datasets.Value("bool"))
    assert ds["train"].features["soft_labels"] == datasets.List(datasets.Value("float32"))
    card = files["README.md"].decode()
    meta = front_matter(card)
    assert meta["configs"] == [{"config_name": "default", "data_files": [{"split": "train",
                                                                         "path": "data/train-*.parquet"}]}]
    assert {f["name"]: f.get("list", f.get("dtype")) for f in meta["dataset_info"]["features"]} == {
        "id": "string", "prompt": "string", "completions": "string", "labels": "bool", "soft_labels": "float32"}
    assert meta["license"] == "mit" and meta["size_categories"] == "n<1K" and "process-reward-model" in meta["tags"]
    # the body: lineage from the manifests
    for text in ("**`ingest`**", "**`mc-label`**", "**`filter`**", "model `scripted:echo`", "sampling.temperature=0.6",
                 "continuations=4", "prompt_template.hash=", "`status:mc_status=ok`",
                 "hard labels: value > 0 of the step values `mc_value`", "![value by step](images/value_by_step.png)"):
        assert text in card, text
    n = sum(d.num_rows for d in ds.values())
    assert f"| train | {n} |" in card


def test_republish_with_another_schema_leaves_no_stale_shard(hub, labelled, tmp_path):
    folder = tmp_path / "export"
    export(labelled, folder, ExportConfig(labels="mc_label", rows_per_file=2))
    publish(folder, cfg())
    n_hard = len([f for f in hub.files(REPO) if f.startswith("data/")])
    assert n_hard >= 2
    export(labelled, folder, ExportConfig(labels="mc_value", soft=True), force=True)  # one file now, soft labels
    publish(folder, cfg())
    files = hub.files(REPO)
    assert sorted(f for f in files if f.startswith("data/")) == ["data/train-00000-of-00001.parquet"]
    assert "images/first_error_histogram.png" not in files  # soft labels have no first error: the old one goes
    meta = front_matter(files["README.md"].decode())
    feats = {f["name"]: f.get("list", f.get("dtype")) for f in meta["dataset_info"]["features"]}
    assert feats["labels"] == "float32" and "soft_labels" not in feats  # rendered anew, never merged
    local = snapshot_download(REPO, repo_type="dataset", local_dir=tmp_path / "download")
    ds = datasets.load_dataset(local, cache_dir=str(tmp_path / "cache"))
    assert ds["train"].features["labels"] == datasets.List(datasets.Value("float32"))


def test_case_412_commits_are_retried_and_land_once(hub, labelled, tmp_path, cases):
    case = cases["hub-parallel-commits-412"]
    folder = tmp_path / "export"
    export(labelled, folder, ExportConfig(labels="mc_label", rows_per_file=1))
    files = json.loads((folder / "stepkit.manifest.json").read_text())["splits"]["train"]["files"]
    assert len(files) >= 4
    hub.fail_next("commit", status=412, times=case["input"]["workers"] - 1)
    publish(folder, cfg())
    on_hub = sorted(f for f in hub.files(REPO) if f.startswith("data/"))
    assert on_hub == sorted(files)  # every shard, each once, in one commit
    assert hub.count("commit", status=412) == 3 and hub.count("commit", status=200) == 1
    # each publish below changes the files (an unchanged folder makes no commit)
    export(labelled, folder, ExportConfig(labels="mc_label", rows_per_file=2), force=True)
    hub.fail_next("commit", status=429, times=1, retry_after=0)
    publish(folder, cfg())
    assert hub.count("commit", status=429) == 1 and hub.count("commit", status=200) == 2
    # bounded: a commit that keeps failing gives up with one clear line
    export(labelled, folder, ExportConfig(labels="mc_label", rows_per_file=3), force=True)
    hub.fail_next("commit", status=503, times=3)
    with pytest.raises(StepkitError, match=r"failed after 3 attempts: HTTP 503"):
        publish(folder, cfg(max_retries=2))
    assert hub.count("commit", status=503) == 3
    # not retried: 404 / 403
    for status in (404, 403):  # (the folder changed above and has not landed yet)
        before = hub.count("commit")
        hub.fail_next("commit", status=status, times=1)
        with pytest.raises(StepkitError, match=f"HTTP {status}"):
            publish(folder, cfg())
        assert hub.count("commit") == before + 1


def test_bad_token_and_unreachable_endpoint_are_one_line_and_leave_the_folder(hub, labelled, tmp_path):
    folder = tmp_path / "export"
    export(labelled, folder, ExportConfig(labels="mc_label"))
    before = tree_hashes(folder)
    env = {**hub.env, "HF_TOKEN": "hf_wrong"}
    p = subprocess.run([sys.executable, "-m", "stepkit.cli", "publish", folder, "--repo-id", REPO], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0, p.stderr
    assert p.stderr.startswith("error: ") and "HTTP 401" in p.stderr and "HF_TOKEN" in p.stderr
    assert hub.count("create_repo") == 1  # not retried
    p = subprocess.run([sys.executable, "-m", "stepkit.cli", "publish", folder, "--repo-id", REPO, "--endpoint",
                        "http://127.0.0.1:9", "--max-retries", "1", "--retry-wait", "0"], env=hub.env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0, p.stderr
    assert "http://127.0.0.1:9" in p.stderr and "cannot reach the Hub" in p.stderr
    assert tree_hashes(folder) == before  # no card, no figures: the folder is as export left it
    assert not list(tmp_path.glob(".export.publish-*"))


def test_dry_run_needs_no_token_and_checks_the_folder(labelled, tmp_path):
    folder = tmp_path / "export"
    export(labelled, folder, ExportConfig(labels="mc_label"))
    p = run_cli("publish", folder, "--dry-run")
    assert "nothing uploaded" in p.stderr and "README.md" in p.stderr
    assert (folder / "README.md").exists() and (folder / "images" / "value_by_step.png").exists()
    with pytest.raises(ConfigError, match="--repo-id ORG/NAME, or --dry-run"):
        PublishConfig()
    with pytest.raises(ConfigError, match="write ORG/NAME"):
        PublishConfig(repo_id="no-slash")
    # a data file the export did not write (say, from a soft export) is refused: one dataset, one export
    (folder / "data" / "train-00009-of-00010.parquet").write_bytes((folder / "data" /
                                                                   "train-00000-of-00001.parquet").read_bytes())
    with pytest.raises(ConfigError, match="holds files the export did not write"):
        publish(folder, PublishConfig(dry_run=True))
    with pytest.raises(ConfigError, match="not a stepkit export folder"):
        publish(tmp_path, PublishConfig(dry_run=True))


def test_pairs_card_counts_pairs_and_draws_their_margins(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stepkit.stages.mcts_label import PAIR_SCHEMA

    steps = json.loads((DATA / "processbench" / "gsm8k.json").read_text())[0]["steps"]
    pairs = [{"problem_id": f"p{i}", "prompt": "Q?", "node_id": "n", "prefix_steps": steps[:1], "chosen": steps[1:2],
              "rejected": ["A wrong step."], "chosen_node_id": f"c{i}", "rejected_node_id": f"r{i}",
              "chosen_value": 0.25 * (i + 1), "rejected_value": 0.0} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(pairs, schema=PAIR_SCHEMA), tmp_path / "pairs.parquet")
    export(tmp_path / "pairs.parquet", tmp_path / "dpo", ExportConfig(format="pairs"))
    report = publish(tmp_path / "dpo", PublishConfig(dry_run=True))
    assert "3 pairs, in the **pairs** (DPO) format" in report["card"]
    assert "| mean value margin (chosen - rejected) | 0.5 |" in report["card"]
    assert report["images"] == ["images/pair_margin_histogram.png"]
    assert "truncation" not in report["card"]


def test_report_html_beside_the_card_linked_and_off_with_no_report(labelled, tmp_path):
    from stepkit.stages.report import ReportConfig, build

    folder = tmp_path / "export"
    export(labelled, folder, ExportConfig(labels="mc_label"))
    p = run_cli("publish", folder, "--dry-run")
    assert "README.md, images/ and report.html written there" in p.stderr
    page = (folder / "report.html").read_text()
    assert "[`report.html`](report.html)" in (folder / "README.md").read_text()
    data = json.loads(page.split('id="stepkit-data">', 1)[1].split("</script>", 1)[0])
    assert data == {**build([str(folder)], ReportConfig()), "title": "export", "created": data["created"]}
    assert [lab["title"] for lab in data["labellers"]] == ["export (trl): hard labels as written in `mc_label`"]
    report = publish(folder, PublishConfig(dry_run=True, report=False))
    assert report["report"] is None and not (folder / "report.html").exists()
    assert "report.html" not in report["card"] and "report.html" not in (folder / "README.md").read_text()


def test_private_into_an_existing_public_repository_is_refused(hub, labelled, tmp_path):
    """Breaking run E7: create_repo(exist_ok=True, private=True) left the public repository public and the
    upload went there."""
    folder = tmp_path / "export"
    export(labelled, folder, ExportConfig(labels="mc_value"))
    hub.create_repo(REPO, private=False)
    r = run_cli("publish", folder, "--repo-id", REPO, "--private", "--retry-wait", "0", check=False)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: --private: {REPO} exists and is public on ")
    assert not hub.repo(REPO).private and not [c for c in hub.commits(REPO) if c.title.startswith("stepkit")]
    hub.create_repo("stepkit-org/closed", private=True)  # an existing private repository: published into
    publish(folder, cfg(private=True, repo_id="stepkit-org/closed"))
    assert hub.repo("stepkit-org/closed").private and hub.files("stepkit-org/closed")
