"""Lossless when the verifier decodes a plain step while a far draft drafts (RequestSpeculation.propose ->
DraftSession.prefetch), and verifies the block after that step's token on the next round (at_hand).

The verifier's round loop (TransformersEngine.rounds) over real Propose streams to an in-process draft. The
policy's far-draft choice is forced (--far-draft step), so that every round without a block at hand takes it:
- greedy: the tokens are the target's own, whatever the draft guessed (n-gram, and a draft whose guesses are
  mostly wrong);
- sampled at T = 1: the first three tokens follow the target's exact marginals (a model draft sending q, whose
  rows are taken from the block's second on when the step's token was its first).
"""

from __future__ import annotations

import asyncio

import pytest

from draft_service.model_draft import ModelProposer
from specdec.runtime.config import ServerConfig
from specdec.decoding.sampling import SamplingParams
from tests.draft_service.inprocess import draft_server
from tests.verifier_service.speculation.test_pipelined_sampling import (
    INFO,
    SAMPLES,
    assert_follows,
    sample_three,
    three_token_marginals,
)
from tests.verifier_service.speculation.test_rejection_sampler import build_small_vocab_pair
from verifier_service.engines.decode_loop import DecodeSpec
from verifier_service.draft.client import DraftLink
from verifier_service.engines.transformers_engine import TransformersEngine
from verifier_service.speculation.request import RequestSpeculation
from verifier_service.speculation.policy import SpeculationPolicy


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_small_vocab_pair(tmp_path_factory.mktemp("stepped"), seed=5, noise=0.05, init_range=0.5)


async def generate(engine, spec, speculation, n: int) -> list[int]:
    tokens = []
    rounds = engine.rounds(spec, speculation)
    async for emitted in rounds:
        tokens += emitted
        if len(tokens) >= n:
            break
    await rounds.aclose()
    speculation.close(None)
    return tokens[:n]


@pytest.mark.parametrize("proposer", ["ngram", "model"])
def test_greedy_tokens_with_stepped_rounds_are_the_targets(pair, proposer):
    target, draft = pair
    engine = TransformersEngine(target)
    prompts = [[1], [3, 4, 5, 3, 4, 5, 3, 4], [2, 7, 2, 7, 2], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]]
    greedy = SamplingParams()

    async def main():
        outcomes, stepped = {}, 0
        async with draft_server(proposer=ModelProposer(draft) if proposer == "model" else None, info=INFO) as \
                (address, _):
            link = DraftLink(address, ServerConfig(), INFO, timeout_s=10.0)
            for i, prompt in enumerate(prompts):
                spec = DecodeSpec(f"r{i}", prompt, greedy, 24, [], None)
                plain = await generate(engine, spec, RequestSpeculation(SpeculationPolicy(4, 8), None), 24)
                speculation = RequestSpeculation(SpeculationPolicy(4, 8, far_draft="step"), link.session(spec.request_id, greedy))
                assert await generate(engine, spec, speculation, 24) == plain, prompt
                for outcome, n in speculation.draft.ahead.prefetched.items():
                    outcomes[outcome] = outcomes.get(outcome, 0) + n
                stepped += speculation.stats.num_fallback_rounds
            await link.close()
        return outcomes, stepped

    outcomes, stepped = asyncio.run(asyncio.wait_for(main(), 120))
    print(f"figure: {proposer}: {stepped} stepped rounds, prefetched blocks {outcomes}")
    assert stepped >= len(prompts) and outcomes.get("used", 0) >= 1 and outcomes.get("missed", 0) >= 1


def stepping_policy() -> SpeculationPolicy:
    return SpeculationPolicy(2, 8, requested_k=2, greedy=False, far_draft="step")


@pytest.mark.slow
def test_tokens_sampled_with_stepped_rounds_follow_the_target(pair):
    target, draft = pair
    prompt = [1]
    expected = three_token_marginals(target, prompt)
    counts, used = asyncio.run(sample_three(target, draft, prompt, stepping_policy,
                                            lambda session: session.ahead.prefetched["used"], propose_ahead="never"))
    print(f"figure: {SAMPLES} samples, {used} blocks verified after the plain step they guessed")
    assert used > SAMPLES // 10, "the stepped path was hardly exercised"
    assert_follows(counts, expected)


def test_a_stepping_round_takes_the_hybrids_suffix_block_at_once_and_stays_lossless(pair, monkeypatch):
    """Where the policy would decode a plain step while the model drafts, a draft that sizes some blocks at no
    forward's cost (the hybrid's suffix side) is asked for one first: a block that comes at once is verified instead
    of the step, and only where there is none does the round step. Greedy output is the target's either way."""
    from draft_service.hybrid import HybridProposer, HybridSequence
    from draft_service.suffix import SuffixProposer

    target, draft = pair
    engine = TransformersEngine(target)
    prompts = [[3, 4, 5, 3, 4, 5, 3, 4], [2, 7, 2, 7, 2], [6, 1, 6, 1, 6, 1]]
    greedy = SamplingParams()

    answers = []  # each sized-only ask's block length (the draft is in process)
    original = HybridSequence.propose_sized
    monkeypatch.setattr(HybridSequence, "propose_sized",
                        lambda self, k: answers.append(len((block := original(self, k)).token_ids)) or block)

    async def main():
        stepped = 0
        hybrid = HybridProposer(SuffixProposer(), ModelProposer(draft), 4, longest=8)
        async with draft_server(proposer=hybrid, info=INFO, max_speculative_tokens=8) as (address, _):
            link = DraftLink(address, ServerConfig(), INFO, timeout_s=10.0)
            for i, prompt in enumerate(prompts):
                spec = DecodeSpec(f"h{i}", prompt, greedy, 24, [], None)
                plain = await generate(engine, spec, RequestSpeculation(SpeculationPolicy(4, 8), None), 24)
                speculation = RequestSpeculation(SpeculationPolicy(4, 8, far_draft="step"),
                                                 link.session(spec.request_id, greedy))
                assert await generate(engine, spec, speculation, 24) == plain, prompt
                stepped += speculation.stats.num_stepped_rounds
            assert link.sizes_some_blocks
            await link.close()
        return stepped

    stepped = asyncio.run(asyncio.wait_for(main(), 120))
    answered = sum(1 for n in answers if n)
    print(f"figure: {len(answers)} sized-only asks in stepping rounds, {answered} answered, {stepped} stepped rounds")
    # (sized-only asks also come where the model's blocks stop paying, so the counts do not pair up one to one)
    assert answered >= 1 and stepped >= 1
