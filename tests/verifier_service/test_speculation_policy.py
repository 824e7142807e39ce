"""Adaptive speculation: k from the speedup model with measured round times and acceptance."""

import pytest

from verifier_service.speculation_policy import (
    COOLDOWN_ROUNDS,
    HOPELESS_AFTER_ROUNDS,
    MAX_COOLDOWN_ROUNDS,
    PROBE_K,
    RoundCost,
    SpeculationPolicy,
)


def cost_of(a: float, b: float, acceptance: float | None = None) -> RoundCost:
    """A RoundCost that has seen rounds taking a + b k seconds at k = 0 and k = 4."""
    cost = RoundCost()
    for _ in range(3):
        cost.observe(0, 0, a)
        cost.observe(4, 0, a + 4 * b)
    cost.acceptance[True].value = acceptance
    return cost


def test_round_cost_fits_a_line_through_the_measured_block_sizes():
    a, b = cost_of(0.05, 0.02).line()
    assert a == pytest.approx(0.05) and b == pytest.approx(0.02)


def test_a_requested_k_is_kept_exactly():
    policy = SpeculationPolicy(default_k=4, max_k=16, requested_k=7, cost=cost_of(0.05, 0.05, 0.0))
    policy.observe(7, 0, 0.1)
    assert policy.block_size(100, 1000, live_sequences=99) == 7


def test_cheap_verification_and_high_acceptance_choose_a_long_block():
    policy = SpeculationPolicy(default_k=4, max_k=16, cost=cost_of(0.05, 0.002, acceptance=0.9))
    assert policy.block_size(1000, 1000) >= 8


def test_expensive_verification_and_low_acceptance_turn_speculation_off_then_probe():
    # this CPU in bf16: a 4-token block costs about 2.4 plain steps
    policy = SpeculationPolicy(default_k=4, max_k=16, cost=cost_of(0.07, 0.025, acceptance=0.2))
    assert policy.block_size(1000, 1000) == 0 and policy.off_reason == "not_paying"
    for _ in range(COOLDOWN_ROUNDS):
        assert policy.block_size(1000, 1000) == 0
    assert policy.block_size(1000, 1000) == PROBE_K  # cool-down over: a small retry


def test_acceptance_of_this_request_overrides_the_server_prior():
    policy = SpeculationPolicy(default_k=4, max_k=16, cost=cost_of(0.07, 0.025, acceptance=0.2))
    for _ in range(6):
        policy.observe(4, 4, 0.17)  # this request's drafts are all accepted (copying)
    assert policy.block_size(1000, 1000) > 0


def test_k_never_passes_max_tokens():
    policy = SpeculationPolicy(default_k=8, max_k=16, cost=cost_of(0.05, 0.001, acceptance=0.95))
    assert policy.block_size(remaining_tokens=3, remaining_context=1000) == 2


def test_speculation_turns_off_under_load_and_back_on():
    policy = SpeculationPolicy(default_k=4, max_k=16, max_concurrency=4)
    assert policy.block_size(1000, 1000, live_sequences=8) == 0 and policy.off_reason == "load"
    assert policy.block_size(1000, 1000, live_sequences=2) == 4  # nothing measured yet: the default k


def test_sampled_requests_take_their_prior_from_sampled_requests():
    cost = cost_of(0.07, 0.025, acceptance=0.9)  # greedy requests copy well
    cost.acceptance[False].value = 0.05  # sampled ones do not
    assert SpeculationPolicy(4, 16, cost=cost, greedy=True).block_size(1000, 1000) > 0
    assert SpeculationPolicy(4, 16, cost=cost, greedy=False).block_size(1000, 1000) == 0


def test_a_fully_accepted_block_grows_the_next_one():
    policy = SpeculationPolicy(4, 16, cost=cost_of(0.07, 0.025, acceptance=0.5))
    k = policy.block_size(1000, 1000)
    policy.observe(k, k, 0.07 + 0.025 * k)
    assert policy.block_size(1000, 1000) >= k + 2


def test_a_short_block_is_not_read_as_rejected_tokens():
    """Suffix and n-gram drafts return fewer tokens than asked when the evidence is short: k=8 asked,
    2 drafted and both accepted is a fully accepted block, not 6 rejections."""
    short = SpeculationPolicy(default_k=8, max_k=16, cost=cost_of(0.05, 0.002, acceptance=0.5))
    rejected = SpeculationPolicy(default_k=8, max_k=16, cost=cost_of(0.05, 0.002, acceptance=0.5))
    for _ in range(8):
        assert short.block_size(100, 1000) > 2
        short.observe(2, 2, 0.06)  # the block the draft returned: 2 tokens, both accepted
        rejected.observe(8, 2, 0.07)  # 8 drafted, 2 accepted
    assert short.alpha() > 0.9 > 0.5 > rejected.alpha()
    assert short.streak == 2 and short.block_size(100, 1000) >= 4  # a fully accepted block grows the next


def test_a_fixed_cost_per_drafted_round_is_counted_in_full():
    """A remote draft: every drafted round pays a 30 ms round trip on top of a 100 ms step, 5 ms per token.
    A line through all block sizes spread that over k and kept drafting at acceptance 0.25 (a loss); the plain
    step measured on its own shows blocks do not pay, so speculation turns off."""
    cost = RoundCost()
    for _ in range(3):
        cost.observe(0, 0, 0.100)
        cost.observe(2, 0, 0.100 + 0.030 + 2 * 0.005)
        cost.observe(4, 0, 0.100 + 0.030 + 4 * 0.005)
    cost.acceptance[True].value = 0.25
    assert cost.time(0) == pytest.approx(0.100)
    assert cost.time(3) == pytest.approx(0.145)
    policy = SpeculationPolicy(default_k=4, max_k=16, cost=cost)
    assert policy.block_size(1000, 1000) == 0 and policy.off_reason == "not_paying"
    # the same machine with the draft next door (no round trip) does pay at this acceptance
    near = RoundCost()
    for _ in range(3):
        near.observe(0, 0, 0.100)
        near.observe(2, 0, 0.100 + 2 * 0.005)
        near.observe(4, 0, 0.100 + 4 * 0.005)
    near.acceptance[True].value = 0.25
    assert SpeculationPolicy(default_k=4, max_k=16, cost=near).block_size(1000, 1000) > 0


def test_a_draft_as_slow_as_the_target_stays_off_although_every_block_is_accepted():
    """The model draft is the target's own size: every block is accepted, but a round with k drafted
    tokens takes about k + 1.5 plain steps (the draft's k forwards, then the verification). A probe that
    is accepted whole but slower than plain steps is not a retry that paid; and once the times show that
    even blocks accepted whole lose, the cool-down is the longest at once."""
    plain = 0.1
    cost = RoundCost()
    for _ in range(3):
        cost.observe(0, 0, plain)
    policy = SpeculationPolicy(default_k=4, max_k=8, cost=cost)
    for _ in range(HOPELESS_AFTER_ROUNDS):  # the first requests draft and lose, each block accepted whole
        cost.observe(1, 1, 2.5 * plain)
        cost.observe(4, 4, 5.5 * plain)
    assert cost.hopeless(cost.times(8))
    assert not cost.beat_plain(1, 2.5 * plain) and cost.beat_plain(1, 1.5 * plain)
    assert policy.block_size(1000, 1000) == 0 and policy.cooldown == MAX_COOLDOWN_ROUNDS


def test_an_accepted_probe_that_was_slower_than_plain_steps_lengthens_the_cool_down():
    cost = cost_of(0.07, 0.025, acceptance=0.2)
    policy = SpeculationPolicy(default_k=4, max_k=16, cost=cost)
    assert policy.block_size(1000, 1000) == 0
    for _ in range(COOLDOWN_ROUNDS):
        policy.block_size(1000, 1000)
    assert policy.block_size(1000, 1000) == PROBE_K
    policy.observe(PROBE_K, PROBE_K, 0.07 * 3)  # accepted, but 2 tokens in 3 plain steps' time
    assert policy.next_cooldown == 2 * COOLDOWN_ROUNDS
    fast = SpeculationPolicy(default_k=4, max_k=16, cost=cost)
    fast.block_size(1000, 1000)
    for _ in range(COOLDOWN_ROUNDS + 1):
        fast.block_size(1000, 1000)
    fast.observe(PROBE_K, PROBE_K, 0.09)  # accepted and 2 tokens in 1.3 plain steps' time: it paid
    assert fast.next_cooldown == COOLDOWN_ROUNDS


def test_a_hopeless_verdict_expires_so_that_short_requests_draft_again():
    """Blocks judged unable to pay give the longest cool-down; a request shorter than it never probes, so the
    verdict would stand for good. After MAX_COOLDOWN_ROUNDS plain rounds server-wide it lapses: the next request
    probes after the short cool-down, and its probe re-times drafted rounds."""
    plain = 0.1
    cost = RoundCost()
    for _ in range(3):
        cost.observe(0, 0, plain)
    for _ in range(HOPELESS_AFTER_ROUNDS):  # cold drafts: slow rounds, nothing accepted
        cost.observe(1, 0, 2.5 * plain)
    assert cost.hopeless(cost.times(8))
    for _ in range(MAX_COOLDOWN_ROUNDS):  # requests of 32 tokens, all plain
        cost.observe(0, 0, plain)
    assert not cost.hopeless(cost.times(8))
    policy = SpeculationPolicy(default_k=4, max_k=8, cost=cost)
    sizes = [policy.block_size(1000, 1000) for _ in range(COOLDOWN_ROUNDS + 2)]  # off at once, 8 plain, probe
    assert sizes[-1] == PROBE_K and not any(sizes[:-1]), sizes  # a probe within a 32-token request
    policy.observe(PROBE_K, PROBE_K, 1.2 * plain)  # the draft is warm now: a fast round, accepted whole
    assert cost.plain_since_drafted == 0
