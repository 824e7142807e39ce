"""Asking a far draft during a plain step (DraftSession.prefetch / at_hand), against a real in-process n-gram draft:
a prefetched block is used only after exactly the tokens it begins with, and the draft stays in step either way.

The "target" is the sequence itself, a repeating pattern the n-gram draft copies (as in test_draft_ahead).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from draft_service.ngram import NgramProposer
from specdec.runtime.config import ServerConfig
from specdec.decoding.sampling import SamplingParams
from tests.draft_service.inprocess import draft_server
from tests.verifier_service.draft.test_ahead import truth
from tests.verifier_service.draft.test_link_limits import target
from verifier_service.draft.client import DraftLink
from verifier_service.speculation.policy import RoundCost, SpeculationPolicy
from verifier_service.speculation.request import RequestSpeculation, Round

PROMPT = [truth(i) for i in range(20)]  # the pattern twice: the n-gram draft continues it


def scenario(body):
    async def main():
        async with draft_server() as (address, _servicer):
            link = DraftLink(address, ServerConfig(), target(), timeout_s=5.0, pipeline=False)
            session = link.session("r", SamplingParams())
            try:
                return await body(session)
            finally:
                session.close(None)
                await link.close()

    return asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("steps", [1, 2])
def test_a_prefetched_block_is_used_after_the_plain_steps_it_guessed(steps):
    """Asked for 4 (+1) after the prompt; the plain steps decode the pattern's next tokens, which the draft guessed:
    the block is the rest of its answer, and the draft's copy of the sequence is in step (the next ask continues)."""
    async def body(session):
        assert await session.prefetch(PROMPT, 4) == ""
        decoded = PROMPT + [truth(20 + i) for i in range(steps)]
        block, first_ok = await session.at_hand(decoded, 4)
        assert first_ok is True and block.ahead
        assert block.token_ids == [truth(len(decoded) + i) for i in range(5 - steps)]
        assert session.synced == len(decoded)
        session.accepted(len(block.token_ids))  # the target kept it all, then emitted its own next token
        tokens = decoded + block.token_ids + [truth(25)]
        again, reason = await session.propose(tokens, 4)
        assert reason == "" and again.token_ids == [truth(26 + i) for i in range(4)]
        return session.ahead.prefetched

    assert scenario(body) == {"used": 1}


def test_a_prefetched_block_after_a_token_it_did_not_guess_is_never_used():
    """The plain step decoded 99, which the draft did not propose: no block, the first-token check failed, and the
    next ask re-syncs the draft to the real tokens (its block follows them, not the discarded guess)."""
    async def body(session):
        await session.prefetch(PROMPT, 4)
        decoded = PROMPT + [99]
        assert await session.at_hand(decoded, 4) == (None, False)
        assert await session.at_hand(decoded, 4) == (None, None)  # consumed: asked once, judged once
        tokens = decoded + [truth(0), truth(1)]  # 99 was never seen; "11 12" continues as the pattern
        block, reason = await session.propose(tokens, 3)
        assert reason == "" and block.token_ids == [truth(2), truth(3), truth(4)]
        return session.ahead.prefetched

    assert scenario(body) == {"missed": 1}


def test_a_block_the_plain_steps_ran_past_is_not_used():
    """More tokens were decoded than the answer holds: nothing of it is left for this round."""
    async def body(session):
        await session.prefetch(PROMPT, 1)  # 2 tokens asked
        assert await session.at_hand(PROMPT + [truth(20), truth(21)], 1) == (None, True)
        return session.ahead.prefetched

    assert scenario(body) == {"missed": 1}


class SlowReader(NgramProposer):
    """An n-gram draft that takes `seconds` to read a prompt, off the event loop, as a model draft's prefill does."""

    inline = False

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def start(self, prompt_ids, sampling, return_probs, tenant=""):
        time.sleep(self.seconds)
        return super().start(prompt_ids, sampling, return_probs, tenant)


def test_a_draft_still_reading_the_prompt_keeps_its_stream_and_answers_later():
    """The first round times out while the draft reads the prompt: the stream is kept (not restarted, which would
    read the prompt again), rounds meanwhile are plain steps asking nothing, and the late answer is used as a
    prefetched block after the tokens it guessed; the back-off the timeout set is cleared by that answer."""
    async def main():
        async with draft_server(proposer=SlowReader(0.6)) as (address, servicer):
            link = DraftLink(address, ServerConfig(), target(), timeout_s=5.0, pipeline=False)
            session = link.session("r", SamplingParams())
            try:
                block, reason = await session.propose(PROMPT, 4, wait_s=0.1)
                assert (block.token_ids, reason) == ([], "timeout")
                assert session.reading_prompt and session.stream is not None
                stream = session.stream
                assert await session.at_hand(PROMPT + [truth(20)], 4) == (None, None)  # not read yet: no wait
                await asyncio.sleep(1.0)
                decoded = PROMPT + [truth(20), truth(21)]
                block, first_ok = await session.at_hand(decoded, 4)
                assert first_ok is True and block.token_ids == [truth(22), truth(23)]
                assert session.stream is stream and not session.reading_prompt and link.backoff.timeouts == 0
                assert len(servicer.live) == 1  # one sequence: the prompt was read once
                return session.ahead.prefetched
            finally:
                session.close(None)
                await link.close()

    assert asyncio.run(asyncio.wait_for(main(), 30)) == {"used": 1}


def test_a_round_spent_waiting_for_the_prompt_to_be_read_prices_no_block():
    """The request's first round times out while the draft reads the prompt. That says how long a prompt takes to
    read, not what a block of 4 costs: the policy records a plain step (not 4 drafted tokens, none accepted, at the
    round's whole time), the wait is not the draft's usual one, and the pace learns it as the opening's."""
    async def main():
        async with draft_server(proposer=SlowReader(0.6)) as (address, servicer):
            link = DraftLink(address, ServerConfig(), target(), timeout_s=0.1, pipeline=False)
            cost = RoundCost()
            speculation = RequestSpeculation(SpeculationPolicy(4, 8, cost=cost), link.session("r", SamplingParams()))
            try:
                block, reason = await speculation.propose(PROMPT, 4)
                assert (block.token_ids, reason) == ([], "timeout") and speculation.draft.reading_prompt
                speculation.record(Round(0, 0, 0.35, draft_wait_s=0.1, forward_s=0.25, fallback=reason))
                assert set(cost.seconds) == {0} and cost.seconds[0].value == pytest.approx(0.25)
                assert cost.acceptance[True].judged == 0.0, "no rejection is counted"
                assert cost.wait.value is None
                assert link.pace.predicted(4) is None and link.pace.opening.value == pytest.approx(0.2)
            finally:
                speculation.close(None)
                await link.close()

    asyncio.run(asyncio.wait_for(main(), 30))


class SizingNgram(NgramProposer):
    """An n-gram draft whose every block is sized by its evidence, as the hybrid draft's suffix side's: asked for k,
    it answers with twice as many where its match goes that far, and says so."""

    def start(self, prompt_ids, sampling, return_probs, tenant=""):
        sequence = super().start(prompt_ids, sampling, return_probs, tenant)
        propose = sequence.propose
        sequence.propose = lambda k: dataclasses.replace(propose(2 * k), sized_by_draft=True)
        return sequence


@pytest.mark.parametrize("prefetched", [False, True])
def test_a_block_the_draft_sized_may_be_longer_than_asked_asked_or_prefetched(prefetched):
    """Asked for 3 (prefetched: 3 + 1), the draft sizes its block by its match: 6 (8) tokens come, all kept for the
    policy to cut; a longer one than the draft's own --max-speculative-tokens is refused as before."""
    async def main():
        async with draft_server(proposer=SizingNgram()) as (address, servicer):
            link = DraftLink(address, ServerConfig(), target(), timeout_s=5.0, pipeline=False)
            session = link.session("r", SamplingParams())
            try:
                if prefetched:
                    assert await session.prefetch(PROMPT, 3) == ""
                    decoded = PROMPT + [truth(20)]
                    block, first_ok = await session.at_hand(decoded, 3)
                    assert first_ok is True and session.ahead.prefetched == {"used": 1}
                    assert block.token_ids == [truth(21 + i) for i in range(7)] and block.sized_by_draft
                else:
                    block, reason = await session.propose(PROMPT, 3)
                    assert reason == "" and block.sized_by_draft
                    assert block.token_ids == [truth(20 + i) for i in range(6)]
                link.max_k = 5  # a draft that sends more than its own limit
                block, reason = await session.propose(PROMPT + [truth(20)], 3)
                assert block.token_ids == [] and reason == "failed"
            finally:
                session.close(None)
                await link.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_prefetched_answer_times_the_draft_and_one_given_up_on_grows_its_estimate():
    """A block asked during a plain step and answered 0.3 s after its ask teaches the draft's pace that a block of
    k + 1 takes that long: where the policy steps while drafting, no other round would time the draft, and every wait
    would stay at the floor. A prefetch given up on (no answer within its wait) teaches that it takes longer."""
    async def main():
        async with draft_server(inject_delay_ms=300, enable_fault_injection=True) as (address, servicer):
            link = DraftLink(address, ServerConfig(), target(), timeout_s=5.0, pipeline=False)
            speculation = RequestSpeculation(SpeculationPolicy(4, 8, cost=RoundCost()),
                                             link.session("r", SamplingParams()))
            session = speculation.draft
            try:
                await session.propose(PROMPT, 4)  # opens the stream (the opening's own time)
                session.accepted(4)
                tokens = PROMPT + [truth(20 + i) for i in range(5)]
                assert await session.prefetch(tokens, 3) == ""
                block, first_ok = await session.at_hand(tokens + [truth(25)], 3)
                assert first_ok is True and block.token_ids
                speculation.record(Round(len(block.token_ids), len(block.token_ids), 0.4))
                assert link.pace.predicted(4) == pytest.approx(0.3, abs=0.15)  # asked 3 + 1
                tokens += [truth(25)] + block.token_ids + [truth(29)]
                assert await session.prefetch(tokens, 3) == ""
                assert await session.at_hand(tokens + [truth(30)], 3, wait_s=0.05) == (None, None)
                speculation.record(Round(0, 0, 0.1, fallback="failed"))
                assert link.pace.predicted(4) >= 2 * 0.05
            finally:
                speculation.close(None)
                await link.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_step_decoded_while_the_draft_drafts_is_timed_with_its_block_not_as_a_plain_step():
    """Plain steps took 0.1 s and the draft's answers 0.1 s. A step decoded while the draft drafts took 0.25 s (the
    two shared cores): that is not what a plain step costs, so neither the plain round's time nor its forward's
    learns it; and its block of 4 (3 asked, one more for the step's token), answered 0.3 s after its ask, teaches the
    policy that stepping beside the draft takes that long at that size (`RoundCost.ready_time`), against which
    stepping is weighed."""
    async def main():
        async with draft_server(inject_delay_ms=300, enable_fault_injection=True) as (address, _servicer):
            link = DraftLink(address, ServerConfig(), target(), timeout_s=5.0, pipeline=False)
            cost = RoundCost()
            for _ in range(3):
                cost.observe(0, 0, 0.1)
                cost.observe_forward(0, 0.1)
            cost.observe_wait(0.1)
            speculation = RequestSpeculation(SpeculationPolicy(4, 8, cost=cost), link.session("r", SamplingParams()))
            session = speculation.draft
            try:
                await session.propose(PROMPT, 4)
                session.accepted(4)
                tokens = PROMPT + [truth(20 + i) for i in range(5)]
                assert await session.prefetch(tokens, 3) == ""
                speculation.record(Round(0, 0, 0.25, forward_s=0.25, fallback="stepped"))
                assert cost.seconds[0].value == pytest.approx(0.1) and cost.forward[0].value == pytest.approx(0.1)
                assert cost.ready_time(4) is None  # nothing timed yet
                block, first_ok = await session.at_hand(tokens + [truth(25)], 3)
                assert first_ok is True and block.token_ids
                speculation.record(Round(len(block.token_ids), len(block.token_ids), 0.1, forward_s=0.1))
                assert cost.ready_time(4) == pytest.approx(0.3, abs=0.15)
            finally:
                speculation.close(None)
                await link.close()

    asyncio.run(asyncio.wait_for(main(), 30))
