"""verifier_service.draft.rendezvous: stable ownership, and only a leaving replica's keys move."""

from __future__ import annotations

import collections

from verifier_service.draft.rendezvous import owner, ranked, weight

REPLICAS = ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051", "10.0.0.4:50051"]
TENANTS = [f"tenant-{i}" for i in range(2000)]


def test_ownership_is_stable_and_independent_of_order():
    first = {t: owner(t, REPLICAS) for t in TENANTS}
    assert {t: owner(t, reversed(REPLICAS)) for t in TENANTS} == first
    assert {t: owner(t, REPLICAS + REPLICAS[:1]) for t in TENANTS} == first  # a repeat changes nothing
    # a fixed value: the weight is a keyed hash, the same in every process (not Python's salted hash())
    assert weight("tenant-0", REPLICAS[0]) == weight("tenant-0", REPLICAS[0])
    assert owner("a", []) is None and ranked("a", []) == []


def test_keys_spread_over_the_replicas():
    counts = collections.Counter(owner(t, REPLICAS) for t in TENANTS)
    assert set(counts) == set(REPLICAS)
    assert min(counts.values()) > len(TENANTS) / len(REPLICAS) * 0.8


def test_only_a_leaving_replicas_keys_move_each_to_its_next_choice():
    before = {t: owner(t, REPLICAS) for t in TENANTS}
    gone = REPLICAS[1]
    left = [r for r in REPLICAS if r != gone]
    after = {t: owner(t, left) for t in TENANTS}
    moved = [t for t in TENANTS if after[t] != before[t]]
    assert moved and all(before[t] == gone for t in moved)  # nobody else's tenant moves
    assert all(after[t] == ranked(t, REPLICAS)[1] for t in moved)  # each to its own second choice
    spread = collections.Counter(after[t] for t in moved)
    assert set(spread) == set(left)  # spread over the rest, not piled on one
    # the replica comes back: exactly its keys return to it
    assert {t: owner(t, REPLICAS) for t in TENANTS} == before


def test_a_joining_replica_takes_only_the_keys_it_wins():
    before = {t: owner(t, REPLICAS) for t in TENANTS}
    newcomer = "10.0.0.5:50051"
    after = {t: owner(t, [*REPLICAS, newcomer]) for t in TENANTS}
    moved = [t for t in TENANTS if after[t] != before[t]]
    assert moved and all(after[t] == newcomer for t in moved)
    assert len(moved) < len(TENANTS) / 5 * 1.3
