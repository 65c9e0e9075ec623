"""prm-label against the real vLLM engine: the bundled SmolLM2-135M read as a Math-Shepherd PRM (scoring call),
and a train-prm model read back through vLLM's pooling runner. The numbers are meaningless (the bundled model
was never trained on step tags; the trained one is a one-layer model); the positions are not: both are checked
against a plain transformers forward pass that reads each step at its own token.

One engine at a time: each prm-label run is a subprocess that ends before the next starts."""

from __future__ import annotations

import json
import math
import re

import pyarrow.parquet as pq
import pytest

from stepkit.stages.export_text import numbered
from tests.conftest import DATA
from tests.conftest import run_cli as run

pytestmark = pytest.mark.engine
TAG = " ки"


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    out = tmp_path_factory.mktemp("pb") / "pb.parquet"
    run("ingest", "processbench", DATA / "processbench" / "gsm8k.json", out, "--skip", 198, "--limit", 4)
    return out


@pytest.fixture(scope="module")
def shepherd(pb, tmp_path_factory):
    out = tmp_path_factory.mktemp("ms") / "ms.parquet"
    p = run("prm-label", pb, out, "--model", "smollm2-135m", "--no-progress")  # kind from config: a causal LM
    return out, p


def test_math_shepherd_scores_match_the_logits_at_each_tag(shepherd):
    """The official Math-Shepherd reading: one forward pass over the whole tagged text, and at each tag's last
    token the softmax over the logits of '+' and '-'. prm-label got each by two forced continuations."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stepkit.models import resolve_model

    out, p = shepherd
    rows = pq.read_table(out).to_pylist()
    assert all(r["prm_status"] == "ok" and len(r["prm_score"]) == len(r["steps"]) for r in rows)
    path = resolve_model("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    plus, minus = (tok(t, add_special_tokens=False).input_ids for t in ("+", "-"))
    assert len(plus) == len(minus) == 1
    worst = 0.0
    for r in rows:
        text = r["prompt"].strip() + " " + "\n".join(numbered(k + 1, s) + TAG for k, s in enumerate(r["steps"]))
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ends = [m.end() for m in re.finditer(re.escape(TAG), text)]
        assert len(ends) == len(r["steps"])
        at = [next(j for j, (_, e) in enumerate(enc.offset_mapping) if e == c) for c in ends]
        with torch.no_grad():
            logits = model(torch.tensor([enc.input_ids])).logits[0]
        want = [torch.softmax(logits[j, [plus[0], minus[0]]], -1)[0].item() for j in at]
        worst = max(worst, max(abs(a - b) for a, b in zip(want, r["prm_score"])))
        assert r["prm_score"] == pytest.approx(want, abs=0.05), (want, r["prm_score"])  # bf16 engine, fp32 here
    print(f"\nlargest |vllm - transformers| P(+) over {sum(len(r['steps']) for r in rows)} steps: {worst:.4f}")


def test_eval_processbench_on_the_output(shepherd):
    out, _ = shepherd
    r = run("eval", "processbench", out, "--pred", "prm_first_error")
    assert "prm_first_error" in r.stdout
    assert "math-shepherd" in run("stats", out).stdout


@pytest.mark.own_engine  # prm-label builds its pooling engine itself: the session's engine is closed first
def test_a_train_prm_model_is_read_back_through_the_pooling_runner(pb, tmp_path):
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from stepkit.stages.train_prm import TrainPRMConfig, train_prm
    from stepkit.stepwise import encode_text
    from tests.test_train_prm import build_tiny_base

    run("export", pb, tmp_path / "trl", "--format", "trl", "--labels", "reference_first_error")
    base = build_tiny_base(tmp_path / "base")
    model_dir = tmp_path / "prm"
    train_prm(str(tmp_path / "trl"), model_dir, TrainPRMConfig(base_model=str(base), max_length=512, max_steps=2,
                                                             batch_size=2, learning_rate=1e-3, step_separator="\n\n"),
              progress=False, log=lambda m: None)
    out = tmp_path / "tc.parquet"
    run("prm-label", pb, out, "--model", model_dir, "--no-progress")
    rows = pq.read_table(out).to_pylist()
    manifest = json.loads((tmp_path / "tc.manifest.json").read_text())
    assert manifest["config"]["layout"]["kind"] == "token-classification"
    assert manifest["config"]["layout"]["step_separator"] == "\n\n"  # from the model's stepkit-prm.json
    assert manifest["provenance"]["engine"]["runner"] == "pooling"
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForTokenClassification.from_pretrained(model_dir, dtype=torch.float32)
    worst = 0.0
    for r in rows:
        enc = encode_text(lambda s: tok(s, add_special_tokens=False).input_ids, r["prompt"], r["steps"], "\n\n")
        with torch.no_grad():
            probs = torch.softmax(model(torch.tensor([enc.input_ids])).logits[0].float(), -1)[:, 1]
        want = [probs[j].item() for j in enc.positions]
        worst = max(worst, max(abs(a - b) for a, b in zip(want, r["prm_score"])))
        assert r["prm_score"] == pytest.approx(want, abs=0.02)
        assert r["prm_first_error"] == next((i for i, s in enumerate(r["prm_score"]) if s < 0.5), -1)
        assert not math.isnan(sum(r["prm_score"]))
    print(f"\nlargest |vllm pooling - transformers| P(correct): {worst:.4f}")
