"""The openai engine's scoring path: prompt log-probabilities through the completions endpoint.

A text to score is sent as the token ids of the local tokenizer (so the server scores exactly the
tokens whose character offsets :meth:`stepkit.engines.base.Engine.score` mapped to its target spans) with
``echo: true, logprobs: 0, max_tokens: 0, temperature: 0`` (OpenAI's completions API; vLLM serves it from
the prompt log-probs). The reply's ``choices[0].logprobs.token_logprobs`` holds the log-probability (nats)
of each prompt token given the tokens before it (``None`` at position 0). A reply that cannot be the
answer to the ids sent (not one choice, no log-prob list, another length, a missing number, or, on vLLM,
other ``prompt_token_ids``) is :class:`~stepkit.engines.base.EngineUnavailable`, never a result for the
wrong text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from stepkit.engines.base import Completion, EngineUnavailable
from stepkit.errors import ConfigError


def offsets(tokenizer, path: str, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids and character offsets of ``text`` (as written, no special tokens) from a transformers
    fast tokenizer loaded from ``path``.

    Raises:
        ConfigError: a tokenizer without character offsets (not a fast tokenizer).
    """
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError as exc:
        raise ConfigError(f"tokenizer {path}: scoring needs a fast tokenizer with character offsets "
                          f"({' '.join(str(exc).split())[:200]})") from None
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def score_body(model: str, ids: list[int], token_ids: bool) -> dict[str, Any]:
    """Keyword arguments of ``completions.create`` that score the prompt ``ids`` without sampling."""
    body: dict[str, Any] = dict(model=model, prompt=ids, max_tokens=0, echo=True, logprobs=0, temperature=0)
    if token_ids:
        body["extra_body"] = {"return_token_ids": True}
    return body


def parse_scores(data: dict, ids: list[int], base_url: str) -> list[float | None]:
    """The per-position log-probs of one echo reply, checked against the ``ids`` sent.

    Returns:
        ``len(ids)`` values: None at position 0, a float (nats) at every later position.
    Raises:
        EngineUnavailable: not one choice, no ``logprobs.token_logprobs`` list, a length other than the
            prompt's, a number missing after position 0, or (vLLM) other prompt token ids than sent.
    """
    def bad(why: str):
        return EngineUnavailable(f"the server at {base_url} answered a scoring request with {why}")

    choices = data["choices"]
    if len(choices) != 1 or not isinstance(choices[0], dict):
        raise bad(f"{len(choices)} choices instead of 1")
    choice = choices[0]
    logprobs = choice.get("logprobs")
    lps = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
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


async def score_ids(post: Callable[[dict], Awaitable[dict | Completion]], model: str, ids: list[int],
                    token_ids: bool, base_url: str) -> list[float | None] | str:
    """Score one text's ``ids``: its log-probs (:func:`parse_scores`), or the error message of a text the
    server rejects alone (HTTP 400, e.g. longer than the context).

    ``post(body)`` is the retrying completions call
    (:meth:`stepkit.engines.openai_http.ServerClient.post_completions`).
    """
    data = await post(score_body(model, ids, token_ids))
    if isinstance(data, Completion):
        return data.error
    return parse_scores(data, ids, base_url)
