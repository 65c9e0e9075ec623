"""The engine interface shared by every stage.

An engine turns rendered prompt texts into sampled continuations::

    engine.generate([Request(prompt, n=4), ...], SamplingConfig(...)) -> [[Completion, ...] * 4, ...]
    await engine.agenerate(Request(prompt, n=4), SamplingConfig(...))   -> [Completion, ...] * 4

``generate`` sends a batch and waits for all of it; ``submit`` / ``agenerate`` start one request and
return as soon as it is done, while the engine keeps batching everything else in flight.

Results are order-preserving (``results[i]`` answers ``requests[i]``) and every request gets exactly
``n`` completions. Prompts are *rendered text* (chat template already applied, assistant prefix
appended), so requests that share a solution prefix share a token prefix and hit the prefix cache.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepkit.errors import ConfigError
from stepkit.options import Config, check_field, identity, opt


@dataclass(frozen=True)
class SamplingConfig(Config):
    """Sampling parameters, always explicit (vLLM's own default ``max_tokens=16`` is never used).

    Attributes:
        temperature: softmax temperature (float >= 0).
        top_p: nucleus sampling mass in (0, 1].
        max_tokens: generation budget per completion, in tokens. A completion that hits it has
            ``finish_reason == "length"`` and is counted as *truncated*, never as wrong.
        stop: stop strings; the matched string is not included in the text (each stage has its own
            ``--stop`` option, so this field has none).
        seed: engine seed (vLLM on CPU cannot take per-request seeds, so the engine is seeded once;
            on GPU, request ``i`` of a call gets ``seed + i``).

    Raises:
        ConfigError: a value out of range or not finite (``nan``, ``inf``).
    """

    temperature: float = opt(0.8, "Sampling temperature.", min=0)
    top_p: float = opt(1.0, "Nucleus sampling mass.", min=0, max=1, min_open=True)
    max_tokens: int = opt(512, "Tokens per generation; hitting it marks the generation truncated.", min=1,
                         max=1_000_000)
    stop: tuple[str, ...] = opt((), cli=False)
    seed: int = opt(0, "Seed (the engine's; on GPU request i of a call gets seed + i).", min=0, max=2**32 - 1)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["stop"] = list(self.stop)
        return d


@dataclass(frozen=True)
class Request:
    """One prompt to continue ``n`` times. ``prompt`` is rendered text, generation continues it."""

    prompt: str
    n: int = 1


@dataclass(frozen=True)
class Completion:
    """One sampled continuation.

    Attributes:
        text: generated text only (not the prompt), stop string excluded; empty on an error.
        finish_reason: ``"stop"`` (EOS or stop string), ``"length"`` (hit ``max_tokens``: truncated) or
            ``"error"`` (the engine failed on this request).
        num_tokens: number of generated tokens.
        error: why the engine failed on this request (set exactly when ``finish_reason == "error"``);
            build such a completion with :meth:`failed`.
    """

    text: str
    finish_reason: str
    num_tokens: int = 0
    error: str | None = None

    @classmethod
    def failed(cls, message: str, num_tokens: int = 0) -> "Completion":
        """A completion for a request the engine could not serve (``finish_reason == "error"``)."""
        return cls("", "error", num_tokens, message)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass
class EngineStats:
    """Counters an engine keeps across calls (reported in progress bars, summaries and manifests)."""

    requests: int = 0
    completions: int = 0
    generated_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NoOptions(Config):
    """An engine with no options of its own."""


class Engine:
    """Base class of all engines.

    Subclasses implement :meth:`generate`, :meth:`render_chat` and :meth:`describe`, and declare their
    options as a nested ``Options`` :class:`~stepkit.options.Config` dataclass (the constructor takes
    ``model``, ``seed`` and those fields as keywords).
    """

    name = "base"
    Options: type[Config] = NoOptions
    uses_seed = True  # False for an engine whose results do not depend on the seed (scripted)

    def __init__(self):
        self.stats = EngineStats()

    @classmethod
    def create(cls, model: str, seed: int = 0, **options: Any) -> "Engine":
        """Build the engine from a model name, a seed and its ``Options`` fields (:func:`make_engine`)."""
        return cls(model, seed=seed, **options)

    def generate(self, requests: list[Request], sampling: SamplingConfig) -> list[list[Completion]]:
        """Sample ``r.n`` continuations of each ``r.prompt``; order-preserving."""
        raise NotImplementedError

    def submit(self, request: Request, sampling: SamplingConfig) -> concurrent.futures.Future:
        """Start one request and return a future of its ``request.n`` completions.

        The asynchronous path: a stage whose next request depends on an answer (a binary search, a tree
        search, a retry) submits it when the answer arrives, and the engine batches whatever is in
        flight, so no search waits for another's slowest continuation. This default answers at once
        through :meth:`generate` (right for the scripted engine); the vllm and openai engines run
        requests concurrently. Results equal :meth:`generate`'s for the same request.
        """
        fut: concurrent.futures.Future = concurrent.futures.Future()
        try:
            fut.set_result(self.generate([request], sampling)[0])
        except Exception as exc:  # noqa: BLE001 - the caller sees it when it awaits the result
            fut.set_exception(exc)
        return fut

    async def agenerate(self, request: Request, sampling: SamplingConfig) -> list[Completion]:
        """``await engine.agenerate(request, sampling)``: :meth:`submit` for coroutines (one per row or
        problem, gathered by the stage; the model is datatrove's ``rollout_fn(document, generate)``)."""
        return await asyncio.wrap_future(self.submit(request, sampling))

    @staticmethod
    def check_requests(requests) -> list[Request]:
        """The requests as a list, after checking each asks for ``n >= 1`` (ConfigError otherwise)."""
        requests = list(requests)
        for r in requests:
            if r.n < 1:
                raise ConfigError(f"a request needs n >= 1, got {r.n}")
        return requests

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """Apply the model's chat template to ``messages`` with the generation prompt appended.

        The returned text ends where the assistant's reply begins; callers append an assistant
        prefix to it (see :func:`stepkit.prompts.render_continuation`).
        """
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """Provenance for the manifest: engine name, model, options that change results."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the model (child processes, memory)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# name -> (module, class); each engine class declares its ``Options``. Importing this module imports no backend.
ENGINES = {
    "vllm": ("stepkit.engines.vllm_engine", "VLLMEngine"),
    "openai": ("stepkit.engines.openai_engine", "OpenAIEngine"),
    "scripted": ("stepkit.engines.scripted", "ScriptedEngine"),
}


def engine_class(name: str) -> type[Engine]:
    """The engine class registered as ``name`` (its module is imported; vLLM itself is not).

    Raises:
        ConfigError: unknown engine name.
    """
    import importlib

    if name not in ENGINES:
        raise ConfigError(f"unknown engine {name!r} (choose {', '.join(ENGINES)})")
    module, cls = ENGINES[name]
    return getattr(importlib.import_module(module), cls)


def checked_engine_options(name: str, options: dict[str, Any]) -> Config:
    """``options`` checked against engine ``name``'s ``Options`` dataclass.

    Raises:
        ConfigError: an option that engine does not have (a misspelt option is never dropped silently),
            or a value out of range.
    """
    cls = engine_class(name).Options
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"engine {name} has no option {', '.join(map(repr, unknown))} "
                          f"(its options: {', '.join(sorted(known)) or 'none'})")
    return cls(**options)


def make_engine(name: str, model: str, seed: int = 0, **options) -> Engine:
    """Build an engine by name: ``vllm``, ``openai`` or ``scripted``.

    Args:
        name: a key of :data:`ENGINES`.
        model: the model (registry name, local folder, served name or scripted policy).
        seed: the engine seed.
        **options: fields of that engine's ``Options``.

    Raises:
        ConfigError: unknown engine name or option, or the backend cannot load ``model``.
    """
    opts = checked_engine_options(name, options)
    values = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}  # as given (asdict would copy)
    return engine_class(name).create(model, seed=seed, **values)


@dataclass(frozen=True)
class EngineSpec:
    """Which engine a stage uses, known without loading it: ``EngineSpec("vllm", "smollm2-135m", 0, {...})``.

    Attributes:
        name: engine name (a key of :data:`ENGINES`).
        model: model name or path.
        seed: engine seed.
        options: that engine's options (checked against its ``Options`` on construction).
        factory: builds the engine instead of :func:`make_engine` (tests pass a ready scripted engine);
            not part of the identity.

    Raises:
        ConfigError: unknown engine or option.
    """

    name: str
    model: str
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    factory: Callable[[], Engine] | None = field(default=None, compare=False)

    def __post_init__(self):
        check_field(SamplingConfig, "seed", self.seed)
        if self.factory is None:
            checked_engine_options(self.name, self.options)

    @classmethod
    def of(cls, engine: Engine) -> "EngineSpec":
        """A spec that hands out an engine already built (for tests and benchmarks)."""
        return cls(engine.name, getattr(engine, "model", engine.name), factory=lambda: engine)

    def identity(self) -> dict[str, Any]:
        """What changes results: name, model, seed, and the engine's options marked ``identity``
        (not where a server runs, so a rerun against a restarted server resumes)."""
        opts = identity(checked_engine_options(self.name, self.options)) if self.factory is None else {}
        seeded = self.name not in ENGINES or engine_class(self.name).uses_seed
        return {"name": self.name, "model": self.model, **({"seed": self.seed} if seeded else {}), **opts}

    def build(self) -> Engine:
        """Load the engine (the slow part: a model load or a server check)."""
        if self.factory is not None:
            return self.factory()
        return make_engine(self.name, self.model, seed=self.seed, **self.options)
