"""The scripted engine's scorers: the linear whole-text form gives exactly the per-token rule's values."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from stepkit.engines.scripted import (
    FLAT_LOGPROB,
    ScriptedEngine,
    echo_scorer,
    first_occurrence_ends,
    flat_scorer,
    scripted_tokens,
)
from tests.conftest import DATA


def reference_echo(text: str) -> list[float | None]:
    """The scorer as it was: each token's context sliced, ``token.strip() in text[:a]`` (quadratic)."""
    spans = scripted_tokens(text)
    return [None] + [-0.5 if text[a:b].strip() and text[a:b].strip() in text[:a] else -3.0 for a, b in spans[1:]]


def real_texts() -> list[str]:
    """Whole solutions of ProcessBench (gsm8k and math) and GSM8K, and one τ-bench conversation."""
    texts = []
    for name in ("gsm8k", "math"):
        rows = json.loads((DATA / "processbench" / f"{name}.json").read_text())
        texts += [r["problem"] + "\n\n" + "\n\n".join(r["steps"]) for r in rows[:40]]
    with open(DATA / "gsm8k" / "test.jsonl") as f:
        texts += [json.loads(next(f))["answer"] for _ in range(20)]
    conv = json.loads((DATA / "tau-bench" / "gpt-4o-airline.json").read_text())[0]
    texts.append(json.dumps(conv["traj"], ensure_ascii=False))  # ~30k characters of JSON and prose
    return texts


def test_echo_scores_of_real_text_equal_the_per_token_rule():
    texts = real_texts()
    engine = ScriptedEngine()
    ids = [engine.tokenize_offsets(t)[0] for t in texts]
    got = engine._prompt_logprobs(texts, ids, [1] * len(texts))
    assert got == [reference_echo(t) for t in texts]
    assert sum(len(t) for t in texts) > 100_000 and any(-0.5 in v for v in got) and any(-3.0 in v for v in got)


def test_flat_and_plain_function_scorers():
    text = "Tom has 6 apples. Tom buys 12 more, so Tom has 18 apples."
    spans = scripted_tokens(text)[1:]
    assert flat_scorer.over_text(text, spans) == [FLAT_LOGPROB] * len(spans) == [flat_scorer("", "x")] * len(spans)
    assert echo_scorer.over_text(text, spans) == [echo_scorer(text[:a], text[a:b]) for a, b in spans]
    seen = []  # a plain function still gets each token's context
    engine = ScriptedEngine(scorer=lambda ctx, tok: seen.append((ctx, tok)) or -1.0)
    (values,) = engine._prompt_logprobs([text], [engine.tokenize_offsets(text)[0]], [1])
    assert values == [None] + [-1.0] * len(spans) and seen == [(text[:a], text[a:b]) for a, b in spans]


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(text=st.text(alphabet="ab c.\n", max_size=60), word=st.text(alphabet="abc.", max_size=4))
def test_first_occurrence_ends_matches_str_find(text, word):
    end = first_occurrence_ends(text)
    at = text.find(word)
    assert end(word) == (None if at < 0 else at + len(word))
    assert all((end(word) is not None and end(word) <= a) == (word in text[:a]) for a in range(len(text) + 1))
