"""RequestSpeculation's one place a round is recorded: what the policy learns from a round without a block."""

import asyncio
import contextlib

import pytest

from specdec.runtime.config import ServerConfig
from specdec.decoding.sampling import SamplingParams
from specdec.v1 import common_pb2
from verifier_service.draft.client import DraftLink
from verifier_service.speculation.request import RequestSpeculation, Round
from verifier_service.speculation.policy import RoundCost, SpeculationPolicy


@contextlib.asynccontextmanager
async def hybrid_link(model, longest: int = 16):
    """An in-process hybrid draft (suffix side, then the tiny model; --hybrid-min-suffix 4) and a checked DraftLink
    to it."""
    from draft_service.hybrid import HybridProposer
    from draft_service.model_draft import ModelProposer
    from draft_service.suffix import SuffixProposer
    from tests.draft_service.inprocess import draft_server
    from tests.draft_service.test_hybrid import served_info

    hybrid = HybridProposer(SuffixProposer(), ModelProposer(model), 4, longest=longest)
    async with draft_server(proposer=hybrid, info=served_info(model), max_speculative_tokens=longest) as (address, _):
        link = DraftLink(address, ServerConfig(), served_info(model, max_context=512), timeout_s=5.0)
        await link.check_compatible()
        try:
            yield link
        finally:
            await link.close()


async def opened_by_a_sized_ask(link, far_draft: str) -> tuple[RequestSpeculation, list[int]]:
    """A hybrid request whose model blocks pay (rounds of 0.1 + 0.01 k s, accepted at 0.8) and whose stream a
    sized-only ask opened, at a point where the suffix side has nothing (after an unseen token): its model has read
    nothing. The request and its tokens."""
    from tests.draft_service.test_hybrid import REPEATED, UNSEEN
    from tests.verifier_service.speculation.test_policy import cost_of

    policy = SpeculationPolicy(4, 16, cost=cost_of(0.1, 0.01, acceptance=0.8), far_draft=far_draft)
    speculation = RequestSpeculation(policy, link.session("r", SamplingParams()))
    tokens = REPEATED + [UNSEEN]
    block, _ = await speculation._sized_block(tokens, 4, 1)
    assert speculation.draft.stream is not None and not block.token_ids
    return speculation, tokens


def test_a_draft_that_gives_nothing_is_charged_to_drafting_not_to_plain_steps():
    """The draft is asked for 4 tokens and does not answer (nothing listens at its address): the round's time,
    the wait included, is what drafting cost, with nothing accepted. A plain step's time stays a plain step's."""
    async def scenario():
        link = DraftLink("127.0.0.1:1", ServerConfig(), common_pb2.ModelInfo(vocab_size=10), timeout_s=0.2)
        cost = RoundCost()
        speculation = RequestSpeculation(SpeculationPolicy(4, 16, cost=cost), link.session("r", SamplingParams()))
        block, reason = await speculation.propose([1, 2, 3], 4)
        assert block.token_ids == [] and reason == "unavailable"
        speculation.record(Round(0, 0, 2.1, draft_wait_s=2.0, forward_s=0.1, fallback=reason))
        assert speculation.stats.num_rounds == 1 and speculation.stats.num_drafts == 0
        assert speculation.stats.num_fallback_rounds == 1
        assert set(cost.seconds) == {4} and cost.seconds[4].value == 2.1  # not a 2.1 s plain step
        assert cost.acceptance[True].accepted == 0.0 and cost.acceptance[True].judged == 1.0  # one rejection

        block, reason = await speculation.propose([1, 2, 3], 0)  # the policy chose a plain step
        speculation.record(Round(0, 0, 0.1, forward_s=0.1, fallback="not_paying"))
        assert cost.seconds[0].value == 0.1
        await link.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_slow_draft_turns_speculation_off():
    """Rounds that ask a draft which never answers in time cost 2 s each against 0.1 s plain steps: the next
    request's policy does not draft."""
    cost = RoundCost()
    for _ in range(3):
        cost.observe(0, 0, 0.1)
    for _ in range(8):
        cost.observe(4, 0, 2.1)  # as recorded above for each draft that gave nothing
    assert SpeculationPolicy(4, 16, cost=cost).block_size(1000, 1000) == 0


def test_a_retry_the_draft_had_nothing_for_is_over():
    """A real n-gram draft with no match for an unrepeated prompt answers a retry with no block and no fallback
    reason: the retry is over (it used to ask again every round). The ask is not carried into the next round's
    record, which did not ask (the vLLM engine records a step's round before it asks for the next block)."""
    from tests.draft_service.inprocess import draft_server
    from tests.verifier_service.draft.test_link_limits import target
    from tests.verifier_service.speculation.test_policy import cost_of
    from verifier_service.speculation.policy import COOLDOWN_ROUNDS, PROBE_K

    async def scenario():
        async with draft_server() as (address, _servicer):
            link = DraftLink(address, ServerConfig(), target(), timeout_s=5.0)
            policy = SpeculationPolicy(4, 16, cost=cost_of(0.07, 0.025, acceptance=0.2))  # blocks do not pay
            speculation = RequestSpeculation(policy, link.session("r", SamplingParams()))
            sizes = [speculation.block_size(1000, 1000) for _ in range(COOLDOWN_ROUNDS + 2)]
            assert sizes == [0] * (COOLDOWN_ROUNDS + 1) + [PROBE_K] and policy.probing
            block, reason = await speculation.propose([1, 2, 3, 4, 5], PROBE_K)
            assert block.token_ids == [] and reason == ""
            speculation.record(Round(0, 0, 0.09, forward_s=0.07))
            assert not policy.probing and speculation.asked_k == 0
            assert speculation.block_size(1000, 1000) == 0 and policy.cooldown == 2 * COOLDOWN_ROUNDS
            speculation.close(None)
            await link.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_chained_block_crosses_the_wire_and_is_cut_and_judged_as_the_policy_says():
    """A real suffix draft chains past its match ([50, 51] drafts [80, 81], then [50, 51, 80, 81] goes on with
    [53, 54, 55]). The verifier learns which tokens were chained (ProposeResponse.num_chained): where chained
    tokens cost 0.35 of a step each and are rarely accepted it verifies only the matched two; on a curve where
    they are nearly free it verifies all five, and the round judges the chained ones apart."""
    from draft_service.suffix import SuffixConfig, SuffixProposer
    from tests.draft_service.inprocess import draft_server
    from tests.draft_service.test_suffix import generate
    from tests.verifier_service.draft.test_link_limits import target
    from tests.verifier_service.speculation.test_policy import FLAT, STEEP, seen, timed

    suffix = SuffixProposer(SuffixConfig(suffix_scope="global"))
    generate(suffix, [7], [50, 51, 80, 81, 53, 54, 55])

    async def verified(curve):
        async with draft_server(proposer=suffix) as (address, _servicer):
            link = DraftLink(address, ServerConfig(), target(), timeout_s=5.0)
            cost = timed(curve)
            cost.acceptance[True], cost.chained[True] = seen(0.8), seen(0.25)
            policy = SpeculationPolicy(4, 8, cost=cost, draft_sizes_blocks=True)
            speculation = RequestSpeculation(policy, link.session("r", SamplingParams()))
            k = speculation.block_size(1000, 1000)
            block, reason = await speculation.propose([1, 2, 3, 50, 51], k)
            assert reason == ""
            speculation.record(Round(len(block.token_ids), len(block.token_ids), 0.1, draft_wait_s=0.001))
            speculation.close(None)
            await link.close()
            return block, cost

    block, _ = asyncio.run(asyncio.wait_for(verified(STEEP), 30))
    assert block.token_ids == [80, 81] and block.num_chained == 0
    block, cost = asyncio.run(asyncio.wait_for(verified(FLAT), 30))
    assert block.token_ids == [80, 81, 53, 54, 55] and block.num_chained == 3
    assert cost.chained[True].judged == pytest.approx(1000 * 0.99 + 3)  # 3 chained tokens judged, all accepted


def test_a_block_too_weak_to_pay_is_a_plain_step_after_the_wait():
    """A real suffix draft answers with a 1-token block ([50] was followed by 80 once). On the AVX2 EPYC's curve,
    where verifying one token costs 1.82 plain steps, and with 1-token blocks accepted 1 time in 5 on this server,
    the round verifies nothing ("weak_draft"); its time, less the wait for the draft, is a plain step's."""
    from draft_service.suffix import SuffixConfig, SuffixProposer
    from tests.draft_service.inprocess import draft_server
    from tests.draft_service.test_suffix import generate
    from tests.verifier_service.draft.test_link_limits import target
    from tests.verifier_service.speculation.test_policy import AVX2, seen, timed

    suffix = SuffixProposer(SuffixConfig(suffix_scope="global", suffix_chain=False))
    generate(suffix, [7], [50, 80])

    async def scenario():
        async with draft_server(proposer=suffix) as (address, _servicer):
            link = DraftLink(address, ServerConfig(), target(), timeout_s=5.0)
            cost = timed(AVX2)
            cost.acceptance[True], cost.by_length[True] = seen(0.7), {1: seen(0.2, 200)}
            policy = SpeculationPolicy(4, 8, cost=cost, draft_sizes_blocks=True)
            speculation = RequestSpeculation(policy, link.session("r", SamplingParams()))
            k = speculation.block_size(1000, 1000)
            block, reason = await speculation.propose([1, 2, 3, 50], k)
            assert k == 8 and block.token_ids == [] and reason == "weak_draft"
            plain = cost.seconds[0].samples
            speculation.record(Round(0, 0, 1.05, draft_wait_s=0.05, forward_s=1.0, fallback=reason))
            assert speculation.stats.num_fallback_rounds == 1 and speculation.stats.num_drafts == 0
            assert cost.seconds[0].samples == plain + 1 and cost.seconds[0].value == pytest.approx(1.0)
            speculation.close(None)
            await link.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


class RecordingSpan:
    """A span that keeps its events, as (name, attributes)."""

    def __init__(self):
        self.events = []

    def add_event(self, name, attributes):
        self.events.append((name, attributes))


def test_forced_tokens_are_their_own_figure():
    """A verified block's grammar-forced tokens (its last ones) are counted in the statistics and the round's span
    event, and the policy judges only the draft's own tokens: 2 of 3 verified tokens forced, all accepted."""
    from specdec.decoding.draft_block import DraftBlock

    span, policy = RecordingSpan(), SpeculationPolicy(4, 16)
    speculation = RequestSpeculation(policy, None, span)
    speculation.block = DraftBlock([5, 6, 7, 8], num_forced=3)  # verified as [5, 6, 7]: 2 forced
    speculation.record(Round(3, 3, 0.1))
    assert speculation.stats.num_forced_tokens == 2 and speculation.stats.to_proto().num_forced_tokens == 2
    assert span.events[-1] == ("round", {"k": 3, "accepted": 3, "round_ms": 100.0, "ahead": False, "forced": 2})
    assert (policy.acceptance.accepted, policy.acceptance.judged) == (1, 1)


def flat_rounds() -> RoundCost:
    """A RoundCost that has seen rounds of k = 0..8 taking 0.30 + 0.02 k seconds, each block accepted whole."""
    cost = RoundCost()
    for _ in range(4):
        cost.observe(0, 0, 0.30)
        for k in range(1, 9):
            cost.observe(k, k, 0.30 + 0.02 * k)
    return cost


def test_a_sized_rounds_span_event_says_how_far_its_blocks_price_is_borne_out():
    """A suffix block of the hybrid (sized by its match), cut and verified with none of its tokens accepted: the
    round's span event carries the tokens as drafted (`sized`) and the request's share borne out after it, now
    below 1 (its price expected accepted tokens that did not come)."""
    from specdec.decoding.draft_block import DraftBlock

    policy = SpeculationPolicy(4, 6, cost=flat_rounds())
    span = RecordingSpan()
    speculation = RequestSpeculation(policy, None, span)
    policy.block_size(100, 100)
    speculation.block, _ = speculation._verified(DraftBlock(list(range(10)), sized_by_draft=True), "", 2)
    verified = len(speculation.block.token_ids)
    assert verified >= 1
    speculation.record(Round(verified, 0, 0.3))
    name, event = span.events[-1]
    assert name == "round" and event["sized"] == verified
    assert event["borne_out"] == round(policy.sized_borne_out(), 3) < 1.0


def test_a_block_the_draft_sized_is_cut_to_what_pays_and_does_not_time_the_draft():
    """The hybrid draft's suffix side answers a round asked for k = 2 with 10 tokens sized by its match: the policy
    verifies as many as pay on the measured round times (more than 2, fewer than 10 where the tail would not pay),
    never past its largest k; and the instant answer teaches neither the draft's pace nor its wait."""
    from specdec.decoding.draft_block import DraftBlock

    policy = SpeculationPolicy(4, 6, cost=flat_rounds())
    for _ in range(10):
        policy.acceptance.add(4, 4)
    speculation = RequestSpeculation(policy, None)
    k = policy.block_size(100, 100)
    assert 1 <= k <= 6 and policy.cut_times is not None
    sized = DraftBlock(list(range(10)), sized_by_draft=True)
    block, reason = speculation._verified(sized, "", 2)
    assert reason == "" and 2 < len(block.token_ids) <= 6, "past k, within the policy's largest"
    block, _ = speculation._verified(DraftBlock(list(range(10))), "", 2)
    assert len(block.token_ids) == 10, "a block not sized by the draft is verified as sent (the client checks k)"
    policy.cut_times = None  # a fixed k or a retry: no cut on measured times
    block, _ = speculation._verified(sized, "", 2)
    assert len(block.token_ids) == 2


def test_a_hybrids_suffix_block_is_priced_on_the_forward_not_on_the_model_sides_waits():
    """Rounds of the hybrid draft at k = 1 came at once (suffix side, 0.2 s) and at k = 8 after the model side's 1 s
    wait (1.3 s): priced on those round times, verifying a suffix block past its first token looks dear, and a block
    matched 10 tokens deep was verified one token a round. Its answer is here and cost nothing: the forward alone
    (0.2 s + 0.01 s a token) prices it, and all of it is verified."""
    from specdec.decoding.draft_block import DraftBlock

    cost = RoundCost()
    for _ in range(4):
        cost.observe(0, 0, 0.2)
        cost.observe(1, 1, 0.2)
        cost.observe(8, 8, 1.3)
        cost.observe_wait(1.0)
        for n in (0, 1, 8):
            cost.observe_forward(n, 0.2 + 0.01 * n)
    assert cost.forward_times(10)[10] == pytest.approx(0.3)
    policy = SpeculationPolicy(4, 16, cost=cost)
    for _ in range(10):  # both sides' blocks have been accepted whole
        policy.acceptance.add(8, 8)
        policy.sized_acceptance.add(8, 8)
    for _ in range(10):
        cost.acceptance[True].add(8, 8)
        cost.sized_acceptance[True].add(8, 8)
    speculation = RequestSpeculation(policy, None)
    assert policy.block_size(100, 100) >= 1 and policy.cut_times is not None
    block, _ = speculation._verified(DraftBlock(list(range(10)), sized_by_draft=True), "", 1)
    assert len(block.token_ids) == 10


def test_a_streams_first_round_is_priced_without_the_drafts_prompt_read():
    """A model draft's first answer of a request came after 3 s, of which 2.6 s were its prompt read (its blocks of
    4 take 0.4 s): the policy times that round as 3.1 - 2.6 = 0.5 s, not 3.1 s, and a few such opening rounds
    cannot make blocks accepted whole look unable to pay. Before any block was timed, the round's time is not
    taken at all (nothing tells the prompt's part from the block's); its acceptance is."""
    from specdec.decoding.draft_block import DraftBlock

    async def scenario():
        link = DraftLink("127.0.0.1:1", ServerConfig(), common_pb2.ModelInfo(vocab_size=10), timeout_s=0.2)
        costs = []
        for known_pace in (False, True):
            if known_pace:
                for _ in range(3):
                    link.pace.observe(4, 0.4)
            cost = RoundCost()
            speculation = RequestSpeculation(SpeculationPolicy(4, 16, cost=cost), link.session("r", SamplingParams()))
            speculation.asked_k, speculation.opening, speculation.block = 4, True, DraftBlock([1, 2, 3, 4])
            speculation.record(Round(4, 4, 3.1, draft_wait_s=3.0, forward_s=0.1))
            assert cost.acceptance[True].accepted == 4.0 and cost.acceptance[True].judged == 4.0
            costs.append(cost)
        assert 4 not in costs[0].seconds
        assert costs[1].seconds[4].value == pytest.approx(0.5)
        await link.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_hybrids_suffix_block_is_priced_apart_from_the_model_blocks_k_sizes():
    """The hybrid's suffix side answered with 8 tokens sized by its match, 2 accepted, at once (0.25 s): that round's
    time and acceptance are not a model block's of 8, so neither enters the round times or the acceptance that size
    the model side's k (which had made its blocks look cheap, and k too large); it is judged among blocks matched
    as far, which cut the next such block. A model block is priced as always; from the suffix draft alone, which
    sizes all its blocks, a sized block is too."""
    from specdec.decoding.draft_block import DraftBlock

    for sizes_all in (False, True):
        cost = RoundCost()
        policy = SpeculationPolicy(4, 16, cost=cost, draft_sizes_blocks=sizes_all)
        speculation = RequestSpeculation(policy, None)
        speculation.block, policy.cut_from = DraftBlock(list(range(8)), sized_by_draft=True), 8
        speculation.record(Round(8, 2, 0.25))
        assert (8 in cost.seconds) == sizes_all
        assert cost.acceptance[True].judged == policy.acceptance.judged == (3.0 if sizes_all else 0.0)
        assert cost.by_length[True] and next(iter(cost.by_length[True].values())).judged == 3.0
        speculation.block = DraftBlock([1, 2, 3, 4])
        speculation.record(Round(4, 4, 1.2))
        assert cost.seconds[4].value == 1.2
        assert policy.acceptance.accepted == pytest.approx(2 * 0.9 + 4 if sizes_all else 4.0)  # (decayed once)


def test_where_the_hybrids_model_blocks_do_not_pay_its_suffix_side_is_still_asked(tiny_pair):
    """The policy finds the draft's blocks do not pay (its round times say a model block of 4 costs what 4 plain
    steps do): it decodes plainly, and a hybrid draft, which sizes some blocks at no forward's cost, is asked for
    those alone (NextBlock.sized_only). On a repeated span its suffix side answers, the block is verified as a sized
    one and priced apart (neither the round times nor the acceptance that decide k move); where it has nothing the
    round is a plain step. A draft that sizes no blocks so is not asked."""
    from specdec.modeling.models import load_causal_lm
    from tests.draft_service.test_hybrid import REPEATED, SPAN, UNSEEN
    from tests.verifier_service.speculation.test_policy import cost_of

    model = load_causal_lm(str(tiny_pair[1]))

    async def scenario():
        async with hybrid_link(model) as link:
            cost = cost_of(0.1, 0.1, acceptance=0.3)  # a block of 4 costs 0.5 s against 0.1 s plain steps
            for _ in range(3):
                for n in (0, 4, 16):
                    cost.observe_forward(n, 0.1 + 0.002 * n)  # of which the target's forward is nearly flat
            policy = SpeculationPolicy(4, 16, cost=cost)
            speculation = RequestSpeculation(policy, link.session("r", SamplingParams()))
            k = speculation.block_size(100, 1000)
            assert policy.off_reason == "not_paying" and speculation.sized_only and k == 16
            block, reason = await speculation.propose(REPEATED, k)
            assert reason == "" and block.sized_by_draft and block.token_ids == SPAN[12:12 + len(block.token_ids)]
            assert len(block.token_ids) >= 1
            seconds_before = {n: e.value for n, e in cost.seconds.items()}
            judged_before = cost.acceptance[True].judged
            speculation.record(Round(len(block.token_ids), len(block.token_ids), 0.12, draft_wait_s=0.01))
            assert {n: e.value for n, e in cost.seconds.items()} == seconds_before
            assert cost.acceptance[True].judged == judged_before and policy.acceptance.judged == 0
            assert speculation.stats.num_drafts == 1

            tokens = REPEATED + block.token_ids + [UNSEEN]
            k = speculation.block_size(100, 1000)
            assert speculation.sized_only
            block, reason = await speculation.propose(tokens, k)
            assert block.token_ids == [] and reason == "not_paying"
            speculation.record(Round(0, 0, 0.11, draft_wait_s=0.01, fallback=reason))
            assert cost.seconds[0].value < 0.11  # a plain step, its short wait not counted

            # a model block asked during a plain step (stepping while drafting) and not yet taken when the policy
            # turned the model off: the suffix side is still asked, and the prefetch's answer, stale, is dropped
            assert await speculation.draft.prefetch(tokens, 4) == "" and speculation.draft.prefetched is not None
            tokens = tokens + SPAN[:12]  # decoded plainly meanwhile: the span again, which the suffix side knows
            k = speculation.block_size(100, 1000)
            assert speculation.sized_only
            block, reason = await speculation.propose(tokens, k)
            assert reason == "" and block.sized_by_draft and block.token_ids == SPAN[12:12 + len(block.token_ids)]
            assert block.token_ids and speculation.draft.prefetched is None
            speculation.close(None)
            link.sizes_some_blocks = False
            other = RequestSpeculation(SpeculationPolicy(4, 16, cost=cost), link.session("s", SamplingParams()))
            assert other.block_size(100, 1000) == 0 and not other.sized_only

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_the_verifier_tells_the_hybrid_at_which_match_its_suffix_side_answers(tiny_pair):
    """With --hybrid-threshold priced, where the model's blocks pay but dearly, the policy prices a suffix block of a
    1-token match above them (NextBlock.min_sized = 1), and the draft's suffix side answers a 2-token match, which
    its own rule (--hybrid-min-suffix 4) would have given to the model. A fixed k, or the default --hybrid-threshold
    draft, sends no threshold: the model drafts."""
    from specdec.modeling.models import load_causal_lm
    from tests.draft_service.test_hybrid import UNIQUE
    from tests.verifier_service.speculation.test_policy import hybrid_policy

    model = load_causal_lm(str(tiny_pair[1]))
    prompt = UNIQUE + [7, 8, 9] + UNIQUE[-2:]  # the last 2 tokens occurred before: a 2-token match
    suffix = {1: 0.3, 2: 0.5, 3: 0.7, 4: 0.85}
    dear = {0: 0.1, 1: 0.16, 2: 0.2, 4: 0.28, 8: 0.45}

    async def scenario():
        async with hybrid_link(model, longest=8) as link:
            assert link.sizes_some_blocks
            sources = {}
            for name, requested_k, priced in (("priced", None, True), ("fixed", 4, True), ("draft", None, False)):
                policy = hybrid_policy(dear, suffix, requested_k, priced)
                speculation = RequestSpeculation(policy, link.session(name, SamplingParams()))
                k = speculation.block_size(100, 1000)
                block, reason = await speculation.propose(prompt, k)
                assert reason == "" and block.token_ids
                sources[name] = (speculation.min_sized, block.sized_by_draft)
                speculation.close(None)
            assert sources == {"priced": (1, True), "fixed": (0, False), "draft": (0, False)}

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_the_hybrids_first_model_ask_is_an_opening_not_a_prefetch(tiny_pair):
    """Sized-only asks opened the hybrid's stream; its model has read nothing. Where the policy would step while
    the draft drafts, the model's first ask is still asked and waited for as an opening (it reads the prompt, which
    an ordinary block's wait timed out on, ending the stream, so that the next ask read the prompt again); the
    model's later asks step while it drafts."""
    from specdec.modeling.models import load_causal_lm
    from tests.draft_service.test_hybrid import UNSEEN

    model = load_causal_lm(str(tiny_pair[1]))

    async def scenario():
        async with hybrid_link(model) as link:
            speculation, tokens = await opened_by_a_sized_ask(link, far_draft="step")
            block, reason = await speculation.propose(tokens, 4)
            assert reason == "" and speculation.asked_k == 4 and speculation.opening and len(block.token_ids) == 4
            speculation.record(Round(4, 0, 0.2, draft_wait_s=0.05, forward_s=0.1))
            tokens = tokens + [UNSEEN + 1]  # the target's token, not the model's: unseen again
            block, reason = await speculation.propose(tokens, 4)
            assert reason == "stepped" and speculation.draft.prefetched is not None
            speculation.close(None)

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_the_hybrids_model_is_not_asked_where_reading_the_sequence_costs_more_than_its_blocks_save(tiny_pair):
    """The model's blocks pay (a round of k takes 0.1 + 0.01 k s, accepted at 0.8: under 0.06 s saved a token they
    draft against 0.1 s plain steps), but the hybrid's model has read nothing, and the draft was measured to take
    0.1 s a token to read: over 40 tokens left its blocks would save under 2.4 s, less than the 4.3 s reading these
    43 tokens costs. So the free side alone is asked ("read_not_paying" where it has nothing), the model reads
    nothing, and the round is the free side's tally. Where the read is cheap (1 ms a token) the model is asked, and
    rounds after it are not tallied."""
    from specdec.modeling.models import load_causal_lm
    from tests.draft_service.test_hybrid import REPEATED, UNSEEN
    from tests.verifier_service.speculation.test_policy import cost_of
    from verifier_service.draft.pace import DraftPace

    model = load_causal_lm(str(tiny_pair[1]))
    tokens = REPEATED + [UNSEEN]  # the suffix side has nothing after an unseen token

    async def scenario():
        async with hybrid_link(model) as link:
            for per_token, asked in ((0.1, False), (0.001, True)):
                link.pace = DraftPace()
                link.pace.observe(4, 0.04)
                link.pace.observe(4, 0.04 + per_token * 100, opening=True, read_tokens=100)
                policy = SpeculationPolicy(4, 16, cost=cost_of(0.1, 0.01, acceptance=0.8))
                speculation = RequestSpeculation(policy, link.session(str(asked), SamplingParams()))
                k = speculation.block_size(40, 1000, context_length=len(tokens))
                assert k > 0 and speculation.sized_only != asked
                block, reason = await speculation.propose(tokens, k)
                if asked:
                    assert reason == "" and len(block.token_ids) == k and not block.sized_by_draft
                    assert speculation.asked_model
                else:
                    assert block.token_ids == [] and reason == "read_not_paying" and not speculation.asked_model
                speculation.record(Round(len(block.token_ids), 0, 0.12, draft_wait_s=0.01, forward_s=0.1,
                                         fallback=reason))
                assert policy.plain_share.tokens == (0 if asked else 1) == policy.plain_share.plain
                speculation.close(None)

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_request_with_speculation_off_does_not_teach_the_hybrid_what_its_free_side_brings(tiny_pair):
    """A request that turned speculation off (k = 0) on a hybrid stack decodes plain steps and asks the free side
    nothing: its rounds are not the free side's tally (`RoundCost.plain_share`), which prices the model's read for
    the requests that choose k. Tallied, every such step counted as a round the free side had nothing for, and a
    benchmark's plain runs on the hybrid's stack made the model's read look worth it on extraction."""
    from specdec.modeling.models import load_causal_lm
    from tests.draft_service.test_hybrid import REPEATED, UNSEEN
    from tests.verifier_service.speculation.test_policy import cost_of
    from verifier_service.draft.pace import DraftPace

    model = load_causal_lm(str(tiny_pair[1]))
    tokens = REPEATED + [UNSEEN]

    async def scenario():
        async with hybrid_link(model) as link:
            link.pace = DraftPace()  # the model's read is dear: the adaptive request asks its free side alone
            link.pace.observe(4, 0.04)
            link.pace.observe(4, 10.04, opening=True, read_tokens=100)
            cost = cost_of(0.1, 0.01, acceptance=0.8)
            for requested_k, tallied in ((0, 0), (None, 1)):
                policy = SpeculationPolicy(4, 16, requested_k, cost=cost)
                speculation = RequestSpeculation(policy, link.session(str(requested_k), SamplingParams()))
                k = speculation.block_size(40, 1000, context_length=len(tokens))
                block, reason = await speculation.propose(tokens, k)
                speculation.record(Round(len(block.token_ids), 0, 0.12, draft_wait_s=0.01, forward_s=0.1,
                                         fallback=reason))
                assert (policy.plain_share.tokens, cost.plain_share.tokens) == (tallied, tallied)
                speculation.close(None)

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_hybrids_first_model_ask_that_times_out_keeps_the_stream_and_takes_the_answer_when_it_comes(tiny_pair):
    """A sized-only ask opened the hybrid's stream; the model's first ask then times out (it reads the sequence
    first). The stream is kept and the draft reads on ("timeout", then plain steps while reading): ended, as an
    ordinary round's timeout ends it, the next ask opened a new stream and read it all again, and on a fresh stack
    two such asks cost 1 s each in one extraction request. The answer, when it comes, is the next block."""
    from specdec.modeling.models import load_causal_lm

    model = load_causal_lm(str(tiny_pair[1]))

    async def scenario():
        async with hybrid_link(model) as link:
            speculation, tokens = await opened_by_a_sized_ask(link, far_draft="wait")
            stream = speculation.draft.stream
            link.timeout_s = 1e-4  # no answer in time
            block, reason = await speculation.propose(tokens, 4)
            assert reason == "timeout" and block.token_ids == [] and speculation.opening
            assert speculation.draft.stream is stream and speculation.draft.reading_prompt
            link.timeout_s = 5.0
            await asyncio.sleep(0.5)
            block, reason = await speculation.propose(tokens, 4)
            assert reason == "" and len(block.token_ids) == 4 and speculation.draft.stream is stream
            speculation.close(None)

    asyncio.run(asyncio.wait_for(scenario(), 60))
