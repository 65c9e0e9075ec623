"""The engine interface shared by every stage.

An engine turns rendered prompt texts into sampled continuations::

    engine.generate([Request(prompt, n=4), ...], SamplingConfig(...)) -> [[Completion, ...] * 4, ...]

Results are order-preserving (``results[i]`` answers ``requests[i]``) and every request gets exactly
``n`` completions. Prompts are *rendered text* (chat template already applied, assistant prefix
appended), so requests that share a solution prefix share a token prefix and hit the prefix cache.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from stepkit.errors import ConfigError


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling parameters, always explicit (vLLM's own default ``max_tokens=16`` is never used).

    Attributes:
        temperature: softmax temperature (float >= 0).
        top_p: nucleus sampling mass in (0, 1].
        max_tokens: generation budget per completion, in tokens. A completion that hits it has
            ``finish_reason == "length"`` and is counted as *truncated*, never as wrong.
        stop: stop strings; the matched string is not included in the text.
        seed: engine seed (vLLM on CPU cannot take per-request seeds, so the engine is seeded once;
            on GPU, request ``i`` of a call gets ``seed + i``).
    """

    temperature: float = 0.8
    top_p: float = 1.0
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self):
        if self.max_tokens <= 0:
            raise ConfigError(f"max_tokens must be positive, got {self.max_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        object.__setattr__(self, "stop", tuple(self.stop))

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
        text: generated text only (not the prompt), stop string excluded.
        finish_reason: ``"stop"`` (EOS or stop string), ``"length"`` (hit ``max_tokens``: truncated) or
            ``"error"`` (the engine failed on this request; ``text`` holds the message).
        num_tokens: number of generated tokens.
    """

    text: str
    finish_reason: str
    num_tokens: int = 0

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


class Engine:
    """Base class of all engines.

    Subclasses implement :meth:`generate`, :meth:`render_chat` and :meth:`describe`.
    """

    name = "base"

    def __init__(self):
        self.stats = EngineStats()

    def generate(self, requests: list[Request], sampling: SamplingConfig) -> list[list[Completion]]:
        """Sample ``r.n`` continuations of each ``r.prompt``; order-preserving."""
        raise NotImplementedError

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


def make_engine(name: str, model: str, **options) -> Engine:
    """Build an engine by name: ``vllm``, ``openai`` or ``scripted``.

    Raises:
        ConfigError: unknown engine name, or the backend cannot load ``model``.
    """
    if name == "vllm":
        from stepkit.engines.vllm_engine import VLLMEngine

        return VLLMEngine(model, **options)
    if name == "scripted":
        from stepkit.engines.scripted import ScriptedEngine

        return ScriptedEngine.from_spec(model, **options)
    if name == "openai":
        from stepkit.engines.openai_engine import OpenAIEngine

        return OpenAIEngine(model, **options)
    raise ConfigError(f"unknown engine {name!r} (choose vllm, openai or scripted)")
