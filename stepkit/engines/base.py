"""The engine interface shared by every stage.

An engine turns rendered prompt texts into sampled continuations::

    engine.generate([Request(prompt, n=4), ...], SamplingConfig(...)) -> [[Completion, ...] * 4, ...]
    await engine.agenerate(Request(prompt, n=4), SamplingConfig(...))   -> [Completion, ...] * 4

``generate`` sends a batch and waits for all of it; ``submit`` / ``agenerate`` start one request and
return as soon as it is done, while the engine keeps batching everything else in flight.

An engine also *scores* text without sampling (one prefill per text, the likelihood labellers)::

    engine.score([ScoreRequest(text, spans=((a, b), ...)), ...]) -> [Scored, ...]

``Scored.logprobs[k]`` holds the log-probability (nats) of each token of target span ``k`` given every
token before it. Token positions come from one tokenisation of the whole text with character offsets
(:func:`assign_tokens`), never from the token count of a prefix, because a BPE token can merge across
the join of a prefix and its target.

Results are order-preserving (``results[i]`` answers ``requests[i]``) and every request gets exactly
``n`` completions. Prompts are *rendered text* (chat template already applied, assistant prefix
appended), so requests that share a solution prefix share a token prefix and hit the prefix cache.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepkit.aio import awaitable
from stepkit.errors import ConfigError, StepkitError
from stepkit.options import Config, check_field, identity, opt


class EngineUnavailable(StepkitError):
    """The engine's server is unreachable or keeps failing after all retries (one-line message).

    Raised by a remote engine (:class:`stepkit.engines.openai_engine.OpenAIEngine`) from ``generate``,
    ``score`` and server-side chat rendering, and by the future ``submit`` returns. Nothing of the call is
    returned; the runner lets it propagate, so the chunk in flight is not committed and rerunning the
    command after restarting the server resumes from that chunk.
    """


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
    """One prompt to continue ``n`` times. ``prompt`` is rendered text, generation continues it.

    ``seed_index``: the request's number for an engine that seeds each request (vLLM on GPU, a server with
    per-request seeds): it sends ``sampling.seed + seed_index``, so the samples do not depend on when the
    request was sent. None: the engine numbers requests as they come (position in a ``generate`` call, or
    its running count of submitted requests, which depends on what was submitted before).
    """

    prompt: str
    n: int = 1
    seed_index: int | None = None


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

    @property
    def empty(self) -> bool:
        """The engine stopped with no text (whitespace only), e.g. the model ended its turn at once, or the
        prompt's chat template had already closed the assistant turn. It is not an error completion: it
        splits into no step, which ``rollout`` keeps as a row error ("empty completion") and the labellers
        count apart, outside every value's denominator (never graded as a wrong continuation)."""
        return self.finish_reason != "error" and not self.text.strip()


@dataclass(frozen=True)
class ScoreRequest:
    """One rendered text whose target spans are scored by one prefill.

    Attributes:
        text: the whole rendered text (chat template applied), tokenised once as written (special
            tokens written in it are parsed; none are added).
        spans: character spans ``(start, end)`` of the targets, ``0 <= start < end <= len(text)``, in
            order and not overlapping (an answer after a prefix, or each step of a solution).
    """

    text: str
    spans: tuple[tuple[int, int], ...]

    def __post_init__(self):
        last = 0
        for start, end in self.spans:
            if not (last <= start < end <= len(self.text)):
                raise ConfigError(f"score span ({start}, {end}) is empty, out of order or outside a text of "
                                  f"{len(self.text)} characters")
            last = end


@dataclass(frozen=True)
class Scored:
    """The scores of one :class:`ScoreRequest`.

    Attributes:
        logprobs: per span, the log-probability in nats of each of its tokens (the actual token, looked up
            by id; never the most likely one).
        span_tokens: per span, the token ids scored (what ``logprobs`` is about).
        token_ids: the whole text's token ids (two models share a tokenizer when these agree).
        error: why the engine could not score the text (e.g. longer than the context); then the other
            fields are empty. Build such a result with :meth:`failed`.
    """

    logprobs: tuple[tuple[float, ...], ...] = ()
    span_tokens: tuple[tuple[int, ...], ...] = ()
    token_ids: tuple[int, ...] = ()
    error: str | None = None

    @classmethod
    def failed(cls, message: str) -> "Scored":
        return cls(error=message)

    @property
    def sums(self) -> list[float]:
        """The summed log-probability (nats) of each span (``math.fsum`` of its tokens)."""
        return [math.fsum(lp) for lp in self.logprobs]


def assign_tokens(offsets: list[tuple[int, int]], spans, text: str | None = None) -> list[list[int]]:
    """Which tokens of a text belong to each target span, from the tokens' character offsets.

    Rule: a token belongs to the *last* span it overlaps (``start < span_end`` and ``end > span_start``;
    a zero-width token, as some tokenizers report for trimmed whitespace, overlaps the span holding its
    position). So a token that merges the end of the prefix with the start of the target (``"ow"`` in
    ``"Ho" + "w are you"``) is the target's, and a token spanning the join of two steps is the later
    step's (case ``step-token-boundary-merge``).

    Args:
        offsets: ``(start, end)`` character offsets of the text's tokens, in order.
        spans: ``(start, end)`` character spans, in order, not overlapping.
        text: the text; when given, characters no token's offsets cover may be whitespace (tokenizers that
            trim offsets leave a token's leading space out of them).

    Returns:
        ``out[k]``: the token positions of span ``k`` (ascending).

    Raises:
        StepkitError: a span's characters (other than whitespace when ``text`` is given) are not all covered
            by tokens (the offsets do not describe the text), or a span gets no token (the next span took
            its only one).
    """
    out: list[list[int]] = [[] for _ in spans]
    k = 0
    for j, (s, e) in enumerate(offsets):
        owner = None
        for i in range(k, len(spans)):
            a, b = spans[i]
            if a >= max(e, s + 1):  # spans are ordered: none further can overlap
                break
            if (s < b and e > a) if e > s else a <= s < b:
                owner = i
        if owner is not None:
            out[owner].append(j)
        while k < len(spans) and spans[k][1] <= s:
            k += 1

    def gap_ok(lo: int, hi: int) -> bool:
        return lo >= hi or (text is not None and text[lo:hi].isspace())

    for (a, b), positions in zip(spans, out):
        if not positions:
            raise StepkitError(f"no token belongs to the target span ({a}, {b}): a token that spans it and "
                               f"what follows belongs to the next span")
        start = offsets[positions[0]][0]
        covered, j = max(start, a), positions[0]  # the span's characters must all lie in tokens (any span's)
        while covered < b and j < len(offsets):
            s, e = offsets[j]
            if s > covered and not gap_ok(covered, min(s, b)):
                break
            covered = max(covered, e)
            j += 1
        if not gap_ok(a, start) or (covered < b and not gap_ok(covered, b)):
            raise StepkitError(f"the tokens' character offsets do not cover the target span ({a}, {b})")
    return out


def actual_token_logprobs(prompt_logprobs, token_ids, start: int = 1) -> list[float | None]:
    """The log-probability of each *actual* prompt token from vLLM-style ``prompt_logprobs``.

    ``prompt_logprobs[i]`` is ``None`` at position 0 (nothing precedes it) and else a mapping from token id
    (int, or str in JSON) to a ``Logprob`` (or a dict with ``"logprob"``) holding the top-k entries plus
    the actual token when it is not among them (k or k+1 entries). The entry of ``token_ids[i]`` is read,
    never the first or most likely one (case ``vllm-prompt-logprobs-pick-actual-token``).

    ``start``: the first position whose entry is read (positions before it are ``None``): a request that
    read the prefix cache has no log-probabilities for the cached positions nor for the first one after.

    Returns:
        one float (nats) per position, ``None`` at positions before ``start`` (always at 0).

    Raises:
        StepkitError: lengths differ, or a position from ``start`` on has no entry for its actual token (never
            replaced by 0.0 or skipped).
    """
    if len(prompt_logprobs) != len(token_ids):
        raise StepkitError(f"prompt log-probs for {len(prompt_logprobs)} positions, but {len(token_ids)} tokens")
    out: list[float | None] = []
    for i, (entries, tid) in enumerate(zip(prompt_logprobs, token_ids)):
        if i < start:
            out.append(None)
            continue
        if entries is None:
            if i:
                raise StepkitError(f"no prompt log-prob at position {i}")
            out.append(None)
            continue
        entry = entries.get(tid, entries.get(str(tid)))
        if entry is None:
            raise StepkitError(f"prompt log-probs at position {i} have no entry for the actual token {tid}")
        out.append(float(entry["logprob"] if isinstance(entry, dict) else entry.logprob))
    return out


@dataclass
class EngineStats:
    """Counters an engine keeps across calls (reported in progress bars, summaries and manifests)."""

    requests: int = 0
    completions: int = 0
    generated_tokens: int = 0
    scored_tokens: int = 0  # prompt tokens prefilled by score() (every token of each scored text)
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
        return await awaitable(self.submit(request, sampling))

    def submit_each(self, request: Request, sampling: SamplingConfig) -> list[concurrent.futures.Future]:
        """Start one request; return one future per sample (``request.n`` of them, in sample order), each
        resolved with its :class:`Completion` as soon as that sample is done: a binary search decides a
        probe by its first correct sample and sends the next probe while the others finish. Results equal
        :meth:`submit`'s for the same request. This default resolves every sample when the whole request
        is done (:meth:`submit`); an engine that finishes samples apart overrides it.

        Raises:
            what :meth:`submit` raises; each future carries what its request's future carries (a
            StepkitError when the engine returned a number of completions other than ``request.n``).
        """
        whole = self.submit(request, sampling)
        parts = [concurrent.futures.Future() for _ in range(request.n)]

        def spread(done: concurrent.futures.Future) -> None:
            exc = done.exception()
            got = done.result() if exc is None else []
            if exc is None and len(got) != len(parts):
                exc = StepkitError(f"{self.name} engine returned {len(got)} completions for n = {len(parts)}")
            for j, part in enumerate(parts):
                if part.set_running_or_notify_cancel():  # (False: cancelled by its waiter)
                    part.set_exception(exc) if exc is not None else part.set_result(got[j])

        whole.add_done_callback(spread)
        return parts

    def agenerate_each(self, request: Request, sampling: SamplingConfig) -> list:
        """:meth:`submit_each` for coroutines: ``request.n`` awaitables (asyncio futures of this thread's
        running loop), each giving one :class:`Completion`, in sample order."""
        return [awaitable(f) for f in self.submit_each(request, sampling)]

    @staticmethod
    def check_requests(requests) -> list[Request]:
        """The requests as a list, after checking each asks for ``n >= 1`` (ConfigError otherwise)."""
        requests = list(requests)
        for r in requests:
            if r.n < 1:
                raise ConfigError(f"a request needs n >= 1, got {r.n}")
        return requests

    def score(self, requests: list[ScoreRequest]) -> list[Scored]:
        """The log-probability of every token of each request's target spans, by one prefill per text and
        no sampling (vLLM ``prompt_logprobs``; the completions endpoint's ``echo`` + ``logprobs``).

        The text is tokenised once with character offsets (:meth:`tokenize_offsets`), the spans are mapped
        to token positions by :func:`assign_tokens`, and the backend returns the actual token's
        log-probability at every position (:meth:`_prompt_logprobs`). A target token at position 0 has no
        log-probability (nothing precedes it): such a request fails.

        Returns:
            ``results[i]`` answers ``requests[i]``: a :class:`Scored`, or ``Scored.failed(why)`` for a
            text the engine cannot take (longer than the context, rejected by the server) or whose spans its
            tokens do not fit (a span whose only token also covers the next span).

        Raises:
            StepkitError: the backend's reply does not fit the tokens (a wrong length, a missing entry);
                never a result attached to the wrong text.

        Updates ``self.stats.scored_tokens`` (every token of every scored text: the prefill cost).
        """
        requests = list(requests)
        if not requests:
            return []
        tokenised = [self.tokenize_offsets(r.text) for r in requests]
        owners: list[list[list[int]] | str] = []
        for r, (_, offsets) in zip(requests, tokenised):
            try:
                positions = assign_tokens(offsets, r.spans, r.text)
            except StepkitError as exc:  # this text cannot be scored as asked; the others can
                owners.append(str(exc))
                continue
            owners.append(positions if all(p[0] > 0 for p in positions) else
                          "a target starts the text: its first token has no log-probability")
        todo = [i for i, o in enumerate(owners) if not isinstance(o, str)]
        got = self._prompt_logprobs([requests[i].text for i in todo], [tokenised[i][0] for i in todo],
                                    [min(p[0] for p in owners[i]) for i in todo])
        if len(got) != len(todo):
            raise StepkitError(f"{self.name} engine scored {len(got)} texts of {len(todo)}")
        per_position: list = list(owners)
        for i, lps in zip(todo, got):
            per_position[i] = lps
        out = []
        for (ids, _), positions, lps in zip(tokenised, owners, per_position):
            if isinstance(lps, str):
                out.append(Scored.failed(lps))
                continue
            if len(lps) != len(ids):
                raise StepkitError(f"{self.name} engine returned {len(lps)} log-probs for {len(ids)} tokens")
            if any(lps[j] is None for p in positions for j in p):  # pragma: no cover - a backend's bug
                raise StepkitError(f"{self.name} engine returned no log-prob for a target token")
            self.stats.scored_tokens += len(ids)
            out.append(Scored(tuple(tuple(lps[j] for j in p) for p in positions),
                              tuple(tuple(ids[j] for j in p) for p in positions), tuple(ids)))
        return out

    def tokenize_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The token ids of ``text`` (as written, no special tokens added) and each token's character
        ``(start, end)`` offsets. Backends implement it with their tokenizer (a fast tokenizer's
        ``return_offsets_mapping``)."""
        raise NotImplementedError(f"the {self.name} engine cannot score text")

    def _prompt_logprobs(self, texts: list[str], token_ids: list[list[int]],
                         needed_from: list[int]) -> list[list[float | None] | str]:
        """Backend hook of :meth:`score`: for each text and its token ids (from :meth:`tokenize_offsets`),
        the actual token's log-probability at every position from ``needed_from[i]`` on (its first target
        token; earlier positions may be ``None``, position 0 always is), or an error message for a text it
        cannot take. Batched like generation."""
        raise NotImplementedError(f"the {self.name} engine cannot score text")

    def classify_tokens(self, token_ids: list[list[int]]) -> list[list[list[float]] | str]:
        """The class logits of every token of each text (a token-classification or reward model; the vllm
        engine's pooling runner, :mod:`stepkit.engines.vllm_pooling`): ``result[i][position][class]``, or an
        error message for a text the engine cannot take. ``token_ids`` come from :meth:`tokenize_offsets`."""
        raise NotImplementedError(f"the {self.name} engine cannot classify tokens")

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
