"""The proposer vLLM's model runners build: it proposes nothing, because our drafts reach vLLM through its scheduler.

vLLM (0.32) speculates only with a speculative method configured; `{"method": "custom_class", "model":
"verifier_service.engines.vllm_proposer.NoDrafts"}` makes it reserve draft slots and verify whatever
drafts the scheduler hands out, without a drafter of its own. Each model runner builds one (in the
verifier's process at one GPU, in every worker process beyond), and it returns an empty block per row.
The drafts come from the step thread through `vllm_scheduler.DraftScheduler` instead, which every rank
reads in the next step's `SchedulerOutput`.

This module imports nothing of ours: vLLM's worker processes import it by name.
"""

from __future__ import annotations


class NoDrafts:
    def __init__(self, vllm_config):
        self.vllm_config = vllm_config

    def load_model(self, *args, **kwargs) -> None:
        """vLLM hands the target model to its drafters; this one has nothing to load."""

    def propose(self, sampled_token_ids: list[list[int]], *args, **kwargs) -> list[list[int]]:
        """One empty block per row (sampled_token_ids: [rows][tokens emitted this step])."""
        return [[] for _ in sampled_token_ids]
