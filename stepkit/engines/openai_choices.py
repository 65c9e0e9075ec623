"""The openai engine's sampling requests and the checking of their answers' choices.

A completions answer for ``n`` samples is used only when each of its choices can be matched to one sample
slot (:func:`check_choices`): a choice that is no object, an ``index`` that is not an integer in ``[0, n)``
or repeats, or a ``text`` that is no string makes the whole answer "not a completion", which the retry
policy sends again (:mod:`stepkit.engines.openai_http`). Choices in any order are put in ``index`` order
(:func:`parse_choices`). Fewer choices than ``n`` (or none) is a valid answer: the missing samples are
asked for by follow-up requests, up to :data:`MAX_TOP_UPS`, and then become error completions of that
request alone (:func:`sample_n`). So a choice is never attached to another request or sample slot than
the one it answers.

The request body follows OpenAI's completions API ("Completions" in the API reference) with vLLM's extra
``return_token_ids`` (per-choice generated token ids, so ``num_tokens`` is exact).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from stepkit.engines.base import Completion, SamplingConfig

MAX_TOP_UPS = 3
"""Follow-up requests sent when a server returns fewer than ``n`` choices."""


def completion_body(model: str, prompt: str, n: int, sampling: SamplingConfig, seed: int | None,
                    token_ids: bool) -> dict[str, Any]:
    """Keyword arguments of ``completions.create`` for ``n`` samples of ``prompt``: explicit ``temperature``,
    ``top_p``, ``max_tokens`` and ``stop``; ``seed`` when given; ``return_token_ids`` (vLLM) when
    ``token_ids``."""
    body: dict[str, Any] = dict(model=model, prompt=prompt, n=n, temperature=sampling.temperature,
                                top_p=sampling.top_p, max_tokens=sampling.max_tokens)
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if seed is not None:
        body["seed"] = seed
    if token_ids:
        body["extra_body"] = {"return_token_ids": True}
    return body


def check_choices(data: dict, n: int) -> None:
    """Refuse a completions answer to a request for ``n`` samples whose choices cannot be matched to
    samples. Fewer choices than ``n`` (or none) are fine.

    Raises:
        ValueError: a choice that is not an object, an ``index`` that is not an integer in ``[0, n)`` or
            repeats, a ``text`` that is not a string.
    """
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


def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` counts that differ by at most one and sum to ``total``."""
    base, extra = divmod(max(int(total), 0), parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def parse_choices(data: dict, need: int, count: Callable[[str], int] | None) -> list[Completion]:
    """The completions of one answer checked by :func:`check_choices`, in ``index`` order, at most ``need``.

    ``num_tokens``: the length of each choice's ``token_ids`` when every choice has them (vLLM), else
    ``count(text)`` with the local tokenizer when there is one, else ``usage.completion_tokens`` split
    evenly over the choices (sums stay exact). A ``finish_reason`` other than ``stop``/``length`` gives an
    error completion.
    """
    choices = sorted(data["choices"], key=lambda c: c["index"])[:need]
    if not choices:
        return []
    usage = data.get("usage") or {}
    if all(isinstance(c.get("token_ids"), list) for c in choices):
        counts = [len(c["token_ids"]) for c in choices]
    elif count is not None:
        counts = [count(c.get("text") or "") for c in choices]
    else:
        counts = split_evenly(usage.get("completion_tokens") or 0, len(choices))
    out = []
    for choice, num in zip(choices, counts):
        reason = choice.get("finish_reason")
        text = choice.get("text") or ""
        if reason in ("stop", "length"):
            out.append(Completion(text, reason, num))
        else:
            out.append(Completion.failed(f"the server finished a completion with {reason!r}", num))
    return out


def prompt_tokens(data: dict) -> int:
    """``usage.prompt_tokens`` of an answer (0 when absent)."""
    return int((data.get("usage") or {}).get("prompt_tokens") or 0)


async def sample_n(post: Callable[[int, bool], Awaitable[dict | Completion]], n: int,
                   parse: Callable[[dict, int], list[Completion]]) -> list[Completion]:
    """Exactly ``n`` completions of one prompt.

    Args:
        post: ``post(need, first)`` sends a request for ``need`` samples (``first``: the first request of
            this prompt, the only one that carries a per-request seed) and returns its answer checked by
            :func:`check_choices`, or an error Completion when the server rejects the request.
        parse: ``parse(answer, need)``, the answer's completions (:func:`parse_choices`).

    Returns:
        ``n`` completions: the choices returned over at most ``1 + MAX_TOP_UPS`` requests, then error
        completions for the samples still missing; a rejected request's error for all remaining samples.
    """
    got: list[Completion] = []
    for round_ in range(MAX_TOP_UPS + 1):
        need = n - len(got)
        data = await post(need, round_ == 0)
        if isinstance(data, Completion):  # rejected request
            return got + [data] * need
        got.extend(parse(data, need))
        if len(got) >= n:
            return got[:n]
    message = f"the server returned {len(got)} of {n} completions after {MAX_TOP_UPS} follow-up requests"
    return got + [Completion.failed(message)] * (n - len(got))
