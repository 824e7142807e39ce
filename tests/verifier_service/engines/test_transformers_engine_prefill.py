"""The transformers engine's chunked prefill: the same cache and tokens as one pass, other sequences' rounds
between a long prompt's chunks, prefill admission by the PrefillGate, and a cancelled call stopping between
chunks. A tiny seeded model in float32."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from specdec.modeling.models import load_causal_lm
from specdec.decoding.sampling import SamplingParams
from verifier_service.engines.decode_loop import DecodeSpec
from verifier_service.engines.transformers_engine import TransformersEngine
from verifier_service.speculation.request import RequestSpeculation
from verifier_service.speculation.policy import SpeculationPolicy

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def target(tiny_pair):
    return load_causal_lm(str(tiny_pair[0]))


def prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 300) for _ in range(length)]


class RecordingEngine(TransformersEngine):
    """Records every forward pass as (the sequence's token count, tokens fed), in the order they ran."""

    def __init__(self, model, chunk: int = 0, budget: int = 0):
        super().__init__(model)
        # set after construction, so that the same test runs (and fails) on an engine without these arguments
        self.prefill_chunk_tokens = chunk
        if budget:
            from verifier_service.prefill_gate import PrefillGate

            self.prefill_gate = PrefillGate(budget)
        self.forwards: list[tuple[int, int]] = []

    def _forward(self, state, token_ids, last_only=False):
        self.forwards.append((len(state.tokens), len(token_ids)))
        return super()._forward(state, token_ids, last_only)


def plain(spec_id: str, ids: list[int], max_tokens: int = 400) -> tuple[DecodeSpec, RequestSpeculation]:
    spec = DecodeSpec(spec_id, ids, GREEDY, max_tokens, [], None)
    return spec, RequestSpeculation(SpeculationPolicy(4, 8), None)


async def first_output(engine, ids: list[int], name: str) -> list[int]:
    rounds = engine.rounds(*plain(name, ids))
    try:
        return await rounds.__anext__()
    finally:
        await rounds.aclose()


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_gives_the_cache_and_tokens_of_one_pass(target, chunk):
    ids = prompt(150, seed=1)
    whole, chunked = TransformersEngine(target), TransformersEngine(target, prefill_chunk_tokens=chunk)
    states = [whole.start(ids), chunked.start(ids)]
    assert [s.cached_length for s in states] == [len(ids) - 1] * 2
    assert [s.cache.get_seq_length() for s in states] == [len(ids) - 1] * 2
    for layer_a, layer_b in zip(states[0].cache.layers, states[1].cache.layers):
        torch.testing.assert_close(layer_a.keys, layer_b.keys, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(layer_a.values, layer_b.values, rtol=1e-4, atol=1e-4)
    logits = [engine.score(state, [5, 6, 7]) for engine, state in zip((whole, chunked), states)]  # [4, V] each
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)

    async def greedy_tokens(engine) -> list[int]:
        tokens = []
        rounds = engine.rounds(*plain("g", ids))
        async for emitted in rounds:
            tokens += emitted
            if len(tokens) >= 40:
                break
        await rounds.aclose()
        return tokens[:40]

    assert asyncio.run(greedy_tokens(chunked)) == asyncio.run(greedy_tokens(whole))


def test_a_short_sequence_decodes_between_a_long_prompts_chunks(target):
    """The long prompt is fed in 75 chunk jobs; the short sequence's rounds run between them."""
    engine = RecordingEngine(target, chunk=4)
    long_ids, short_ids = prompt(301, seed=2), prompt(5, seed=3)

    async def scenario() -> int:
        short_rounds = engine.rounds(*plain("short", short_ids))
        await short_rounds.__anext__()  # the short sequence is decoding
        long_first = asyncio.get_running_loop().create_task(first_output(engine, long_ids, "long"))
        outputs_meanwhile = 0
        while not long_first.done():
            await short_rounds.__anext__()
            outputs_meanwhile += 1
        await long_first
        await short_rounds.aclose()
        return outputs_meanwhile

    outputs_meanwhile = asyncio.run(asyncio.wait_for(scenario(), 120))
    prefill_jobs = [n for length, n in engine.forwards if length == len(long_ids)]
    print(f"figure: {outputs_meanwhile} short rounds while the long prompt prefilled in {len(prefill_jobs)} jobs")
    assert max(prefill_jobs) <= 4
    assert outputs_meanwhile >= 30


def test_prefill_admission_takes_long_prompts_in_turn_and_short_ones_at_once(target):
    """Budget 150: two 120-token prompts prefill one after the other; a one-chunk prompt is not held back."""
    engine = RecordingEngine(target, chunk=16, budget=150)
    first, second, short = prompt(121, seed=4), prompt(122, seed=5), prompt(10, seed=6)

    async def scenario():
        tasks = [asyncio.get_running_loop().create_task(first_output(engine, ids, name))
                 for ids, name in ((first, "first"), (second, "second"))]
        await asyncio.sleep(0)  # both asked for admission: the second waits
        assert engine.prefill_gate.in_flight == 120 and engine.prefill_gate.num_waiting == 1
        await first_output(engine, short, "short")  # a one-chunk prompt prefills meanwhile
        await asyncio.gather(*tasks)
        assert engine.prefill_gate.in_flight == 0

    asyncio.run(asyncio.wait_for(scenario(), 120))
    order = [length for length, n in engine.forwards if n > 1]  # prefill jobs (rounds here feed one token)
    last_of_first, first_of_second = max(i for i, x in enumerate(order) if x == 121), order.index(122)
    assert last_of_first < first_of_second, order
    assert order.index(10) < last_of_first, "the short prompt waited for the long prefill"


def test_a_cancelled_call_stops_its_prefill_between_chunks(target):
    engine = RecordingEngine(target, chunk=4)
    long_ids = prompt(301, seed=7)

    async def scenario():
        task = asyncio.get_running_loop().create_task(first_output(engine, long_ids, "cancelled"))
        while sum(n for _, n in engine.forwards) < 8:  # two chunks in
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the compute thread finishes what it runs now; nothing of this sequence is queued after it
        await asyncio.get_running_loop().run_in_executor(engine._compute, lambda: None)

    asyncio.run(asyncio.wait_for(scenario(), 120))
    fed = sum(n for _, n in engine.forwards)
    print(f"figure: cancelled after {fed} of {len(long_ids) - 1} prompt tokens")
    assert fed < len(long_ids) - 1 and len(engine.forwards) <= 5
