"""verifier_service/draft/pace.py: a round's wait follows the draft's measured answer time.

Units: the prediction by block size, what a timeout teaches, the floor and the cap. Then the verifier's round
loop (TransformersEngine.rounds) over real Propose streams to an in-process model draft that is slower than
--draft-timeout-ms (each drafted token sleeps), against a target slowed to a known step: the draft is used
once its pace is measured, and the tokens are the target's greedy ones; and a hung draft costs a bounded
number of waits.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from draft_service.model_draft import ModelProposer
from specdec.runtime import metrics
from specdec.runtime.config import ServerConfig
from specdec.decoding.sampling import SamplingParams
from tests.draft_service.inprocess import draft_server
from tests.verifier_service.speculation.test_pipelined_sampling import INFO
from tests.verifier_service.speculation.test_rejection_sampler import build_small_vocab_pair
from verifier_service.engines.decode_loop import DecodeSpec
from verifier_service.draft.client import PATIENCE, DraftLink
from verifier_service.draft.pace import GROW, SLACK, DraftPace
from verifier_service.engines.transformers_engine import TransformersEngine
from verifier_service.speculation.request import RequestSpeculation
from verifier_service.speculation.policy import RoundCost, SpeculationPolicy


def test_a_size_not_timed_is_predicted_no_cheaper_than_its_neighbours():
    pace = DraftPace()
    assert pace.predicted(4) is None and pace.wait_s(4, floor_s=1.0, cap_s=10.0) == 1.0  # unmeasured: the floor
    pace.observe(2, 0.4)
    pace.observe(4, 0.6)
    assert pace.predicted(1) == pytest.approx(0.2)  # below the smallest size timed: its cost per token
    assert pace.predicted(3) == pytest.approx(0.5)  # between: linear
    assert pace.predicted(8) == pytest.approx(1.2)  # past the largest: its cost per token


def test_the_wait_is_slack_times_the_prediction_within_the_floor_and_the_cap():
    pace = DraftPace()
    pace.observe(4, 1.4)
    assert pace.wait_s(4, floor_s=1.0, cap_s=None) == pytest.approx(SLACK * 1.4)  # the flag is a floor, not a cap
    assert pace.wait_s(4, floor_s=1.0, cap_s=2.0) == pytest.approx(2.0)  # no longer than a block of 4 can pay for
    assert pace.wait_s(4, floor_s=5.0, cap_s=2.0) == 5.0  # never under the floor
    pace.observe(4, 0.01)
    assert pace.wait_s(4, floor_s=1.0, cap_s=2.0) == 2.0  # an average: one fast answer does not undo the others


def test_a_timeout_grows_the_estimate_and_the_first_round_of_a_stream_is_learnt_apart():
    pace = DraftPace()
    pace.timed_out(4, 1.0)
    assert pace.predicted(4) == pytest.approx(GROW * 1.0)  # it takes longer than the wait that was too short
    pace.timed_out(4, 0.5)
    assert pace.predicted(4) == pytest.approx(GROW * 1.0), "a shorter timeout says nothing new"
    pace = DraftPace()
    pace.observe(4, 1.0)
    pace.observe(4, 3.0, opening=True)  # the draft read the prompt first
    assert pace.predicted(4) == pytest.approx(1.0) and pace.predicted(4, opening=True) == pytest.approx(3.0)
    pace.timed_out(4, 4.0, opening=True)
    assert pace.predicted(4) == pytest.approx(1.0) and pace.predicted(4, opening=True) == pytest.approx(8.0)
    pace = DraftPace()
    pace.timed_out(4, 1.0)  # a first estimate from a timeout (2 s) ...
    pace.observe(4, 1.2, opening=True)  # ... and a first round faster than that, prompt and all
    assert pace.predicted(4) < 2.0 and pace.opening.value is None, "an estimate grown by a timeout comes down"
    pace = DraftPace()
    pace.observe(4, 1.0)
    pace.observe(4, 3.0, opening=True)
    pace.timed_out(4, 4.0, opening=True)
    # a stream's first round may wait longer than the cap: the prompt is read once per request
    assert pace.wait_s(4, floor_s=0.1, cap_s=1.0, opening=True) > 1.0 >= pace.wait_s(4, floor_s=0.1, cap_s=1.0)


def test_a_first_round_before_any_block_was_timed_teaches_the_opening_only():
    """A server's first round waits for the prompt to be read and the block drafted, with nothing to tell the two
    apart. Charged to the block, a long prompt would make that size look dear to the policy for as long as it is not
    asked again (a size the policy stops asking for is never re-timed); so it is the opening's."""
    pace = DraftPace()
    pace.timed_out(4, 1.0, opening=True)
    assert pace.predicted(4) is None and pace.opening.value == pytest.approx(GROW * 1.0)
    pace = DraftPace()
    pace.observe(4, 1.6, opening=True)
    assert pace.predicted(4) is None and pace.opening.value == pytest.approx(1.6)
    pace.observe(1, 0.2)
    assert pace.predicted(1, opening=True) == pytest.approx(1.8)  # a later stream's first round waits for both


def test_the_read_is_learnt_per_token_so_a_longer_sequence_is_predicted_to_take_longer():
    """What a draft that has not read the sequence yet will take to read it (the hybrid's model, priced before it is
    first asked): its first rounds' extra time over their block's, per token read. Not from a first round before any
    block was timed, which holds the block's time as well: 0.5 s for a block and a 30-token read, charged per token,
    predicted 10 s for a 600-token read."""
    pace = DraftPace()
    pace.observe(4, 0.5, opening=True, read_tokens=30)
    assert pace.read_s(600) is None and pace.opening.value == pytest.approx(0.5)
    pace.observe(4, 0.4)
    pace.observe(4, 0.4 + 1.0, opening=True)  # how many tokens it read not given: no figure per token
    assert pace.read_s(500) is None
    pace.observe(4, 0.4 + 1.0, opening=True, read_tokens=500)  # 2 ms a token
    assert pace.read_s(500) == pytest.approx(1.0) and pace.read_s(100) == pytest.approx(0.2)
    pace.timed_out(4, 2.0, opening=True, read_tokens=500)  # still reading after 2 s: at least 4 s less the block's
    assert pace.read_s(500) == pytest.approx(GROW * 2.0 - 0.4)


def test_the_policy_does_not_ask_for_a_block_that_cannot_arrive_in_time():
    """Rounds were timed at k = 0 and 1 only. Priced on the prior slope, a block of 8 looks nearly free; priced with
    the draft's pace, the policy asks for the block that pays with the draft's time, and for none past the timed
    one when the draft is slower per token than the target."""
    cost = RoundCost()
    for _ in range(4):
        cost.observe(0, 0, 1.0)
        cost.observe(1, 1, 1.1)
    for _ in range(10):
        cost.acceptance[True].add(4, 4)  # a draft that is nearly always right
    pace = DraftPace()
    pace.observe(1, 0.1)  # near at first ...
    assert SpeculationPolicy(4, 8, cost=cost).block_size(100, 100, pace=pace) == 8
    pace = DraftPace()
    pace.observe(4, 1.8)  # ... or 0.45 of a step per token (k = 8 would wait 3.6 steps)
    assert 1 <= SpeculationPolicy(4, 8, cost=cost).block_size(100, 100, pace=pace) <= 7
    pace = DraftPace()
    pace.observe(4, 4.4)  # slower per token than the target: no block past the one timed pays (not even to try)
    assert SpeculationPolicy(4, 8, cost=cost).block_size(100, 100, pace=pace) == 1
    assert SpeculationPolicy(4, 8, cost=cost).block_size(100, 100) == 8, "without the pace, blocks look nearly free"


def test_a_draft_timed_at_one_size_is_asked_for_a_smaller_block_where_that_pays():
    """The draft was timed at k = 4 only (0.35 s, the target's plain step 0.2 s) and half its tokens are accepted.
    Priced at that block's whole cost, a smaller one never looked cheaper, so it was never asked and never timed:
    every round asked for 4. At its cost per token, a block of 1 or 2 is asked, and timed."""
    cost = RoundCost()
    for _ in range(4):
        cost.observe(0, 0, 0.2)
        cost.observe(4, 1, 0.57)
    for _ in range(10):
        cost.acceptance[True].add(10, 5)
    pace = DraftPace()
    pace.observe(4, 0.35)
    assert 1 <= SpeculationPolicy(4, 8, cost=cost).block_size(100, 100, pace=pace) < 4


# --- the round loop against a slow in-process draft ----------------------------------------------------------

STEP_S = 0.06  # the target's forward pass, slowed to this
TOKEN_S = 0.025  # each drafted token costs the draft this: a block of 4 takes 0.1 s, about 0.4 of a step a token
FLOOR_MS = 15  # --draft-timeout-ms: shorter than any block, even of one token


class SlowTarget(TransformersEngine):
    """The tiny target, as slow as a real one's step against its draft."""

    def _forward(self, state, token_ids, last_only=False):
        time.sleep(STEP_S)
        return super()._forward(state, token_ids, last_only)


class SlowProposer(ModelProposer):
    """The tiny model draft, slower per drafted token than the floor allows for a block."""

    def start(self, prompt_ids, sampling, return_probs, tenant=""):
        sequence = super().start(prompt_ids, sampling, return_probs, tenant)
        propose = sequence.propose

        def slow_propose(k):
            time.sleep(TOKEN_S * k)
            return propose(k)
        sequence.propose = slow_propose
        return sequence


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_small_vocab_pair(tmp_path_factory.mktemp("slow-draft"), seed=5, noise=0.05, init_range=0.5)


async def generate(engine, spec, speculation) -> list[int]:
    tokens = []
    async for emitted in engine.rounds(spec, speculation):
        tokens += emitted
        if len(tokens) >= spec.max_tokens:
            break
    speculation.close(None)
    return tokens[:spec.max_tokens]


PROMPTS = [[3, 4, 5, 3, 4, 5, 3, 4], [2, 7, 2, 7, 2], [1, 2, 3], [9, 8, 7, 6, 5]]


def test_a_draft_slower_than_the_timeout_is_used_once_its_pace_is_measured(pair):
    target, draft = pair
    engine = SlowTarget(target)
    greedy = SamplingParams()

    async def main():
        async with draft_server(proposer=SlowProposer(draft), info=INFO) as (address, _):
            link = DraftLink(address, ServerConfig(), INFO, timeout_s=FLOOR_MS / 1000)
            cost = RoundCost()
            results = []
            for i, prompt in enumerate(PROMPTS):
                spec = DecodeSpec(f"r{i}", prompt, greedy, 20, [], None)
                plain = await generate(engine, spec, RequestSpeculation(SpeculationPolicy(4, 8), None))
                speculation = RequestSpeculation(SpeculationPolicy(4, 8, cost=cost),
                                                 link.session(spec.request_id, greedy))
                results.append((prompt, plain, await generate(engine, spec, speculation), speculation.stats))
            await link.close()
            return results, link.pace

    results, pace = asyncio.run(asyncio.wait_for(main(), 120))
    for prompt, plain, speculative, _stats in results:
        assert speculative == plain, prompt
    accepted = sum(stats.num_accepted_tokens for *_, stats in results)
    drafted = sum(stats.num_draft_tokens for *_, stats in results)
    print(f"figure: {accepted} of {drafted} draft tokens accepted; draft answer by k (ms): "
          f"{ {k: round(e.value * 1000) for k, e in sorted(pace.seconds.items())} }")
    assert accepted > 0, "the slow draft must be used once its pace is measured"
    assert min(e.value for e in pace.seconds.values()) * 1000 > FLOOR_MS, "every block takes longer than the floor"


def test_a_hung_draft_costs_a_bounded_number_of_waits(pair):
    """The draft never answers: after PATIENCE timeouts in a row the rounds stop asking for a back-off that grows
    with the waits; a 60-token request (3.6 s of plain steps) waits a handful of times, and decodes the target's
    tokens."""
    target, draft = pair
    engine = SlowTarget(target)
    greedy = SamplingParams()

    async def main():
        async with draft_server(proposer=ModelProposer(draft), info=INFO, enable_fault_injection=True,
                                inject_delay_ms=600_000) as (address, _):
            link = DraftLink(address, ServerConfig(), INFO, timeout_s=0.1)
            spec = DecodeSpec("hung", PROMPTS[0], greedy, 60, [], None)
            plain = await generate(engine, spec, RequestSpeculation(SpeculationPolicy(4, 8), None))
            speculation = RequestSpeculation(SpeculationPolicy(4, 8, cost=RoundCost()), link.session("hung", greedy))
            started = time.perf_counter()
            tokens = await generate(engine, spec, speculation)
            elapsed = time.perf_counter() - started
            await link.close()
            return plain, tokens, speculation, elapsed

    timeouts = metrics.FALLBACK_ROUNDS.labels(reason="timeout")
    before = timeouts._value.get()
    plain, tokens, speculation, elapsed = asyncio.run(asyncio.wait_for(main(), 120))
    waits = timeouts._value.get() - before
    print(f"figure: hung draft: {elapsed:.2f} s for 60 tokens ({60 * STEP_S:.2f} s of plain steps), {waits:.0f} waits")
    assert tokens == plain
    assert waits <= PATIENCE + 2, "waiting on a draft that never answers must cost a bounded number of waits"


def test_only_an_answer_teaches_the_pace():
    """A round that asked during the link's back-off (no stream, no wait), or whose draft failed, says nothing of
    how long the draft takes: the pace learns from answered rounds, and from timeouts as a lower bound."""
    from specdec.v1 import common_pb2
    from verifier_service.speculation.request import Round

    async def scenario():
        link = DraftLink("127.0.0.1:1", ServerConfig(), common_pb2.ModelInfo(vocab_size=10), timeout_s=0.2)
        speculation = RequestSpeculation(SpeculationPolicy(4, 8), link.session("r", SamplingParams()))
        for fallback, wait in (("backoff", 1e-5), ("failed", 0.01), ("unavailable", 0.01)):
            speculation.asked_k = 4
            speculation.record(Round(0, 0, 0.1, draft_wait_s=wait, fallback=fallback))
        assert link.pace.predicted(4) is None
        speculation.asked_k = 4
        speculation.record(Round(4, 2, 0.5, draft_wait_s=0.3))
        assert link.pace.predicted(4) == pytest.approx(0.3)
        speculation.asked_k = 4
        speculation.record(Round(0, 0, 1.1, draft_wait_s=1.0, fallback="timeout"))
        assert link.pace.predicted(4) == pytest.approx(2.0)
        await link.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
