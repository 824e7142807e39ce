"""DraftBridge bookkeeping: what vLLM's step emitted becomes the round statistics, row by row."""

import asyncio

import numpy as np

from opentelemetry import context as otel_context
from specdec.sampling import SamplingParams
from verifier_service.decode_loop import DecodeSpec, DraftSync, Stats
from verifier_service.speculation_policy import SpeculationPolicy
from verifier_service.vllm_bridge import DraftBridge, Drafting


def drafting(prompt):
    spec = DecodeSpec("r", prompt, SamplingParams(temperature=1.0), 16, [], 4)
    return Drafting(spec, SpeculationPolicy(4, 16, 4), DraftSync(None), Stats(), otel_context.get_current())


def test_rows_record_accepted_tokens_and_skip_prefill_and_foreign_rows():
    loop = asyncio.new_event_loop()
    bridge = DraftBridge(None, loop, max_context=64, timeout_s=1.0)
    ours, prefilling = drafting([1, 2, 3]), drafting([4, 5])
    bridge.add("a", ours)
    bridge.add("b", prefilling)
    ours.last_k = 3  # the previous step verified 3 drafts for row "a"
    tokens = np.zeros((4, 64), dtype=np.int32)
    blocks = bridge.propose(["a", "b", "c"], [[7, 8], [], [9]], np.array([5, 2, 1, 0]), tokens, max_k=4)
    assert blocks == [[], [], []]  # no draft link: nothing to propose
    assert (ours.stats.num_rounds, ours.stats.num_draft_tokens, ours.stats.num_accepted_tokens) == (1, 3, 1)
    assert ours.stats.accepted_per_position == [1, 0, 0]
    assert prefilling.stats.num_rounds == 0  # still prefilling: nothing emitted yet
    assert ours.draft_spec.sampling.greedy  # vLLM takes no q: the draft must propose greedily
    bridge.remove("a")
    assert "a" not in bridge.sequences
    loop.close()
