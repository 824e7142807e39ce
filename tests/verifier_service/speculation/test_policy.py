"""Adaptive speculation: k from the speedup model with measured round times and acceptance."""

import pytest

from verifier_service.draft.pace import DraftPace
from verifier_service.speculation.policy import (
    COOLDOWN_ROUNDS,
    DECAY,
    EXPLORE_Z,
    HOPELESS_AFTER_ROUNDS,
    MAX_COOLDOWN_ROUNDS,
    PROBE_K,
    SERVER_DECAY,
    Acceptance,
    Batch,
    Calibration,
    RoundCost,
    SpeculationPolicy,
    StepCost,
    waiting_and_stepping,
)


def seen(alpha: float, tokens: float = 1000.0) -> Acceptance:
    """A server-wide acceptance that has judged `tokens` draft tokens at rate alpha."""
    return Acceptance(SERVER_DECAY, accepted=alpha * tokens, judged=tokens)


def cost_of(a: float, b: float, acceptance: float | None = None) -> RoundCost:
    """A RoundCost that has seen rounds taking a + b k seconds at k = 0 and k = 4."""
    cost = RoundCost()
    for _ in range(3):
        cost.observe(0, 0, a)
        cost.observe(4, 0, a + 4 * b)
    cost.acceptance[True] = seen(acceptance) if acceptance is not None else Acceptance(SERVER_DECAY)
    return cost


def timed(seconds_by_k: dict[int, float]) -> RoundCost:
    """A RoundCost that has seen 3 rounds of each block size k in `seconds_by_k` (k = 0: a plain step), taking
    those seconds, in that order each time."""
    cost = RoundCost()
    for _ in range(3):
        for k, t in seconds_by_k.items():
            cost.observe(k, 0, t)
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


def test_a_draft_none_of_whose_blocks_was_timed_is_asked_for_the_configured_k():
    """Verification nearly flat and acceptance high: priced as if drafting were free, k is the largest. A model draft
    whose answer time is not known yet (its pace holds at most an opening) is asked for the configured k, which
    arrives within the floor's wait and is timed; once a block was timed, the pace prices every size."""
    cost = cost_of(0.05, 0.001, acceptance=0.95)
    pace = DraftPace()
    assert SpeculationPolicy(default_k=4, max_k=16, cost=cost).block_size(1000, 1000, pace=None) == 16
    assert SpeculationPolicy(default_k=4, max_k=16, cost=cost).block_size(1000, 1000, pace=pace) == 4
    pace.observe(4, 1.5, opening=True, read_tokens=300)  # a first round: all of it the opening's
    assert SpeculationPolicy(default_k=4, max_k=16, cost=cost).block_size(1000, 1000, pace=pace) == 4
    pace.observe(4, 0.004)  # a fast draft, timed
    assert SpeculationPolicy(default_k=4, max_k=16, cost=cost).block_size(1000, 1000, pace=pace) > 4


def test_speculation_turns_off_under_load_and_back_on():
    policy = SpeculationPolicy(default_k=4, max_k=16, max_concurrency=4)
    assert policy.block_size(1000, 1000, live_sequences=8) == 0 and policy.off_reason == "load"
    assert policy.block_size(1000, 1000, live_sequences=2) == 4  # nothing measured yet: the default k


def test_sampled_requests_take_their_prior_from_sampled_requests():
    cost = cost_of(0.07, 0.025, acceptance=0.9)  # greedy requests copy well
    cost.acceptance[False] = seen(0.05)  # sampled ones do not
    assert SpeculationPolicy(4, 16, cost=cost, greedy=True).block_size(1000, 1000) > 0
    assert SpeculationPolicy(4, 16, cost=cost, greedy=False).block_size(1000, 1000) == 0


def test_acceptance_counts_a_block_only_up_to_its_first_rejection():
    """Verification stops at the first rejected token: 8 drafted with 2 accepted is 2 accepted of 3 judged. Counting
    all 8 put this request at alpha 0.25, where blocks stop paying; it is at 2/3."""
    policy = SpeculationPolicy(default_k=8, max_k=16, cost=cost_of(0.05, 0.002))
    for _ in range(30):
        policy.observe(8, 2, 0.07)
    assert policy.alpha() == pytest.approx(2 / 3, abs=0.02)
    assert policy.cost.acceptance[True].value() > 0.6  # the server-wide estimate counts the same way


def test_a_draft_that_sizes_its_own_blocks_is_asked_for_the_longest_whenever_drafting_pays():
    """Suffix decoding drafts only as far as its evidence goes: asking it for fewer tokens only cuts its confident
    drafts short. It gets max_k when the model says drafting pays, nothing when it does not, and a probe's PROBE_K."""
    paying = SpeculationPolicy(default_k=4, max_k=16, cost=cost_of(0.07, 0.025, acceptance=0.5),
                               draft_sizes_blocks=True)
    assert paying.block_size(1000, 1000) == 16
    assert paying.block_size(remaining_tokens=5, remaining_context=1000) == 4  # still within max_tokens
    losing = SpeculationPolicy(default_k=4, max_k=16, cost=cost_of(0.07, 0.025, acceptance=0.2),
                               draft_sizes_blocks=True)
    assert [losing.block_size(1000, 1000) for _ in range(COOLDOWN_ROUNDS + 2)] == [0] * (COOLDOWN_ROUNDS + 1) + [PROBE_K]


def chaining_policy(seconds_by_k: dict[int, float], alpha: float, alpha_chained: float) -> SpeculationPolicy:
    """A policy for a draft that sizes its blocks, on measured round times, after a block_size that drafts."""
    cost = timed(seconds_by_k)
    cost.acceptance[True] = seen(alpha)
    cost.chained[True] = seen(alpha_chained)
    policy = SpeculationPolicy(default_k=4, max_k=8, cost=cost, draft_sizes_blocks=True)
    assert policy.block_size(1000, 1000) == 8
    return policy


FLAT = {0: 1.0, 1: 1.8, 2: 1.8, 3: 1.8, 4: 1.8, 5: 1.8, 6: 1.8, 7: 1.8, 8: 1.8}  # a forward over 9 costs one over 2
STEEP = {k: 1.0 + 0.35 * k for k in range(9)}  # each token 0.35 of a step


def test_chained_tokens_are_verified_where_they_are_nearly_free_and_cut_where_they_cost():
    """A block of 2 matched tokens and 4 chained: on a curve where a longer block costs nothing more, even chained
    tokens accepted 1 time in 4 add tokens for free; where each token costs 0.35 of a step, they do not."""
    assert chaining_policy(FLAT, alpha=0.8, alpha_chained=0.25).cut_block(6, 4) == 6
    assert chaining_policy(STEEP, alpha=0.8, alpha_chained=0.25).cut_block(6, 4) == 2
    assert chaining_policy(STEEP, alpha=0.8, alpha_chained=0.95).cut_block(6, 4) >= 5  # mostly accepted: they pay
    assert chaining_policy(STEEP, alpha=0.8, alpha_chained=0.25).cut_block(3, 0) == 3  # nothing chained: all


AVX2 = {0: 1.0, 1: 1.82, 2: 2.28, 3: 2.10, 4: 1.87, 5: 1.66, 6: 1.88, 7: 1.75, 8: 2.12}  # the AVX2 EPYC's fp32 curve


def test_a_block_too_short_for_its_acceptance_is_not_verified():
    """Where verifying one token costs 1.82 plain steps, a 1-token block pays only if accepted over 82% of the time.
    Replayed, a suffix draft's 1-token blocks were accepted 0.19-0.63 of the time and its blocks of 4 and more
    0.67-1.0 (`python -m bench policy-sim lengths`): each block is judged by blocks whose match was as long (`RoundCost.by_length`), and
    a weak one decodes a plain step instead; a long one on the same server is verified whole."""
    policy = chaining_policy(AVX2, alpha=0.7, alpha_chained=0.5)
    policy.cost.by_length[True] = {1: seen(0.2, 200), 6: seen(0.95, 200)}
    assert policy.cut_block(1, 0) == 0
    assert policy.cut_block(6, 0) == 6
    assert policy.cut_block(3, 0) == 3  # no evidence for blocks matched as far: the request's acceptance (0.7)


def test_a_block_judged_too_weak_is_tried_again_as_its_evidence_ages():
    """A length whose blocks are not verified learns nothing new: its evidence fades each time one is cut, back to the
    request's acceptance, so where that says they pay (0.9 here), 1-token blocks are verified again and learnt from."""
    policy = chaining_policy(AVX2, alpha=0.9, alpha_chained=0.5)
    policy.cost.by_length[True] = {1: seen(0.2, 50)}
    cuts = [policy.cut_block(1, 0) for _ in range(400)]
    assert cuts[0] == 0 and cuts[-1] == 1
    assert policy.cost.by_length[True][1].judged < 50


def test_the_blocks_matched_length_as_drafted_files_its_evidence():
    """A block of 6 matched tokens cut to 2 is evidence about blocks matched 6 tokens far, not 2."""
    policy = chaining_policy(FLAT, alpha=0.8, alpha_chained=0.5)
    policy.cut_block(6, 0)
    policy.observe(2, 1, 1.8)
    assert set(policy.cost.by_length[True]) == {6} and policy.cost.by_length[True][6].judged == 2
    policy.observe(3, 3, 1.8)  # a round with no block cut before it (an engine's other path) files nothing
    assert policy.cost.by_length[True][6].judged == 2


def test_chained_tokens_are_not_verified_at_a_fixed_k_or_in_a_retry():
    fixed = SpeculationPolicy(default_k=4, max_k=8, requested_k=6, cost=timed(FLAT), draft_sizes_blocks=True)
    fixed.block_size(1000, 1000)
    assert fixed.cut_block(6, 4) == 2
    retry = chaining_policy(FLAT, alpha=0.8, alpha_chained=0.9)
    retry.probing = True
    retry.block_size(1000, 1000)
    assert retry.cut_block(6, 4) == 2


def test_chained_tokens_are_judged_apart_from_the_matched_ones():
    """A block of 2 matched and 4 chained with 3 accepted: the matched part was accepted whole (2 of 2 judged), the
    chained part 1 of 2 judged. Counting all 6 together would put this draft at 3 of 4."""
    cost = RoundCost()
    policy = SpeculationPolicy(default_k=4, max_k=8, cost=cost, draft_sizes_blocks=True)
    policy.observe(6, 3, 0.1, asked_k=8, num_chained=4)
    assert (policy.acceptance.accepted, policy.acceptance.judged) == (2, 2)
    assert (cost.acceptance[True].accepted, cost.acceptance[True].judged) == (2, 2)
    assert (cost.chained[True].accepted, cost.chained[True].judged) == (1, 2)
    policy.observe(6, 1, 0.1, asked_k=8, num_chained=4)  # rejected within the match: the chain was not judged
    assert (cost.chained[True].accepted, cost.chained[True].judged) == (1, 2)
    assert cost.seconds[6].samples == 2  # timed as blocks of 6


def test_forced_tokens_do_not_count_in_the_acceptance_that_prices_k():
    """A block of 2 drafted tokens and 4 the grammar forced, 5 accepted: the request's acceptance is 1 of 2 judged
    (the draft's own tokens), not 5 of 6; the forced ones were not judged (a token before them was rejected). A block
    of forced tokens only leaves the acceptance as it was, and teaches the forced tokens' own estimate."""
    cost = RoundCost()
    policy = SpeculationPolicy(default_k=4, max_k=8, cost=cost)
    policy.observe(6, 1, 0.1, asked_k=6, num_forced=4)
    assert (policy.acceptance.accepted, policy.acceptance.judged) == (1, 2)
    assert cost.forced[True].judged == 0
    before = policy.alpha()
    for _ in range(20):
        policy.observe(4, 4, 0.1, asked_k=6, num_forced=4)
    assert policy.alpha() == before and cost.forced[True].value() == 1.0
    policy.observe(6, 5, 0.1, asked_k=6, num_chained=1, num_forced=4)  # [1 matched][1 chained][4 forced]: 3 forced
    assert cost.chained[True].accepted == cost.chained[True].judged == 1 and cost.forced[True].value() < 1.0
    assert cost.seconds[4].samples == 20 and cost.seconds[6].samples == 2  # timed with their blocks


def test_forced_tokens_are_verified_as_nearly_certain_and_kept_at_a_fixed_k():
    """On STEEP round times, weak drafted tokens (alpha 0.3) hardly pay; 4 forced tokens after 1 of them do (their
    prior acceptance is FORCED_PRIOR), and a block of forced tokens alone is verified whole. At a fixed k they are
    kept, unless chained tokens come before them (dropped with those)."""
    weak = chaining_policy(STEEP, alpha=0.3, alpha_chained=0.25)
    assert weak.cut_block(5, 0) <= 1
    assert weak.cut_block(5, 0, num_forced=4) == 5
    assert weak.cut_block(4, 0, num_forced=4) == 4
    assert weak.cut_block(8, 0, num_forced=4) <= 1  # behind 4 weak tokens, forced ones are seldom reached
    fixed = SpeculationPolicy(default_k=4, max_k=8, requested_k=6, cost=timed(FLAT), draft_sizes_blocks=True)
    fixed.block_size(1000, 1000)
    assert fixed.cut_block(6, 0, num_forced=4) == 6
    assert fixed.cut_block(6, 2, num_forced=2) == 2


def test_round_times_follow_the_measured_curve_not_a_line_through_it():
    """This Xeon in fp32: forwards over 2, 3, 4, 5 tokens cost 1.09, 1.13, 1.64, 1.74 plain steps (a step between 3
    and 4 tokens). A line through those averages made k = 3 look 1.52 steps and chose it at acceptance 0.85, where
    it costs 1.64 and k = 2 yields more per second."""
    cost = timed({0: 1.00, 1: 1.09, 2: 1.13, 3: 1.64, 4: 1.74})
    times = cost.times(8)
    assert times[:5] == pytest.approx([1.00, 1.09, 1.13, 1.64, 1.74])
    a, b = cost.line(drafted_only=True)
    assert times[8] == pytest.approx(1.74 + 4 * b)  # past the last measured size: along the line's slope
    assert all(later >= earlier for earlier, later in zip(times[1:], times[2:]))
    cost.acceptance[True] = seen(0.85)
    assert SpeculationPolicy(default_k=4, max_k=8, cost=cost).best_k(times) == 2
    assert SpeculationPolicy(default_k=4, max_k=8, cost=cost).block_size(1000, 1000) == 5  # 5 is tried once...
    for _ in range(2):
        cost.observe(5, 0, 2.0)
    assert SpeculationPolicy(default_k=4, max_k=8, cost=cost).block_size(1000, 1000) == 2  # ...and costs too much


def test_a_longer_block_measured_cheaper_than_a_shorter_one_keeps_its_own_time():
    """One Xeon in fp32: forwards over 4, 5, 6 tokens cost 1.87, 1.85, 1.68 plain steps. Clamped to never fall,
    k = 5 looked as dear as k = 3 and the policy stayed at k = 2 on copied text where k = 5 yields the most per
    second. A size's own measured average stands; a size between measured ones never costs less than the one
    before it."""
    cost = timed({0: 1.00, 1: 1.10, 2: 1.20, 3: 1.87, 5: 1.68})
    times = cost.times(5)
    assert times[3] == pytest.approx(1.87) and times[5] == pytest.approx(1.68)
    assert times[4] == pytest.approx(1.87)  # interpolated (1.775) but not below k = 3's
    cost.acceptance[True] = seen(0.8)
    assert SpeculationPolicy(default_k=4, max_k=5, cost=cost).best_k(times) == 5


def test_the_next_block_size_past_the_measured_ones_is_tried_before_a_line_rules_it_out():
    """With blocks of 1 measured (1.09 steps) and one early block of 4 (1.74), a line put k = 2 at 1.3 steps, so
    the policy never tried it; on this CPU it costs 1.13 (`python -m bench policy-sim`: long_prompt and copy-heavy n-gram
    stuck at k = 1, 0.94-0.96x the best fixed k). The size past the measured ones is predicted at the largest
    measured size's cost until it is timed; once timed, its own average stands."""
    cost = RoundCost()
    cost.observe(4, 0, 1.74)
    for _ in range(3):
        cost.observe(0, 0, 1.00)
        cost.observe(1, 0, 1.09)
    assert cost.times(4)[2] > 1.25  # the line
    assert cost.optimistic(cost.times(4))[2] == pytest.approx(1.09)
    cost.acceptance[True] = seen(0.5)
    policy = SpeculationPolicy(default_k=4, max_k=4, cost=cost)
    assert policy.block_size(1000, 1000) == 2
    for _ in range(2):
        cost.observe(2, 0, 1.13)
    times = cost.optimistic(cost.times(4))
    assert times[2] == pytest.approx(1.13) and times[3] == pytest.approx(1.13)  # and now k = 3 is tried once
    for _ in range(2):
        cost.observe(3, 0, 1.64)
    assert cost.optimistic(cost.times(4))[3] == pytest.approx(1.64)
    assert policy.block_size(1000, 1000) == 2
    assert not cost.hopeless(cost.times(4))


def test_one_measured_block_size_is_not_yet_a_curve():
    """Until two sizes have MEASURED_AFTER rounds each, T(k) is the fitted line (with its prior slope)."""
    cost = RoundCost()
    cost.observe(0, 0, 1.0)
    cost.observe(4, 0, 1.4)
    a, b = cost.line()
    assert cost.times(6)[1:] == pytest.approx([a + b * k for k in range(1, 7)])


def test_a_fixed_cost_per_drafted_round_is_counted_in_full():
    """A remote draft: every drafted round pays a 30 ms round trip on top of a 100 ms step, 5 ms per token.
    A line through all block sizes spread that over k and kept drafting at acceptance 0.25 (a loss); the plain
    step measured on its own shows blocks do not pay, so speculation turns off."""
    cost = timed({0: 0.100, 2: 0.100 + 0.030 + 2 * 0.005, 4: 0.100 + 0.030 + 4 * 0.005})
    cost.acceptance[True] = seen(0.25)
    assert cost.time(0) == pytest.approx(0.100)
    assert cost.time(3) == pytest.approx(0.145)
    policy = SpeculationPolicy(default_k=4, max_k=16, cost=cost)
    policy.acceptance = Acceptance(DECAY, accepted=10.0, judged=40.0)  # its own rounds agree with the server's 0.25
    assert policy.block_size(1000, 1000) == 0 and policy.off_reason == "not_paying"
    # the same machine with the draft next door (no round trip) does pay at this acceptance
    near = RoundCost()
    for _ in range(3):
        near.observe(0, 0, 0.100)
        near.observe(2, 0, 0.100 + 2 * 0.005)
        near.observe(4, 0, 0.100 + 4 * 0.005)
    near.acceptance[True] = seen(0.25)
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


def test_a_retry_drafts_the_cheapest_block_and_pays_if_it_beat_plain_steps():
    """One AVX2 EPYC in fp32: forwards over 2 and 6 tokens cost 1.82 and 1.66 plain steps. A retry of k = 1 paid
    the most for the least evidence; it drafts k = 5. It counts as paid when its round beat plain steps in time,
    whether or not all 5 were accepted."""
    cost = timed({0: 1.00, 1: 1.82, 2: 2.28, 3: 2.10, 4: 1.87, 5: 1.66, 6: 1.88})
    cost.acceptance[True] = seen(0.1)
    policy = SpeculationPolicy(default_k=4, max_k=6, cost=cost)
    sizes = [policy.block_size(1000, 1000) for _ in range(COOLDOWN_ROUNDS + 2)]
    assert sizes == [0] * (COOLDOWN_ROUNDS + 1) + [5]
    policy.observe(5, 2, 1.66)  # 3 tokens in 1.66 steps
    assert policy.next_cooldown == COOLDOWN_ROUNDS


def test_a_retry_that_comes_back_empty_is_over():
    """A retry whose ask came back empty (no n-gram match) used to ask again every round until a block came: a
    round trip a round on text the draft never matches (chat + n-gram 20 ms away: 0.929x of off in
    `python -m bench policy-sim --rho 0.15`, 0.976x with the change). Now the request's evidence decides, as after any
    retry that did not pay: here, off for a doubled cool-down."""
    policy = SpeculationPolicy(default_k=4, max_k=16, cost=cost_of(0.07, 0.025, acceptance=0.2))
    assert policy.block_size(1000, 1000) == 0
    for _ in range(COOLDOWN_ROUNDS):
        policy.block_size(1000, 1000)
    assert policy.block_size(1000, 1000) == PROBE_K and policy.probing
    policy.observe(0, 0, 0.09, asked_k=PROBE_K)
    assert not policy.probing
    assert policy.block_size(1000, 1000) == 0 and policy.cooldown == 2 * COOLDOWN_ROUNDS


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


def step_cost(a: float, b: float, wait: float = 0.0, tokens=(4, 8, 12, 16)) -> StepCost:
    """A StepCost that has seen decode-only steps taking a + b n seconds for n tokens computed."""
    cost = StepCost()
    for _ in range(5):
        for n in tokens:
            cost.observe(n, a + b * n)
    cost.observe_wait(wait)
    return cost


def test_step_cost_fits_step_time_against_tokens_computed():
    a, b = step_cost(0.05, 0.01).line()
    assert a == pytest.approx(0.05) and b == pytest.approx(0.01)
    assert StepCost().line() is None and StepCost().batch(8, 7.0) is None


def test_one_batch_size_seen_charges_every_token_the_average():
    """Steps of one size say nothing of the slope: assume the compute-bound worst case, not free tokens."""
    a, b = step_cost(0.05, 0.01, tokens=(8,)).line()
    assert a == pytest.approx(0.0) and b == pytest.approx((0.05 + 0.08) / 8)


def test_a_line_through_the_origin_never_has_a_negative_base():
    """Steps of one size: a + b n through the origin can leave round-off below 0 (-8.7e-19 was seen); a is 0."""
    for tokens in range(1, 13):
        for seconds in (0.1218114703958811, 0.34458146201282047, 0.47482421960368, 0.49412933921252805):
            for repeats in range(1, 10):
                cost = StepCost()
                for _ in range(repeats):
                    cost.observe(tokens, seconds)
                a, b = cost.line()
                assert a >= 0.0 and b * tokens == pytest.approx(seconds)


def test_a_row_alone_in_its_step_is_judged_by_its_own_rounds():
    assert step_cost(0.05, 0.01).batch(step_tokens=1, other_tokens=0) is None


def test_a_block_that_pays_for_its_row_but_costs_the_batch_more_waits_for_the_load_to_drop():
    # a CPU: every token computed costs the same (compute-bound), and this row drafts well
    cost = cost_of(0.05, 0.005, acceptance=0.8)
    policy = SpeculationPolicy(default_k=4, max_k=8, cost=cost)
    assert policy.block_size(1000, 1000) > 0  # alone, its block pays
    batch = step_cost(0.0, 0.01).batch(step_tokens=15, other_tokens=15)  # 16 rows, 15 others
    assert policy.block_size(1000, 1000, live_sequences=16, batch=batch) == 0 and policy.off_reason == "load"
    assert policy.cooldown == 0  # no cool-down: the next step asks again
    assert policy.block_size(1000, 1000, live_sequences=1) > 0


def test_a_batch_whose_extra_tokens_are_nearly_free_keeps_drafting():
    # a GPU: the step is memory-bound, 16 more tokens cost little
    policy = SpeculationPolicy(default_k=4, max_k=8, cost=cost_of(0.05, 0.001, acceptance=0.8))
    batch = step_cost(0.05, 0.0001, wait=0.001).batch(step_tokens=15, other_tokens=15)
    assert policy.block_size(1000, 1000, live_sequences=16, batch=batch) >= 4


def test_the_draft_wait_is_charged_to_the_step():
    policy = SpeculationPolicy(default_k=4, max_k=8, cost=cost_of(0.05, 0.001, acceptance=0.8))
    far = step_cost(0.05, 0.0001, wait=0.5).batch(step_tokens=3, other_tokens=3)  # a draft 500 ms away
    assert policy.block_size(1000, 1000, live_sequences=4, batch=far) == 0 and policy.off_reason == "load"


def test_an_estimate_from_a_few_tokens_just_under_break_even_drafts_on_to_learn():
    """A plain step costs 100 ms and a round of 1 drafted token 109 ms (a nearly free block, as on this Xeon in
    fp32): break-even acceptance 0.09. At 0.07 over 2 judged tokens of its own the request drafts on, since
    half a standard error higher it would pay; at 0.07 over 200 judged tokens it turns off."""
    cost = RoundCost()
    for _ in range(3):
        cost.observe(0, 0, 0.100)
        cost.observe(1, 0, 0.109)
        cost.observe(2, 0, 0.113)
        cost.observe(3, 0, 0.164)
    cost.acceptance[True] = seen(0.07)
    unsure = SpeculationPolicy(default_k=4, max_k=3, cost=cost)
    unsure.acceptance = Acceptance(DECAY, accepted=0.14, judged=2.0)
    assert unsure.alpha() == pytest.approx(0.07, abs=0.002) and unsure.best_k(cost.times(3)) == 0
    alpha = unsure.alpha()
    assert unsure.alpha_upper() == pytest.approx(alpha + EXPLORE_Z * (alpha * (1 - alpha) / 6) ** 0.5)
    assert unsure.block_size(1000, 1000) > 0 and unsure.off_reason == ""
    # in a batched step (another row emits a token; a draft token adds 5 ms to the 100 ms step) the same
    # acceptance judges the step: at 0.07 the block would not pay for the step, half an error higher it does
    batch = Batch(other_tokens=1.0, base_s=0.100, per_token_s=0.005, wait_s=0.0)
    assert unsure.best_k(batch.times(3), batch.other_tokens) == 0
    assert unsure.block_size(1000, 1000, live_sequences=2, batch=batch) > 0 and unsure.off_reason == ""
    sure = SpeculationPolicy(default_k=4, max_k=3, cost=cost)
    sure.acceptance = Acceptance(DECAY, accepted=14.0, judged=200.0)
    assert sure.block_size(1000, 1000) == 0 and sure.off_reason == "not_paying"


@pytest.mark.parametrize("wait_s, acceptance, fixed, steps", [
    (0.001, 0.3, False, False),  # a near draft (1% of a step): always waited for
    (0.03, 0.3, False, True),  # far, 30% accepted: 1.43 tokens in 0.18 s waiting, 1 + 0.43 in 0.145 s stepping
    (0.03, 0.95, False, False),  # far, 95% accepted: 4.52 tokens in 0.18 s beat 5.29 in 0.2425 s
    (0.03, 0.3, True, False),  # a fixed k waits: the request asked for its blocks
    (None, 0.3, False, False),  # nothing waited for yet: nothing to weigh
])
def test_a_far_draft_is_asked_during_a_plain_step_when_waiting_for_it_costs_more(wait_s, acceptance, fixed, steps):
    """Plain steps of 0.1 s, rounds of 4 of 0.18 s (the draft's wait included): the speedup model's rate of waiting
    for the block against decoding a plain step meanwhile and verifying the block after it (SpeculationPolicy
    .step_while_drafting)."""
    cost = cost_of(0.1, 0.02, acceptance=acceptance)
    if wait_s is not None:
        cost.observe_wait(wait_s)
    policy = SpeculationPolicy(4, 8, 4 if fixed else None, cost=cost)
    assert policy.step_while_drafting(4) is steps


@pytest.mark.parametrize("ready_s, steps", [
    (0.10, True),  # the block was ready when the step ended, as priced: stepping pays, as above
    (0.16, False),  # step and draft took 0.16 s side by side (they share cores): 1.43 tokens in 0.205 s
])
def test_a_far_draft_is_waited_for_where_stepping_beside_it_was_measured_to_slow_both(ready_s, steps):
    """The far draft above, 30% accepted (stepping priced at 1.43 tokens in 0.145 s against waiting's 1.43 in 0.18
    s, the step's block ready with the step at 0.1 s): a block of 5 (a round of 4, one token more asked during the
    step) took ready_s from its ask to its answer. Where the step and the draft slow each other, the round waits
    (`RoundCost.ready_time`); where they do not, it still steps."""
    cost = cost_of(0.1, 0.02, acceptance=0.3)
    cost.observe_wait(0.03)
    cost.observe_ready(5, ready_s)
    assert cost.ready_time(5) == pytest.approx(ready_s)
    policy = SpeculationPolicy(4, 8, cost=cost)
    assert policy.step_while_drafting(4) is steps


def test_stepping_is_priced_at_the_ready_time_measured_for_its_block_not_at_a_ratio_over_the_average_wait():
    """A slow draft beside the target on shared cores: plain steps of 0.1 s, rounds of 1 and 4 of 0.27 and 0.42 s
    (their waits 0.15 and 0.3 s), 50% accepted. A block of 5 asked during a step came 0.4 s after its ask, when the
    draft's waits averaged 0.3 s. Rounds of 1 then bring that average down to 0.15 s: a ratio of the ready time over
    the average wait (1.33) would price the next step's block of 5 at 0.2 s and step; measured at its size, it
    takes 0.4 s, and the round of 4 waits. A block of 2 is priced along the sizes timed, not at the 0.4 s."""
    cost = timed({0: 0.1, 1: 0.27, 4: 0.42})
    cost.acceptance[True] = seen(0.5)
    for _ in range(3):
        cost.observe_wait(0.3)
    cost.observe_ready(5, 0.4)
    for _ in range(20):
        cost.observe_wait(0.15)
    policy = SpeculationPolicy(4, 8, cost=cost)
    assert cost.ready_time(5) == pytest.approx(0.4)
    assert not policy.step_while_drafting(4)
    alpha = min(policy.alpha(), 0.999)
    waiting, stepping = waiting_and_stepping(alpha, 4, 0.1, cost.time(4), cost.wait.value, 0.4 / 0.3 * cost.wait.value)
    assert stepping > waiting  # what the ratio would have chosen
    cost.observe_ready(2, 0.2)
    assert cost.ready_time(3) == pytest.approx(0.2 + (0.4 - 0.2) / 3)


def test_a_prefetched_block_whose_first_token_was_wrong_ends_a_retry_and_is_not_counted_as_rejected():
    """The plain step judged the block's first token for free: a retry it failed is over, but the acceptance the
    verified blocks give is kept as it is (the step is a filter, not a drafted round)."""
    policy = SpeculationPolicy(4, 8, cost=cost_of(0.1, 0.02, acceptance=0.3))
    policy.probing = True
    policy.observe_first_token(False)
    assert not policy.probing and policy.acceptance.judged == 0.0
    policy.probing = True
    policy.observe_first_token(True)
    assert policy.probing  # the retry goes on: its block is verified next


def hybrid_policy(model_round_s: dict[int, float], suffix_alpha_by_length: dict[int, float],
                  requested_k: int | None = None, priced: bool = True) -> SpeculationPolicy:
    """A hybrid's policy (--hybrid-threshold priced unless `priced` is False): model blocks timed at `model_round_s`
    (plain steps 0.1 s), accepted at 0.8; the target's forward nearly flat (0.09 s + 2 ms a token); the suffix side's
    blocks accepted by matched length as given."""
    cost = timed(model_round_s)
    for _ in range(3):
        for n in range(9):
            cost.observe_forward(n, 0.09 + 0.002 * n)
    cost.acceptance[True] = seen(0.8)
    cost.by_length[True] = {length: seen(alpha, 50) for length, alpha in suffix_alpha_by_length.items()}
    if suffix_alpha_by_length:  # the suffix side's blocks of every length, as their prior
        cost.sized_acceptance[True] = seen(sum(suffix_alpha_by_length.values()) / len(suffix_alpha_by_length), 400)
    return SpeculationPolicy(default_k=4, max_k=8, requested_k=requested_k, cost=cost, priced_threshold=priced)


def test_the_hybrids_suffix_side_answers_from_the_match_whose_block_is_worth_more_than_the_models():
    """NextBlock.min_sized from both sides' prices: a suffix block of a given match is verified on the forward alone
    (no draft time) with the acceptance of blocks matched as far; a model block of k costs its measured round. Dear
    model blocks lose to a 1-token match; cheap ones beat matches shorter than 3; a suffix side that is seldom
    right never answers; a fixed k, and the default --hybrid-threshold draft, leave the draft its own rule; a
    sized-only round (the model's blocks do not pay) takes any match."""
    suffix = {1: 0.3, 2: 0.5, 3: 0.7, 4: 0.85, 5: 0.9, 6: 0.9, 7: 0.9, 8: 0.9}
    dear = {0: 0.1, 1: 0.16, 2: 0.2, 4: 0.28, 8: 0.45}
    cheap = {0: 0.1, 1: 0.11, 2: 0.12, 4: 0.14, 8: 0.18}
    thresholds = {}
    for name, times, alphas in (("dear", dear, suffix), ("cheap", cheap, suffix),
                                ("seldom right", cheap, dict.fromkeys(range(1, 9), 0.05))):
        policy = hybrid_policy(times, alphas)
        k = policy.block_size(1000, 1000)
        assert k > 0
        thresholds[name] = policy.min_sized(k)
    assert thresholds == {"dear": 1, "cheap": 3, "seldom right": 9}
    fixed = hybrid_policy(cheap, suffix, requested_k=4)
    assert fixed.min_sized(fixed.block_size(1000, 1000)) == 0
    drafts_rule = hybrid_policy(dear, suffix, priced=False)
    k = drafts_rule.block_size(1000, 1000)
    assert k > 0 and drafts_rule.min_sized(k) == 0 and drafts_rule.min_sized(k, sized_only=True) == 0
    assert hybrid_policy(dear, suffix).min_sized(8, sized_only=True) == 1


def test_the_priced_threshold_leaves_the_draft_its_rule_until_the_suffix_side_has_been_judged():
    """A fresh server: a warm-up's one rejected 1-token suffix block is all it has judged of the suffix side.
    Priced on that, no match beats a cheap model block (9: none answers), so no suffix block would be verified and
    its price never learnt. Until PRICED_AFTER_JUDGED matched tokens are judged, the draft's own rule (0) answers;
    from then on the price does."""
    from verifier_service.speculation.policy import PRICED_AFTER_JUDGED

    cheap = {0: 0.1, 1: 0.11, 2: 0.12, 4: 0.14, 8: 0.18}
    policy = hybrid_policy(cheap, {})
    policy.cost.sized_acceptance[True].add(1, 0)
    k = policy.block_size(1000, 1000)
    assert k > 0 and policy.min_sized(k) == 0
    while policy.cost.sized_acceptance[True].judged < PRICED_AFTER_JUDGED:  # the counts fade as they grow
        policy.cost.sized_acceptance[True].add(1, 0)
    assert policy.min_sized(k) == policy.max_k + 1


def test_a_model_block_is_priced_with_the_drafts_time_even_when_its_round_did_not_wait_for_it():
    """Blocks drafted ahead or asked during a plain step arrive at once: their rounds (0.11-0.18 s here) hold little
    of the model's drafting time. Priced on those rounds alone the model side beats matches shorter than 3; with the
    draft's measured pace (its answer takes 30 or 50 ms a token), shorter matches win, down to any match."""

    class Pace:
        def __init__(self, per_token_s: float):
            self.per_token_s = per_token_s

        def predicted(self, k: int, opening: bool = False) -> float:
            return self.per_token_s * k

    suffix = {1: 0.3, 2: 0.5, 3: 0.7, 4: 0.85, 5: 0.9, 6: 0.9, 7: 0.9, 8: 0.9}
    cheap = {0: 0.1, 1: 0.11, 2: 0.12, 4: 0.14, 8: 0.18}
    thresholds = []
    for pace in (None, Pace(0.03), Pace(0.05)):
        policy = hybrid_policy(cheap, suffix)
        thresholds.append(policy.min_sized(policy.block_size(1000, 1000), pace=pace))
    assert thresholds == [3, 2, 1]


def test_the_hybrids_suffix_blocks_are_cut_on_their_own_acceptance_not_the_models():
    """The hybrid's model blocks are accepted at 0.8. Its suffix side's blocks, judged apart, are cut on the
    acceptance of such blocks: where they are seldom right (0.2), a 12-token sized block is verified a token or
    two deep; where they are mostly right (0.9), further. Judged by the model's 0.8, the weak side's blocks were
    verified as deep as the strong side's. A sized block's evidence goes to that acceptance, not to the model's."""
    cut = {}
    for name, alpha in (("weak", 0.2), ("strong", 0.9)):
        policy = hybrid_policy({0: 0.1, 1: 0.11, 2: 0.12, 4: 0.14, 8: 0.18}, {})
        policy.cost.sized_acceptance[True] = seen(alpha)
        policy.block_size(1000, 1000)
        cut[name] = policy.cut_block(12, 0, sized=True)
    assert cut["weak"] <= 2 < 8 <= cut["strong"]
    policy.observe(cut["strong"], 3, 0.15, sized=True)
    assert policy.sized_acceptance.judged == 4.0 and policy.acceptance.judged == 0.0


def test_a_retry_the_hybrids_suffix_side_answered_is_over():
    """A retry of the model's blocks (k = 1 after a cool-down) that the suffix side answered says nothing of the
    model: it is over, and the next round weighs the model again (here: still not paying, so a new cool-down,
    whose rounds cut suffix blocks on the forward's times). Kept on, every round was a retry of k = 1, and every
    suffix block was cut to 1 token."""
    policy = hybrid_policy({0: 0.1, 1: 0.5, 2: 0.9, 4: 1.7, 8: 3.3}, {})
    assert policy.block_size(1000, 1000) == 0 and policy.off_reason == "not_paying"
    cooldown = policy.cooldown
    for _ in range(cooldown):
        policy.block_size(1000, 1000)
    assert policy.probing and policy.block_size(1000, 1000) == 1
    policy.cut_block(6, 0, sized=True)
    policy.observe(1, 1, 0.1, asked_k=1, sized=True)
    assert not policy.probing and policy.acceptance.judged == 0.0
    assert policy.block_size(1000, 1000) == 0 and policy.off_reason == "not_paying" and policy.cooldown > 0


def test_a_retry_of_the_hybrids_model_is_answered_by_the_model_under_either_rule():
    """After a cool-down the policy retries the model's blocks (k = 1): with the draft's rule (any match answers) the
    suffix side took every such retry, so the model was never re-timed and stayed off for the whole request. The
    retry now asks the model to answer (min_sized past any block: max_k + 1); other rounds keep each rule's own."""
    for priced in (False, True):
        policy = hybrid_policy({0: 0.1, 1: 0.5, 2: 0.9, 4: 1.7, 8: 3.3}, {}, priced=priced)
        assert policy.block_size(1000, 1000) == 0 and policy.off_reason == "not_paying"
        for _ in range(policy.cooldown):
            policy.block_size(1000, 1000)
        k = policy.block_size(1000, 1000)
        assert policy.probing and k == 1 and policy.min_sized(k) == policy.max_k + 1
        assert policy.min_sized(k, sized_only=True) == (1 if priced else 0)


def test_only_blocks_the_draft_sized_file_evidence_by_their_length():
    """A hybrid's model block of 4 says nothing of how often a 4-token suffix match is right: it is not filed under
    `by_length`, which prices the suffix side; the suffix side's sized block is."""
    policy = hybrid_policy({0: 0.1, 4: 0.14}, {})
    policy.block_size(1000, 1000)
    policy.cut_block(4, 0)
    policy.observe(4, 1, 0.14)
    assert policy.cost.by_length[True] == {}
    policy.block_size(1000, 1000)
    policy.cut_block(4, 0, sized=True)
    policy.observe(4, 1, 0.1, sized=True)
    assert set(policy.cost.by_length[True]) == {4}


def test_a_suffix_match_is_priced_with_the_chained_tokens_that_follow_it():
    """The suffix side drafts past its match (chained tokens) up to the longest block it may. Once chained tokens
    have been judged, a match is worth its own tokens and the chained ones after it at their measured acceptance:
    against model blocks of a middling price (a 2-token match and longer beat them on the match alone), a 1-token
    match followed by tokens accepted half the time beats them too; chained tokens that are never right leave the
    threshold where the match alone puts it."""
    suffix = {1: 0.3, 2: 0.5, 3: 0.7, 4: 0.85, 5: 0.9, 6: 0.9, 7: 0.9, 8: 0.9}
    middling = {0: 0.1, 1: 0.13, 2: 0.16, 4: 0.22, 8: 0.34}
    thresholds = {}
    for name, chained in (("unseen", None), ("right half the time", 0.5), ("never right", 0.0)):
        policy = hybrid_policy(middling, suffix)
        if chained is not None:
            policy.cost.chained[True] = seen(chained, 200)
        thresholds[name] = policy.min_sized(policy.block_size(1000, 1000))
    assert thresholds == {"unseen": 2, "right half the time": 1, "never right": 2}


def test_a_requests_own_chained_tokens_price_its_matches_over_the_servers():
    """The server's chained tokens were never right (code, say); this request's are (extraction copying its input):
    after a few of its suffix blocks, a 1-token match with its chained tokens beats the model's block, as it would
    on a server that had seen only such requests. Priced on the server's alone, only a 2-token match did."""
    suffix = {1: 0.3, 2: 0.5, 3: 0.7, 4: 0.85, 5: 0.9, 6: 0.9, 7: 0.9, 8: 0.9}
    middling = {0: 0.1, 1: 0.13, 2: 0.16, 4: 0.22, 8: 0.34}
    policy = hybrid_policy(middling, suffix)
    policy.cost.chained[True] = seen(0.0, 200)
    assert policy.min_sized(policy.block_size(1000, 1000)) == 2
    for _ in range(4):  # a 1-token match and 3 chained tokens, all accepted
        policy.block_size(1000, 1000)
        policy.cut_block(4, 3, sized=True)
        policy.observe(4, 4, 0.1, num_chained=3, sized=True)
    assert policy.chained_alpha() > 0.5
    assert policy.min_sized(policy.block_size(1000, 1000)) == 1


def test_the_suffix_sides_price_is_scaled_by_what_its_verified_blocks_bore_out():
    """The suffix side's blocks are priced on estimates read optimistically (by length with a prior, half a standard
    error up) and on chained tokens judged elsewhere. Each of its blocks verified as cut files the accepted tokens its
    price expected against those accepted (`RoundCost.sized_calibration`), and the side's price is scaled by that
    ratio: against the same model blocks, a 1-token match answers while nothing is borne out yet; where its blocks
    brought a fifth of what was expected, only a 4-token match does; where they brought twice as much, a 1-token
    match answers even with chained tokens that were never right (2 unscaled)."""
    suffix = {1: 0.3, 2: 0.5, 3: 0.7, 4: 0.85, 5: 0.9, 6: 0.9, 7: 0.9, 8: 0.9}
    middling = {0: 0.1, 1: 0.13, 2: 0.16, 4: 0.22, 8: 0.34}
    thresholds = {}
    for name, chained, borne_out in (("unscaled", 0.5, None), ("a fifth", 0.5, (40.0, 8.0)),
                                     ("unscaled, never chained", 0.0, None), ("twice", 0.0, (20.0, 40.0))):
        policy = hybrid_policy(middling, suffix)
        policy.cost.chained[True] = seen(chained, 200)
        if borne_out is not None:
            policy.cost.sized_calibration[True] = Calibration(SERVER_DECAY, *borne_out)
        thresholds[name] = policy.min_sized(policy.block_size(1000, 1000))
    assert thresholds == {"unscaled": 1, "a fifth": 4, "unscaled, never chained": 2, "twice": 1}

    policy = hybrid_policy(middling, suffix)
    calibration = policy.cost.sized_calibration[True]
    policy.block_size(1000, 1000)
    n = policy.cut_block(6, 5, sized=True)
    verified, expected = policy.cut_expected
    assert verified == n > 0 and expected > 0
    policy.observe(n, 0, 0.1, num_chained=n - 1, sized=True)
    assert (calibration.expected, calibration.realized) == (expected, 0.0) and policy.cut_expected is None
    assert (policy.sized_calibration.expected, policy.sized_calibration.realized) == (expected, 0.0)
    policy.block_size(1000, 1000)
    n = policy.cut_block(6, 5, sized=True)
    policy.observe(n - 1, 0, 0.1, num_chained=n - 2, sized=True)  # verified shorter than cut: not its price's test
    policy.block_size(1000, 1000)
    policy.cut_block(4, 0)
    policy.observe(4, 1, 0.14)  # a model block: priced otherwise
    assert calibration.expected == expected


def test_a_requests_own_suffix_blocks_show_how_far_their_price_is_borne_out():
    """On a server whose suffix blocks brought what their price expected, a request whose 1-token matches (with 7
    chained tokens) bring nothing: the server's acceptance by length barely moves, but the request's own share borne
    out falls from 1 towards none, and its threshold rises from any match to 3 after three such blocks."""
    suffix = {1: 0.3, 2: 0.5, 3: 0.7, 4: 0.85, 5: 0.9, 6: 0.9, 7: 0.9, 8: 0.9}
    policy = hybrid_policy({0: 0.1, 1: 0.13, 2: 0.16, 4: 0.22, 8: 0.34}, suffix)
    policy.cost.chained[True] = seen(0.5, 200)
    policy.cost.sized_calibration[True] = Calibration(SERVER_DECAY, expected=100.0, realized=100.0)
    thresholds = []
    for _ in range(3):
        thresholds.append(policy.min_sized(policy.block_size(1000, 1000)))
        n = policy.cut_block(8, 7, sized=True)
        policy.observe(n, 0, 0.1, num_chained=n - 1, sized=True)
    thresholds.append(policy.min_sized(policy.block_size(1000, 1000)))
    assert thresholds == [1, 2, 3, 3]
    assert policy.sized_borne_out() < 0.6 < 0.95 < policy.cost.sized_calibration[True].value()


def test_one_slow_forward_at_a_size_seldom_timed_does_not_price_every_longer_block():
    """Forwards over 0..8 draft tokens timed often at 0.20 + 0.01 s a token; one over 2 tokens timed once, at 0.42 s
    (it ran beside the draft's prompt read). The curve stays non-decreasing, but that one forward is pooled with
    its neighbours by their samples, not made the floor of every longer block: verifying 8 tokens still costs more
    than verifying 3. With a running maximum, blocks of 2 to 8 all cost 0.42 s, and the policy verified the
    longest since its extra tokens looked free."""
    cost = RoundCost()
    for _ in range(10):
        for n in (0, 1, 3, 4, 5, 6, 7, 8):
            cost.observe_forward(n, 0.2 + 0.01 * n)
    cost.observe_forward(2, 0.42)
    times = cost.forward_times(8)
    assert times == sorted(times)
    assert times[8] - times[3] > 0.03  # (0.05 measured; the slow one pooled into sizes 2-4)
    assert times[2] < 0.25 and times[0] == pytest.approx(0.2)


def test_the_hybrids_model_is_first_asked_only_where_its_blocks_save_more_than_its_read():
    """The model block of 4 pays (3.35 tokens expected in a 0.2 s round, against 0.1 s plain steps: 0.04 s saved per
    token it drafts), but the hybrid's model has not read the sequence. With no free rounds seen, every token is
    taken for a plain step's: over 40 tokens left it saves 1.6 s, more than a 1.5 s read and less than a 2 s one.
    Once the free side answered 36 of 40 tokens, a tenth are the model's: 0.16 s, less than a 0.2 s read, except
    with 400 tokens left. Unknown read (None): asked, and learnt. A fixed k: asked."""
    policy = hybrid_policy({0: 0.1, 1: 0.13, 2: 0.16, 4: 0.2, 8: 0.4}, {}, priced=False)
    k = policy.block_size(100, 1000)
    assert k == 4 and policy.cut_times[k] == pytest.approx(0.2)
    assert policy.model_read_pays(k, 40, None)
    assert policy.model_read_pays(k, 40, 1.5) and not policy.model_read_pays(k, 40, 2.0)
    for _ in range(9):
        policy.observe_free_round(4, plain=False)
    for _ in range(4):
        policy.observe_free_round(1, plain=True)
    assert policy.plain_share.value(0.1, 0.0) == pytest.approx(0.1)
    assert policy.model_read_pays(k, 40, 0.1) and not policy.model_read_pays(k, 40, 0.2)
    assert policy.model_read_pays(k, 400, 0.2)
    fixed = hybrid_policy({0: 0.1, 4: 0.2}, {}, requested_k=4, priced=False)
    assert fixed.model_read_pays(fixed.block_size(100, 1000), 40, 100.0)
