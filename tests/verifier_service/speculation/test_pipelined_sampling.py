"""Sampling stays exact with pipelined drafting: the verifier's round loop (TransformersEngine.rounds) over a
real Propose stream to an in-process model draft that drafts ahead, at T=1, against the target's exact
marginals of the first three tokens. The third token is where blocks drafted ahead are used: they were
drafted before the second was known, on a guess, and may only be used when the guess came true.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from draft_service.model_draft import ModelProposer
from specdec.runtime.config import ServerConfig
from specdec.decoding.sampling import SamplingParams, probs_from_logits
from devkit.testing import pooled_chi_square_p_value
from specdec.v1 import common_pb2
from tests.draft_service.inprocess import draft_server
from tests.verifier_service.speculation.test_rejection_sampler import ENGINE_VOCAB, build_small_vocab_pair
from verifier_service.engines.decode_loop import DecodeSpec
from verifier_service.draft.client import DraftLink
from verifier_service.engines.transformers_engine import TransformersEngine
from verifier_service.speculation.request import RequestSpeculation
from verifier_service.speculation.policy import SpeculationPolicy

SAMPLES = 400
PARAMS = SamplingParams(temperature=1.0)
INFO = common_pb2.ModelInfo(model="small", vocab_size=ENGINE_VOCAB, max_context=64, tokenizer_fingerprint="fp",
                            tokenizer_class="T", tokenizer_vocab_size=ENGINE_VOCAB)


def three_token_marginals(model, prompt):
    """Exact target distributions of the first three generated tokens: [3, V]."""
    v = ENGINE_VOCAB
    with torch.inference_mode():
        first = probs_from_logits(model(input_ids=torch.tensor([prompt])).logits[0, -1:], PARAMS)[0]
        after1 = probs_from_logits(model(input_ids=torch.tensor([prompt + [x] for x in range(v)])).logits[:, -1],
                                   PARAMS)  # [V, V]
        pairs = torch.tensor([prompt + [x, y] for x in range(v) for y in range(v)])
        after2 = probs_from_logits(model(input_ids=pairs).logits[:, -1], PARAMS).reshape(v, v, v)
    joint2 = first[:, None] * after1  # [x1, x2]
    return torch.stack([first, joint2.sum(0), (joint2[:, :, None] * after2).sum((0, 1))])


def ahead_policy() -> SpeculationPolicy:
    return SpeculationPolicy(1, 8, requested_k=1, greedy=False)


async def sample_three(target, draft, prompt, policy=ahead_policy, counted=lambda draft: draft.ahead.used, **server):
    """Histograms [3, V] of the first three tokens over SAMPLES seeded requests, each with `policy()`, and the sum of
    `counted(draft session)`: the rounds that took the path under test. `server`: the draft service's settings."""
    engine = TransformersEngine(target)
    counts = torch.zeros(3, ENGINE_VOCAB)
    used = 0
    async with draft_server(proposer=ModelProposer(draft), info=INFO, **(server or {"propose_ahead": "always"})) \
            as (address, _):
        link = DraftLink(address, ServerConfig(), INFO, timeout_s=10.0)
        for i in range(SAMPLES):
            params = SamplingParams(temperature=1.0, seed=i)
            spec = DecodeSpec(f"r{i}", list(prompt), params, 8, [], 1)
            speculation = RequestSpeculation(policy(), link.session(spec.request_id, params))
            tokens = []
            rounds = engine.rounds(spec, speculation)
            async for emitted in rounds:
                tokens += emitted
                if len(tokens) >= 3:
                    break
            await rounds.aclose()
            speculation.close(None)
            used += counted(speculation.draft)
            for position in range(3):
                counts[position, tokens[position]] += 1
        await link.close()
    return counts, used


def assert_follows(counts, expected) -> None:
    """Each position's histogram against the target's exact marginal (pooled chi-square: bins expected to hold under 5
    samples are merged; a token of p = 1e-4 seen once is no evidence)."""
    for position in range(3):
        probs = expected[position].double()
        assert pooled_chi_square_p_value(counts[position].tolist(), (probs / probs.sum()).numpy()) > 1e-3, position


@pytest.fixture(scope="module")
def peaked_pair(tmp_path_factory):
    """A target peaked enough that the draft's guess of its next token often comes true, and a draft close to it."""
    return build_small_vocab_pair(tmp_path_factory.mktemp("peaked"), seed=5, noise=0.05, init_range=0.5)


@pytest.mark.slow
def test_tokens_sampled_with_blocks_drafted_ahead_follow_the_target(peaked_pair):
    target, draft = peaked_pair
    prompt = [1]
    expected = three_token_marginals(target, prompt)
    counts, used = asyncio.run(sample_three(target, draft, prompt))
    print(f"figure: {SAMPLES} samples, {used} rounds served by a block drafted ahead")
    assert used > SAMPLES // 10, "the pipelined path was hardly exercised"
    assert_follows(counts, expected)
