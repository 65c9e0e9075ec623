"""likelihood-label against the real engines with the bundled model: offline vLLM and a real vLLM server give
the same values, and both agree with a plain transformers forward pass (so token positions are right).

One engine at a time: the offline runs borrow the session's engine, which is closed before the session's
server starts (tests/conftest.py orders them); what they build is session-scoped, so it is built once."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from stepkit.shards import read_manifest
from tests.conftest import DATA
from tests.conftest import run_cli as run

pytestmark = pytest.mark.engine

# Two scorings of one text agree to the bf16 rounding of the batch each was computed in (vLLM's CPU kernels
# round differently for another batch; an offline batch is queued whole, so one run is reproducible, but a
# cached prefix was computed in an earlier batch and a server batches requests as they arrive). Measured on
# these 18 values (2026-12-07): cached vs uncached at most 0.16 nats (mean 0.058), offline vs server at most
# 0.19. Reading a span one token off (or without its first token) moves each of these values by 0.27 nats
# at least (median 0.43, a transformers forward pass), so the mean catches a position error, the maximum a
# broken value.
MAX_NATS, MEAN_NATS = 0.5, 0.15


def agree(a: list[dict], b: list[dict]) -> tuple[float, float]:
    """``(largest, mean)`` absolute difference of the rows' ``lh_value_start`` and ``lh_value`` entries."""
    diffs = [abs(u - v) for x, y in zip(a, b, strict=True)
             for u, v in zip([x["lh_value_start"], *x["lh_value"]], [y["lh_value_start"], *y["lh_value"]], strict=True)]
    return max(diffs), sum(diffs) / len(diffs)


@pytest.fixture(scope="session")
def pb(tmp_path_factory):
    out = tmp_path_factory.mktemp("pb") / "pb.parquet"
    run("ingest", "processbench", DATA / "processbench" / "gsm8k.json", out, "--limit", 3)
    return out


@pytest.fixture(scope="session")
def offline(pb, tmp_path_factory):
    out = tmp_path_factory.mktemp("lh") / "vllm.parquet"
    p = run("likelihood-label", pb, out, "--model", "smollm2-135m", "--no-progress")
    return out, p


def test_offline_vllm_labels_every_row(offline):
    out, p = offline
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 3
    for r in rows:
        assert r["lh_status"] == "ok" and r["error"] is None
        assert len(r["lh_value"]) == len(r["lh_gain"]) == len(r["lh_label"]) == len(r["steps"])
        assert all(v < 0 for v in r["lh_value"]) and r["lh_value_start"] < 0  # log-probabilities
        assert r["lh_first_error"] is not None and r["lh_answer_tokens"] >= 2  # the answer and its "."
    assert "likelihood-label" in p.stderr and "cached tokens" in p.stderr  # the summary table


def test_values_match_a_transformers_forward_pass(pb, offline):
    """An independent computation of one value: log P(answer | text before it) from the model's logits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stepkit.models import resolve_model
    from stepkit.prompts import load_answer_scaffold

    out, _ = offline
    row = pq.read_table(out).to_pylist()[0]
    path = resolve_model("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    sc = load_answer_scaffold()
    chat = tok.apply_chat_template([{"role": "user", "content": sc.user.replace("{problem}", row["prompt"])}],
                                   tokenize=False, add_generation_prompt=True)
    text, (a, b) = sc.answer_text(chat, row["steps"], row["step_separator"], 1, row["reference_answer"])
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc.input_ids
    positions = [j for j, (s, e) in enumerate(enc.offset_mapping) if s < b and e > a]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    value = sum(logp[j - 1, ids[j]].item() for j in positions)
    assert math.isclose(value, row["lh_value"][0], abs_tol=0.15), (value, row["lh_value"][0])  # bf16 vs fp32


def test_openai_server_gives_the_same_values(pb, offline, vllm_server_url, tmp_path):
    out, _ = offline
    served = tmp_path / "openai.parquet"
    run("likelihood-label", pb, served, "--engine", "openai", "--model", "smollm2-135m", "--base-url",
        vllm_server_url, "--no-progress")
    a, b = pq.read_table(out).to_pylist(), pq.read_table(served).to_pylist()
    for x, y in zip(a, b):
        assert x["lh_scored_tokens"] == y["lh_scored_tokens"] and x["lh_answer_tokens"] == y["lh_answer_tokens"]
    worst, mean = agree(a, b)
    print(f"\n|vllm - openai| over {sum(len(x['lh_value']) + 1 for x in a)} values: largest {worst:.2e}, mean "
          f"{mean:.2e} nats")
    assert worst <= MAX_NATS and mean <= MEAN_NATS


def test_stats_say_what_the_bundled_model_cannot_do(offline):
    out, _ = offline
    stats = run("stats", out).stdout
    assert "note: labelled with the bundled SmolLM2-135M, whose likelihood labels carried no step" in stats
    assert "(P = 0.31" in stats


@pytest.mark.engine
def test_implicit_prm_with_the_model_as_its_own_reference(pb, tmp_path):
    """Policy and reference are the same model, built one after the other from their specs: every step's
    log-ratio is 0, so both passes scored the same tokens at the same positions. Both specs are lent the
    session's engine (one load; its prefix cache is emptied before each, as a fresh engine's is). (The
    command refuses this configuration, whose rewards are 0 by construction: tests/test_likelihood.py; the
    stage built with an explicit reference spec is this check's way in.)"""
    from stepkit.engines.base import EngineSpec, SamplingConfig
    from stepkit.runner import run_stage
    from stepkit.stages.likelihood import LikelihoodConfig, LikelihoodStage
    from tests import shared_engines
    out = tmp_path / "ip.parquet"
    stage = LikelihoodStage(LikelihoodConfig(method="implicit-prm", reference_model="smollm2-135m"),
                            EngineSpec("vllm", "smollm2-135m", 0), SamplingConfig(),
                            reference=EngineSpec("vllm", "smollm2-135m", 0))
    with shared_engines.lent():
        run_stage(stage, pb, out, progress=False)
    rows = pq.read_table(out).to_pylist()
    for r in rows:
        assert r["lh_status"] == "ok" and len(r["lh_reward"]) == len(r["steps"])
        assert max(abs(x) for x in r["lh_reward"]) <= 1e-3 and max(abs(x) for x in r["lh_q"]) <= 1e-2


@pytest.mark.other_engine
def test_reading_the_prefix_cache_changes_no_value(pb, offline, tmp_path):
    """The offline engine reads the prefix cache for scoring (only positions after the cached prefix are kept);
    with prefix caching off every text is prefilled whole. The values agree to the batches' bf16 rounding
    (``MAX_NATS``, ``MEAN_NATS``)."""
    out, _ = offline
    plain = tmp_path / "plain.parquet"
    # --max-model-len 4096: the engine of test_agent_engine's 4,096-token judge (one load for both)
    run("likelihood-label", pb, plain, "--model", "smollm2-135m", "--no-prefix-caching", "--max-model-len", 4096,
        "--no-progress")
    a, b = pq.read_table(out).to_pylist(), pq.read_table(plain).to_pylist()
    assert read_manifest(out)["counts"]["cached_tokens"] > 0 == read_manifest(plain)["counts"]["cached_tokens"]
    worst, mean = agree(a, b)
    print(f"\n|cached - uncached|: largest {worst:.2e}, mean {mean:.2e} nats")
    assert worst <= MAX_NATS and mean <= MEAN_NATS
