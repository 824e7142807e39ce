"""Suffix trees and the bounded output cache, as token lists."""

import random
import time

import pytest

from draft_service.suffix_cache import SuffixCache, SuffixTree


def tree_of(*sequences, depth=24):
    tree = SuffixTree(depth)
    for seq in sequences:
        tree.add(list(seq))
    return tree


def test_frequency_picks_the_continuation():
    tree = tree_of([1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 9])
    draft = tree.speculate([7, 1, 2], 8, max_spec_factor=2.0, min_token_prob=0.5)
    # after [1, 2]: 3 always (p=1), then 4 in two of three (p=2/3), then 5 or 6 (p=1/3 < 0.5): stop
    assert draft.token_ids == [3, 4]
    assert draft.probs == pytest.approx([1.0, 2 / 3])
    assert draft.score == pytest.approx(5 / 3)
    assert draft.match_len == 2


def test_longest_match_wins():
    tree = tree_of([8, 1, 2, 3, 4], [1, 2, 9, 9], [0, 1, 2, 9, 9])
    # [1, 2] alone continues with 9 more often, but [8, 1, 2] has been followed by [3, 4] every time
    draft = tree.speculate([8, 1, 2], 8, max_spec_factor=1.0)
    assert draft.token_ids == [3, 4]
    assert draft.match_len == 3


def test_draft_length_follows_the_match_length():
    tree = tree_of([1, 2, 3, 4, 5, 6, 7])
    assert tree.speculate([0, 3], 8, max_spec_factor=1.0).token_ids == [4]  # one token matched
    assert tree.speculate([0, 3], 8, max_spec_factor=2.0).token_ids == [4, 5]
    assert tree.speculate([0, 2, 3], 8, max_spec_factor=1.0).token_ids == [4, 5]
    assert tree.speculate([0, 3], 8, max_spec_factor=1.0, max_spec_offset=2.0).token_ids == [4, 5, 6]


def test_weak_evidence_drafts_nothing():
    tree = tree_of(*[[1, token] for token in range(10, 20)])  # ten different continuations of 1
    assert tree.speculate([0, 1], 8, min_token_prob=0.2).token_ids == []
    assert tree.speculate([0, 1], 8, min_token_prob=0.1).token_ids == [10]  # p=0.1 each; the first seen wins the tie


def test_k_bounds_the_draft_and_the_evidence_may_give_fewer():
    tree = tree_of([1, 2, 3, 4, 5, 6])
    assert tree.speculate([1, 2, 3], 0, max_spec_factor=4.0).token_ids == []
    assert tree.speculate([1, 2, 3], 2, max_spec_factor=4.0).token_ids == [4, 5]
    assert tree.speculate([1, 2, 3], 32, max_spec_factor=4.0).token_ids == [4, 5, 6]  # all there is


def test_no_match_drafts_nothing():
    assert tree_of([1, 2, 3]).speculate([7, 8], 4).token_ids == []
    assert SuffixTree(8).speculate([1, 2], 4).token_ids == []


def test_depth_limits_match_plus_draft():
    tree = tree_of(list(range(1, 11)), depth=4)
    # suffixes hold 4 tokens: matching [1, 2, 3] leaves room for [4] only, so the 2-token match drafting [4, 5] wins
    assert tree.speculate([1, 2, 3], 8, max_spec_factor=1.0).token_ids == [4, 5]
    assert tree.speculate([1, 2, 3], 8, max_spec_factor=1.0).match_len == 2


def test_counts_match_brute_force_under_adds_and_oldest_first_removals():
    rng = random.Random(0)
    for _ in range(60):
        tree, live = SuffixTree(rng.randint(2, 6)), []
        for _ in range(8):
            if live and rng.random() < 0.4:
                tree.remove(live.pop(0))
            else:
                seq = [rng.randrange(rng.randint(1, 3)) for _ in range(rng.randint(1, 12))]
                tree.add(seq)
                live.append(seq)
            tree.check(live)  # also: no node refers to a removed sequence, so its memory is freed


def test_removal_in_any_order_keeps_counts_right():
    rng = random.Random(1)
    for _ in range(40):
        tree, live, every = SuffixTree(4), [], []
        for _ in range(8):
            if live and rng.random() < 0.4:
                tree.remove(live.pop(rng.randrange(len(live))))
            else:
                seq = [rng.randrange(3) for _ in range(rng.randint(1, 10))]
                tree.add(seq)
                live.append(seq)
                every.append(seq)
            tree.check(live, refs=every)


def test_a_growing_sequence_indexes_like_a_whole_one():
    rng = random.Random(2)
    seq = [rng.randrange(3) for _ in range(60)]
    grown, tokens = SuffixTree(5), []
    track = grown.track(tokens)
    for token in seq:
        tokens.append(token)
        track.index_to(len(tokens))
    grown.check([tokens])
    whole = tree_of(seq, depth=5)
    for end in range(1, 60, 7):
        assert grown.speculate(seq[:end], 4).token_ids == whole.speculate(seq[:end], 4).token_ids


def test_cache_evicts_the_oldest_request():
    cache = SuffixCache(max_depth=8, max_requests=2, max_tokens=1000)
    for seq in ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]):
        cache.insert("", seq)
    assert cache.outputs("") == [[5, 6, 7, 8], [9, 10, 11, 12]]
    assert cache.speculate("", [1, 2], 4).token_ids == []
    assert cache.speculate("", [5, 6], 4).token_ids == [7, 8]
    cache.check()


def test_cache_stays_within_its_token_budget():
    rng = random.Random(3)
    cache = SuffixCache(max_depth=16, max_requests=10_000, max_tokens=500)
    inserted = 0
    while inserted < 25 * 500:
        seq = [rng.randrange(100) for _ in range(rng.randint(10, 60))]
        result = cache.insert("", seq)
        inserted += len(seq)
        assert cache.cached_tokens <= 500
        assert result.cached == len(seq) and not result.truncated
    tree = cache.tree("")
    assert tree.num_tokens == cache.cached_tokens == sum(map(len, cache.outputs("")))
    assert tree.num_nodes <= 2 * cache.cached_tokens  # compressed paths: O(tokens) nodes
    assert len(tree._count) <= 2 * 500 + 200  # and deleted nodes' slots are reused
    cache.check()


def test_oversized_output_is_cut_to_the_budget_not_refused():
    cache = SuffixCache(max_depth=8, max_requests=10, max_tokens=10)
    cache.insert("", [100, 101])
    result = cache.insert("", list(range(25)))
    assert result.truncated and result.cached == 10 and result.evicted_for_tokens == 1
    assert cache.outputs("") == [list(range(10))]
    assert cache.cached_tokens == 10


def test_turned_off_cache_holds_nothing():
    for cache in (SuffixCache(8, 0, 100), SuffixCache(8, 10, 0)):
        assert cache.insert("", [1, 2, 3]).cached == 0
        assert cache.cached_requests == 0 and cache.speculate("", [1, 2], 4).token_ids == []


def test_scopes_share_no_entries():
    cache = SuffixCache(max_depth=8, max_requests=10, max_tokens=100)
    cache.insert("tenant-a", [1, 2, 3, 4])
    cache.insert("tenant-b", [1, 2, 8, 9])
    assert cache.speculate("tenant-a", [1, 2], 4).token_ids == [3, 4]
    assert cache.speculate("tenant-b", [1, 2], 4).token_ids == [8, 9]
    assert cache.speculate("tenant-c", [1, 2], 4).token_ids == []
    assert cache.tree("tenant-a") is not cache.tree("tenant-b")
    cache.check()  # each tenant's tree counts its own output only and refers to nothing else


def test_a_scope_whose_outputs_are_all_evicted_is_dropped():
    cache = SuffixCache(max_depth=8, max_requests=1, max_tokens=100, max_scopes=1)
    for tenant in ("a", "b", "c"):
        cache.insert(tenant, [1, 2, 3])
    assert cache.scopes == ["c"]


def test_one_scopes_traffic_never_evicts_another_scopes_outputs():
    cache = SuffixCache(max_depth=8, max_requests=3, max_tokens=12, max_scopes=2)
    cache.insert("b", [1, 2, 3, 4])
    cache.insert("b", [5, 6, 7, 8])
    b_outputs, b_draft = cache.outputs("b"), cache.speculate("b", [1, 2], 4)
    for i in range(50):  # far over the budgets, which are each scope's own
        result = cache.insert("a", [1, 2, 100 + i, 200 + i])
        assert result.evicted_for_scopes == 0
    assert cache.outputs("b") == b_outputs and cache.speculate("b", [1, 2], 4) == b_draft
    assert len(cache.outputs("a")) == 3 and cache.outputs("a")[-1] == [1, 2, 149, 249]
    assert cache.cached_requests == 5 and cache.cached_tokens == 20
    cache.check()


def test_a_new_scope_beyond_max_scopes_evicts_the_least_recently_used_one_whole():
    cache = SuffixCache(max_depth=8, max_requests=10, max_tokens=100, max_scopes=2)
    cache.insert("a", [1, 2, 3])
    cache.insert("b", [1, 2, 4])
    cache.insert("b", [1, 2, 5])
    assert cache.speculate("a", [1, 2], 4).token_ids == [3]  # a drafted: b is now the least recently used
    result = cache.insert("c", [1, 2, 6])
    assert result.evicted_for_scopes == 2 and cache.scopes == ["a", "c"]
    assert cache.speculate("b", [1, 2], 4).token_ids == [] and cache.outputs("a") == [[1, 2, 3]]
    assert cache.cached_requests == 2 and cache.cached_tokens == 6
    cache.check()


def test_memory_stays_bounded_by_scopes_times_tokens():
    rng = random.Random(7)
    cache = SuffixCache(max_depth=8, max_requests=1000, max_tokens=50, max_scopes=3)
    for _ in range(400):
        cache.insert(f"tenant-{rng.randrange(10)}", [rng.randrange(50) for _ in range(rng.randrange(1, 30))])
        assert cache.cached_tokens <= 3 * 50 and len(cache.scopes) <= 3
    cache.check()


def test_proposal_cost_does_not_grow_with_the_cache():
    rng = random.Random(4)
    records = [[1000 + field, 7] + [rng.randrange(300) for _ in range(3)] for field in range(20)]

    def time_proposals(num_tokens):
        cache = SuffixCache(max_depth=24, max_requests=100_000, max_tokens=num_tokens)
        while cache.cached_tokens + 100 <= num_tokens:
            cache.insert("", [token for record in rng.sample(records, 20) for token in record])
        contexts = [rng.choice(records)[:rng.randint(2, 5)] for _ in range(300)]
        started = time.perf_counter()
        for context in contexts:
            cache.speculate("", context, 8)
        return time.perf_counter() - started

    small, large = time_proposals(1_000), time_proposals(10_000)
    assert large < small * 3 + 0.05
