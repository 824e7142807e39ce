"""The accept/reject rules, as token lists, and their output distribution."""

import dataclasses

import pytest
import torch

from specdec.decoding.sampling import SamplingParams, keyed_sample, make_generator, probs_from_logits, sample
from verifier_service.speculation.rejection_sampler import Verdict, drafter_invariant_sample, greedy_verify, rejection_sample

# ---- greedy: token lists --------------------------------------------------------------


@pytest.mark.parametrize(
    "spec_tokens, target_argmax, expected_emitted",
    [
        ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4]),  # all accepted, plus the bonus token
        ([1, 2, 3], [1, 5, 3, 4], [1, 5]),  # rejected at position 1: the target's token replaces it
        ([1, 2, 3], [7, 2, 3, 4], [7]),  # rejected at once: one target token
        ([], [9], [9]),  # no draft: plain decoding
        ([4], [4, 4], [4, 4]),
    ],
)
def test_greedy_verify_token_lists(spec_tokens, target_argmax, expected_emitted):
    verdict = greedy_verify(spec_tokens, target_argmax)
    assert verdict.emitted(spec_tokens) == expected_emitted
    assert verdict.num_accepted == len(expected_emitted) - 1


# ---- sampling: token lists with certain outcomes -------------------------------------


def one_hot_rows(ids, vocab=6):
    return torch.nn.functional.one_hot(torch.tensor(ids), vocab).float()


def test_rejection_sample_accepts_tokens_the_target_is_sure_of():
    target = one_hot_rows([1, 2, 3, 4])  # p is certain of 1, 2, 3, then 4
    verdict = rejection_sample([1, 2, 3], one_hot_rows([1, 2, 3]), target, make_generator(0))
    assert verdict == Verdict(3, 4)


def test_rejection_sample_rejects_a_token_the_target_never_emits():
    target = one_hot_rows([1, 5, 3, 4])
    verdict = rejection_sample([1, 2, 3], None, target, make_generator(0))  # one-hot q (n-gram)
    assert verdict.emitted([1, 2, 3]) == [1, 5]


def test_rejection_sample_with_no_draft_samples_the_bonus_distribution():
    verdict = rejection_sample([], None, one_hot_rows([3]), make_generator(0))
    assert verdict == Verdict(0, 3)


def test_residual_never_repeats_the_rejected_token():
    target = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    for seed in range(200):
        verdict = rejection_sample([0], None, target, make_generator(seed))
        if verdict.num_accepted == 0:
            assert verdict.next_token == 1  # max(0, p - onehot(0)) leaves only token 1


# ---- sampling: the output distribution is the target's ------------------------------

VOCAB = 8
SAMPLES = 12_000


def wrong_rejection_sample(draft_token_ids, draft_probs, target_probs, generator):
    """A deliberately wrong sampler: on rejection it draws from p, skipping the residual."""
    verdict = rejection_sample(draft_token_ids, draft_probs, target_probs, generator)
    if verdict.num_accepted < len(draft_token_ids):
        return Verdict(verdict.num_accepted, sample(target_probs[verdict.num_accepted], generator))
    return verdict


def first_token_histogram(sampler, p, q, params, samples=SAMPLES, seed=1234):
    """Histogram of the first emitted token when the draft proposes from q."""
    generator = make_generator(seed)
    counts = torch.zeros(VOCAB)
    for _ in range(samples):
        drafted = sample(q[0], generator)
        verdict = sampler([drafted], q, p, generator)
        counts[verdict.emitted([drafted])[0]] += 1
    return counts


def chi_square_p_value(counts, probs):
    """Pearson chi-square goodness-of-fit p-value over the support of probs."""
    from scipy.stats import chisquare  # noqa: PLC0415  (heavy import, only here)

    support = probs > 0
    if (counts[~support] > 0).any():
        return 0.0  # a token outside the target's support: certainly wrong
    if int(support.sum()) == 1:
        return 1.0  # a certain token, and every sample hit it
    expected = probs[support] * counts.sum()
    return float(chisquare(counts[support].numpy(), expected.numpy()).pvalue)


SETTINGS = {
    "T=1.0": SamplingParams(temperature=1.0),
    "T=0.7 top_p=0.9": SamplingParams(temperature=0.7, top_p=0.9),
    "top_k=5": SamplingParams(temperature=1.0, top_k=5),
}


def shaped(params, seed):
    torch.manual_seed(seed)
    target_logits = torch.randn(2, VOCAB) * 1.5  # [k + 1, V] with k = 1
    draft_logits = target_logits + torch.randn(2, VOCAB) * 1.5  # a draft that often disagrees
    return probs_from_logits(target_logits, params), probs_from_logits(draft_logits[:1], params)


@pytest.mark.parametrize("name", SETTINGS)
def test_speculative_sampling_matches_the_target_distribution(name):
    p, q = shaped(SETTINGS[name], seed=7)
    counts = first_token_histogram(rejection_sample, p, q, SETTINGS[name])
    assert chi_square_p_value(counts, p[0]) > 1e-3


@pytest.mark.parametrize("name", SETTINGS)
def test_a_sampler_that_skips_the_residual_fails_the_same_test(name):
    p, q = shaped(SETTINGS[name], seed=7)
    counts = first_token_histogram(wrong_rejection_sample, p, q, SETTINGS[name])
    assert chi_square_p_value(counts, p[0]) < 1e-6


# ---- the coupled rule (drafter-invariant): keyed draws, accept iff equal -------------------


def keyed_row_samples(target, seed, first_position):
    """The target's keyed sample at each row: [k + 1] token ids."""
    return [keyed_sample(row, seed, first_position + i) for i, row in enumerate(target)]


def test_coupled_rule_accepts_exactly_when_the_draft_equals_the_keyed_sample():
    torch.manual_seed(0)
    target = torch.randn(5, VOCAB).softmax(-1)  # [k + 1, V], k = 4
    for seed in range(50):
        wanted = keyed_row_samples(target, seed, first_position=17)
        # a perfect draft: everything accepted, and the bonus is the keyed sample after it
        assert drafter_invariant_sample(wanted[:4], target, seed, 17) == Verdict(4, wanted[4])
        # any draft: the accepted prefix is where it equals the keyed samples; the next token is the keyed sample
        draft = torch.randint(0, VOCAB, (4,)).tolist()
        verdict = drafter_invariant_sample(draft, target, seed, 17)
        first_miss = next((i for i in range(4) if draft[i] != wanted[i]), 4)
        assert verdict == Verdict(first_miss, wanted[first_miss])
        assert verdict.emitted(draft) == wanted[:first_miss + 1]  # the same tokens, whatever was drafted
        # an empty block (speculation off) emits the keyed sample too
        assert drafter_invariant_sample([], target[:1], seed, 17) == Verdict(0, wanted[0])


def test_keyed_draws_depend_on_seed_and_position_only():
    p = torch.full((VOCAB,), 1 / VOCAB)
    assert [keyed_sample(p, 5, n) for n in range(40)] == [keyed_sample(p, 5, n) for n in range(40)]
    assert len({keyed_sample(p, 5, n) for n in range(40)}) > 1  # positions draw apart
    assert len({keyed_sample(p, seed, 3) for seed in range(40)}) > 1  # and seeds
    assert keyed_sample(p, 2**64 - 1, 2**40) in range(VOCAB)  # the extreme seed and a far position are valid


def adversarial_draft(seed, p, q):
    """A draft that tries to bias the output: it sees the noise (it samples q with the same keyed noise) or
    proposes the token the target likes least, by the seed's parity."""
    if seed % 2:
        return [keyed_sample(q[0], seed, 0)]
    return [int(torch.where(p[0] > 0, p[0], torch.inf).argmin())]


def coupled_first_token_histogram(sampler, p, q, samples=SAMPLES):
    counts = torch.zeros(VOCAB)
    for seed in range(samples):
        drafted = adversarial_draft(seed, p, q)
        counts[sampler(drafted, p, seed, 0).emitted(drafted)[0]] += 1
    return counts


def accept_what_the_target_allows(draft_token_ids, target_probs, seed, first_position):
    """A deliberately wrong coupled rule: it keeps any draft token the target gives p > 0."""
    if draft_token_ids and target_probs[0, draft_token_ids[0]] > 0:
        return Verdict(1, keyed_sample(target_probs[1], seed, first_position + 1))
    return drafter_invariant_sample(draft_token_ids, target_probs, seed, first_position)


@pytest.mark.parametrize("name", SETTINGS)
def test_coupled_sampling_matches_the_target_distribution(name):
    """Over seeds at a fixed position, the coupled rule's token follows p, whatever an adversarial draft does."""
    p, q = shaped(SETTINGS[name], seed=7)
    counts = coupled_first_token_histogram(drafter_invariant_sample, p, q)
    assert chi_square_p_value(counts, p[0]) > 1e-3


def test_a_coupled_rule_that_keeps_likely_enough_drafts_fails_the_same_test():
    p, q = shaped(SETTINGS["T=1.0"], seed=7)
    counts = coupled_first_token_histogram(accept_what_the_target_allows, p, q)
    assert chi_square_p_value(counts, p[0]) < 1e-6


# ---- through speculation: a real draft model and the verifier's round -------------------

ENGINE_VOCAB = 12
ENGINE_SAMPLES = 800  # the exact samplers pass at p > 1e-3; the wrong one is caught with 1500 (its own test)


def build_small_vocab_pair(root, seed: int, noise: float, init_range: float):
    """(target, draft) models over a 12-token vocabulary, the draft the target plus `noise`."""
    from specdec.modeling.models import load_causal_lm
    from devkit.testing import build_tiny_model

    target = build_tiny_model(root / "t", ENGINE_VOCAB, eos_token_id=ENGINE_VOCAB - 1, seed=seed,
                              init_range=init_range)
    build_tiny_model(root / "d", ENGINE_VOCAB, eos_token_id=ENGINE_VOCAB - 1, seed=seed + 1, noise_from=target,
                     noise=noise, init_range=init_range)
    return load_causal_lm(str(root / "t")), load_causal_lm(str(root / "d"))


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory):
    """A target and a noisy draft over a 12-token vocabulary, so that histograms are well filled: a small init
    keeps p spread over many tokens; heavy noise makes q overlap p by about half."""
    return build_small_vocab_pair(tmp_path_factory.mktemp("small-vocab"), seed=3, noise=3.0, init_range=0.1)


def two_token_marginals(model, prompt, params):
    """Exact target distributions of the first and second generated tokens: [V] each."""
    with torch.inference_mode():
        first = probs_from_logits(model(input_ids=torch.tensor([prompt])).logits[0, -1:], params)[0]
        batch = torch.tensor([prompt + [x] for x in range(ENGINE_VOCAB)])
        after = probs_from_logits(model(input_ids=batch).logits[:, -1], params)  # [V, V]
    return first, first @ after


def speculative_two_tokens(target, draft, prompt, params, sampler, samples=ENGINE_SAMPLES):
    """Histograms of the first two tokens produced by draft + verify rounds (k = 2).

    draft: a draft model, or a proposer (anything with `start(prompt, sampling, return_probs)`)."""
    from draft_service.model_draft import ModelProposer
    from verifier_service.engines import transformers_engine as engine_module
    from specdec.decoding.draft_block import DraftBlock
    from verifier_service.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(target)
    proposer = draft if hasattr(draft, "start") else ModelProposer(draft)
    counts = torch.zeros(2, ENGINE_VOCAB)
    generator = make_generator(99)
    original = engine_module.rejection_sample
    engine_module.rejection_sample = sampler
    try:
        for i in range(samples):
            state = engine.start(prompt)
            sequence = proposer.start(prompt, dataclasses.replace(params, seed=i), return_probs=True)
            proposal = sequence.propose(2)
            verdict, _ = engine_module.verify_block(engine, state, DraftBlock(proposal.token_ids, proposal.probs), params,
                                                  generator)
            emitted = verdict.emitted(proposal.token_ids)
            if len(emitted) < 2:  # one more plain round for the second token
                verdict, _ = engine_module.verify_block(engine, state, DraftBlock.empty(), params, generator)
                emitted += [verdict.next_token]
            counts[0, emitted[0]] += 1
            counts[1, emitted[1]] += 1
    finally:
        engine_module.rejection_sample = original
    return counts


@pytest.mark.parametrize("name", SETTINGS)
def test_tokens_sampled_through_speculation_follow_the_target(small_vocab_pair, name):
    target, draft = small_vocab_pair
    prompt, params = [1], SETTINGS[name]
    first, second = two_token_marginals(target, prompt, params)
    counts = speculative_two_tokens(target, draft, prompt, params, rejection_sample)
    assert chi_square_p_value(counts[0], first) > 1e-3
    assert chi_square_p_value(counts[1], second) > 1e-3


def test_speculation_with_a_sampler_that_skips_the_residual_is_caught(small_vocab_pair):
    target, draft = small_vocab_pair
    prompt, params = [1], SETTINGS["T=1.0"]
    first, _ = two_token_marginals(target, prompt, params)
    counts = speculative_two_tokens(target, draft, prompt, params, wrong_rejection_sample, samples=1500)
    assert chi_square_p_value(counts[0], first) < 1e-6


def test_tokens_sampled_through_a_suffix_draft_follow_the_target(small_vocab_pair):
    """A suffix draft is deterministic (one-hot q): T=1.0 through it still gives the target's distribution."""
    from draft_service.suffix import SuffixConfig, SuffixProposer

    target, _draft = small_vocab_pair
    proposer = SuffixProposer(SuffixConfig(suffix_scope="global"))
    for output in ([3, 1, 5, 6, 7], [3, 1, 5, 6, 2], [3, 1, 5, 6, 7]):  # earlier outputs that went on after 3, 1
        sequence = proposer.start([3, 1], SamplingParams(), return_probs=False)
        sequence.update(2, output)
        sequence.finish()
        sequence.close()
    probe = proposer.start([3, 1], SamplingParams(), return_probs=False)
    assert probe.propose(2).token_ids == [5, 6], "the suffix cache should draft the cached continuation"
    prompt, params = [3, 1], SETTINGS["T=1.0"]
    first, second = two_token_marginals(target, prompt, params)
    counts = speculative_two_tokens(target, proposer, prompt, params, rejection_sample)
    assert chi_square_p_value(counts[0], first) > 1e-3
    assert chi_square_p_value(counts[1], second) > 1e-3
