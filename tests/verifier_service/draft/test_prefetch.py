"""Asking a far draft during a plain step (DraftSession.prefetch / at_hand), against a real in-process n-gram draft:
a prefetched block is used only after exactly the tokens it begins with, and the draft stays in step either way.

The "target" is the sequence itself, a repeating pattern the n-gram draft copies (as in test_draft_ahead).
"""

from __future__ import annotations

import asyncio

import pytest

from specdec.runtime.config import ServerConfig
from specdec.decoding.sampling import SamplingParams
from tests.draft_service.inprocess import draft_server
from tests.verifier_service.draft.test_ahead import truth
from tests.verifier_service.draft.test_link_limits import target
from verifier_service.draft.client import DraftLink

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
