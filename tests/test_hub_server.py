"""FakeHub (tests/hub_server.py) against the real ``huggingface_hub`` client: create, upload (regular + LFS
files), list, download, delete patterns, tokens, injected faults, explicit endpoints and subprocesses."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import huggingface_hub
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

from tests.conftest import ROOT
from tests.hub_server import FakeHub, hub_env

TOKEN = "hf_test"
REPO = "stepkit-org/prm-demo"
README = "---\nlicense: apache-2.0\n---\n# PRM demo\n"

# The client's own LFS PUT passes a file object as ``data=``, which its HTTP library deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A started FakeHub, with huggingface_hub in this process online and pointed at it."""
    with FakeHub(tokens={TOKEN}) as hub:
        hub_env(monkeypatch, hub, tmp_path / "hf-home")
        yield hub


def write_dataset(folder: Path, shards: list[list[dict]]) -> Path:
    """A Hub-layout dataset folder: README.md + data/train-0000i-of-0000n.parquet."""
    (folder / "data").mkdir(parents=True)
    (folder / "README.md").write_text(README)
    for i, rows in enumerate(shards):
        pq.write_table(pa.Table.from_pylist(rows), folder / "data" / f"train-{i:05d}-of-{len(shards):05d}.parquet")
    return folder


def rows(start: int, n: int) -> list[dict]:
    return [{"problem_id": f"p{i}", "step": "Add 2 and 3.", "label": i % 2 == 0} for i in range(start, start + n)]


def test_create_repo_records_private_and_honours_exist_ok(hub):
    api = HfApi()
    url = api.create_repo(REPO, repo_type="dataset", private=True)
    assert url.repo_id == REPO and url.repo_type == "dataset" and url.startswith(hub.endpoint)
    assert hub.repo(REPO).private
    assert api.create_repo(REPO, repo_type="dataset", private=True, exist_ok=True).repo_id == REPO
    with pytest.raises(HfHubHTTPError) as e:
        api.create_repo(REPO, repo_type="dataset")
    assert e.value.response.status_code == 409
    assert [(r.kind, r.status) for r in hub.requests if r.kind == "create_repo"] == [
        ("create_repo", 200), ("create_repo", 409), ("create_repo", 409)]

    info = api.dataset_info(REPO)
    assert info.private and info.sha == hub.commits(REPO)[-1].oid
    assert [s.rfilename for s in info.siblings] == [".gitattributes"]  # the Hub's initial commit
    huggingface_hub.create_repo("stepkit-org/public-model")  # the module-level HfApi is pointed at FakeHub too
    assert not api.model_info("stepkit-org/public-model").private  # a model repo, public by default
    with pytest.raises(RepositoryNotFoundError):
        api.dataset_info("stepkit-org/missing")


def test_upload_list_download_and_load_back(hub, tmp_path):
    import datasets

    api = HfApi()
    api.create_repo(REPO, repo_type="dataset", exist_ok=True)
    folder = write_dataset(tmp_path / "out", [rows(0, 3), rows(3, 2)])
    info = api.upload_folder(folder_path=folder, repo_id=REPO, repo_type="dataset", commit_message="Publish v1")

    head = hub.commits(REPO)[-1]
    assert info.oid == head.oid and head.title == "Publish v1" and len(hub.commits(REPO)) == 2
    files = hub.files(REPO)
    shards = ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]
    assert sorted(files) == [".gitattributes", "README.md", *shards]
    assert all(files[s] == (folder / s).read_bytes() for s in shards)
    assert files["README.md"] == README.encode()
    # Parquet took the LFS path (batch + PUT + verify, then lfsFile lines), the README went inline.
    assert head.lfs_paths == frozenset(shards)
    assert hub.count("lfs_upload", status=200) == 2 and hub.count("lfs_verify", status=200) == 2
    assert hub.count("commit") == 1 and hub.count("xet_token") == 0 and hub.count("unknown") == 0

    assert sorted(api.list_repo_files(REPO, repo_type="dataset")) == sorted(files)
    top = {e.path for e in api.list_repo_tree(REPO, repo_type="dataset")}
    assert top == {".gitattributes", "README.md", "data"}
    lfs_entry = next(e for e in api.list_repo_tree(REPO, "data", repo_type="dataset") if e.path == shards[0])
    assert lfs_entry.lfs.size == len(files[shards[0]])

    local = Path(snapshot_download(REPO, repo_type="dataset", local_dir=tmp_path / "snap"))
    assert all((local / p).read_bytes() == data for p, data in files.items())
    ds = datasets.load_dataset("parquet", data_files=sorted(str(p) for p in (local / "data").glob("*.parquet")),
                               split="train", cache_dir=str(tmp_path / "ds-cache"))
    assert ds.num_rows == 5 and sorted(ds["problem_id"]) == [f"p{i}" for i in range(5)]

    # One file into the (isolated) cache, by revision sha: the metadata HEAD carried what the client needs.
    cached = hf_hub_download(REPO, shards[1], repo_type="dataset", revision=head.oid)
    assert Path(cached).read_bytes() == files[shards[1]] and str(tmp_path / "hf-home") in cached


def test_second_upload_with_delete_patterns_leaves_no_stale_file(hub, tmp_path):
    api = HfApi()
    api.create_repo(REPO, repo_type="dataset")
    api.upload_folder(folder_path=write_dataset(tmp_path / "v1", [rows(0, 3), rows(3, 2)]), repo_id=REPO,
                      repo_type="dataset", commit_message="v1")
    v2 = write_dataset(tmp_path / "v2", [rows(10, 4)])
    api.upload_folder(folder_path=v2, repo_id=REPO, repo_type="dataset", commit_message="v2",
                      delete_patterns=["data/*"])

    files = hub.files(REPO)
    assert sorted(files) == [".gitattributes", "README.md", "data/train-00000-of-00001.parquet"]
    assert files["data/train-00000-of-00001.parquet"] == (v2 / "data/train-00000-of-00001.parquet").read_bytes()
    assert [c.title for c in hub.commits(REPO)] == ["initial commit", "v1", "v2"]
    assert hub.count("tree") >= 1  # delete_patterns lists the remote files first
    v1_files = hub.files(REPO, revision=hub.commits(REPO)[1].oid)  # history is kept
    assert "data/train-00001-of-00002.parquet" in v1_files

    local = Path(snapshot_download(REPO, repo_type="dataset", local_dir=tmp_path / "snap"))
    assert sorted(p.name for p in (local / "data").iterdir()) == ["train-00000-of-00001.parquet"]
    assert pq.read_table(local / "data" / "train-00000-of-00001.parquet").num_rows == 4


def test_unchanged_upload_makes_no_commit(hub, tmp_path):
    """The preupload oids let the client drop unchanged files, so a re-upload commits nothing."""
    api = HfApi()
    api.create_repo(REPO, repo_type="dataset")
    folder = write_dataset(tmp_path / "out", [rows(0, 3)])
    first = api.upload_folder(folder_path=folder, repo_id=REPO, repo_type="dataset")
    again = api.upload_folder(folder_path=folder, repo_id=REPO, repo_type="dataset")
    assert again.oid == first.oid and hub.count("commit") == 1 and len(hub.commits(REPO)) == 2


def test_bad_or_missing_token_is_a_401_at_once(hub, monkeypatch, tmp_path):
    hub.create_repo(REPO)
    folder = write_dataset(tmp_path / "out", [rows(0, 2)])
    calls = (lambda api: api.create_repo(REPO, repo_type="dataset", exist_ok=True),
             lambda api: api.upload_folder(folder_path=folder, repo_id=REPO, repo_type="dataset"),
             lambda api: api.list_repo_files(REPO, repo_type="dataset"))
    t0 = time.monotonic()
    for token in ("hf_wrong", False):
        for call in calls:
            with pytest.raises(HfHubHTTPError) as e:
                call(HfApi(token=token))
            assert e.value.response.status_code == 401
            assert e.value.response.json() == {"error": "Invalid credentials in Authorization header"}
    assert time.monotonic() - t0 < 3
    assert len(hub.commits(REPO)) == 1 and hub.count("commit") == 0

    hub_env(monkeypatch, hub, tmp_path / "no-token-home", token="")  # no HF_TOKEN, no implicit token
    with pytest.raises(HfHubHTTPError) as e:
        HfApi().list_repo_files(REPO, repo_type="dataset")
    assert e.value.response.status_code == 401
    assert "authorization" not in e.value.response.request.headers


def test_injected_412_on_commit_surfaces_and_nothing_lands(hub, tmp_path):
    api = HfApi()
    api.create_repo(REPO, repo_type="dataset")
    folder = write_dataset(tmp_path / "out", [rows(0, 2)])
    hub.fail_next("commit", status=412)
    with pytest.raises(HfHubHTTPError) as e:
        api.upload_folder(folder_path=folder, repo_id=REPO, repo_type="dataset")
    assert e.value.response.status_code == 412
    assert len(hub.commits(REPO)) == 1 and hub.count("commit", status=412) == 1

    api.upload_folder(folder_path=folder, repo_id=REPO, repo_type="dataset")  # the fault is used up
    assert hub.count("commit", status=200) == 1 and len(hub.commits(REPO)) == 2
    assert hub.count("lfs_upload") == 1  # the retry found the LFS object already stored


@pytest.mark.parametrize("status", [429, 500, 503, 401, 403, 404])
def test_injected_commit_faults_carry_their_status(hub, tmp_path, status):
    """A plain create_commit does not retry its commit POST: each fault shows once, then the next one lands."""
    api = HfApi()
    api.create_repo(REPO, repo_type="dataset")
    hub.fail_next("commit", status=status, times=2, retry_after=7 if status in (429, 503) else None)
    for _ in range(2):
        with pytest.raises(HfHubHTTPError) as e:
            api.upload_file(path_or_fileobj=b"hello\n", path_in_repo="notes.txt", repo_id=REPO, repo_type="dataset")
        assert e.value.response.status_code == status
        assert ("Retry-After" in e.value.response.headers) == (status in (429, 503))
    if status == 404:
        assert isinstance(e.value, RepositoryNotFoundError)
    api.upload_file(path_or_fileobj=b"hello\n", path_in_repo="notes.txt", repo_id=REPO, repo_type="dataset")
    assert hub.files(REPO)["notes.txt"] == b"hello\n" and hub.count("commit") == 3


def test_faults_on_other_kinds_and_a_commit_that_lands_but_answers_500(hub):
    hub.create_repo(REPO)
    raw = httpx.Client(base_url=hub.endpoint, headers={"Authorization": f"Bearer {TOKEN}"})
    hub.fail_next("repo_info", status=429, retry_after=3)
    r = raw.get(f"/api/datasets/{REPO}")
    assert r.status_code == 429 and r.headers["Retry-After"] == "3" and "error" in r.json()
    assert raw.get(f"/api/datasets/{REPO}").json()["id"] == REPO
    with pytest.raises(ValueError):
        hub.fail_next("comit")

    hub.fail_next("commit", status=500, apply=True)
    with pytest.raises(HfHubHTTPError) as e:
        HfApi().upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=REPO, repo_type="dataset")
    assert e.value.response.status_code == 500
    assert hub.files(REPO)["x.txt"] == b"x"  # ...yet it landed


def test_parent_commit_mismatch_is_a_412(hub):
    api = HfApi()
    api.create_repo(REPO, repo_type="dataset")
    old = hub.commits(REPO)[-1].oid
    api.upload_file(path_or_fileobj=b"1", path_in_repo="a.txt", repo_id=REPO, repo_type="dataset")
    with pytest.raises(HfHubHTTPError) as e:
        api.upload_file(path_or_fileobj=b"2", path_in_repo="b.txt", repo_id=REPO, repo_type="dataset",
                        parent_commit=old)
    assert e.value.response.status_code == 412 and "b.txt" not in hub.files(REPO)


def test_an_explicit_endpoint_wins_over_hf_endpoint(monkeypatch, tmp_path):
    """HF_ENDPOINT points at a closed port; ``HfApi(endpoint=...)`` and ``endpoint=`` still reach FakeHub."""
    with FakeHub(tokens={TOKEN}) as hub:
        hub_env(monkeypatch, hub, tmp_path / "hf-home", endpoint="http://127.0.0.1:9")
        api = HfApi(endpoint=hub.endpoint, token=TOKEN)
        assert api.create_repo(REPO, repo_type="dataset").startswith(hub.endpoint)
        folder = write_dataset(tmp_path / "out", [rows(0, 2)])
        api.upload_folder(folder_path=folder, repo_id=REPO, repo_type="dataset")
        path = hf_hub_download(REPO, "data/train-00000-of-00001.parquet", repo_type="dataset",
                               endpoint=hub.endpoint)
        assert Path(path).read_bytes() == (folder / "data/train-00000-of-00001.parquet").read_bytes()
        assert hub.count("unknown") == 0


def test_a_subprocess_reaches_fakehub_under_hf_hub_offline(hub, monkeypatch, tmp_path):
    """The env hub_env returns makes a fresh interpreter (as ``stepkit publish`` would be) online and pointed
    at FakeHub, although the parent environment says HF_HUB_OFFLINE=1."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    env = hub_env(monkeypatch, hub, tmp_path / "child-home")
    folder = write_dataset(tmp_path / "out", [rows(0, 3), rows(3, 3)])
    script = textwrap.dedent(f"""
        from huggingface_hub import HfApi, snapshot_download, constants
        assert not constants.HF_HUB_OFFLINE
        api = HfApi()
        api.create_repo({REPO!r}, repo_type="dataset", private=True, exist_ok=True)
        api.upload_folder(folder_path={str(folder)!r}, repo_id={REPO!r}, repo_type="dataset",
                          commit_message="from a subprocess", delete_patterns=["data/*"])
        print(sorted(api.list_repo_files({REPO!r}, repo_type="dataset")))
        print(snapshot_download({REPO!r}, repo_type="dataset", local_dir={str(tmp_path / "snap")!r}))
    """)
    p = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert hub.repo(REPO).private and hub.commits(REPO)[-1].title == "from a subprocess"
    assert "data/train-00001-of-00002.parquet" in p.stdout
    snap = tmp_path / "snap" / "data"
    assert sorted(x.name for x in snap.iterdir()) == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    assert list((tmp_path / "child-home").iterdir())  # the child's cache and state went to the isolated home
