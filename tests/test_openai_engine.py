"""The ``openai`` engine: fault injection against a fake server, then the real vLLM server (CPU).

The fake-server tests are fast. The real-server tests (``engine`` mark) share ONE server for the session
(~40 s to start). A server that goes away mid-run and comes back: tests/faults/test_server_faults.py (a fake
server stopped and restarted on its port; a restart of the real one would cost another load).
"""

from __future__ import annotations

import time

import pyarrow.parquet as pq
import pytest

from stepkit.engines.base import Completion, Request, SamplingConfig, make_engine
from stepkit.engines.openai_engine import EngineUnavailable, OpenAIEngine, parse_prometheus
from stepkit.errors import ConfigError, StepkitError
from stepkit.shards import read_manifest
from tests.conftest import DATA, run_cli
from tests.servers import FakeServer, free_port

GREEDY = SamplingConfig(temperature=0.0, max_tokens=12)
SAMPLED = SamplingConfig(temperature=1.0, max_tokens=8)
LIST_COLUMNS = ("mc_rollouts", "mc_successes", "mc_truncated", "mc_value", "mc_label", "mc_estimated", "mc_progress")


# ---------------------------------------------------------------------------------------------------
# fake server: configuration errors, retries, per-request rejections


def test_unreachable_server_is_one_line_config_error_fast():
    url = f"http://127.0.0.1:{free_port()}/v1"
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        make_engine("openai", "smollm2-135m", base_url=url, concurrency=4, seed=0)
    assert time.monotonic() - t0 < 5
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"cannot reach the server at {url}: ConnectError")
    assert "start it first, e.g. python -m vllm.entrypoints.openai.api_server" in message


def test_wrong_model_name_is_config_error():
    with FakeServer(models=("other-model", "second")) as fake:
        with pytest.raises(ConfigError, match=rf"^the server at {fake.base_url} serves other-model, second, "
                                              r"not smollm2-135m$"):
            OpenAIEngine("smollm2-135m", fake.base_url)


def test_models_endpoint_missing_is_config_error():
    with FakeServer() as fake:
        with pytest.raises(ConfigError, match=r"answered GET /models with HTTP 404"):
            OpenAIEngine("smollm2-135m", fake.base_url[: -len("/v1")])  # forgot /v1


def test_generation_is_order_preserving_with_n_each_in_one_request():
    with FakeServer(models=("fake-model",)) as fake, OpenAIEngine("fake-model", fake.base_url, concurrency=3) as eng:
        requests = [Request(f"prompt number {i:03d}", n=1 + i % 4) for i in range(20)]
        results = eng.generate(requests, SamplingConfig(temperature=0.7, max_tokens=32, stop=("\n",), seed=5))
        assert [len(r) for r in results] == [r.n for r in requests]
        for i, comps in enumerate(results):
            assert [c.text for c in comps] == [f"<{requests[i].prompt[-12:]}|{j}>" for j in range(requests[i].n)]
            assert all(c.finish_reason == "stop" for c in comps)
        assert fake.hits["/v1/completions"] == 20  # n travels in one request
        body = fake.bodies[0]
        assert (body["temperature"], body["top_p"], body["max_tokens"], body["stop"]) == (0.7, 1.0, 32, ["\n"])
        assert "seed" not in body  # per-request seeds are off by default (they crash CPU servers)
        assert "return_token_ids" not in body  # only sent to vLLM servers
        # no per-choice token ids and no local tokenizer: usage.completion_tokens split evenly, sums exact
        for comps in results:
            k = len(comps)
            assert sum(c.num_tokens for c in comps) == 3 * k + (1 if k > 1 else 0)
        assert eng.stats.requests == 20 and eng.stats.completions == sum(r.n for r in requests)
        assert eng.stats.generated_tokens == sum(c.num_tokens for r in results for c in r)
        assert eng.generate([], SAMPLED) == []


def test_submitted_requests_run_concurrently_and_match_generate():
    """The asynchronous path: coroutines awaiting agenerate share the engine's loop and concurrency limit."""
    import asyncio

    with FakeServer(models=("fake-model",)) as fake, OpenAIEngine("fake-model", fake.base_url, concurrency=3) as eng:
        sampling = SamplingConfig(temperature=0.7, max_tokens=32)
        requests = [Request(f"prompt number {i:03d}", n=1 + i % 3) for i in range(12)]

        async def chain(r):  # each coroutine waits for its own answer before asking again
            first = await eng.agenerate(r, sampling)
            second = await eng.agenerate(Request(r.prompt + "!", 1), sampling)
            return first, second

        async def main():
            return await asyncio.gather(*(chain(r) for r in requests))

        results = asyncio.run(main())
        expected = eng.generate(requests, sampling)
        assert [first for first, _ in results] == expected
        assert all(len(second) == 1 and second[0].text.endswith("|0>") for _, second in results)
        assert eng.stats.requests == 12 * 2 + 12
        with pytest.raises(ConfigError, match="n >= 1"):
            eng.submit(Request("x", 0), sampling)


def test_greedy_n_is_sent_as_n_single_requests_and_seeds_are_opt_in():
    with FakeServer(models=("fake-model",)) as fake:
        with OpenAIEngine("fake-model", fake.base_url, per_request_seed=True) as eng:
            results = eng.generate([Request("a", 2), Request("b", 3)], SamplingConfig(temperature=0, max_tokens=3, seed=10))
        assert [[c.finish_reason for c in r] for r in results] == [["length"] * 2, ["length"] * 3]
        assert sorted(b["n"] for b in fake.bodies) == [1] * 5
        assert sorted(b["seed"] for b in fake.bodies) == [10, 11, 12, 13, 14]  # seed + index of the HTTP request


def test_fewer_choices_than_n_are_topped_up():
    with FakeServer(models=("fake-model",), max_choices=2) as fake, OpenAIEngine("fake-model", fake.base_url) as eng:
        (comps,) = eng.generate([Request("xyz", 5)], SAMPLED)
        assert len(comps) == 5 and all(c.finish_reason == "stop" for c in comps)
        assert [b["n"] for b in fake.bodies] == [5, 3, 1]


@pytest.mark.parametrize("status", [429, 503])
def test_transient_failures_are_retried_and_succeed(status):
    k = 3
    with FakeServer(fail_times=k, fail_status=status, retry_after="0.05") as fake:
        with OpenAIEngine("smollm2-135m", fake.base_url, max_retries=6) as eng:
            (comps,) = eng.generate([Request("hello", 2)], SAMPLED)
            assert [c.finish_reason for c in comps] == ["stop", "stop"]
            assert fake.hits["/v1/completions"] == k + 1
            assert eng.stats.extra["retries"] == k
            assert eng.describe()["retries"] == k


def test_retry_after_is_honoured():
    with FakeServer(fail_times=1, fail_status=429, retry_after="1") as fake:
        with OpenAIEngine("smollm2-135m", fake.base_url) as eng:
            t0 = time.monotonic()
            eng.generate([Request("hello")], SAMPLED)
            assert time.monotonic() - t0 >= 0.95
            assert fake.hits["/v1/completions"] == 2


def test_exhausted_retries_raise_engine_unavailable():
    with FakeServer(fail_times=1000, fail_status=503) as fake:
        with OpenAIEngine("smollm2-135m", fake.base_url, max_retries=2, concurrency=2) as eng:
            with pytest.raises(EngineUnavailable) as info:
                eng.generate([Request("a"), Request("b"), Request("c")], SAMPLED)
            message = str(info.value)
            assert isinstance(info.value, StepkitError) and "\n" not in message
            assert "keeps failing (HTTP 503: injected failure" in message and "after 2 retries" in message
            assert "rerun the same command to resume" in message
            assert eng.stats.requests == 0 and eng.stats.completions == 0  # nothing of the call is returned


def test_timeouts_raise_engine_unavailable():
    with FakeServer(delay=1.0) as fake:
        with OpenAIEngine("smollm2-135m", fake.base_url, timeout=0.2, max_retries=1) as eng:
            with pytest.raises(EngineUnavailable, match=r"did not answer within 0.2 s \(after 1 retries\)"):
                eng.generate([Request("slow")], SAMPLED)
        assert fake.hits["/v1/completions"] == 2


def test_server_gone_mid_run_raises_engine_unavailable():
    fake = FakeServer().start()
    eng = OpenAIEngine("smollm2-135m", fake.base_url, max_retries=1)
    try:
        assert eng.generate([Request("up")], SAMPLED)[0][0].finish_reason == "stop"
        fake.stop()
        with pytest.raises(EngineUnavailable, match=r"is unreachable \(ConnectError: .*\) after 1 retries"):
            eng.generate([Request("down")], SAMPLED)
    finally:
        eng.close()
        eng.close()  # idempotent


def test_http_400_becomes_error_completions_for_that_request_only():
    with FakeServer(reject=lambda p: "TOO LONG" in p) as fake, OpenAIEngine("smollm2-135m", fake.base_url) as eng:
        results = eng.generate([Request("fine"), Request("TOO LONG", 3), Request("also fine", 2)], SAMPLED)
        assert [len(r) for r in results] == [1, 3, 2]
        assert results[1] == [Completion.failed("HTTP 400: prompt rejected: too long")] * 3
        assert all(c.finish_reason == "stop" for c in results[0] + results[2])
        assert fake.hits["/v1/completions"] == 3  # a 400 is not retried


def test_cli_with_unreachable_server_fails_with_one_line(tmp_path):
    solutions = tmp_path / "solutions.parquet"
    _ingest_solutions(solutions, 2)
    url = f"http://127.0.0.1:{free_port()}/v1"
    p = _mc_label(url, solutions, tmp_path / "labeled.parquet", timeout=300)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines()[-1].startswith(f"error: cannot reach the server at {url}: ConnectError")
    assert not (tmp_path / "labeled.parquet").exists()


def test_chat_rendering_sources_without_vllm_endpoints():
    messages = [{"role": "user", "content": "Hi"}]
    with FakeServer() as fake:
        with pytest.raises(ConfigError, match=r"^--tokenizer nope: no such folder \(nor a bundled model name: smollm2-135m\)$"):
            OpenAIEngine("smollm2-135m", fake.base_url, tokenizer="nope")
        with OpenAIEngine("smollm2-135m", fake.base_url) as local:  # prepared registry name: local template
            text = local.render_chat(messages)
            assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
            assert local.describe()["chat_template_check"] == "not checked (no /tokenize endpoint)"
            assert local.render_chat(messages) is text  # cached
        with OpenAIEngine("smollm2-135m", fake.base_url, tokenizer="server") as remote:
            with pytest.raises(ConfigError, match=r"has no /tokenize endpoint to render chat prompts"):
                remote.render_chat(messages)


def test_prometheus_parsing():
    text = ('# HELP vllm:prefix_cache_hits_total x\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 96.0\n'
            'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 4.0\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="other"} 1000.0\n'
            'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 200.0\n')
    got = parse_prometheus(text, ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"), "m")
    assert got == {"vllm:prefix_cache_queries_total": 200.0, "vllm:prefix_cache_hits_total": 100.0}


# ---------------------------------------------------------------------------------------------------
# the real vLLM server (the session's)


@pytest.fixture(scope="module")
def server(vllm_server_url):
    """The session's real server (tests/shared_engines.py; also read by tests/test_likelihood_engine.py)."""
    print(f"\nvLLM server ready in {vllm_server_url.server.start_seconds[-1]:.1f} s at {vllm_server_url}")
    return vllm_server_url


@pytest.fixture(scope="module")
def engine(server):
    with make_engine("openai", "smollm2-135m", base_url=server, concurrency=32, seed=0) as eng:
        yield eng


@pytest.mark.engine
def test_real_results_are_order_preserving_with_n_each(engine):
    requests = [
        Request("The capital of France is", n=1),
        Request("1, 2, 3, 4, 5,", n=2),
        Request("A, B, C, D,", n=3),
        Request("The capital of France is", n=2),
    ]
    results = engine.generate(requests, GREEDY)
    assert [len(r) for r in results] == [1, 2, 3, 2]
    assert "Paris" in results[0][0].text and "Paris" in results[3][1].text
    assert all(c.text.startswith(" 6, 7") for c in results[1])
    assert all(c.text.startswith(" E, F") for c in results[2])
    assert all(c.finish_reason in ("stop", "length") and 0 < c.num_tokens <= 12 for r in results for c in r)

    before = engine.stats.extra["http_requests"]
    sampled = engine.generate([Request("1, 2, 3,", n=4), Request("Once upon a time", n=3)], SAMPLED)
    assert [len(r) for r in sampled] == [4, 3]
    assert engine.stats.extra["http_requests"] - before == 2  # n=4 and n=3 each in one request
    assert all(c.finish_reason in ("stop", "length") and 0 < c.num_tokens <= 8 for r in sampled for c in r)


@pytest.mark.engine
def test_real_tiny_max_tokens_gives_length(engine):
    prompt = engine.render_chat([{"role": "user", "content": "Write a long story about a dragon."}])
    results = engine.generate([Request(prompt, n=3)], SamplingConfig(temperature=0.8, max_tokens=2))
    assert [(c.finish_reason, c.num_tokens, c.truncated) for c in results[0]] == [("length", 2, True)] * 3


@pytest.mark.engine
def test_real_stop_strings_are_respected(engine):
    sampling = SamplingConfig(temperature=0.0, max_tokens=30, stop=(" 8", "\n"))
    (completion,) = engine.generate([Request("1, 2, 3, 4, 5,")], sampling)[0]
    assert completion.text == " 6, 7,"
    assert completion.finish_reason == "stop"


@pytest.mark.engine
def test_real_render_chat_matches_the_model_template(engine, server):
    from transformers import AutoTokenizer

    from stepkit.models import resolve_model

    messages = [{"role": "user", "content": "Solve: 2 + 3 =  "}]
    expected = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m")).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    assert engine.render_chat(messages) == expected
    assert engine.describe()["chat_template_check"] == "matches the server's /tokenize"
    # the same text rendered by the server itself (/tokenize + /detokenize), e.g. for a hub-only model
    with OpenAIEngine("smollm2-135m", server, tokenizer="server") as remote:
        assert remote.render_chat(messages) == expected
        assert remote.render_chat([{"role": "system", "content": "Be brief."}, *messages]).startswith(
            "<|im_start|>system\nBe brief.<|im_end|>\n")
        assert remote.describe()["chat_template"] == "server /tokenize + /detokenize"


@pytest.mark.engine
def test_real_prompt_too_long_is_a_per_request_error(engine):
    too_long = "x " * 9000  # beyond max_model_len (8192 tokens)
    results = engine.generate([Request("1, 2, 3,", 2), Request(too_long, 2)], SAMPLED)
    assert [c.finish_reason for c in results[0]] == ["length", "length"]
    assert [c.finish_reason for c in results[1]] == ["error", "error"]
    assert results[1][0].error.startswith("HTTP 400: ") and "context length" in results[1][0].error


@pytest.mark.engine
def test_real_describe_and_prefix_cache_counters(engine):
    d = engine.describe()
    assert d["engine"] == "openai" and d["model"] == "smollm2-135m" and d["concurrency"] == 32
    assert d["server_model_root"].endswith("smollm2-135m") and d["server_max_model_len"] == 8192
    assert d["server_version"] and d["per_request_seed"] is False
    long_prompt = engine.render_chat([{"role": "user", "content": "Count the sheep. " * 40}])
    before = engine.prefix_cache_stats()
    engine.generate([Request(long_prompt, 1)], SAMPLED)
    engine.generate([Request(long_prompt, 1)], SAMPLED)
    after = engine.prefix_cache_stats()
    assert after["queries"] > before["queries"]
    assert after["hits"] - before["hits"] >= 128  # the second request reuses the first one's blocks


@pytest.mark.engine
def test_real_throughput_figure(engine):
    """Not an assertion on speed: prints generated tokens/s for the report (64 prompts x n=4 x 64 tokens)."""
    prompt = engine.render_chat([{"role": "user", "content": "Tell me about the sea."}])
    t0 = time.monotonic()
    results = engine.generate([Request(prompt + f"{i}.", 4) for i in range(64)],
                              SamplingConfig(temperature=1.0, max_tokens=64))
    seconds = time.monotonic() - t0
    tokens = sum(c.num_tokens for r in results for c in r)
    print(f"\nopenai engine: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.0f} tokens/s")
    assert tokens > 0 and all(len(r) == 4 for r in results)


def _ingest_solutions(path, limit):
    p = run_cli("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", path, "--limit", limit, "--generator", "175b_verification", check=False)
    assert p.returncode == 0, p.stderr[-3000:]


def _mc_label(server, inp, out, *extra, timeout=900):
    return run_cli("mc-label", inp, out, "--engine", "openai", "--base-url", server, "--model", "smollm2-135m", "-k", "2", "--max-tokens", "64", "--no-progress", *extra, check=False)


def _check_labeled(rows):
    for r in rows:
        m = len(r["steps"])
        assert r["error"] is None, r["error"]
        for col in LIST_COLUMNS:
            assert len(r[col]) == m, (r["id"], col)
        assert all(0 <= s <= n for s, n in zip(r["mc_successes"], r["mc_rollouts"]))
        assert all(t <= n for t, n in zip(r["mc_truncated"], r["mc_rollouts"]))
        assert r["mc_status"] in ("ok", "no_signal")


@pytest.mark.engine
def test_real_cli_mc_label_through_the_server(server, tmp_path):
    solutions = tmp_path / "solutions.parquet"
    _ingest_solutions(solutions, 2)
    out = tmp_path / "labeled.parquet"
    p = _mc_label(server, solutions, out)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = pq.read_table(out).to_pylist()
    assert [r["id"] for r in rows] == [f"gsm8k-test-{i}:175b_verification" for i in range(2)]
    _check_labeled(rows)
    assert all(n == 2 for r in rows for n in r["mc_rollouts"][:-1])
    provenance = read_manifest(out)["provenance"]["engine"]
    assert provenance["engine"] == "openai" and provenance["base_url"] == str(server)


@pytest.mark.engine
def test_real_cli_rollout_through_the_server(server, tmp_path):
    """rollout on 4 real GSM8K problems x 4 samples through the openai engine."""
    problems = tmp_path / "problems.parquet"
    run_cli("ingest", "gsm8k", DATA / "gsm8k" / "test.jsonl", problems, "--limit", "4")
    out = tmp_path / "rollouts.parquet"
    p = run_cli("rollout", problems, out, "--engine", "openai", "--base-url", server, "--model", "smollm2-135m", "-n", "4", "--max-tokens", "160", "--no-progress", check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 16 and [r["id"] for r in rows[:4]] == [f"gsm8k-test-0:r{j}" for j in range(4)]
    for r in rows:
        assert r["rollout_finish_reason"] in ("stop", "length") and r["rollout_completion_tokens"] > 0
        if r["error"] is None:
            assert r["steps"] and all(s.strip() for s in r["steps"])
        if r["rollout_finish_reason"] == "length":
            assert r["outcome_correct"] is None
    manifest = read_manifest(out)
    assert manifest["provenance"]["engine"]["engine"] == "openai" and manifest["counts"]["samples"] == 16
