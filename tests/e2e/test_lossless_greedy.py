"""Greedy output through the three running services equals model.generate(do_sample=False), token for token."""

import concurrent.futures
import os

import pytest
import torch

from devkit.stack import scrape_metrics
from specdec.modeling.models import load_causal_lm, load_tokenizer
from specdec.v1 import gateway_pb2

pytestmark = pytest.mark.slow

PROMPTS = [
    "The quick brown fox", '{"name": "Ada", "age": 36}', "SELECT id FROM users", "def add(a, b):",
    "Speculative decoding", "café", "東京", "for i in range(10):", "Hello, world!", "a", "zzzz",
    '{"tags": ["math", "code"]} -> {"tags": [', "return a + b", "ORDER BY name;", "🙂🙂🙂", "The lazy dog",
    "SELECT id, name FROM users WHERE age > 30 ORDER BY", "print(i * i)", "naïve", "emoji and more",
    "1 2 3 4 5 6 7 8", "The The The The", "over the", "jumps", "verifies them in one pass", "def f(x):\n    return",
    '"age": 36, "age": 36, "age":', "WHERE WHERE", "Ünïcödé", "tokens and verifies",
]
MAX_TOKENS = 24
# Requests in flight at once. The transformers verifier computes each sequence's rounds as jobs of their own (one
# row per forward pass, its own KV cache), so concurrency cannot change a greedy token; it overlaps one request's
# round trips between the three processes with another's compute, which is where serial requests spend their time.
CONCURRENCY = 6
# SPECDEC_DEVICE=cuda runs the reference here and both services (which read the same variable) on a GPU.
DEVICE = os.environ.get("SPECDEC_DEVICE", "cpu")


@pytest.fixture(scope="module")
def reference(tiny_pair):
    """Target-only greedy continuations, computed in this process."""
    tokenizer = load_tokenizer(str(tiny_pair[0]))
    model = load_causal_lm(str(tiny_pair[0]), device=DEVICE)
    eos = tokenizer.eos_token_id
    expected = {}
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids], device=DEVICE),
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=DEVICE),
                                 max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=eos)
        tokens = out[0, len(ids):].tolist()
        expected[prompt] = tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
    return expected


def generate_all(gateway, k: int) -> list:
    """Every prompt through the gateway at temperature 0 and block length k, CONCURRENCY at a time; the responses
    in PROMPTS' order."""
    def one(prompt):
        return gateway.Generate(gateway_pb2.GenerateRequest(
            prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.0, num_speculative_tokens=k))

    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        return list(pool.map(one, PROMPTS))


@pytest.mark.parametrize("k", [1, 4, 8])
# suffix and hybrid: the suffix cache warms over k
@pytest.mark.parametrize("stack", ["ngram", "model", "suffix", "hybrid"], indirect=True)
def test_greedy_output_is_token_identical_to_target_only_decoding(stack, reference, k):
    method, services, gateway = stack
    mismatches, accepted, ahead_used = [], 0, 0
    for prompt, response in zip(PROMPTS, generate_all(gateway, k)):
        accepted += response.speculation.num_accepted_tokens
        ahead_used += response.speculation.num_ahead_used
        if list(response.token_ids) != reference[prompt]:
            mismatches.append((prompt, list(response.token_ids), reference[prompt]))
    assert not mismatches, f"{method} k={k}: {len(mismatches)} prompts differ, first: {mismatches[0]}"
    if method == "model":
        assert accepted > 0, "the model draft should be accepted sometimes"
        if k == 4:  # pipelined drafting is on by default: whole blocks accepted, guesses true, blocks came ahead
            # (deterministic: greedy; at k=8 the tiny draft never has all 8 accepted, so nothing is drafted ahead)
            assert ahead_used > 0, f"model k={k}: no block drafted ahead was used"
    if method == "suffix" and k > 1:
        # the same prompts ran at k=1 first: their outputs are in the suffix cache, so drafts must be accepted
        assert accepted > len(PROMPTS), f"suffix k={k}: only {accepted} drafts accepted with a warm cache"
    if method == "hybrid" and k > 1:  # the warm cache answers the prompts seen before, the model the rest
        drafted = scrape_metrics(services["draft"].metrics_port)
        for source in ("suffix", "model"):
            assert drafted.get(("specdec_draft_hybrid_blocks_total", (("source", source),)), 0) > 0, source


@pytest.mark.parametrize("stack", ["model:wrong_ahead"], indirect=True)
def test_greedy_output_is_identical_when_every_ahead_block_is_wrong(stack, reference):
    """wrong_ahead: the draft sends every block it drafts ahead with each token changed; the verifier uses them
    (their tags are right), rejects the wrong tokens, and the output is still the target's."""
    variant, _services, gateway = stack
    used = 0
    for prompt, response in zip(PROMPTS, generate_all(gateway, 4)):
        assert list(response.token_ids) == reference[prompt], (variant, prompt)
        used += response.speculation.num_ahead_used
    assert used > 0, "no wrong block drafted ahead was ever verified"
