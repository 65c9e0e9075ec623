"""A deterministic engine for unit tests of algorithms (never for real labels).

The engine calls a *policy* ``policy(prompt, j, n) -> str | Completion`` for sample ``j`` of ``n`` of each
request. :class:`KnownValuePolicy` makes the success probability of every prefix known exactly, so MC
estimators and searches can be checked to the count: of ``n`` samples, the first ``round(p * n)``
answer correctly. Every stage is also tested against the real vLLM engine.

From the CLI, ``--engine scripted --model scripted:echo`` answers "The answer is <last number in the
prompt>" (deterministic, fast); ``scripted:judge`` answers judge prompts (:func:`judge_policy`); ``scripted:clues`` answers the clue
recovery and clue verification prompts of ``stepkit clue`` (:func:`clues_policy`); ``scripted:empty`` stops at
once with no text (:func:`empty_policy`: a model that ends its turn at the prefix); ``STEPKIT_SCRIPTED_DELAY`` (seconds per request or scored text) slows it
down so tests can kill a run mid-shard.

Scoring (:meth:`ScriptedEngine.score`): the text is split into tokens by :func:`scripted_tokens` (a word
with its leading space, a run of punctuation, a run of whitespace) and a *scorer*
``scorer(context, token) -> logprob`` gives each token's log-probability from the text before it.
:data:`echo_scorer` (the default) makes values known exactly: ``-0.5`` for a token already seen in the
context, ``-3.0`` otherwise; ``scripted:flat`` scores every token ``-2.0`` (a reference model). Both also
score a whole text at once in time linear in its length (``over_text``); a plain function given as
``scorer`` is called with each token's context ``text[:a]``, which is quadratic in a long text.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

from stepkit.engines.base import Completion, Engine, Request, SamplingConfig
from stepkit.errors import ConfigError

Policy = Callable[[str, int, int], "str | Completion"]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_TOKEN = re.compile(r" ?\w+| ?[^\w\s]+|\s+")

Scorer = Callable[[str, str], float]
Tokenizer = Callable[[str], list[tuple[int, int]]]


def scripted_tokens(text: str) -> list[tuple[int, int]]:
    """Character offsets of the scripted tokenizer's tokens: a word with its leading space, a run of
    punctuation with its leading space, or a run of whitespace; together they cover ``text``."""
    return [m.span() for m in _TOKEN.finditer(text)]


SEEN_LOGPROB, UNSEEN_LOGPROB, FLAT_LOGPROB = -0.5, -3.0, -2.0


def first_occurrence_ends(text: str) -> Callable[[str], int | None]:
    """A function ``end(s)``: the end (exclusive) of the first occurrence of ``s`` in ``text``, or None when
    ``s`` does not occur; so ``s in text[:a]`` is ``end(s) is not None and end(s) <= a``.

    Built as the suffix automaton of ``text`` (Blumer et al. 1985, "The smallest automaton recognizing
    the subwords of a text"), each state keeping the end of its strings' first occurrence: building takes
    time linear in ``len(text)``, and ``end(s)`` time linear in ``len(s)``, however long the text.
    """
    nxt: list[dict[str, int]] = [{}]
    link, length, first = [-1], [0], [-1]
    last = 0
    for i, ch in enumerate(text):
        cur = len(nxt)
        nxt.append({})
        link.append(0)
        length.append(length[last] + 1)
        first.append(i)
        p = last
        while p != -1 and ch not in nxt[p]:
            nxt[p][ch] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][ch]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(nxt)
                nxt.append(dict(nxt[q]))
                link.append(link[q])
                length.append(length[p] + 1)
                first.append(first[q])
                while p != -1 and nxt[p].get(ch) == q:
                    nxt[p][ch] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        last = cur

    def end(s: str) -> int | None:
        state = 0
        for ch in s:
            state = nxt[state].get(ch)
            if state is None:
                return None
        return first[state] + 1 if s else 0

    return end


class EchoScorer:
    """``-0.5`` nats when ``token`` (stripped) already occurs in ``context``, else ``-3.0``: an answer the
    prefix has written scores well (a known-value stand-in for a likelihood)."""

    def __call__(self, context: str, token: str) -> float:
        return SEEN_LOGPROB if token.strip() and token.strip() in context else UNSEEN_LOGPROB

    def over_text(self, text: str, spans: list[tuple[int, int]]) -> list[float]:
        """``[self(text[:a], text[a:b]) for a, b in spans]``, in time linear in ``len(text)`` and the spans'
        length (:func:`first_occurrence_ends`; no context is sliced)."""
        end = first_occurrence_ends(text)
        out = []
        for a, b in spans:
            word = text[a:b].strip()
            at = end(word) if word else None
            out.append(SEEN_LOGPROB if at is not None and at <= a else UNSEEN_LOGPROB)
        return out


class FlatScorer:
    """Every token ``-2.0`` nats (``scripted:flat``: a stand-in reference model)."""

    def __call__(self, context: str, token: str) -> float:
        return FLAT_LOGPROB

    def over_text(self, text: str, spans: list[tuple[int, int]]) -> list[float]:
        return [FLAT_LOGPROB] * len(spans)


echo_scorer = EchoScorer()
flat_scorer = FlatScorer()


def echo_policy(prompt: str, j: int, n: int) -> str:
    """Answer with the last number of the prompt (a stand-in that depends on the prefix)."""
    nums = _NUMBER.findall(prompt)
    return f" so the total is computed.\nThe answer is {nums[-1] if nums else 0}."


def empty_policy(prompt: str, j: int, n: int) -> str:
    """Stop at once with no text, as a model does that ends its turn at the prefix (or whose chat template
    already closed the assistant turn): every completion is empty."""
    return ""


_PARAGRAPH = re.compile(r"<paragraph_(\d+)>")
_TURN = re.compile(r"<turn_(\d+)>")


def judge_policy(prompt: str, j: int, n: int) -> str:
    """A stand-in judge: sample ``j`` of a prompt with M tagged paragraphs names paragraph
    ``(j % (M + 1)) - 1`` as the first error (sample 0 says -1), in the format the prompt asks for
    (per-step lines when it mentions "Paragraph k: correct", ``Turn k: score S`` lines of 8 before the
    error and 2 from it for the scored agent template (turns tagged ``<turn_k>``), else ``\\boxed{}``)."""
    m = len(set(_PARAGRAPH.findall(prompt)))
    if 'of the form "Turn k: score S"' in prompt:  # the scored agent template: 8 before the error, 2 from it
        m = len(set(_TURN.findall(prompt)))
        first = (j % (m + 1)) - 1
        return "Scored each turn.\n" + "\n".join(f"Turn {k}: score {8 if first == -1 or k < first else 2}"
                                                  for k in range(m))
    first = (j % (m + 1)) - 1
    if "Paragraph k: correct" in prompt:
        lines = [f"Paragraph {k}: {'correct' if first == -1 or k < first else 'incorrect'}" for k in range(m)]
        return "Checked each paragraph.\n" + "\n".join(lines)
    return f"Checked each paragraph.\n\\boxed{{{first}}}"


def clues_policy(prompt: str, j: int, n: int) -> str:
    """A stand-in for ``stepkit clue``. A recovery prompt (``clue-recover`` template) is answered with one
    ``CLUE k`` line per arithmetic claim ``a op b = c`` of the reference solution shown in it (value c;
    ``uses`` the earlier clues whose value is an operand), and a reply with no clue line when it shows no
    reference solution ("(none)"), which the stage must record as a parse failure. A verification prompt
    (``clue-verify`` template) is answered with ``\\boxed{k}``, k the first paragraph that states the
    clue's last number (-1 none); a clue with no number gets a reply with no box (a verdict failure)."""
    from stepkit.grading.clues import number_value, read_step

    if "[Verified answer]" in prompt:
        solution = prompt.split("[Reference solution]", 1)[1].split("Work backward", 1)[0].strip()
        if solution.startswith("(none)"):
            return "I cannot work backward without a reference solution."
        lines, values = [], []
        for claim in (c for line in solution.splitlines() for c in read_step(line).claims):
            ops = {number_value(x) for x in re.findall(r"\d+(?:\.\d+)?", claim.lhs)}
            uses = [str(i + 1) for i, v in enumerate(values) if v in ops] or ["none"]
            lines.append(f"CLUE {len(lines) + 1}: {claim.lhs} = {claim.rhs} || value: {claim.rhs} || uses: "
                         f"{', '.join(uses)}")
            values.append(number_value(claim.rhs))
        return "Working backward from the answer.\n" + "\n".join(lines)
    if "[Clue]" in prompt:
        clue = prompt.split("[Clue]", 1)[1].split("Does any paragraph", 1)[0]
        nums = _NUMBER.findall(clue.replace(",", ""))
        if not nums:
            return "I cannot tell."
        paragraphs = re.findall(r"<paragraph_(\d+)>\n(.*?)\n</paragraph_\1>", prompt, re.DOTALL)
        hit = next((int(k) for k, text in paragraphs if nums[-1] in _NUMBER.findall(text.replace(",", ""))), -1)
        return f"Checked each paragraph.\n\\boxed{{{hit}}}"
    return echo_policy(prompt, j, n)


class KnownValuePolicy:
    """Exact, known success probability per prompt.

    Args:
        value: ``value(prompt) -> p`` in [0, 1]: the share of continuations of ``prompt`` that succeed.
        right: the text of a successful continuation (e.g. ``"The answer is 18."``).
        wrong: the text of a failed one.
        truncated: ``truncated(prompt) -> k``: the first ``k`` samples hit ``max_tokens`` (default 0).
    """

    def __init__(self, value: Callable[[str], float], right: str, wrong: str,
                 truncated: Callable[[str], int] | None = None):
        self.value, self.right, self.wrong, self.truncated = value, right, wrong, truncated

    def __call__(self, prompt: str, j: int, n: int) -> Completion:
        k_trunc = self.truncated(prompt) if self.truncated else 0
        if j < k_trunc:
            return Completion("and then", "length", 2)
        ok = (j - k_trunc) < round(self.value(prompt) * (n - k_trunc))
        text = self.right if ok else self.wrong
        return Completion(text, "stop", len(text.split()))


class ScriptedEngine(Engine):
    """Deterministic engine driven by a policy. ``calls`` records every request (for budget checks)."""

    name = "scripted"
    uses_seed = False

    def __init__(self, policy: Policy = echo_policy, model: str = "scripted:echo", delay: float = 0.0,
                 scorer: Scorer = echo_scorer, tokenizer: Tokenizer = scripted_tokens, max_len: int | None = None,
                 classifier: Callable[[list[str]], list[list[float]]] | None = None):
        super().__init__()
        self.policy, self.model, self.delay = policy, model, delay
        self.scorer, self.tokenizer, self.max_len = scorer, tokenizer, max_len
        self.classifier = classifier  # classify_tokens: token texts -> per token class logits
        self._texts: dict[int, str] = {}  # token id -> its text (ids are hashes of the text)
        self.calls: list[Request] = []
        self.scored: list[str] = []  # every text scored, in order

    @classmethod
    def create(cls, model: str, seed: int = 0, **options) -> "ScriptedEngine":
        """The engine ``make_engine("scripted", model)`` builds (see :meth:`from_spec`); seed unused."""
        return cls.from_spec(model)

    @classmethod
    def from_spec(cls, spec: str) -> "ScriptedEngine":
        """``scripted`` or ``scripted:echo`` -> the echo policy, ``scripted:judge`` -> :func:`judge_policy`,
        ``scripted:clues`` -> :func:`clues_policy`, ``scripted:empty`` -> :func:`empty_policy`.

        Raises:
            ConfigError: another name.
        """
        policies = {"scripted": echo_policy, "scripted:echo": echo_policy, "scripted:judge": judge_policy,
                    "scripted:clues": clues_policy, "scripted:flat": echo_policy, "scripted:empty": empty_policy}
        if spec not in policies:
            raise ConfigError(f"unknown scripted model {spec!r} (use scripted:echo, scripted:judge, scripted:clues, "
                              f"scripted:flat or scripted:empty)")
        return cls(policies[spec], spec, float(os.environ.get("STEPKIT_SCRIPTED_DELAY", "0")),
                   scorer=flat_scorer if spec == "scripted:flat" else echo_scorer)

    def tokenize_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids (a stable hash of each token's text) and offsets from ``self.tokenizer``."""
        import zlib

        offsets = self.tokenizer(text)
        ids = [zlib.crc32(text[a:b].encode()) for a, b in offsets]
        self._texts.update((i, text[a:b]) for i, (a, b) in zip(ids, offsets))
        return ids, offsets

    def classify_tokens(self, token_ids: list[list[int]]) -> list[list[list[float]] | str]:
        """``self.classifier(token texts)`` for each text (the texts of ids :meth:`tokenize_offsets` made)."""
        if self.classifier is None:
            raise NotImplementedError("this scripted engine has no classifier")
        out: list[list[list[float]] | str] = []
        for ids in token_ids:
            self.scored.append("".join(self._texts[i] for i in ids))
            if self.max_len is not None and len(ids) > self.max_len:
                out.append(f"prompt too long: {len(ids)} tokens, max_model_len {self.max_len}")
                continue
            out.append(self.classifier([self._texts[i] for i in ids]))
            self.stats.scored_tokens += len(ids)
        return out

    def _prompt_logprobs(self, texts: list[str], token_ids: list[list[int]],
                         needed_from: list[int]) -> list[list[float | None] | str]:
        out: list[list[float | None] | str] = []
        for text, ids in zip(texts, token_ids):
            if self.delay:
                time.sleep(self.delay)
            self.scored.append(text)
            if self.max_len is not None and len(ids) > self.max_len:
                out.append(f"prompt too long: {len(ids)} tokens, max_model_len {self.max_len}")
                continue
            spans = self.tokenizer(text)[1:]
            over_text = getattr(self.scorer, "over_text", None)
            if over_text is not None:  # linear in the text's length
                out.append([None] + over_text(text, spans))
            else:  # a plain scorer function: each token's context sliced (quadratic in a long text)
                out.append([None] + [self.scorer(text[:a], text[a:b]) for a, b in spans])
        return out

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"

    def generate(self, requests: list[Request], sampling: SamplingConfig) -> list[list[Completion]]:
        out = []
        for r in requests:
            if self.delay:
                time.sleep(self.delay)
            self.calls.append(r)
            samples = []
            for j in range(r.n):
                c = self.policy(r.prompt, j, r.n)
                if isinstance(c, str):
                    c = Completion(c, "stop", len(c.split()))
                elif c.finish_reason == "error" and c.error is None:  # a policy's Completion("why", "error")
                    c = Completion.failed(c.text, c.num_tokens)
                samples.append(c)
            out.append(samples)
            self.stats.requests += 1
            self.stats.completions += r.n
            self.stats.generated_tokens += sum(c.num_tokens for c in samples)
        return out

    def describe(self) -> dict:
        return {"engine": "scripted", "model": self.model}
