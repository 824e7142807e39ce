"""Adaptive speculation: k follows acceptance; it turns off when it does not pay or under load."""

from verifier_service.speculation_policy import Rate, SpeculationPolicy


def test_a_requested_k_is_kept_exactly():
    policy = SpeculationPolicy(default_k=4, max_k=16, requested_k=7, plain=Rate(10.0))
    policy.observe(7, 0, 0.1)
    assert policy.block_size(100, 1000, live_sequences=99) == 7


def test_k_grows_after_full_acceptance_and_shrinks_after_rejection():
    policy = SpeculationPolicy(default_k=4, max_k=16, plain=Rate(10.0))
    policy.observe(4, 4, 0.1)
    assert policy.k == 6
    policy.observe(6, 2, 0.1)
    assert policy.k == 5


def test_k_never_passes_max_tokens():
    policy = SpeculationPolicy(default_k=8, max_k=16, plain=Rate(10.0))
    assert policy.block_size(remaining_tokens=3, remaining_context=1000) == 2


def test_speculation_turns_off_when_drafted_rounds_are_slower_then_retries():
    policy = SpeculationPolicy(default_k=4, max_k=16, plain=Rate(20.0))  # plain rounds: 20 tokens/s
    for _ in range(4):
        assert policy.block_size(1000, 1000) > 0
        policy.observe(4, 0, 0.1)  # 1 token in 0.1 s = 10 tokens/s: slower than plain
    assert policy.block_size(1000, 1000) == 0 and policy.off_reason == "not_paying"
    for _ in range(7):
        policy.block_size(1000, 1000)
    assert policy.block_size(1000, 1000) > 0  # cool-down over: retried


def test_speculation_turns_off_under_load_and_back_on():
    policy = SpeculationPolicy(default_k=4, max_k=16, max_concurrency=4, plain=Rate(10.0))
    assert policy.block_size(1000, 1000, live_sequences=8) == 0 and policy.off_reason == "load"
    assert policy.block_size(1000, 1000, live_sequences=2) == 4


def test_a_plain_round_is_measured_first():
    policy = SpeculationPolicy(default_k=4, max_k=16, plain=Rate())
    assert policy.block_size(1000, 1000) == 0 and policy.off_reason == "probe"
    policy.observe(0, 0, 0.05)
    assert policy.block_size(1000, 1000) == 4
