"""``stepkit publish``: an export folder -> a dataset repository on the Hugging Face Hub (or a dry run).

Steps, in order; nothing is uploaded before every check has passed, and a failed publish leaves the
local folder as it was:

1. read the export manifest (``stepkit.manifest.json``) and the data files of each split;
2. build the card and figures in a staging folder beside FOLDER (its data files are hard links, or
   copies): ``README.md`` from ``data_cards/prm-dataset.md`` (:mod:`stepkit.stages.dataset_card`) with the
   features rendered from the files' Arrow schema, ``images/*.png``, and ``report.html`` (``stepkit report``
   over FOLDER, :mod:`stepkit.stages.report`; linked from the card; not with ``--no-report`` nor for pairs);
3. check that ``datasets.load_dataset(<staging folder>)`` — the card's ``configs`` decide the splits —
   loads every split with its row count and the features the card declares;
4. ``--dry-run``: put the card and figures into FOLDER and print what would be uploaded. Otherwise
   upload with ``huggingface_hub``: ``create_repo(exist_ok=True)``, then read the repository's head, its
   files and card, merge the card with the subsets (``--config``) it holds
   (:mod:`stepkit.stages.card_merge`), and make one ``create_commit`` naming that head as its parent
   commit: the subset's files added, its stale files (under ``data/`` and ``images/``, or ``data/NAME/``
   and ``images/NAME/``) deleted, other subsets untouched. HTTP 412 (another commit landed first) plans
   the commit again on the new head, with one line, up to ``--max-retries`` times; 408, 429, 500, 502, 503, 504 and
   connection errors are retried with exponential backoff; 401/403/404 fail at once (case
   ``hub-parallel-commits-412``). The token comes from ``HF_TOKEN`` (else the user's saved login), the
   endpoint from ``--endpoint`` or ``HF_ENDPOINT``. After the commit the card, figures and report are put
   into FOLDER. The report (``report.html``, ``report-NAME.html`` for a subset; :mod:`stepkit.stages.report`)
   is the subset's own file like its data: with ``--no-report`` an older one is removed from FOLDER and the
   repository.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from stepkit.errors import ConfigError, StepkitError
from stepkit.options import Config, opt
from stepkit.shards import Writing, file_sha256, remove_stale, write_error_in, write_json
from stepkit.stages import card_merge, dataset_card
from stepkit.stages.export import MANIFEST, read_export_manifest

RETRY_STATUS = {408, 412, 429, 500, 502, 503, 504}
MAX_WAIT = 300.0  # seconds: the longest wait before a retry, whatever a Retry-After header asks


@dataclass(frozen=True)
class PublishConfig(Config):
    """``stepkit publish`` options."""

    repo_id: str | None = opt(None, "ORG/NAME of the dataset repository (required unless --dry-run).")
    dry_run: bool = opt(False, "Write the card, check the folder loads, print what would be uploaded; upload nothing.")
    private: bool = opt(False, "The data must not be public: create the repository as private; an existing "
                               "repository that is public is refused (nothing uploaded).")
    endpoint: str | None = opt(None, "Hub endpoint URL (default: HF_ENDPOINT, else the public Hub).")
    license: str | None = opt(None, "The card's license id, one the Hub lists (mit, apache-2.0, cc-by-4.0, ...; "
                                    "default: from the source data when known, else unknown).")
    config: str = opt("default", "The subset (config) this folder is: its files go to data/NAME/, its own configs: "
                                 "entry and card section, merged with the subsets already on the repository.",
                      metavar="NAME")
    pretty_name: str | None = opt(None, "The card's title [default: the repository's name].")
    commit_message: str | None = opt(None, "The commit message (default: 'stepkit publish: N rows, format F').")
    max_retries: int = opt(5, "Retries of a commit on 412 / 408 / 429 / 500 / 502 / 503 / 504 / connection errors.", min=0, max=50)
    report: bool = opt(True, "Add report.html (stepkit report over the folder: one self-contained page to browse the "
                             "labels), linked from the card.", flag="--report/--no-report")
    retry_wait: float = opt(2.0, "Seconds before the first retry (doubled each time; a Retry-After header wins).",
                            min=0, max=600)

    def __post_init__(self):
        super().__post_init__()
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", self.config):
            raise ConfigError(f"--config {self.config!r}: a subset name is letters, digits, '_', '.' and '-' "
                              "(e.g. gsm8k)")
        from stepkit.stages.card_sources import check_license

        check_license(self.license)  # (breaking run D9: any text, even '', went into the card)
        if self.repo_id is None and not self.dry_run:
            raise ConfigError("give --repo-id ORG/NAME, or --dry-run to check the folder without uploading")
        if self.repo_id is not None:
            if self.repo_id.count("/") != 1 or not all(self.repo_id.split("/")):
                raise ConfigError(f"--repo-id {self.repo_id!r}: write ORG/NAME")
            from huggingface_hub.utils import HFValidationError, validate_repo_id

            try:
                validate_repo_id(self.repo_id)
            except HFValidationError as e:
                raise ConfigError(f"--repo-id {self.repo_id!r}: not a Hub repository id ({str(e).splitlines()[0][:160]})"
                                  ) from None


def _splits(folder: Path, manifest: dict) -> dict[str, list[str]]:
    """The data files of each split, checked against the export manifest: the same files, rows and bytes.

    Raises:
        ConfigError: a damaged manifest, or data files the export did not write (added, missing, replaced).
    """
    try:
        splits = {s: [str(f) for f in info["files"]] for s, info in manifest["splits"].items()}
        rows = {s: int(info["rows"]) for s, info in manifest["splits"].items()}
        hashes = {f: h for info in manifest["splits"].values() for f, h in (info.get("sha256") or {}).items()}
        manifest["config"]["format"]
    except (KeyError, TypeError, AttributeError, ValueError):
        raise ConfigError(f"{folder / MANIFEST}: damaged (no splits, files, rows or format); re-export the folder"
                          ) from None
    listed = {f for fs in splits.values() for f in fs}
    on_disk = {f"data/{p.name}" for p in (folder / "data").glob("*") if not p.name.startswith(".")}
    if on_disk != listed:
        extra, missing = sorted(on_disk - listed), sorted(listed - on_disk)
        what = "; ".join(x for x in (f"holds files the export did not write: {', '.join(extra)}" if extra else "",
                                      f"lacks files the export wrote: {', '.join(missing)}" if missing else "") if x)
        raise ConfigError(f"{folder}/data: {what}; re-export the folder (one dataset is one export)")
    for s, fs in splits.items():
        for f in fs:
            if f in hashes and file_sha256(folder / f) != hashes[f]:
                raise ConfigError(f"{folder / f}: not the file the export wrote (its bytes changed); re-export")
        try:
            n = sum(pq.ParquetFile(folder / f).metadata.num_rows for f in fs)
        except (pa.ArrowException, OSError) as e:
            raise ConfigError(f"{folder}: a {s} data file is not readable Parquet ({str(e).splitlines()[0][:120]})"
                              ) from None
        if n != rows[s]:
            raise ConfigError(f"{folder}: split {s} holds {n} rows, the export wrote {rows[s]}; re-export")
    return splits


def data_prefix(config: str) -> str:
    """Where a subset's files go in the repository: ``data/`` (``default``) or ``data/<config>/``."""
    return "data/" if config == "default" else f"data/{config}/"


def owned(path: str, config: str) -> bool:
    """Whether a repository file is the subset's own (its data files, figures, lineage and report page), replaced
    on publish."""
    if config == "default":
        return bool(re.fullmatch(r"(data|images)/[^/]+|lineage\.json|report\.html", path))
    return path.startswith((f"data/{config}/", f"images/{config}/")) or path in (f"lineage-{config}.json",
                                                                                f"report-{config}.html")


def _stage(folder: Path, staging: Path, splits: dict[str, list[str]], config: str) -> dict[str, list[str]]:
    """Fill the staging folder beside FOLDER with the data files where the repository keeps them; returns the
    splits' files by their repository paths."""
    shutil.rmtree(staging, ignore_errors=True)
    (staging / data_prefix(config)).mkdir(parents=True)
    staged = {s: [data_prefix(config) + Path(f).name for f in fs] for s, fs in splits.items()}
    for f, g in zip((f for fs in splits.values() for f in fs), (g for gs in staged.values() for g in gs)):
        try:
            os.link(folder / f, staging / g)
        except OSError:
            shutil.copy2(folder / f, staging / g)
    return staged


def check_loads(folder: Path, splits: dict[str, list[str]], config: str = "default") -> dict[str, int]:
    """``datasets.load_dataset(folder)`` as a Hub user would: every split, its rows and the card's features.

    Raises:
        StepkitError: a split is missing, has other rows than its files, or other features than declared.
    """
    import datasets
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    cache = folder / ".cache"
    try:
        ds = datasets.load_dataset(str(folder), None if config == "default" else config, cache_dir=str(cache))
    except Exception as e:  # noqa: BLE001 - datasets raises many kinds; each is one line here
        if write_error_in(e) is not None:  # a full disk under its cache is not bad data: the caller words it
            raise
        raise StepkitError(f"{folder}: datasets cannot load the folder ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    from huggingface_hub import DatasetCard

    info = DatasetCard.load(folder / "README.md").data.to_dict().get("dataset_info") or {}
    if isinstance(info, list):
        info = next((i for i in info if i.get("config_name") == config), {})
    yaml_features = info.get("features")
    declared = datasets.Features._from_yaml_list(yaml_features) if yaml_features else None
    rows = {}
    for s, files in splits.items():
        want = sum(pq.ParquetFile(folder / f).metadata.num_rows for f in files)
        if s not in ds:
            raise StepkitError(f"{folder}: split {s!r} does not load (loaded: {', '.join(ds)})")
        if ds[s].num_rows != want:
            raise StepkitError(f"{folder}: split {s!r} loads {ds[s].num_rows} rows, its files hold {want}")
        if declared is not None and ds[s].features != declared:
            raise StepkitError(f"{folder}: split {s!r} loads with features {ds[s].features}, the card declares {declared}")
        rows[s] = want
    return rows


def _upload_files(staging: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(staging)), p.stat().st_size) for p in staging.rglob("*")
                  if p.is_file() and not p.relative_to(staging).parts[0].startswith("."))


def _status(e: Exception) -> int | None:
    resp = getattr(e, "response", None)
    return getattr(resp, "status_code", None)


def _retry_after(e: Exception) -> float | None:
    resp = getattr(e, "response", None)
    try:
        return float(resp.headers.get("Retry-After")) if resp is not None and resp.headers.get("Retry-After") else None
    except (TypeError, ValueError):
        return None


def _is_transport_error(e: Exception) -> bool:
    """A connection or timeout error of the HTTP stack under huggingface_hub (its library varies by version)."""
    root = type(e).__module__.split(".")[0]
    return isinstance(e, (ConnectionError, TimeoutError)) or root in ("httpx", "httpx2", "httpcore", "httpcore2",
                                                                      "requests", "urllib3")


def with_retries(call, what: str, cfg: PublishConfig, endpoint: str, sleep=None, passthrough=frozenset()):
    """Run ``call()``; retry on the HTTP statuses of ``RETRY_STATUS`` (408, 412, 429, 500, 502, 503, 504) and
    connection errors with exponential backoff; an HTTP error whose status is in ``passthrough`` is raised as it
    is (the caller handles it: the commit path passes 412 through and plans the commit again on the new head).

    Raises:
        StepkitError: one line naming ``what``, the endpoint and the status; at once for other HTTP
            errors (401 bad token, 403, 404), after ``cfg.max_retries`` retries for the others.
    """
    from huggingface_hub.errors import HfHubHTTPError

    wait = cfg.retry_wait
    for attempt in range(cfg.max_retries + 1):
        try:
            return call()
        except HfHubHTTPError as e:
            status = _status(e)
            if status in passthrough:
                raise
            msg = (getattr(e, "server_message", None) or str(e)).splitlines()[0][:200]
            if status in (401, 403):
                raise StepkitError(f"{endpoint}: {what} refused (HTTP {status}): the token in HF_TOKEN is missing, "
                                   f"wrong or lacks write access ({msg})") from None
            if status not in RETRY_STATUS:
                raise StepkitError(f"{endpoint}: {what} failed (HTTP {status}): {msg}") from None
            last = f"HTTP {status}: {msg}"
            delay = min(_retry_after(e) or wait, MAX_WAIT)
        except Exception as e:  # noqa: BLE001 - the HTTP library's transport errors, whichever it is
            if not _is_transport_error(e):
                raise StepkitError(f"{endpoint}: {what} failed ({type(e).__name__}: "
                                   f"{(str(e).splitlines() or [''])[0][:200]})") from None
            last, delay = f"cannot reach the Hub ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})", wait
        if attempt == cfg.max_retries:
            raise StepkitError(f"{endpoint}: {what} failed after {cfg.max_retries + 1} attempts: {last}")
        (sleep or time.sleep)(delay)
        wait *= 2


def publish(folder: str | os.PathLike, cfg: PublishConfig, log=print) -> dict[str, Any]:
    """Publish the export folder ``folder`` (see the module docstring); returns a report dict with
    ``files`` (path, bytes), ``splits`` (rows), ``card`` (its text) and, unless a dry run, ``commit``.

    Raises:
        ConfigError: not an export folder; data files that are not the export's.
        StepkitError: the folder does not load with ``datasets``; an upload error (one line).
    """
    given, folder = str(folder), Path(folder).absolute()
    remove_stale(folder, "publish")
    manifest = read_export_manifest(folder)
    if manifest is None:
        raise ConfigError(f"{folder}: not a stepkit export folder (no readable {MANIFEST}); run stepkit export first")
    splits = _splits(folder, manifest)
    from stepkit.runner.parts import OutputLock

    with OutputLock(folder):  # (an export writing FOLDER, or another publish of it: refused)
        return _publish(folder, given, manifest, splits, cfg, log)


def _publish(folder: Path, given: str, manifest: dict, splits: dict[str, list[str]], cfg: PublishConfig,
             log) -> dict[str, Any]:
    staging = folder.with_name(f".{folder.name}.publish-{os.getpid()}")
    lineage_file = "lineage.json" if cfg.config == "default" else f"lineage-{cfg.config}.json"
    pretty = cfg.pretty_name or (cfg.repo_id or folder.name).split("/")[-1]
    guard = Writing("publish", folder, staging, folder)  # a full disk or a read-only folder: one line
    try:
        with guard:
            guard.target = staging / "data"
            staged = _stage(folder, staging, splits, cfg.config)
            guard.target = None
            for f, g in zip((f for fs in splits.values() for f in fs), (g for gs in staged.values() for g in gs)):
                try:  # a damaged data file is one line, before anything
                    pq.read_table(staging / g)
                except (pa.ArrowException, OSError) as e:
                    raise StepkitError(f"{folder / f}: not a readable Parquet file ({str(e).splitlines()[0][:160]}); "
                                       "re-export the folder") from None
            stats = dataset_card.label_stats(staging, staged, manifest["config"]["format"])
            guard.target = staging / "images"
            images = dataset_card.draw_figures(stats, staging, pretty, cfg.config)
            made = _report(folder, staging, manifest, cfg, pretty, guard)
            card = dataset_card.render_card(staging, manifest, staged, cfg.repo_id or given, cfg.license, images,
                                            stats, cfg.config, pretty, lineage_file, report=made)
            guard.target = staging / "README.md"
            (staging / "README.md").write_text(card)
            guard.target = staging / lineage_file
            write_json(staging / lineage_file, dataset_card.public_lineage(manifest))
            guard.target = staging / ".cache"  # (datasets' cache, loading the folder as a Hub user would)
            try:
                rows = check_loads(staging, staged, cfg.config)
            except StepkitError as e:  # name the user's folder, not the staging copy
                raise StepkitError(str(e).replace(str(staging), str(folder))) from None
            guard.target = staging / "README.md"
            card = card_merge.merge(None, card, cfg.config, pretty)
            (staging / "README.md").write_text(card)
            guard.target = None
            files = _upload_files(staging)
            report: dict[str, Any] = {"files": files, "splits": rows, "card": card, "images": images, "report": made}
        if not cfg.dry_run:
            report["commit"], report["card"] = _upload(staging, cfg, manifest, sum(rows.values()), card, pretty, log)
        try:
            with Writing("publish", folder) as install:
                _install(staging, folder, images, lineage_file, made, cfg.config, install)
        except StepkitError as e:
            if cfg.dry_run:
                raise
            raise StepkitError(f"{e} (commit {report['commit']} was published; {folder} keeps its earlier card)"
                               ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


def report_file(config: str) -> str:
    """The subset's report page in the repository and FOLDER: ``report.html``, or ``report-NAME.html``."""
    return "report.html" if config == "default" else f"report-{config}.html"


def _report(folder: Path, staging: Path, manifest: dict, cfg: PublishConfig, title: str,
            guard: Writing | None = None) -> str | None:
    """Write the subset's report page (:mod:`stepkit.stages.report`, the default sample) over the export
    ``folder`` into ``staging``; its file name, or None with ``--no-report`` and for preference pairs (no
    steps to show)."""
    if not cfg.report or manifest["config"]["format"] == "pairs":
        return None
    from stepkit.stages.report import ReportConfig, write_report

    name = report_file(cfg.config)
    write_report([str(folder)], ReportConfig(out=str(staging / name), title=title), guard=guard)
    return name


def _install(staging: Path, folder: Path, images: list[str], lineage_file: str, report: str | None = None,
             config: str = "default", guard: Writing | None = None) -> None:
    """Put the card, figures and report into FOLDER, removing figures of an older publish (and its report
    when none was made). Every file is copied beside its place first (``.NAME.tmp-<pid>``, the step that needs
    space), then each is renamed into place: a full disk leaves FOLDER's earlier card, figures and report as
    they were.

    Raises:
        OSError: a file cannot be copied (the copies made are removed)."""
    rels = ["README.md", lineage_file, *images, *([report] if report else [])]
    tmps = []
    try:
        for rel in rels:
            dst = folder / rel
            if guard is not None:
                guard.target = dst
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmps.append(dst.with_name(f".{dst.name}.tmp-{os.getpid()}"))
            shutil.copy2(staging / rel, tmps[-1])
    except BaseException:
        for t in tmps:
            t.unlink(missing_ok=True)
        raise
    for rel, tmp in zip(rels, tmps):
        os.replace(tmp, folder / rel)
    for d in {Path(i).parent for i in images} | {Path("images")}:
        for old in (folder / d).glob("*.png") if (folder / d).is_dir() else ():
            if str(d / old.name) not in images:
                old.unlink()
    if report is None:
        (folder / report_file(config)).unlink(missing_ok=True)


def _upload(staging: Path, cfg: PublishConfig, manifest: dict, n_rows: int, card: str, pretty: str,
            log) -> tuple[str, str]:
    """One commit of the staged subset on the repository's head, naming that head as its parent: the card
    merged with the subsets the head holds, the subset's old files not in this export deleted. A commit that
    finds another one landed first (HTTP 412) is planned again on the new head (one line) up to
    ``--max-retries`` times. Returns (commit id, the card uploaded)."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, constants, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # stepkit prints its own summary of what was uploaded
    from huggingface_hub.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # its own retry notices; stepkit reports the outcome in one line

    endpoint = cfg.endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    if constants.HF_HUB_OFFLINE:
        raise StepkitError("HF_HUB_OFFLINE is set: huggingface_hub makes no network calls; unset it to publish "
                           "(or use --dry-run)")
    api = HfApi(endpoint=endpoint, token=os.environ.get("HF_TOKEN") or None)
    repo = cfg.repo_id
    with_retries(lambda: api.create_repo(repo, repo_type="dataset", private=cfg.private, exist_ok=True),
                 f"creating {repo}", cfg, endpoint)
    if cfg.private:  # create_repo leaves an existing repository as it is (breaking run E7: published publicly)
        visible = with_retries(lambda: api.repo_info(repo, repo_type="dataset").private, f"reading {repo}", cfg,
                               endpoint)
        if visible is not True:
            state = "is public" if visible is False else "does not say whether it is private"
            raise StepkitError(f"--private: {repo} exists and {state} on {endpoint}, so this upload would be public; "
                               f"nothing uploaded: make it private first (its settings page, or huggingface_hub's "
                               f"HfApi().update_repo_settings({repo!r}, private=True, repo_type='dataset')) or drop "
                               "--private")
    subset = "" if cfg.config == "default" else f", subset {cfg.config}"
    message = cfg.commit_message or f"stepkit publish: {n_rows} rows, format {manifest['config']['format']}{subset}"
    upload = [rel for rel, _ in _upload_files(staging)]
    wait = cfg.retry_wait
    for attempt in range(cfg.max_retries + 1):
        head = with_retries(lambda: api.repo_info(repo, repo_type="dataset").sha, f"reading {repo}", cfg, endpoint)
        on_hub = with_retries(lambda h=head: api.list_repo_files(repo, repo_type="dataset", revision=h),
                              f"listing {repo}", cfg, endpoint)
        old = None
        if "README.md" in on_hub:
            old = Path(with_retries(lambda h=head: hf_hub_download(repo, "README.md", repo_type="dataset", revision=h,
                                                            endpoint=endpoint, token=api.token,
                                                            cache_dir=str(staging / ".hub-cache")),
                                    f"reading {repo}'s README.md", cfg, endpoint)).read_text()
        merged = card_merge.merge(old, card, cfg.config, pretty)
        (staging / "README.md").write_text(merged)
        ops = [CommitOperationAdd(path_in_repo=rel, path_or_fileobj=str(staging / rel)) for rel in upload]
        ops += [CommitOperationDelete(path_in_repo=p) for p in on_hub if owned(p, cfg.config) and p not in upload]
        try:
            info = with_retries(lambda h=head, o=ops: api.create_commit(repo, o, commit_message=message,
                                                                        repo_type="dataset", parent_commit=h),
                                f"the commit to {repo}", cfg, endpoint, passthrough={412})
            return getattr(info, "oid", None) or str(info), merged
        except HfHubHTTPError as e:  # 412: another commit landed after `head`
            if attempt == cfg.max_retries:
                raise StepkitError(f"{endpoint}: the commit to {repo} failed after {cfg.max_retries + 1} attempts: "
                                   f"HTTP {_status(e)}: the repository kept moving on (another publish?)") from None
            log(f"note: {repo} moved on from {head[:12]} while publishing (HTTP 412): merging the card with the "
                f"new head and committing again ({attempt + 1}/{cfg.max_retries})")
            time.sleep(min(_retry_after(e) or wait, MAX_WAIT))
            wait *= 2
    raise AssertionError("unreachable")
