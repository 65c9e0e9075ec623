"""The openai engine's HTTP client and its one retry policy.

Two kinds of call reach the server:

* **completions** (generation and scoring): ``POST {base_url}/completions`` through the ``openai``
  package's ``AsyncOpenAI`` (``completions.with_raw_response.create``, so the JSON is read as sent and
  vLLM's extra fields, such as per-choice ``token_ids``, need no SDK model), on the engine's private event
  loop; :meth:`ServerClient.post_completions`.
* **control-plane calls**, synchronous ``httpx``: ``GET /models``, ``/version`` and ``/metrics`` and ``POST
  /reset_prefix_cache`` (checks and provenance: one attempt each, a server that is not up at construction
  is a one-line ``ConfigError`` at once), and ``POST /tokenize`` / ``/detokenize`` during a run
  (:meth:`ServerClient.control`, retried).

**The retry policy** (:class:`RetryPolicy`) is the only one: the SDK's own retries are turned off
(``max_retries=0``), so no attempt is ever retried by two loops at once, and both call paths ask the same
policy what to retry, how long to wait and when to give up.

* retried: connection errors and timeouts; HTTP 408, 409, 429 and 5xx; and, for completions, an answer
  that is not a completion: malformed JSON, no ``choices`` list, or choices the caller's ``check``
  refuses (indices that repeat or fall outside ``[0, n)``, a text that is no string).
* not retried: HTTP 400/413/422 (the request's own content, e.g. a prompt longer than the context: an
  error completion for that request alone); any other 4xx (401/403/404: the job is refused,
  :class:`~stepkit.engines.base.EngineUnavailable` at once); fewer choices than ``n`` (a valid answer: the
  missing ones are asked for by follow-up requests, :mod:`stepkit.engines.openai_choices`).
* backoff: before retry ``k + 1`` (``k`` = 0, 1, ...) the server's ``Retry-After`` / ``retry-after-ms``
  when it gives one of at most 120 s, else ``0.5 s * 2**k`` capped at 8 s minus up to 25 % jitter (the
  schedule of the openai SDK). After ``max_retries`` retries (default 6: about 20 s without an answer)
  the last failure becomes :class:`~stepkit.engines.base.EngineUnavailable`, one line ending "restart it
  and rerun the same command to resume".
* counted: every retry in ``stats.extra["retries"]``, every completions attempt in
  ``stats.extra["http_requests"]``.

API key: ``$STEPKIT_API_KEY``, else ``$OPENAI_API_KEY``, else a dummy (vLLM needs none by default).
"""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from stepkit.engines.base import Completion, EngineUnavailable
from stepkit.errors import ConfigError

REQUEST_ERROR_STATUSES = frozenset({400, 413, 422})
"""HTTP statuses that reject one request for its own content; they become per-request error completions."""

CONTROL_TIMEOUT = 10.0
"""Seconds allowed for control-plane calls (``/models``, ``/tokenize``, ``/metrics``)."""

CONNECT_TIMEOUT = 10.0
"""Seconds allowed to open a connection for a completions request (the read timeout is ``timeout``)."""

MAX_RETRY_AFTER = 120.0
"""A server's ``Retry-After`` longer than this many seconds is ignored (the backoff schedule is used)."""

START_HINT = ("python -m vllm.entrypoints.openai.api_server --model DIR --served-model-name NAME "
              "--host 127.0.0.1 --port PORT")

RESUME_HINT = "restart it and rerun the same command to resume"


def one_line(text: Any, limit: int = 300) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def reason(exc: BaseException) -> str:
    """A short one-line description of a transport error, e.g. ``ConnectError: [Errno 111] ...``."""
    cause = exc
    while cause.__cause__ is not None and type(cause).__module__.startswith("openai"):
        cause = cause.__cause__
    text = one_line(cause) or "no details"
    return f"{type(cause).__name__}: {text}"


def server_message(response) -> str:
    """The ``error.message`` (or ``message`` / ``detail`` / body text) of an HTTP error response, one line."""
    try:
        body = response.json()
    except Exception:  # noqa: BLE001 - not JSON: use the text
        return one_line(getattr(response, "text", "") or "") or "no details"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return one_line(err["message"])
        if isinstance(err, str) and err:
            return one_line(err)
        for key in ("message", "detail"):
            if body.get(key):
                return one_line(body[key])
    return one_line(body) or "no details"


def server_root(base_url: str) -> str:
    """The server root for vLLM's non-OpenAI endpoints: ``base_url`` without a trailing ``/v1``.

    Raises:
        ValueError: a URL ``urlsplit`` refuses.
    """
    url = base_url.rstrip("/")
    if url.endswith("/v1"):
        return url[: -len("/v1")]
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def api_key() -> str:
    return os.environ.get("STEPKIT_API_KEY") or os.environ.get("OPENAI_API_KEY") or "EMPTY"


@dataclass(frozen=True)
class Failure:
    """One failed attempt: ``give_up(retries)`` is the one-line message if no retry is left; ``headers``
    are the HTTP response's (for ``Retry-After``), or None when there was no response."""

    give_up: Callable[[int], str]
    headers: Any = None


def retry_after(headers) -> float | None:
    """Seconds the server asks to wait (``retry-after-ms``, ``retry-after`` in seconds or as an HTTP date),
    or None when it asks for nothing usable."""
    if headers is None:
        return None
    try:
        return float(headers.get("retry-after-ms", "")) / 1000
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after") or ""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return when.timestamp() - time.time()


class RetryPolicy:
    """What is retried, how long to wait and when to give up (see the module docstring).

    Args:
        max_retries: retries after the first attempt (>= 0).
        stats: a dict whose ``"retries"`` count is increased by every retry.
    """

    def __init__(self, max_retries: int, stats: dict[str, int]):
        self.max_retries, self.stats = int(max_retries), stats

    @staticmethod
    def retryable(status: int) -> bool:
        """HTTP statuses retried: 408, 409, 429 and 5xx."""
        return status in (408, 409, 429) or status >= 500

    def backoff(self, attempt: int, headers=None) -> float:
        """Seconds to wait after failed attempt ``attempt`` (0-based): the server's ``Retry-After`` when it
        gives one in ``(0, MAX_RETRY_AFTER]``, else ``0.5 * 2**attempt`` capped at 8, minus up to 25 %."""
        asked = retry_after(headers)
        if asked is not None and 0 < asked <= MAX_RETRY_AFTER:
            return asked
        return min(0.5 * 2 ** attempt, 8.0) * (1 - 0.25 * random.random())

    def next_delay(self, attempt: int, failure: Failure) -> float:
        """The wait before the next attempt after ``failure`` of attempt ``attempt``, counting the retry.

        Raises:
            EngineUnavailable: ``failure.give_up(max_retries)``, when ``max_retries`` retries are spent.
        """
        if attempt >= self.max_retries:
            raise EngineUnavailable(failure.give_up(self.max_retries))
        self.stats["retries"] += 1
        return self.backoff(attempt, failure.headers)


class ServerClient:
    """The HTTP side of one :class:`~stepkit.engines.openai_engine.OpenAIEngine`.

    Args:
        base_url: the OpenAI API root (``http://HOST:PORT/v1``).
        timeout: seconds one completions attempt may take (read timeout; connecting gets at most 10 s).
        max_retries: see :class:`RetryPolicy`.
        stats: the engine's ``stats.extra`` (``retries`` and ``http_requests`` are counted in it).

    Raises:
        ConfigError: a URL that cannot be split.
    """

    def __init__(self, base_url: str, timeout: float, max_retries: int, stats: dict[str, int]):
        self.base_url = base_url.rstrip("/")
        try:
            self.root_url = server_root(self.base_url)
        except ValueError as exc:
            raise ConfigError(f"invalid server URL {self.base_url}: {one_line(exc)}") from None
        self.timeout, self.stats = float(timeout), stats
        self.policy = RetryPolicy(max_retries, stats)
        self._api_key = api_key()
        self._http = httpx.Client(timeout=CONTROL_TIMEOUT, headers={"Authorization": f"Bearer {self._api_key}"})
        self._async = None  # AsyncOpenAI, made on the engine's event loop by the first completions request

    # -- control plane (sync) --------------------------------------------------------------------------

    def models(self, model: str) -> dict[str, Any]:
        """The ``GET /models`` entry of ``model`` (one attempt).

        Raises:
            ConfigError: invalid URL, unreachable server, API key refused, an answer that is not a model
                list, or ``model`` not served. One line each.
        """
        url = f"{self.base_url}/models"
        try:
            response = self._http.get(url)
        except (httpx.InvalidURL, ValueError) as exc:
            raise ConfigError(f"invalid server URL {self.base_url}: {one_line(exc)}") from None
        except httpx.HTTPError as exc:
            raise ConfigError(f"cannot reach the server at {self.base_url}: {reason(exc)}; start it first, "
                              f"e.g. {START_HINT}") from None
        if response.status_code in (401, 403):
            raise ConfigError(f"the server at {self.base_url} refused the API key (HTTP {response.status_code}: "
                              f"{server_message(response)}); set STEPKIT_API_KEY or OPENAI_API_KEY")
        if response.status_code != 200:
            raise ConfigError(f"the server at {self.base_url} answered GET /models with HTTP "
                              f"{response.status_code}: {server_message(response)} (is --base-url the API root, "
                              f"e.g. http://HOST:PORT/v1?)")
        try:
            entries = [e for e in response.json().get("data", []) if isinstance(e, dict)]
        except (ValueError, AttributeError):
            raise ConfigError(f"the server at {self.base_url} answered GET /models with something that is "
                              f"not an OpenAI model list") from None
        for entry in entries:
            if entry.get("id") == model:
                return entry
        served = ", ".join(str(e.get("id")) for e in entries) or "no models"
        raise ConfigError(f"the server at {self.base_url} serves {served}, not {model}")

    def version(self) -> str | None:
        """The server's ``GET /version`` (vLLM), or None (one attempt; optional provenance)."""
        try:
            response = self._http.get(f"{self.root_url}/version", timeout=2.0)
            if response.status_code == 200:
                return str(response.json().get("version"))
        except Exception:  # noqa: BLE001 - optional provenance
            pass
        return None

    def metrics(self) -> str | None:
        """The text of ``GET /metrics`` (Prometheus), or None when unreachable or not served (one attempt)."""
        try:
            response = self._http.get(f"{self.root_url}/metrics", timeout=CONTROL_TIMEOUT)
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None

    def reset_prefix_cache(self) -> bool:
        """``POST /reset_prefix_cache`` (vLLM with ``VLLM_SERVER_DEV_MODE=1``): True on success (one attempt)."""
        try:
            return self._http.post(f"{self.root_url}/reset_prefix_cache").status_code == 200
        except httpx.HTTPError:
            return False

    def control(self, method: str, path: str, **kwargs) -> httpx.Response:
        """A control-plane call at the server root (``/tokenize``, ``/detokenize``) under the retry policy;
        returns any HTTP answer whose status is not retried (the caller reads 200, 404, ...).

        Raises:
            EngineUnavailable: unreachable, or 408/409/429/5xx, after ``max_retries`` retries.
        """
        url = f"{self.root_url}{path}"
        for attempt in itertools.count():
            try:
                response = self._http.request(method, url, **kwargs)
            except httpx.HTTPError as exc:
                why, headers = reason(exc), None
            else:
                if not self.policy.retryable(response.status_code):
                    return response
                why, headers = f"HTTP {response.status_code}: {server_message(response)}", response.headers
            failure = Failure(lambda n, why=why: f"the server at {self.base_url} keeps failing on {method} {url} "
                                                 f"({why}) after {n} retries; {RESUME_HINT}", headers)
            time.sleep(self.policy.next_delay(attempt, failure))
        raise AssertionError("unreachable")  # pragma: no cover

    # -- completions (async, on the engine's event loop) -------------------------------------------------

    async def post_completions(self, body: dict[str, Any], check: Callable[[dict], None] | None = None):
        """POST one completions request (``body``: keyword arguments of ``completions.create``) under the retry
        policy: its JSON answer (a dict with a ``choices`` list that ``check`` accepts), or an error
        :class:`~stepkit.engines.base.Completion` for a request the server rejects for its own content
        (HTTP 400/413/422).

        Raises:
            EngineUnavailable: retries spent (unreachable, timeouts, 408/409/429/5xx, or answers that are not
                completions), or the job refused (another 4xx).
        """
        for attempt in itertools.count():
            outcome = await self._attempt(body, check)
            if not isinstance(outcome, Failure):
                return outcome
            await asyncio.sleep(self.policy.next_delay(attempt, outcome))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _attempt(self, body: dict[str, Any], check) -> dict | Completion | Failure:
        """One completions attempt: the answer, a rejected request's error Completion, or a retryable Failure."""
        import openai

        base = self.base_url
        self.stats["http_requests"] += 1
        try:
            raw = await self._client().completions.with_raw_response.create(**body)
        except openai.APIStatusError as exc:
            status, message = exc.status_code, server_message(exc.response)
            if status in REQUEST_ERROR_STATUSES:
                return Completion.failed(f"HTTP {status}: {message}")
            if not self.policy.retryable(status):
                raise EngineUnavailable(f"the server at {base} refused a completions request "
                                        f"(HTTP {status}: {message})") from None
            return Failure(lambda n: f"the server at {base} keeps failing (HTTP {status}: {message}) after {n} "
                                     f"retries; {RESUME_HINT}", exc.response.headers)
        except openai.APITimeoutError:
            return Failure(lambda n: f"the server at {base} did not answer within {self.timeout:g} s (after {n} "
                                     f"retries); {RESUME_HINT}")
        except openai.APIConnectionError as exc:
            why = reason(exc)
            return Failure(lambda n: f"the server at {base} is unreachable ({why}) after {n} retries; {RESUME_HINT}")
        try:
            data = raw.http_response.json()
            if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
                raise ValueError("no choices list")
            if check is not None:
                check(data)
            return data
        except (ValueError, AttributeError, TypeError) as exc:
            why = one_line(exc, 100)
        return Failure(lambda n: f"the server at {base} answered a completions request with something that is not "
                                 f"a completion ({why}) after {n} retries; {RESUME_HINT}", raw.http_response.headers)

    def _client(self):
        if self._async is None:
            import openai

            self._async = openai.AsyncOpenAI(
                api_key=self._api_key,
                base_url=self.base_url,
                max_retries=0,  # the retry policy is RetryPolicy's alone
                timeout=openai.Timeout(self.timeout, connect=min(CONNECT_TIMEOUT, self.timeout)),
                http_client=openai.DefaultAsyncHttpxClient(limits=openai.DEFAULT_CONNECTION_LIMITS),
            )
        return self._async

    async def aclose(self) -> None:
        """Close the async client (on the event loop it was made on)."""
        client, self._async = self._async, None
        if client is not None:
            await client.close()

    def close(self) -> None:
        """Close the sync client (the async one is closed by :meth:`aclose`)."""
        self._http.close()
