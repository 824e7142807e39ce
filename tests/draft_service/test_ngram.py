"""N-gram prompt lookup, as token lists."""

from draft_service.ngram import NgramSequence


def test_proposes_the_continuation_of_the_latest_match():
    seq = NgramSequence([1, 2, 3, 4, 9, 1, 2, 3], min_n=1, max_n=3)
    assert seq.propose(3).token_ids == [4, 9, 1]


def test_prefers_the_longest_matching_ngram():
    # suffix [7, 2]: the 2-gram matches at position 3 (-> 5); the 1-gram [2] alone would match later (-> 6)
    seq = NgramSequence([0, 7, 2, 5, 2, 6, 7, 2], min_n=1, max_n=2)
    assert seq.propose(1).token_ids == [5]


def test_no_match_proposes_nothing():
    assert NgramSequence([1, 2, 3], min_n=1, max_n=3).propose(4).token_ids == []


def test_rollback_undoes_the_index():
    seq = NgramSequence([1, 2, 3, 1, 2], min_n=2, max_n=2)
    assert seq.propose(2).token_ids == [3, 1]  # sequence is now [1, 2, 3, 1, 2, 3, 1]
    seq.update(keep_length=5, append_token_ids=[8])  # the verifier rejected both: [1, 2, 3, 1, 2, 8]
    assert seq.tokens == [1, 2, 3, 1, 2, 8]
    fresh = NgramSequence([1, 2, 3, 1, 2, 8], min_n=2, max_n=2)
    assert seq._index == fresh._index
    assert seq.propose(2).token_ids == fresh.propose(2).token_ids


def test_lookup_cost_does_not_grow_with_context():
    import time

    def time_proposals(length):
        seq = NgramSequence(list(range(length)), min_n=1, max_n=4)
        started = time.perf_counter()
        for _ in range(200):
            seq.propose(4)
            seq.update(len(seq.tokens) - 4, [0])
        return time.perf_counter() - started

    small, large = time_proposals(200), time_proposals(20_000)
    assert large < small * 3 + 0.05
