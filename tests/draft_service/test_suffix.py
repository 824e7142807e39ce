"""The suffix proposer, as token lists: its own tree, the cache of finished outputs, and what may enter it."""

import pytest
from prometheus_client import REGISTRY

from draft_service.suffix import SuffixConfig, SuffixProposer
from specdec.decoding.sampling import SamplingParams


def proposer(**overrides):
    """A suffix proposer; one match per proposal unless suffix_chain=True is given (chaining: the tests at the end)."""
    return SuffixProposer(SuffixConfig(**{"suffix_chain": False, **overrides}))


def start(suffix, prompt, tenant=""):
    return suffix.start(list(prompt), SamplingParams(), False, tenant=tenant)


def generate(suffix, prompt, output, k=4, tenant="", finish=True):
    """Play the verifier: each round take a block, keep the longest prefix that matches `output`, append the
    next true token. Returns the number of rounds."""
    seq = start(suffix, prompt, tenant)
    done = rounds = 0
    while done < len(output):
        rounds += 1
        block = seq.propose(k).token_ids
        accepted = 0
        while accepted < len(block) and done + accepted < len(output) and block[accepted] == output[done + accepted]:
            accepted += 1
        keep = len(prompt) + done + accepted
        done += accepted
        append = output[done: done + 1]
        done += len(append)
        seq.update(keep, append)
    assert seq.tokens == list(prompt) + list(output)
    if finish:
        seq.finish()
    seq.close()
    return rounds


def evictions(reason):
    return REGISTRY.get_sample_value("specdec_draft_suffix_evictions_total", {"reason": reason}) or 0.0


def test_proposes_from_its_own_prompt():
    seq = start(proposer(), [5, 6, 7, 8, 9, 1, 2, 3, 5, 6])
    block = seq.propose(4)
    assert block.token_ids == [7, 8]  # two tokens matched ([5, 6]): at most two drafted
    assert block.probs is None  # deterministic: q is one-hot
    assert seq.tokens[-2:] == [7, 8]  # the proposal is part of the sequence until an update rolls it back


def test_a_finished_output_helps_the_next_request():
    suffix = proposer()
    generate(suffix, [100], [1, 2, 3, 4, 5, 6])
    assert suffix.cache.outputs("") == [[1, 2, 3, 4, 5, 6]]
    assert start(suffix, [200, 1, 2, 3]).propose(8).token_ids == [4, 5, 6]


def test_a_repeated_request_takes_fewer_rounds():
    suffix = proposer()
    output = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    first = generate(suffix, [1, 2], output)
    second = generate(suffix, [3, 2], output)
    assert first == len(output)  # nothing to draft from: one token a round
    assert second < first / 2


def test_a_cancelled_request_adds_nothing():
    suffix = proposer()
    generate(suffix, [100], [1, 2, 3, 4, 5, 6], finish=False)
    assert suffix.cache.cached_requests == 0
    assert start(suffix, [200, 1, 2, 3]).propose(8).token_ids == []


def test_finish_once_then_close_adds_the_output_once():
    suffix = proposer()
    seq = start(suffix, [100])
    seq.update(1, [1, 2, 3])
    seq.finish()
    seq.finish()
    seq.close()
    assert suffix.cache.outputs("") == [[1, 2, 3]]


def test_unverified_proposals_never_enter_the_cache():
    suffix = proposer()
    prompt = [9, 1, 2, 3, 4, 1, 2]
    seq = start(suffix, prompt)
    assert seq.propose(2).token_ids == [3, 4]
    seq.update(len(prompt), [8])  # both rejected; the target says 8
    seq.update(len(seq.tokens), [1, 2])
    assert seq.propose(2).token_ids  # a block the verifier never checks: the stream ends
    seq.finish()
    seq.close()
    assert suffix.cache.outputs("") == [[8, 1, 2]]


def test_rollback_removes_unverified_tokens_from_the_request_tree():
    seq = start(proposer(), [1, 2, 3, 1, 2])
    assert seq.propose(2).token_ids == [3, 1]  # tokens: [1, 2, 3, 1, 2, 3, 1]
    seq.update(keep_length=6, append_token_ids=[7])  # 3 kept, 1 rejected, the target says 7
    assert seq.tokens == [1, 2, 3, 1, 2, 3, 7] and seq.verified_length == 7
    seq._tree.check([seq.tokens[:7]], refs=[seq.tokens])  # exactly the verified tokens are indexed
    fresh = start(proposer(), [1, 2, 3, 1, 2, 3, 7])
    assert seq.propose(3).token_ids == fresh.propose(3).token_ids

    seq.update(keep_length=4, append_token_ids=[5])  # into verified tokens (the verifier never does this)
    assert seq.tokens == [1, 2, 3, 1, 5]
    seq._tree.check([seq.tokens], refs=[seq.tokens])


def test_an_assumed_sync_is_indexed_only_once_the_verifier_confirms_it():
    # drafting ahead: the draft syncs itself to its guess of the next sync (its block accepted whole, then its
    # guess of the target's token); a miss rolls back below it, which must not rebuild the request's tree
    suffix = proposer()
    prompt = [1, 2, 3, 1, 2]
    seq = start(suffix, prompt)
    tree = seq._tree
    assert seq.propose(2).token_ids == [3, 1]
    seq.update(7, [2], assumed=True)  # the guess: both accepted, then the target says 2
    assert seq.verified_length == 5  # nothing of the guess is indexed
    seq.propose(2)  # the block drafted ahead from the guess
    seq.update(6, [1])  # the real sync: 1 kept, then the target's 1 (a miss)
    assert seq._tree is tree and seq.verified_length == 7  # no rebuild; the real tokens indexed
    seq._tree.check([seq.tokens], refs=[seq.tokens])
    fresh = start(proposer(), [1, 2, 3, 1, 2, 3, 1])
    block = seq.propose(2).token_ids
    assert len(block) == 2 and block == fresh.propose(2).token_ids

    seq.update(9, [4], assumed=True)  # guess again; this time the real sync is the same: a hit
    seq.propose(2)
    seq.confirm(10)
    assert seq.verified_length == 10 and seq.tokens[:10] == [1, 2, 3, 1, 2, 3, 1, *block, 4]
    seq._tree.check([seq.tokens[:10]], refs=[seq.tokens])


def test_a_missed_guess_never_enters_the_cache():
    suffix = proposer()
    seq = start(suffix, [100])
    seq.update(1, [1, 2])
    seq.update(3, [7, 7], assumed=True)  # a guess the verifier never confirms
    seq.update(3, [3])  # the real sync; the stream ends
    seq.finish()
    seq.close()
    assert suffix.cache.outputs("") == [[1, 2, 3]]


def test_the_cache_wins_with_a_longer_match():
    suffix = proposer()
    generate(suffix, [100], [9, 1, 2, 5, 6])
    # own tree: [1, 2] went on with [3, 4] ([9, 1, 2] only ends the prompt); the cache matches [9, 1, 2]
    assert start(suffix, [1, 2, 3, 4, 9, 1, 2]).propose(4).token_ids == [5, 6]


def test_on_an_equal_match_the_request_wins_over_a_higher_scoring_cache():
    suffix = proposer()
    for _ in range(3):
        generate(suffix, [100], [1, 2, 5, 6])
    # both match [1, 2]: the cache's [5, 6] always followed it (score 2), the request's [3, 4] once of two
    # occurrences (score 1); the request's own text is the better predictor of itself (prefer_own)
    assert start(suffix, [1, 2, 3, 4, 0, 1, 2]).propose(4).token_ids == [3, 4]


def test_the_request_wins_with_stronger_evidence():
    suffix = proposer()
    for output in ([1, 2, 5], [1, 2, 6], [1, 2, 7]):
        generate(suffix, [100], output)
    # cache: three different continuations (p=1/3, one token each); own tree: [3, 4] at p=1/2
    assert start(suffix, [1, 2, 3, 4, 0, 1, 2]).propose(4).token_ids == [3, 4]


def test_the_oldest_output_is_evicted_first():
    suffix = proposer(suffix_max_cached_requests=2)
    before = evictions("requests")
    for output in ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]):
        generate(suffix, [100], output)
    assert suffix.cache.outputs("") == [[5, 6, 7, 8], [9, 10, 11, 12]]
    assert evictions("requests") == before + 1
    assert start(suffix, [0, 1, 2]).propose(4).token_ids == []
    assert start(suffix, [0, 5, 6]).propose(4).token_ids == [7, 8]


def test_an_oversized_output_is_drafted_for_and_cut_to_the_budget():
    suffix = proposer(suffix_max_cached_tokens=8)
    before = evictions("oversized")
    output = [1, 2, 3, 4, 5, 6] * 4
    rounds = generate(suffix, [100], output, k=8)
    assert rounds < len(output) / 2  # its own tree drafted the repeats
    assert suffix.cache.outputs("") == [output[:8]]
    assert suffix.cache.cached_tokens == 8
    assert evictions("oversized") == before + 1


def test_tenants_share_no_entries():
    suffix = proposer(suffix_scope="tenant")
    generate(suffix, [100], [1, 2, 3, 4], tenant="a")
    generate(suffix, [100], [1, 2, 8, 9], tenant="b")
    assert start(suffix, [0, 1, 2], tenant="a").propose(4).token_ids == [3, 4]
    assert start(suffix, [0, 1, 2], tenant="b").propose(4).token_ids == [8, 9]
    assert start(suffix, [0, 1, 2], tenant="c").propose(4).token_ids == []
    assert suffix.cache.outputs("a") == [[1, 2, 3, 4]] and suffix.cache.outputs("b") == [[1, 2, 8, 9]]
    suffix.cache.check()  # each tenant's tree counts its own outputs only and refers to nothing else


def test_a_tenants_drafts_do_not_change_with_another_tenants_traffic():
    """Each tenant's cache has its own budget: tenant a's traffic cannot evict b's outputs, so b's drafts, and so
    its acceptance statistics, are the same with or without a's traffic in between."""

    def b_repeats(a_requests: int) -> tuple[int, list[list[int]]]:
        suffix = proposer(suffix_scope="tenant", suffix_max_cached_tokens=40)
        generate(suffix, [100], [1, 2, 3, 4, 5, 6, 7, 8], tenant="b")
        for i in range(a_requests):
            generate(suffix, [100], [50 + i, 60, 70 + i, 80, 90 + i], tenant="a")
        rounds = generate(suffix, [100], [1, 2, 3, 4, 5, 6, 7, 8], tenant="b", finish=False)
        return rounds, [start(suffix, [0, 1, 2, 3], tenant="b").propose(4).token_ids, suffix.cache.outputs("b")]

    assert b_repeats(a_requests=30) == b_repeats(a_requests=0)


def test_global_scope_shares_across_tenants():
    suffix = proposer(suffix_scope="global")
    generate(suffix, [100], [1, 2, 3, 4], tenant="a")
    assert start(suffix, [0, 1, 2], tenant="b").propose(4).token_ids == [3, 4]


def test_k_zero_and_k_beyond_the_evidence():
    suffix = proposer(suffix_max_spec_factor=4.0)
    generate(suffix, [100], [1, 2, 3, 4, 5])
    seq = start(suffix, [0, 1, 2])
    assert seq.propose(0).token_ids == [] and seq.tokens == [0, 1, 2]
    assert seq.propose(32).token_ids == [3, 4, 5]  # all the evidence holds


def test_proposal_metrics_count_matches():
    suffix = proposer()
    asked = REGISTRY.get_sample_value("specdec_draft_suffix_proposals_total") or 0.0
    matched = REGISTRY.get_sample_value("specdec_draft_suffix_proposals_matched_total", {"source": "request"}) or 0.0
    seq = start(suffix, [1, 2, 3, 1, 2])
    seq.propose(2)
    seq.update(5, [9])
    seq.propose(2)
    assert REGISTRY.get_sample_value("specdec_draft_suffix_proposals_total") == asked + 2
    assert REGISTRY.get_sample_value("specdec_draft_suffix_proposals_matched_total", {"source": "request"}) == matched + 1


# --- chaining: where a match's draft stops short of k, match again on the context plus the draft ----------------

def test_a_draft_cut_at_its_match_goes_on_from_the_longer_match_it_makes():
    suffix = proposer(suffix_chain=True)
    generate(suffix, [100], [50, 51, 80, 81, 53, 54, 55])
    context = [1, 2, 3, 50, 51]  # the cache matches [50, 51]: two tokens, so it drafts two, [80, 81]
    assert start(proposer(), context).propose(6).token_ids == []  # (a fresh cache knows nothing)
    unchained = start(suffix, context)
    unchained._config = SuffixConfig(suffix_chain=False)
    assert unchained.propose(6).token_ids == [80, 81]
    seq = start(suffix, context)
    block = seq.propose(6)
    # then [50, 51, 80, 81] matches four tokens and goes on
    assert block.token_ids == [80, 81, 53, 54, 55] and block.num_chained == 3
    assert seq.tokens == context + block.token_ids  # proposed: part of the sequence until an update rolls it back
    assert seq.propose(0).num_chained == 0


def test_a_chain_needs_a_match_of_two_tokens():
    suffix = proposer(suffix_chain=True)
    generate(suffix, [100], [50, 51, 80, 81])
    block = start(suffix, [81, 5, 3, 50, 51]).propose(8)
    # the cache drafts [80, 81] and ends there; of [.., 50, 51, 80, 81] only [81] goes on (to 5, in the prompt)
    assert block.token_ids == [80, 81] and block.num_chained == 0


@pytest.mark.parametrize("min_token_prob, num_chained", [(0.6, 0), (0.3, 2)])
def test_a_chain_stops_where_its_running_probability_falls_below_the_floor(min_token_prob, num_chained):
    suffix = proposer(suffix_chain=True, suffix_min_token_prob=min_token_prob)
    generate(suffix, [100], [50, 51, 80, 81, 53, 54])
    generate(suffix, [100], [50, 51, 80, 81, 63, 64])
    block = start(suffix, [1, 2, 3, 50, 51]).propose(6)
    # [80, 81] followed [50, 51] both times; what followed [50, 51, 80, 81] differed (1/2 each)
    assert block.token_ids[:2] == [80, 81] and block.num_chained == num_chained
    assert len(block.token_ids) == 2 + num_chained


@pytest.mark.parametrize("field, value, flag", [
    ("suffix_scope", "everyone", "--suffix-scope"),
    ("suffix_max_depth", 1, "--suffix-max-depth"),
    ("suffix_max_cached_tokens", -1, "--suffix-max-cached-tokens"),
    ("suffix_max_tenants", 0, "--suffix-max-tenants"),
    ("suffix_min_token_prob", 1.5, "--suffix-min-token-prob"),
])
def test_config_errors_name_the_flag(field, value, flag):
    with pytest.raises(ValueError, match=flag):
        SuffixConfig(**{field: value})
