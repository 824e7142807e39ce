"""A draft tier as real processes (issue 35): two draft replicas behind one verifier, four tenants, and the
replica that owns most tenants killed (SIGKILL) mid-run. Speculation goes on on the other replica: every
request completes, greedy output equals the k = 0 output, and the verifier counts the tenants that moved."""

from __future__ import annotations

from tools.draft_tier_probe import KEYS, busiest_replica, differing, kill_when, play, tier_metrics, tier_stack
from tools.failover_probe import prompts

MAX_TOKENS = 48


def test_a_killed_draft_replica_moves_its_tenants_and_changes_no_output(tiny_pair, tmp_path):
    target, draft = tiny_pair
    texts = prompts(3 * len(KEYS))
    # each tenant asks the same things twice: the second time its replica's suffix memory holds the answers
    requests = {key: [(text, MAX_TOKENS) for text in texts[3 * i:3 * i + 3] * 2] for i, key in enumerate(KEYS)}
    with tier_stack(target, draft, "affine", tmp_path, timeout_s=120) as services:
        gateway, verifier = services["gateway"].address, services["verifier"]
        reference = play(gateway, requests, k=0)
        assert [r.error for rs in reference.values() for r in rs if r.error] == []
        assert tier_metrics(verifier)["tenant_moves"] == 0
        victim = busiest_replica(services, KEYS, ["draft", "draft2"])  # owns 2 or more of the 4 tenants
        half = sum(len(r.token_ids) for rs in reference.values() for r in rs) // 2
        killed = []
        disturbed = play(gateway, requests, k=4, on_tokens=kill_when(half, services[victim], killed))
        assert killed, "the run ended before the kill"
        assert [r.error for rs in disturbed.values() for r in rs if r.error] == []
        assert differing(disturbed, reference) == []
        assert sum(r.accepted for rs in disturbed.values() for r in rs) > 0  # it did speculate
        after = tier_metrics(verifier)
        assert after["tenant_moves"] >= 1
        assert after["live_replicas"] == 1
        assert set(after["replica_sequences"].values()) == {0.0}  # every stream opened was counted closed
        assert "moves from draft replica" in verifier.log()
