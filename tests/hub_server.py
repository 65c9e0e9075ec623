"""FakeHub: a local Hub-compatible HTTP server, so publishing is tested with the real ``huggingface_hub`` client.

Usage (standard library only; ``ThreadingHTTPServer`` in a daemon thread on 127.0.0.1, a free port)::

    with FakeHub(tokens={"hf_test"}) as hub:
        env = hub_env(monkeypatch, hub, tmp_path / "hf")   # this process online + an env dict for subprocesses
        HfApi().create_repo("org/ds", repo_type="dataset")
        HfApi().upload_folder(folder_path=folder, repo_id="org/ds", repo_type="dataset")
        hub.files("org/ds")        # {".gitattributes": b"...", "README.md": b"...", "data/...parquet": b"PAR1..."}
        hub.commits("org/ds")      # [initial commit, upload commit], oldest first
        hub.fail_next("commit", status=412, times=2)    # the next two commit requests answer 412
        hub.count("commit", status=200)                 # commits that landed, from the request log

What ``huggingface_hub`` 2.x sends (read from its source) and what this server answers, by request *kind*
(the names ``fail_next``, ``count`` and ``hub.requests`` use):

=================  =========================================================  ==================================
kind               request                                                    client call
=================  =========================================================  ==================================
whoami             GET  /api/whoami-v2                                        ``whoami``
agent_harnesses    GET  /api/agent-harnesses (no token)                       user-agent, if telemetry is on
create_repo        POST /api/repos/create (409 + ``url`` when it exists)      ``create_repo(exist_ok=...)``
delete_repo        DELETE /api/repos/delete                                   ``delete_repo``
validate_yaml      POST /api/validate-yaml                                    ``create_commit`` with a README.md
repo_info          GET  /api/{models,datasets}/R[/revision/REV]               ``repo_info``, ``snapshot_download``
tree               GET  /api/{type}s/R/tree/REV[/PATH]?recursive=             ``list_repo_tree``/``list_repo_files``
paths_info         POST /api/{type}s/R/paths-info/REV (form: paths=...)       ``get_paths_info``
preupload          POST /api/{type}s/R/preupload/REV                          upload mode ("regular"/"lfs") + oid
lfs_batch          POST /[datasets/]R.git/info/lfs/objects/batch              LFS upload actions (basic transfer)
lfs_upload         PUT  /_fakehub/lfs/TICKET (the href lfs_batch returned)    the LFS object body (no token)
lfs_verify         POST /[datasets/]R.git/info/lfs/objects/verify             after each LFS upload
commit             POST /api/{type}s/R/commit/main (NDJSON)                   ``create_commit``/``upload_folder``
resolve            HEAD/GET /[datasets/]R/resolve/REV/PATH                    ``hf_hub_download``, ``snapshot_download``
xet_token          GET  /api/{type}s/R/xet-{read,write}-token/REV -> 501      Xet is not served (see below)
unknown            anything else -> 404                                       (a test can assert none happened)
=================  =========================================================  ==================================

Retries inside the client (``http_backoff``: 429 with ``Retry-After``, 5xx; sleeps of 1 s and more): preupload,
lfs_batch, lfs_upload, lfs_verify and tree. Not retried: commit (on the ``create_commit`` path), create_repo,
validate_yaml, repo_info, resolve. So a fault injected on ``commit`` reaches the caller at once; one on
``preupload`` is first retried by the client itself.

Every request but ``agent_harnesses`` and ``lfs_upload`` needs ``Authorization: Bearer <a valid token>``;
otherwise 401 ``{"error": "Invalid credentials in Authorization header"}``, as the Hub answers a bad token.
Errors carry the Hub's ``X-Error-Code`` header (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``)
so the client raises its specific ``HfHubHTTPError`` subclasses.

Like the Hub, a new repo starts with an "initial commit" holding a ``.gitattributes`` whose ``filter=lfs``
patterns (``*.parquet``, ...) decide, with size (10 MiB) and a NUL byte in the first 512 bytes, which files
the preupload call sends down the LFS path. Unlike the Hub, LFS files are served straight from ``/resolve``
(200, with ``X-Linked-Etag``/``X-Linked-Size``) rather than through a redirect to a CDN, and there are no
pull requests, branches other than ``main``, ``.gitignore`` handling, ``expand=`` details or pagination.

Xet: with ``hf_xet`` installed (it is), the client itself decides to upload LFS-mode files through Xet
storage (``is_xet_available()``: installed and ``HF_HUB_DISABLE_XET`` unset), whatever the server says;
``upload_folder`` then even takes another code path (``_upload_pipeline.pipelined_upload``: commits retried
on 429/5xx, large folders split over several commits). FakeHub does not speak the Xet protocol, so
:func:`hub_env` sets ``HF_HUB_DISABLE_XET=1``: ``upload_folder`` -> ``create_commit`` -> preupload, LFS
batch + PUT, one NDJSON commit, not retried. Downloads use Xet only when a response carries ``X-Xet-Hash``,
which FakeHub never sends.

Offline mode: the Makefile exports ``HF_HUB_OFFLINE=1``. ``huggingface_hub.constants`` reads it (and
``HF_ENDPOINT``, ``HF_HOME``, ...) once, at import, and every request goes through a hook that raises
``OfflineModeIsEnabled`` while ``constants.HF_HUB_OFFLINE`` is true. :func:`hub_env` therefore sets the
variables (for subprocesses and code that reads them later) *and* patches those constants, plus the endpoint
of the module-level ``HfApi`` behind ``huggingface_hub.create_repo`` & co.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import re
import secrets
import socket
import threading
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

HOST = "127.0.0.1"
LFS_THRESHOLD = 10 * 1024 * 1024
"""Files this large always take the LFS path (the Hub's limit for regular git files)."""

DEFAULT_GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in ("*.7z", "*.arrow", "*.bin", "*.gz", "*.npy", "*.parquet", "*.pt", "*.safetensors", "*.tar",
                    "*.zip", "*.zst")
)
"""The ``.gitattributes`` of a new repo's initial commit: a short version of the Hub's default."""

REPO_TYPES = {"models": "model", "datasets": "dataset", None: "model"}
URL_PREFIX = {"model": "", "dataset": "datasets/"}
KINDS = ("whoami", "agent_harnesses", "create_repo", "delete_repo", "validate_yaml", "repo_info", "tree",
         "paths_info", "preupload", "lfs_batch", "lfs_upload", "lfs_verify", "commit", "resolve", "xet_token",
         "unknown")
PUBLIC_KINDS = {"agent_harnesses", "lfs_upload"}
"""Kinds the client sends without a token (the LFS upload URL is authorized by its ticket, like a signed URL)."""

FAULT_MESSAGES = {
    401: "Invalid credentials in Authorization header",
    403: "You don't have the rights to perform this action",
    404: "Repository not found",
    412: "A commit has happened since. Please refresh and try again.",
    429: "Too many requests, please retry later",
}


# ---------------------------------------------------------------------------------------------- state


def git_blob_oid(data: bytes) -> str:
    """The git object id of a blob (what the Hub calls a regular file's ``oid``/ETag)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    """The git-lfs pointer file git stores for an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n".encode()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


@dataclass(frozen=True)
class Commit:
    """One commit of a repo: its 40-hex ``oid``, message, and the whole tree (path -> bytes) after it."""

    oid: str
    title: str
    description: str
    date: str
    files: dict[str, bytes]
    lfs_paths: frozenset[str]
    """Paths stored as LFS objects (the others are regular git blobs)."""

    def entry(self, path: str) -> dict[str, Any]:
        """The Hub's JSON for a file (tree listing, paths-info)."""
        data = self.files[path]
        if path in self.lfs_paths:
            pointer = lfs_pointer(data)
            lfs = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": len(pointer)}
            return {"type": "file", "path": path, "size": len(data), "oid": git_blob_oid(pointer), "lfs": lfs}
        return {"type": "file", "path": path, "size": len(data), "oid": git_blob_oid(data)}

    def folders(self) -> set[str]:
        return {"/".join(parts[:i]) for parts in (p.split("/") for p in self.files) for i in range(1, len(parts))}

    def folder_entry(self, path: str) -> dict[str, Any]:
        return {"type": "directory", "path": path, "size": 0,
                "oid": hashlib.sha1(f"tree {self.oid} {path}".encode()).hexdigest()}


@dataclass
class Repo:
    """An in-memory repo: a linear history on ``main`` and the LFS objects uploaded to it (sha256 -> bytes)."""

    repo_id: str
    repo_type: str
    private: bool
    created_at: str = field(default_factory=_now)
    commits: list[Commit] = field(default_factory=list)
    lfs_objects: dict[str, bytes] = field(default_factory=dict)

    @property
    def head(self) -> Commit:
        return self.commits[-1]

    @property
    def url_path(self) -> str:
        return URL_PREFIX[self.repo_type] + self.repo_id

    def add_commit(self, title: str, description: str, files: dict[str, bytes], lfs_paths: Iterable[str]) -> Commit:
        parent = self.commits[-1].oid if self.commits else ""
        seed = json.dumps([parent, title, len(self.commits), sorted((p, git_blob_oid(d)) for p, d in files.items())])
        commit = Commit(hashlib.sha1(seed.encode()).hexdigest(), title, description, _now(), dict(files),
                        frozenset(lfs_paths))
        self.commits.append(commit)
        return commit


@dataclass(frozen=True)
class LoggedRequest:
    """One entry of ``FakeHub.requests``: what came in and the status it got."""

    method: str
    path: str
    kind: str
    status: int


@dataclass
class _Fault:
    kind: str
    status: int
    times: int
    retry_after: int | None
    apply: bool


@dataclass
class _Reply:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


class HubError(Exception):
    """Raised inside a route to answer with a Hub-style error."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.reply = _json(status, {"error": message}, **(headers or {}))
        self.reply.headers["X-Error-Message"] = message
        if code:
            self.reply.headers["X-Error-Code"] = code


def _json(status: int, obj: Any, content_type: str = "application/json", **headers: str) -> _Reply:
    return _Reply(status, json.dumps(obj).encode(), {"Content-Type": content_type, **headers})


@dataclass
class _Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Any
    body: bytes
    params: dict[str, str]
    """Named groups of the route's regex, unquoted."""

    def flag(self, name: str) -> bool:
        return (self.query.get(name) or ["false"])[0].lower() in ("1", "true")

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"{}")
        except ValueError as e:
            raise HubError(400, f"Invalid JSON body: {e}") from None


# ---------------------------------------------------------------------------------------------- routes

_T = r"(?P<type>models|datasets)"
_P = r"(?:(?P<type>datasets)/)?"  # resolve and LFS URLs: datasets are prefixed, models are not
_R = r"(?P<repo>[^/]+/[^/]+)"
_REV = r"(?P<rev>[^/]+)"
ROUTES: list[tuple[tuple[str, ...], re.Pattern, str]] = [
    (("GET",), re.compile(r"/api/whoami-v2"), "whoami"),
    (("GET",), re.compile(r"/api/agent-harnesses"), "agent_harnesses"),
    (("POST",), re.compile(r"/api/repos/create"), "create_repo"),
    (("DELETE",), re.compile(r"/api/repos/delete"), "delete_repo"),
    (("POST",), re.compile(r"/api/validate-yaml"), "validate_yaml"),
    (("GET",), re.compile(rf"/api/{_T}/{_R}/xet-(?:read|write)-token(?:/{_REV})?"), "xet_token"),
    (("GET",), re.compile(rf"/api/{_T}/{_R}/tree/{_REV}(?:/(?P<path>.*))?"), "tree"),
    (("POST",), re.compile(rf"/api/{_T}/{_R}/paths-info/{_REV}"), "paths_info"),
    (("POST",), re.compile(rf"/api/{_T}/{_R}/preupload/{_REV}"), "preupload"),
    (("POST",), re.compile(rf"/api/{_T}/{_R}/commit/{_REV}"), "commit"),
    (("GET",), re.compile(rf"/api/{_T}/{_R}(?:/revision/{_REV})?"), "repo_info"),
    (("POST",), re.compile(rf"/{_P}{_R}\.git/info/lfs/objects/batch"), "lfs_batch"),
    (("POST",), re.compile(rf"/{_P}{_R}\.git/info/lfs/objects/verify"), "lfs_verify"),
    (("PUT",), re.compile(r"/_fakehub/lfs/(?P<ticket>[0-9a-f]+)"), "lfs_upload"),
    (("GET", "HEAD"), re.compile(rf"/{_P}{_R}/resolve/{_REV}/(?P<path>.+)"), "resolve"),
]


def _route(method: str, path: str) -> tuple[str, dict[str, str]]:
    """The kind of a request and the (unquoted) named groups of its route."""
    for methods, pattern, kind in ROUTES:
        m = pattern.fullmatch(path)
        if m and method in methods:
            return kind, {k: unquote(v) for k, v in m.groupdict().items() if v is not None}
    return "unknown", {}


class FakeHub:
    """In-memory Hub (model and dataset repos) behind a real HTTP server on 127.0.0.1.

    Args:
        tokens: the valid access tokens (any of them may read and write every repo).
        user: the namespace ``whoami`` reports and ``create_repo`` uses for a repo id without one.
        lfs_threshold: files at least this large take the LFS path whatever their name or content.
    """

    def __init__(self, tokens: Iterable[str] = ("hf_test",), *, user: str = "fakehub-user",
                 lfs_threshold: int = LFS_THRESHOLD):
        self.tokens = set(tokens)
        self.user = user
        self.lfs_threshold = lfs_threshold
        self.requests: list[LoggedRequest] = []
        self._repos: dict[tuple[str, str], Repo] = {}
        self._faults: list[_Fault] = []
        self._tickets: dict[str, tuple[Repo, str, int]] = {}
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()  # kept alive by the client's pool; closed by stop()

    # -- lifecycle

    def start(self) -> FakeHub:
        server = ThreadingHTTPServer((HOST, 0), _Handler)
        server.daemon_threads = True
        server.hub = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="fakehub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            with self._lock:
                for conn in self._connections:  # lets the handler threads blocked on a kept-alive socket end
                    try:
                        conn.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                self._connections.clear()
            self._thread.join(timeout=5)  # type: ignore[union-attr]
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``: what ``HF_ENDPOINT`` or ``HfApi(endpoint=...)`` takes."""
        if self._server is None:
            raise RuntimeError("FakeHub is not started")
        return f"http://{HOST}:{self._server.server_address[1]}"

    # -- test controls and inspection

    def create_repo(self, repo_id: str, repo_type: str = "dataset", *, private: bool = False,
                    files: dict[str, bytes] | None = None) -> Repo:
        """Seed a repo directly (as the Hub would: an initial commit with ``.gitattributes``, then ``files``)."""
        with self._lock:
            if (repo_type, repo_id) in self._repos:
                raise ValueError(f"{repo_type} repo {repo_id} exists")
            repo = self._repos[(repo_type, repo_id)] = Repo(repo_id, repo_type, private)
            repo.add_commit("initial commit", "", {".gitattributes": DEFAULT_GITATTRIBUTES.encode()}, ())
            if files:
                merged = {**repo.head.files, **files}
                repo.add_commit("Seed files", "", merged, (p for p, d in files.items() if self._is_lfs(repo, p, d)))
            return repo

    def repo(self, repo_id: str, repo_type: str = "dataset") -> Repo:
        with self._lock:
            return self._repos[(repo_type, repo_id)]

    def files(self, repo_id: str, repo_type: str = "dataset", revision: str = "main") -> dict[str, bytes]:
        """Path -> bytes of every file at ``revision`` (``main`` or a commit oid)."""
        with self._lock:
            return dict(self._revision(self.repo(repo_id, repo_type), revision).files)

    def commits(self, repo_id: str, repo_type: str = "dataset") -> list[Commit]:
        """The history of ``main``, oldest first (the first is the Hub's "initial commit")."""
        with self._lock:
            return list(self.repo(repo_id, repo_type).commits)

    def fail_next(self, kind: str, status: int = 500, *, times: int = 1, retry_after: int | None = None,
                  apply: bool = False) -> None:
        """Answer the next ``times`` requests of ``kind`` (see the module docstring) with ``status``.

        Faults are checked after the token, so a bad-token request does not use one up. ``retry_after`` adds a
        ``Retry-After: N`` header (429, 503). ``apply=True`` carries the request out first and then answers
        with the error: a commit that landed but whose answer was lost.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown request kind {kind!r}; one of {', '.join(KINDS)}")
        with self._lock:
            self._faults.append(_Fault(kind, status, times, retry_after, apply))

    def count(self, kind: str, *, status: int | None = None, method: str | None = None) -> int:
        """How many logged requests were of ``kind`` (and got ``status``, used ``method``)."""
        with self._lock:
            return sum(1 for r in self.requests if r.kind == kind and status in (None, r.status)
                       and method in (None, r.method))

    # -- request handling (called from the handler threads)

    def handle(self, method: str, raw_path: str, headers: Any, body: bytes) -> _Reply:
        """Route, check the token, apply an injected fault or the route's method, log, answer."""
        url = urlsplit(raw_path)
        kind, params = _route(method, url.path)
        req = _Request(method, url.path, parse_qs(url.query), headers, body, params)
        with self._lock:
            try:
                if kind == "unknown":
                    raise HubError(404, f"FakeHub has no route for {method} {url.path}")
                if kind not in PUBLIC_KINDS:
                    self._check_token(headers)
                fault = self._take_fault(kind)
                if fault is None or fault.apply:
                    reply = getattr(self, f"_{kind}")(req)
                if fault is not None:
                    reply = self._fault_reply(fault)
            except HubError as e:
                reply = e.reply
            except Exception as e:  # a FakeHub bug or a payload it does not understand: say so, do not hang up
                traceback.print_exc()
                reply = HubError(500, f"FakeHub failed on {method} {url.path}: {e!r}").reply
            self.requests.append(LoggedRequest(method, url.path, kind, reply.status))
            return reply

    def _check_token(self, headers: Any) -> None:
        scheme, _, token = (headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or token not in self.tokens:
            raise HubError(401, "Invalid credentials in Authorization header")

    def _take_fault(self, kind: str) -> _Fault | None:
        for fault in self._faults:
            if fault.kind == kind:
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    @staticmethod
    def _fault_reply(fault: _Fault) -> _Reply:
        message = FAULT_MESSAGES.get(fault.status, f"FakeHub injected HTTP {fault.status}")
        headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
        code = "RepoNotFound" if fault.status == 404 else None
        return HubError(fault.status, message, code, headers).reply

    # -- lookups shared by the routes

    def _repo_of(self, req: _Request) -> Repo:
        repo = self._repos.get((REPO_TYPES[req.params.get("type")], req.params["repo"]))
        if repo is None:
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    @staticmethod
    def _revision(repo: Repo, rev: str) -> Commit:
        if rev == "main":
            return repo.head
        for commit in repo.commits:
            if commit.oid == rev:
                return commit
        raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    def _is_lfs(self, repo: Repo, path: str, sample: bytes, size: int | None = None) -> bool:
        """The preupload decision: large, binary-looking, or matching a ``filter=lfs`` line of ``.gitattributes``."""
        if (len(sample) if size is None else size) >= self.lfs_threshold or b"\0" in sample[:512]:
            return True
        attributes = repo.head.files.get(".gitattributes", b"").decode(errors="replace")
        for line in attributes.splitlines():
            pattern, *attrs = line.split() or [""]
            if "filter=lfs" in attrs and fnmatch.fnmatchcase(path if "/" in pattern else path.rsplit("/", 1)[-1],
                                                             pattern.lstrip("/")):
                return True
        return False

    # -- routes: one method per kind, named after it

    def _whoami(self, req: _Request) -> _Reply:
        """``HfApi.whoami``."""
        return _json(200, {"type": "user", "id": "0" * 24, "name": self.user, "fullname": "FakeHub user",
                           "orgs": [], "auth": {"type": "access_token",
                                                "accessToken": {"displayName": "fakehub", "role": "write"}}})

    def _agent_harnesses(self, req: _Request) -> _Reply:
        """The registry the client fetches once a process to build its user-agent: empty."""
        return _json(200, {"standardEnvVars": [], "harnesses": {}})

    def _create_repo(self, req: _Request) -> _Reply:
        """``create_repo``: JSON ``{name, organization, type, visibility}``; 409 (with ``url``) if it exists."""
        payload = req.json()
        repo_type = payload.get("type") or "model"
        if repo_type not in URL_PREFIX:
            raise HubError(400, f"FakeHub serves model and dataset repos, not {repo_type!r}")
        repo_id = f"{payload.get('organization') or self.user}/{payload['name']}"
        url = f"{self.endpoint}/{URL_PREFIX[repo_type]}{repo_id}"
        if (repo_type, repo_id) in self._repos:
            return _json(409, {"error": f"You already created this {repo_type} repo", "url": url})
        private = payload.get("visibility") == "private" or payload.get("private") is True
        self.create_repo(repo_id, repo_type, private=private)
        return _json(200, {"url": url, "name": repo_id, "id": secrets.token_hex(12)})

    def _delete_repo(self, req: _Request) -> _Reply:
        """``delete_repo``: JSON ``{name, organization, type}``."""
        payload = req.json()
        key = (payload.get("type") or "model", f"{payload.get('organization') or self.user}/{payload['name']}")
        if self._repos.pop(key, None) is None:
            raise HubError(404, "Repository not found", "RepoNotFound")
        return _json(200, {})

    def _validate_yaml(self, req: _Request) -> _Reply:
        """``create_commit`` checks a README.md's metadata first: only an unclosed ``---`` block is refused."""
        content = req.json().get("content", "")
        if content.startswith("---") and "\n---" not in content[3:]:
            return _json(400, {"errors": [{"message": "The YAML metadata block is not closed by '---'"}]})
        return _json(200, {"errors": [], "warnings": []})

    def _repo_info(self, req: _Request) -> _Reply:
        """``repo_info``/``dataset_info``/``model_info`` (``?blobs=true``: sizes, oids, LFS info of siblings)."""
        repo = self._repo_of(req)
        commit = self._revision(repo, req.params.get("rev", "main"))
        siblings = []
        for path in sorted(commit.files):
            sibling: dict[str, Any] = {"rfilename": path}
            if req.flag("blobs"):
                entry = commit.entry(path)
                sibling.update(size=entry["size"], blobId=entry["oid"])
                if "lfs" in entry:
                    lfs = entry["lfs"]
                    sibling["lfs"] = {"size": lfs["size"], "sha256": lfs["oid"], "pointerSize": lfs["pointerSize"]}
            siblings.append(sibling)
        info = {"_id": hashlib.sha1(repo.url_path.encode()).hexdigest()[:24], "id": repo.repo_id,
                "author": repo.repo_id.split("/")[0], "sha": commit.oid, "lastModified": commit.date,
                "createdAt": repo.created_at, "private": repo.private, "gated": False, "disabled": False,
                "downloads": 0, "likes": 0, "tags": [], "siblings": siblings}
        if repo.repo_type == "model":
            info["modelId"] = repo.repo_id
        return _json(200, info)

    def _tree(self, req: _Request) -> _Reply:
        """``list_repo_tree(path, recursive=...)``, hence ``list_repo_files`` and ``upload_folder(delete_patterns=)``."""
        commit = self._revision(self._repo_of(req), req.params["rev"])
        base = req.params.get("path", "").strip("/")
        prefix = f"{base}/" if base else ""
        folders = commit.folders()
        if base and base not in folders:
            raise HubError(404, f"{base} does not exist on {req.params['rev']}", "EntryNotFound")
        recursive = req.flag("recursive")

        def wanted(path: str) -> bool:
            return path.startswith(prefix) and (recursive or "/" not in path[len(prefix):])

        entries = [commit.folder_entry(p) for p in sorted(folders) if wanted(p)]
        entries += [commit.entry(p) for p in sorted(commit.files) if wanted(p)]
        return _json(200, entries)

    def _paths_info(self, req: _Request) -> _Reply:
        """``get_paths_info``: form-encoded ``paths=...`` (repeated); paths that do not exist are left out."""
        commit = self._revision(self._repo_of(req), req.params["rev"])
        folders = commit.folders()
        out = []
        for path in parse_qs(req.body.decode()).get("paths", []):
            if path in commit.files:
                out.append(commit.entry(path))
            elif path.strip("/") in folders:
                out.append(commit.folder_entry(path.strip("/")))
        return _json(200, out)

    def _preupload(self, req: _Request) -> _Reply:
        """Part of every upload: ``{files: [{path, sample (base64 of the first 512 bytes), size}]}`` ->
        ``uploadMode`` per file, and the ``oid`` of the file already at that path (the client skips unchanged
        files: sha256 for an LFS file, the git blob id for a regular one)."""
        repo = self._repo_of(req)
        head = self._branch(repo, req)
        out = []
        for f in req.json().get("files", []):
            path = f["path"]
            lfs = self._is_lfs(repo, path, base64.b64decode(f.get("sample", "")), f.get("size", 0))
            oid = None
            if path in head.files:
                data = head.files[path]
                oid = hashlib.sha256(data).hexdigest() if path in head.lfs_paths else git_blob_oid(data)
            out.append({"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid})
        return _json(200, {"files": out, "commitOid": head.oid})

    def _lfs_batch(self, req: _Request) -> _Reply:
        """LFS batch API (``operation: upload``): per object an upload href on this server and a verify href,
        or no ``actions`` when the object is already stored."""
        repo = self._repo_of(req)
        payload = req.json()
        if payload.get("operation") != "upload":
            raise HubError(400, "FakeHub's LFS batch API only uploads (downloads go through /resolve)")
        objects = []
        for obj in payload.get("objects", []):
            oid, size = obj["oid"], obj["size"]
            if oid in repo.lfs_objects:
                objects.append({"oid": oid, "size": size})
                continue
            ticket = secrets.token_hex(16)
            self._tickets[ticket] = (repo, oid, size)
            objects.append({"oid": oid, "size": size, "authenticated": True, "actions": {
                "upload": {"href": f"{self.endpoint}/_fakehub/lfs/{ticket}"},
                "verify": {"href": f"{self.endpoint}/{repo.url_path}.git/info/lfs/objects/verify"},
            }})
        return _json(200, {"transfer": "basic", "objects": objects}, content_type="application/vnd.git-lfs+json")

    def _lfs_upload(self, req: _Request) -> _Reply:
        """The PUT of an LFS object to the href ``lfs_batch`` returned (no token; the ticket is the signature)."""
        ticket = self._tickets.get(req.params["ticket"])
        if ticket is None:
            raise HubError(403, "Unknown or used upload ticket")
        repo, oid, size = ticket
        if len(req.body) != size or hashlib.sha256(req.body).hexdigest() != oid:
            raise HubError(400, f"Uploaded content does not match oid {oid} / size {size}")
        repo.lfs_objects[oid] = req.body
        del self._tickets[req.params["ticket"]]
        return _Reply(200, b"", {"ETag": f'"{hashlib.md5(req.body).hexdigest()}"'})

    def _lfs_verify(self, req: _Request) -> _Reply:
        """LFS verify: ``{oid, size}`` must name an uploaded object."""
        repo = self._repo_of(req)
        payload = req.json()
        data = repo.lfs_objects.get(payload.get("oid", ""))
        if data is None or len(data) != payload.get("size"):
            raise HubError(404, f"LFS object {payload.get('oid')} was not uploaded")
        return _json(200, {"success": True})

    def _commit(self, req: _Request) -> _Reply:
        """``create_commit``: NDJSON lines ``header`` (summary, description, parentCommit), then ``file``
        (base64 content), ``lfsFile`` (oid of an uploaded object), ``deletedFile``, ``deletedFolder``."""
        repo = self._repo_of(req)
        if req.flag("create_pr"):
            raise HubError(400, "FakeHub does not implement pull requests")
        head = self._branch(repo, req)
        try:
            lines = [json.loads(line) for line in req.body.splitlines() if line.strip()]
        except ValueError as e:
            raise HubError(400, f"Invalid NDJSON commit payload: {e}") from None
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "The first line of a commit payload must be its header")
        header = lines[0]["value"]
        if header.get("parentCommit") not in (None, head.oid):
            raise HubError(412, FAULT_MESSAGES[412])
        files, lfs = dict(head.files), set(head.lfs_paths)
        for line in lines[1:]:
            key, value = line.get("key"), line.get("value", {})
            path = value.get("path", "")
            if not path or path.startswith("/") or ".." in path.split("/"):
                raise HubError(400, f"Invalid path in commit: {path!r}")
            if key == "file":
                files[path] = base64.b64decode(value["content"])
                lfs.discard(path)
            elif key == "lfsFile":
                data = repo.lfs_objects.get(value.get("oid", ""))
                if data is None:
                    raise HubError(400, f"Your push was rejected because an LFS pointer pointed to a file that "
                                        f"does not exist: {path}")
                files[path] = data
                lfs.add(path)
            elif key == "deletedFile":
                if path not in files:
                    raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                del files[path]
                lfs.discard(path)
            elif key == "deletedFolder":
                doomed = [p for p in files if p.startswith(path.rstrip("/") + "/")]
                if not doomed:
                    raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
                for p in doomed:
                    del files[p]
                    lfs.discard(p)
            else:
                raise HubError(400, f"Unknown commit operation {key!r}")
        commit = repo.add_commit(header.get("summary", ""), header.get("description", ""), files, lfs)
        return _json(200, {"success": True, "commitOid": commit.oid, "hookOutput": "",
                           "commitUrl": f"{self.endpoint}/{repo.url_path}/commit/{commit.oid}"})

    def _resolve(self, req: _Request) -> _Reply:
        """``hf_hub_download``/``snapshot_download``: HEAD for metadata (``X-Repo-Commit``, ``ETag``; for LFS
        files ``X-Linked-Etag`` = sha256 and ``X-Linked-Size``), GET for content (``Range: bytes=`` honoured)."""
        repo = self._repo_of(req)
        commit = self._revision(repo, req.params["rev"])
        path = req.params["path"]
        headers = {"X-Repo-Commit": commit.oid}
        if path not in commit.files:
            raise HubError(404, "Entry not found", "EntryNotFound", headers)
        data = commit.files[path]
        if path in commit.lfs_paths:
            sha256 = hashlib.sha256(data).hexdigest()
            headers.update({"ETag": f'"{sha256}"', "X-Linked-Etag": f'"{sha256}"', "X-Linked-Size": str(len(data))})
        else:
            headers["ETag"] = f'"{git_blob_oid(data)}"'
        headers.update({"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"})
        m = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", req.headers.get("Range") or "")
        if req.method == "GET" and m and (m[1] or m[2]):
            start = int(m[1]) if m[1] else max(len(data) - int(m[2]), 0)
            end = min(int(m[2]), len(data) - 1) if m[1] and m[2] else len(data) - 1
            if start >= len(data) or start > end:
                raise HubError(416, "Range not satisfiable", headers={"Content-Range": f"bytes */{len(data)}"})
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            return _Reply(206, data[start:end + 1], headers)
        return _Reply(200, data, headers)

    def _xet_token(self, req: _Request) -> _Reply:
        """Xet token refresh: refused, with a hint (the client only asks when Xet was not disabled)."""
        raise HubError(501, "FakeHub does not implement Xet storage: set HF_HUB_DISABLE_XET=1 (hub_env does)")

    def _branch(self, repo: Repo, req: _Request) -> Commit:
        """The head of the branch a write targets: only ``main`` exists."""
        if req.params["rev"] != "main":
            raise HubError(404, f"Invalid rev id: {req.params['rev']}", "RevisionNotFound")
        return repo.head


class _Handler(BaseHTTPRequestHandler):
    """Reads the request (Content-Length or chunked body), lets ``FakeHub.handle`` answer, writes the reply."""

    protocol_version = "HTTP/1.1"
    server_version = "FakeHub"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

    def setup(self) -> None:
        super().setup()
        with self.server.hub._lock:  # type: ignore[attr-defined]
            self.server.hub._connections.add(self.connection)  # type: ignore[attr-defined]

    def finish(self) -> None:
        with self.server.hub._lock:  # type: ignore[attr-defined]
            self.server.hub._connections.discard(self.connection)  # type: ignore[attr-defined]
        super().finish()

    def _serve(self) -> None:
        body = self._read_body()
        reply = self.server.hub.handle(self.command, self.path, self.headers, body)  # type: ignore[attr-defined]
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _serve

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def log_message(self, format, *args) -> None:  # the request log is FakeHub.requests
        pass


# ---------------------------------------------------------------------------------------------- client side

_HF_VARS_DROPPED = ("HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HUGGINGFACE_HUB_CACHE", "HUGGINGFACE_ASSETS_CACHE",
                    "HUGGINGFACE_CO_STAGING", "HF_HUB_ENABLE_HF_TRANSFER", "HF_TOKEN")


def client_env(hub: FakeHub, home: Path, *, token: str | None = None, endpoint: str | None = None,
               base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment under which ``huggingface_hub`` in a *new* process talks to ``hub``: online, an isolated
    ``HF_HOME`` (no cached login, no shared cache), ``HF_TOKEN``, no telemetry, no Xet, no progress bars.

    ``token``: ``None`` picks one of the hub's tokens; ``""`` sends none (``HF_HUB_DISABLE_IMPLICIT_TOKEN=1``).
    ``endpoint`` overrides ``HF_ENDPOINT`` (e.g. a dead address, to show an explicit ``endpoint=`` wins).
    ``base`` is the environment to start from (default ``os.environ``).
    """
    home = Path(home)
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _HF_VARS_DROPPED}
    env.update({
        "HF_ENDPOINT": endpoint or hub.endpoint,
        "HF_HUB_OFFLINE": "0",  # beats TRANSFORMERS_OFFLINE=1, which the client also reads
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "0",
    })
    token = sorted(hub.tokens)[0] if token is None else token
    if token:
        env["HF_TOKEN"] = token
    else:
        env["HF_HUB_DISABLE_IMPLICIT_TOKEN"] = "1"
    return env


def hub_env(monkeypatch, hub: FakeHub, home: Path, *, token: str | None = None,
            endpoint: str | None = None) -> dict[str, str]:
    """Point ``huggingface_hub`` at ``hub`` in this process (``monkeypatch`` undoes it all after the test) and
    return :func:`client_env` for subprocesses (``subprocess.run([...], env=hub_env(...))``).

    The variables alone are not enough in-process: ``huggingface_hub.constants`` read them at import, so the
    constants the upload and download paths use are patched too, and so is the endpoint of the module-level
    ``HfApi`` behind ``huggingface_hub.create_repo``/``upload_folder``/... (an ``HfApi()`` made before this call
    keeps its old endpoint). ``datasets.config`` is not touched (loading local Parquet files needs no Hub).
    """
    from huggingface_hub import constants, hf_api

    env = client_env(hub, home, token=token, endpoint=endpoint)
    for name in _HF_VARS_DROPPED:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        if name.startswith("HF_"):
            monkeypatch.setenv(name, value)
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    patched = {
        "HF_HUB_OFFLINE": False,
        "ENDPOINT": env["HF_ENDPOINT"],
        "HUGGINGFACE_CO_URL_TEMPLATE": env["HF_ENDPOINT"] + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": str(home),
        "HF_HUB_CACHE": env["HF_HUB_CACHE"],
        "HUGGINGFACE_HUB_CACHE": env["HF_HUB_CACHE"],
        "HF_ASSETS_CACHE": env["HF_ASSETS_CACHE"],
        "HF_XET_CACHE": env["HF_XET_CACHE"],
        "HF_TOKEN_PATH": env["HF_TOKEN_PATH"],
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": env["HF_HUB_DISABLE_IMPLICIT_TOKEN"] == "1",
    }
    for name, value in patched.items():
        monkeypatch.setattr(constants, name, value)
    monkeypatch.setattr(hf_api.api, "endpoint", env["HF_ENDPOINT"])
    return env
