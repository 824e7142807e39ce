"""Prometheus /metrics of the three real processes agree with the statistics the API returned.

The spec_decode_* counters use vLLM's names and conventions. The verifier owns
them and counts them round by round; the gateway does not count them again (a
Prometheus sum over jobs must not double-count); the draft counts the tokens it
proposed. The requests run on the session's model-draft stack (conftest.py), which other modules use too:
every figure checked is the change over these requests, /metrics scraped before and after.
"""

from __future__ import annotations

import pytest

from devkit.stack import scrape_metrics as scrape
from specdec.v1 import gateway_pb2

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("stack", ["model"], indirect=True)]

REQUESTS = [
    dict(prompt="The quick brown fox jumps over the lazy dog. The quick", max_tokens=24, num_speculative_tokens=4),
    dict(prompt="def add(a, b):\n    return", max_tokens=20, num_speculative_tokens=3),
    dict(prompt="SELECT id, name FROM users", max_tokens=20, temperature=0.8, seed=7, num_speculative_tokens=4),
]
SPEC_DECODE = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted((k, str(v)) for k, v in labels.items()))), 0.0)


def per_position(samples: dict) -> dict[int, float]:
    return {int(dict(labels)["position"]): v for (name, labels), v in samples.items()
            if name == "spec_decode_num_accepted_tokens_per_pos_total" and v}


def change(after: dict, before: dict) -> dict:
    """Every sample's increase (counters and histograms only grow; a sample new since `before` counts whole)."""
    return {key: v - before.get(key, 0.0) for key, v in after.items()}


def settled_scrape(services, wait_s: float = 10.0) -> dict:
    """/metrics per service once the draft's counters have stopped moving: a stream the verifier half-closed
    after an earlier module's request may still be draining in the draft."""
    import time

    deadline, last = time.monotonic() + wait_s, None
    while True:
        now = {name: scrape(service.metrics_port) for name, service in services.items()}
        if now == last or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(0.5)


@pytest.fixture(scope="module")
def scraped(stack):
    """Send a few requests (unary and streamed); return (final statistics per request, /metrics change per
    service over them)."""
    _method, services, gateway = stack
    before = settled_scrape(services)
    finals = [gateway.Generate(gateway_pb2.GenerateRequest(**r), timeout=60) for r in REQUESTS]
    finals.append(list(gateway.GenerateStream(gateway_pb2.GenerateRequest(**REQUESTS[0]), timeout=60))[-1])
    after = settled_scrape(services)
    return finals, {name: change(after[name], before[name]) for name in services}


def expected(finals) -> dict:
    stats = [f.speculation for f in finals]
    positions: dict[int, int] = {}
    for s in stats:
        for position, count in enumerate(s.accepted_per_position):
            if count:
                positions[position] = positions.get(position, 0) + count
    return {
        "spec_decode_num_drafts": sum(s.num_drafts for s in stats),
        "spec_decode_num_draft_tokens": sum(s.num_draft_tokens for s in stats),
        "spec_decode_num_accepted_tokens": sum(s.num_accepted_tokens for s in stats),
        "per_position": positions,
    }


def test_the_requests_speculated(scraped):
    finals, _metrics = scraped
    want = expected(finals)
    assert want["spec_decode_num_drafts"] > 0 and want["spec_decode_num_accepted_tokens"] > 0


def test_spec_decode_counters_match_the_api_statistics(scraped):
    finals, metrics = scraped
    samples, want = metrics["verifier"], expected(finals)
    for name in SPEC_DECODE:
        assert value(samples, name + "_total") == want[name] > 0, name
    assert per_position(samples) == want["per_position"]
    assert sum(per_position(samples).values()) == want["spec_decode_num_accepted_tokens"]
    # vLLM's convention: position i is accepted only if every position before it was
    positions = per_position(samples)
    assert all(positions[i] >= positions.get(i + 1, 0) for i in positions)


def test_a_sum_over_jobs_counts_each_round_once(scraped):
    """The verifier owns spec_decode_*: the gateway and the draft leave them at zero."""
    finals, metrics = scraped
    want = expected(finals)
    for name in SPEC_DECODE:
        assert sum(value(samples, name + "_total") for samples in metrics.values()) == want[name], name
    for service in ("gateway", "draft"):
        assert not per_position(metrics[service]), service
        assert all(value(metrics[service], name + "_total") == 0 for name in SPEC_DECODE), service


def test_verifier_counts_requests_and_tokens(scraped):
    finals, metrics = scraped
    verifier = metrics["verifier"]
    finished = sum(v for (name, _labels), v in verifier.items() if name == "specdec_requests_total")
    assert finished == len(finals)
    assert value(verifier, "specdec_generated_tokens_total") == sum(f.usage.completion_tokens for f in finals)


def test_draft_counts_the_tokens_it_proposed_and_the_blocks_it_sent_ahead(scraped):
    """Pipelined drafting (the default) sends blocks ahead: some are discarded (another outcome came true) or
    cut to the round's k, so the draft proposes more tokens than the verifier scores. The verifier's counts of
    ahead blocks used and discarded equal the sums over the requests' statistics."""
    finals, metrics = scraped
    proposed = value(metrics["draft"], "specdec_draft_tokens_proposed_total")
    scored = expected(finals)["spec_decode_num_draft_tokens"]
    assert proposed >= scored > 0
    used = sum(f.speculation.num_ahead_used for f in finals)
    discarded = sum(f.speculation.num_ahead_discarded for f in finals)
    verifier = metrics["verifier"]
    assert value(verifier, "specdec_ahead_blocks_total", outcome="used") == used
    assert sum(v for (name, labels), v in verifier.items()
               if name == "specdec_ahead_blocks_total" and dict(labels)["outcome"] != "used") == discarded
    sent = value(metrics["draft"], "specdec_draft_ahead_total", outcome="sent")
    assert sent >= used + discarded and value(metrics["draft"], "specdec_draft_ahead_total", outcome="hit") >= used
    print(f"figure: {len(finals)} requests: {scored:.0f} draft tokens scored of {proposed:.0f} proposed; "
          f"{sent:.0f} blocks sent ahead, {used} used, {discarded} discarded")


@pytest.mark.parametrize("service, histogram", [
    ("gateway", "specdec_time_to_first_token_seconds"),
    ("gateway", "specdec_inter_token_latency_seconds"),
    ("verifier", "specdec_verify_forward_seconds"),
    ("verifier", "specdec_draft_wait_seconds"),
])
def test_latency_histograms_have_observations(scraped, service, histogram):
    finals, metrics = scraped
    samples = metrics[service]
    count = value(samples, histogram + "_count")
    assert count > 0, f"{service} has no {histogram} observations"
    assert value(samples, histogram + "_bucket", le="+Inf") == count
    assert value(samples, histogram + "_sum") > 0
    if histogram == "specdec_time_to_first_token_seconds":
        assert count == len(finals)  # one first token per request
    if histogram == "specdec_verify_forward_seconds":
        assert count == sum(f.speculation.num_rounds for f in finals)  # one forward per round
