"""A seed means what it says: through the three running services, a seeded sampled request gives the same tokens
with the suffix, n-gram and model drafts, with k fixed (1, 4), adaptive (unset) or 0 (speculation off), on every
repeat. The verifier draws the token at each position with noise keyed by (seed, position) and accepts a draft
token iff it equals that draw (verifier_service/speculation/rejection_sampler.py: drafter_invariant_sample)."""

import pytest

from specdec.v1 import gateway_pb2

pytestmark = pytest.mark.slow

PROMPTS = ["The quick brown fox", '{"name": "Ada", "age": 36}', "def add(a, b):", "The The The The"]
KS = [4, 1, None, 0]  # None: the server adapts k; 0: speculation off
REPEATS = 2
OUTPUTS: dict[str, list[int]] = {}  # prompt -> tokens, shared by the three stacks: plain decoding is one


@pytest.mark.parametrize("stack", ["suffix", "ngram", "model"], indirect=True)
def test_the_same_seed_gives_the_same_tokens_whatever_the_draft_and_k(stack):
    method, _services, gateway = stack
    drafted = accepted = 0
    for prompt in PROMPTS:
        seen = {}
        for k in KS:
            for repeat in range(REPEATS):  # repeats: the suffix draft learns each output and proposes it next time
                request = gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=24, temperature=0.9, seed=1234)
                if k is not None:
                    request.num_speculative_tokens = k
                response = gateway.Generate(request, timeout=120)
                seen[(k, repeat)] = list(response.token_ids)
                drafted += response.speculation.num_draft_tokens
                accepted += response.speculation.num_accepted_tokens
        expected = OUTPUTS.setdefault(prompt, seen[(0, 0)])
        differing = {key: tokens for key, tokens in seen.items() if tokens != expected}
        assert not differing, f"{method}, {prompt!r}: expected {expected}, got (k, repeat) -> {differing}"
    assert drafted > 0, f"{method}: nothing was drafted, so nothing was tested"
    if method != "ngram":  # the tiny random target rarely continues an n-gram of its prompt at T=0.9
        assert accepted > 0, f"{method}: no draft token was accepted"
