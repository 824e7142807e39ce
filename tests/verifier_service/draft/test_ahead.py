"""Pipelined drafting, DraftLink against a real in-process draft (n-gram): blocks drafted ahead are used
exactly when the round's sync is the one they assumed, and never otherwise.

A simulated verifier drives the session: it accepts a block up to a chosen length and appends its own
next token (the "target" here is the sequence itself: a repeating pattern the n-gram draft copies).
"""

from __future__ import annotations

import asyncio

import pytest

from specdec.runtime.config import ServerConfig
from specdec.decoding.sampling import SamplingParams
from tests.draft_service.inprocess import draft_server
from tests.verifier_service.draft.test_link_limits import target
from verifier_service.draft.client import DraftLink
from verifier_service.draft.stream import MAX_INBOX

PATTERN = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]


def truth(position: int) -> int:
    """The target's token at a position: the pattern, repeated."""
    return PATTERN[position % len(PATTERN)]


async def run_rounds(session, rounds: int, k: int, accept=None, wait_s: float = 0.05):
    """Drive `rounds` verifier rounds; accept(round, block) -> how many draft tokens the target keeps (default:
    as many as match the truth). Returns [(came ahead, tokens, accepted)] and the sequence."""
    tokens = [truth(i) for i in range(2 * len(PATTERN))]
    seen = []
    for i in range(rounds):
        block, reason = await session.propose(tokens, k)
        assert reason in ("", "ahead_invalid", "ahead_discarded"), reason
        matches = 0
        for j, t in enumerate(block.token_ids):
            if t != truth(len(tokens) + j):
                break
            matches += 1
        accepted = matches if accept is None else min(matches, accept(i, block))
        session.accepted(accepted)
        tokens = tokens + block.token_ids[:accepted]
        tokens.append(truth(len(tokens)))  # the target's own token (bonus or correction)
        seen.append((block.ahead, list(block.token_ids), accepted))
        await asyncio.sleep(wait_s)  # the verify step: the draft drafts ahead meanwhile
    return seen, tokens


def scenario(rounds_fn, **draft_config):
    async def main():
        async with draft_server(**draft_config) as (address, servicer):
            link = DraftLink(address, ServerConfig(), target(), timeout_s=5.0)
            session = link.session("r", SamplingParams())
            try:
                return await rounds_fn(session), session.ahead
            finally:
                session.close(None)
                await link.close()

    return asyncio.run(main())


def test_a_fully_accepted_run_is_served_ahead():
    (seen, tokens), counts = scenario(lambda s: run_rounds(s, 8, 4))
    assert [ahead for ahead, _, _ in seen] == [False] + [True] * 7, seen
    assert all(accepted == len(block) == 4 for _, block, accepted in seen)
    assert tokens == [truth(i) for i in range(len(tokens))]
    assert (counts.used, counts.discarded) == (7, 0)


def test_a_rejection_discards_the_ahead_block_and_the_round_is_answered_on_request():
    # round 2 keeps only 1 of its 4 tokens: the block drafted ahead for round 3 assumed 4, so it is discarded
    (seen, tokens), counts = scenario(lambda s: run_rounds(s, 6, 4, accept=lambda i, b: 1 if i == 2 else 99))
    assert [ahead for ahead, _, _ in seen] == [False, True, True, False, True, True], seen
    assert tokens == [truth(i) for i in range(len(tokens))]  # every block was a valid draft for its round
    assert (counts.used, counts.discarded) == (4, 1)


def test_a_smaller_k_cuts_the_ahead_block():
    ks = iter([4, 2, 2, 3])

    async def rounds(session):
        seen = []
        for k in ks:
            part, _ = await run_rounds(session, 1, k)
            seen += part
        return seen

    (seen, counts) = scenario(rounds)
    assert [len(block) for _, block, _ in seen][1:] and all(len(b) <= k for (_, b, _), k in zip(seen, [4, 2, 2, 3]))


@pytest.mark.parametrize("fault", ["wrong_tag", "flood"])
def test_mis_tagged_and_flooded_ahead_blocks_are_dropped_and_counted(fault):
    (seen, tokens), counts = scenario(lambda s: run_rounds(s, 6, 4), inject_ahead_fault=fault, enable_fault_injection=True)
    assert tokens == [truth(i) for i in range(len(tokens))]
    if fault == "wrong_tag":
        assert not any(ahead for ahead, _, _ in seen) and counts.discarded == 5 and counts.used == 0
    else:  # the real one is used; 16 mis-tagged copies each round, beyond the inbox bound, are dropped
        assert [ahead for ahead, _, _ in seen] == [False] + [True] * 5
        assert counts.discarded >= 5 * 16 - MAX_INBOX


def test_wrong_ahead_tokens_are_verified_and_rejected_never_trusted():
    (seen, tokens), counts = scenario(lambda s: run_rounds(s, 6, 4), inject_ahead_fault="wrong_tokens", enable_fault_injection=True)
    assert tokens == [truth(i) for i in range(len(tokens))]
    assert all(accepted == 0 for ahead, _, accepted in seen if ahead)


def test_without_pipelining_nothing_comes_ahead():
    async def main():
        async with draft_server() as (address, _):
            link = DraftLink(address, ServerConfig(), target(), timeout_s=5.0, pipeline=False)
            session = link.session("r", SamplingParams())
            seen, _ = await run_rounds(session, 5, 4)
            session.close(None)
            await link.close()
            return seen, session.ahead

    seen, counts = asyncio.run(main())
    assert not any(ahead for ahead, _, _ in seen) and (counts.used, counts.discarded) == (0, 0)


@pytest.mark.parametrize("mode, inline, drafts_ahead", [
    ("cheap", True, True), ("cheap", False, False), ("always", False, True), ("never", True, False)])
def test_propose_ahead_chooses_which_proposers_draft_ahead(mode, inline, drafts_ahead):
    """--propose-ahead cheap (the default): n-gram and suffix (inline, microseconds) draft ahead; a model draft,
    whose ahead block would delay its answer to every miss, does so only with `always`."""
    import types

    from draft_service.config import DraftConfig
    from draft_service.server import DraftServicer
    from tests.draft_service.inprocess import INFO

    servicer = DraftServicer(types.SimpleNamespace(inline=inline, method="x"), INFO, DraftConfig(propose_ahead=mode))
    assert servicer._ahead_pays() is drafts_ahead


def test_a_suffix_draft_ahead_learns_only_the_target_tokens_and_never_rebuilds_its_tree(monkeypatch):
    """Drafting ahead, the suffix draft syncs itself to its own guesses; a miss rolls back below them. Only the
    target's tokens are indexed (the guesses once confirmed), so no miss rebuilds the request's tree, and the
    finished output the cache keeps is exactly the target's."""
    from draft_service import suffix as suffix_module
    from draft_service.suffix import SuffixConfig, SuffixProposer

    rebuilds = []
    real_tree = suffix_module.SuffixTree
    monkeypatch.setattr(suffix_module, "SuffixTree", lambda depth: rebuilds.append(depth) or real_tree(depth))
    proposer = SuffixProposer(SuffixConfig(suffix_scope="global"))

    async def main():
        async with draft_server(proposer=proposer) as (address, servicer):
            link = DraftLink(address, ServerConfig(), target(), timeout_s=5.0)
            session = link.session("r", SamplingParams())
            try:
                seen, tokens = await run_rounds(session, 8, 4, accept=lambda i, b: 1 if i in (2, 5) else 99)
                counts = session.ahead
                session.close(tokens)
                for _ in range(100):  # the close drains in the background
                    if proposer.cache.cached_requests:
                        break
                    await asyncio.sleep(0.02)
                return seen, tokens, counts
            finally:
                await link.close()

    seen, tokens, counts = asyncio.run(main())
    assert tokens == [truth(i) for i in range(len(tokens))]
    assert counts.used >= 3 and counts.discarded >= 2, (counts.used, counts.discarded)  # hits and misses both
    assert len(rebuilds) == 1  # the sequence's first tree, never rebuilt
    assert proposer.cache.outputs("") == [tokens[2 * len(PATTERN):]]
