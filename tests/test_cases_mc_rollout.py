"""Cases with stage mc_rollout: explicit max_tokens and truncation accounting, continuation prompts that
end in whitespace, and prefix caching recorded in the configuration."""

from __future__ import annotations

import pytest

from stepkit.engines.base import SamplingConfig
from stepkit.errors import ConfigError
from stepkit.grading.steps import render_prefix
from stepkit.prompts import CONTINUATION, render_continuation


class TokenizerChat:
    """The bundled model's real chat template (transformers tokenizer), without loading vLLM."""

    def __init__(self):
        from transformers import AutoTokenizer

        from stepkit.models import resolve_model

        self.tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))

    def render_chat(self, messages):
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@pytest.fixture(scope="module")
def chat():
    return TokenizerChat()


def test_sampling_config_is_explicit(cases):
    """vllm-default-max-tokens-16: stepkit never relies on vLLM's max_tokens=16 default."""
    c = cases["vllm-default-max-tokens-16"]
    cfg = SamplingConfig(**c["input"]["sampling_params"])  # temperature only, as in the report
    assert cfg.max_tokens == 512 and cfg.to_dict()["max_tokens"] == 512
    with pytest.raises(ConfigError):
        SamplingConfig(max_tokens=0)
    # Truncation is counted, not graded: see tests/test_mc_label.py::test_truncated_continuations_are_excluded_not_wrong
    # (scripted) and tests/test_mc_label_engine.py (real engine, tiny max_tokens).


@pytest.mark.parametrize("steps,sep,i", [
    (["Great question! The capital of France is "], "\n", 1),  # the case: prefix ends in a space
    (["Let x = 2.", "Then 2x = 4."], "\n\n", 2),                 # paragraph separator: ends in "\n\n"
    (["Let x = 2.", "Let x = 2."], "\n", 2),                      # final step equal to an earlier one
    (["Let x = 2."], "\n", 0),                                    # empty prefix (v_0)
    (["   "], "\n", 1),                                           # whitespace-only step
])
def test_continuation_prompt_keeps_prefix_and_no_end_of_turn(chat, cases, steps, sep, i):
    """continue-final-message-trailing-whitespace: the rendered prompt ends with the assistant prefix
    byte for byte (documented rule: chat template with generation prompt + raw prefix), never raises,
    and has no end-of-turn token after the prefix."""
    c = cases["continue-final-message-trailing-whitespace"]
    problem = c["input"]["messages"][0]["content"]
    prompt = render_continuation(chat, problem, steps, sep, i)
    prefix = render_prefix(steps, sep, i)
    assert prompt.endswith(prefix)
    head = prompt[: len(prompt) - len(prefix)]
    assert head == chat.render_chat(CONTINUATION.messages(problem))
    assert head.endswith("<|im_start|>assistant\n")
    assert "<|im_end|>" not in prompt[len(head):]
    if i:
        assert prompt.endswith(sep)  # the model starts a new step


def test_prefix_caching_is_part_of_the_configuration(cases):
    """vllm-prefix-cache-first-request-differs: caching is on by design; whether it was on is recorded,
    and --no-prefix-caching (for reproducibility studies) is a different configuration."""
    from stepkit.engines.base import EngineSpec

    on = EngineSpec("vllm", "smollm2-135m", 0, {"max_model_len": 2048, "tensor_parallel_size": 1}).identity()
    off = EngineSpec("vllm", "smollm2-135m", 0, {"enable_prefix_caching": False}).identity()
    assert on["enable_prefix_caching"] is True and off["enable_prefix_caching"] is False
    assert on != off
