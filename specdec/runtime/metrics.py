"""Prometheus metrics, with vLLM's spec-decode counter names.

Each service exposes the ones it can count on `--metrics-port`. The
spec_decode_* counters follow vLLM's convention (vllm/v1/spec_decode/metrics.py):
accepted tokens exclude the bonus token; per-position counts are labelled by
draft position.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

NUM_DRAFTS = Counter("spec_decode_num_drafts", "Verifier rounds that scored a non-empty draft block")
NUM_DRAFT_TOKENS = Counter("spec_decode_num_draft_tokens", "Draft tokens scored by the verifier")
NUM_ACCEPTED_TOKENS = Counter("spec_decode_num_accepted_tokens", "Draft tokens accepted by the verifier")
ACCEPTED_PER_POS = Counter(
    "spec_decode_num_accepted_tokens_per_pos", "Accepted draft tokens by draft position", ["position"]
)
# Structured outputs: of the draft tokens scored, those the draft's grammar forced (ProposeResponse.num_forced)
NUM_FORCED_TOKENS = Counter("spec_decode_num_forced_tokens", "Draft tokens the request's grammar forced, scored by "
                                                             "the verifier (a subset of num_draft_tokens)")
DRAFT_TOKENS_PROPOSED = Counter("specdec_draft_tokens_proposed", "Tokens the draft service proposed")
# Draft: the grammar's work on blocks (--grammar-draft): inner draft tokens cut as forbidden, forced tokens drafted
DRAFT_GRAMMAR_TOKENS = Counter("specdec_draft_grammar_tokens", "Draft tokens the request's grammar cut (forbidden) "
                                                               "or drafted (forced)", ["kind"])
FALLBACK_ROUNDS = Counter("specdec_fallback_rounds", "Rounds decoded without speculation", ["reason"])
# Pipelined drafting. Verifier: blocks the draft sent ahead, used (no round trip) or discarded. Draft: sent, and
# whether the verifier's next sync was the one assumed (hit) or not (miss).
AHEAD_BLOCKS = Counter("specdec_ahead_blocks", "Blocks the draft sent ahead, by what the verifier did with them",
                       ["outcome"])
DRAFT_AHEAD = Counter("specdec_draft_ahead", "Blocks this draft sent ahead, and their outcomes", ["outcome"])
# Verifier: blocks asked for during a plain step instead of waited for (a far draft), by outcome: used (the step's
# token was the block's first), missed (it was not), invalid.
PREFETCHED_BLOCKS = Counter("specdec_prefetched_blocks", "Blocks asked for while a plain step ran, by outcome",
                            ["outcome"])
REQUESTS = Counter("specdec_requests", "Finished requests", ["finish_reason"])
GENERATED_TOKENS = Counter("specdec_generated_tokens", "Tokens generated")
# Gateway: requests moved to another verifier after theirs went away mid-stream (gateway.generation), by the
# status that ended the lost call; and how long the client's stream stalled for it (the failure to the first
# token from the next verifier).
RESUMES = Counter("specdec_gateway_resumes", "Requests resumed on another verifier after theirs went away", ["code"])
RESUME_DELAY = Histogram("specdec_gateway_resume_delay_seconds",
                         "From a verifier's failure to the first token the next verifier sent the resumed request",
                         buckets=LATENCY_BUCKETS)
DRAFT_REPLICA_SEQUENCES = Gauge("specdec_draft_replica_sequences",
                                "Sequences with a draft stream open on each draft replica", ["replica"])
LIVE_DRAFT_REPLICAS = Gauge("specdec_draft_replicas_live", "Draft replicas this verifier routes sequences to now")
DRAFT_TENANT_MOVES = Counter("specdec_draft_tenant_moves", "Tenants routed to another draft replica than their last "
                                                           "one (theirs left the live replicas, or one came back)")
USABLE_VERIFIERS = Gauge("specdec_gateway_usable_verifiers", "Verifiers this gateway may send requests to now")
LIVE_SEQUENCES = Gauge("specdec_live_sequences", "Sequences holding state (KV cache) in this process")
CACHE_TOKENS = Gauge("specdec_cache_tokens", "Tokens held in KV caches in this process")
TIME_TO_FIRST_TOKEN = Histogram("specdec_time_to_first_token_seconds", "Time to first token", buckets=LATENCY_BUCKETS)
INTER_TOKEN_LATENCY = Histogram(
    "specdec_inter_token_latency_seconds", "Time between streamed tokens", buckets=LATENCY_BUCKETS
)
VERIFY_FORWARD_TIME = Histogram(
    "specdec_verify_forward_seconds", "Target forward pass time per verify round", buckets=LATENCY_BUCKETS
)
DRAFT_WAIT_TIME = Histogram(
    "specdec_draft_wait_seconds", "Time a verify round waited for its draft block", buckets=LATENCY_BUCKETS
)


def record_round(num_draft_tokens: int, num_accepted: int, num_forced: int = 0) -> None:
    """Count one verified round the way vLLM does (num_forced: of the draft tokens, those the grammar forced)."""
    if num_draft_tokens == 0:
        return
    NUM_DRAFTS.inc()
    NUM_DRAFT_TOKENS.inc(num_draft_tokens)
    NUM_ACCEPTED_TOKENS.inc(num_accepted)
    if num_forced:
        NUM_FORCED_TOKENS.inc(num_forced)
    for position in range(num_accepted):
        ACCEPTED_PER_POS.labels(position=str(position)).inc()


def serve(port: int, host: str = "") -> int | None:
    """Start the /metrics HTTP endpoint on the gRPC server's --host; -1 turns it off. Returns the port.

    A wildcard host ("[::]", "0.0.0.0", "") binds every IPv4 address, as before; any other host (say
    127.0.0.1) binds only that one, so `--host 127.0.0.1` keeps /metrics off the network too."""
    if port < 0:
        return None
    address = host.strip("[]")
    server, _thread = start_http_server(port, addr="0.0.0.0" if address in ("", "::", "0.0.0.0", "*") else address)
    return server.server_port


ENGINE_STEP_SEQUENCES = Histogram(
    "specdec_engine_step_sequences", "Sequences that received tokens from one batched engine step (vLLM engine)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
STEP_BASE_TIME = Gauge("specdec_engine_step_base_seconds",
                       "Batched engine step time, fitted T(n) = base + per_token * n over decode-only steps: base")
STEP_TOKEN_TIME = Gauge("specdec_engine_step_token_seconds",
                        "Batched engine step time, fitted T(n) = base + per_token * n: what each token computed adds")


# Suffix decoding (draft_service/suffix.py): the global cache of finished outputs, and how often it drafts.
SUFFIX_CACHED_REQUESTS = Gauge("specdec_draft_suffix_cached_requests", "Finished outputs held by the suffix cache")
SUFFIX_CACHED_TOKENS = Gauge("specdec_draft_suffix_cached_tokens", "Output tokens held by the suffix cache")
SUFFIX_EVICTIONS = Counter(
    "specdec_draft_suffix_evictions",
    "Outputs evicted from the suffix cache (reason: a tenant's requests or tokens budget; tenants: with the whole "
    "cache of the tenant idle longest, for a new one), or cut to fit it (oversized)",
    ["reason"],
)
SUFFIX_PROPOSALS = Counter("specdec_draft_suffix_proposals", "Suffix proposals asked for (k > 0)")
SUFFIX_CHAINED_TOKENS = Counter(
    "specdec_draft_suffix_chained_tokens",
    "Suffix draft tokens chained past a proposal's match (--suffix-chain); the verifier verifies them while they pay",
)
SUFFIX_PROPOSALS_MATCHED = Counter(
    "specdec_draft_suffix_proposals_matched",
    "Suffix proposals that drafted at least one token, by the tree that won (request or cache)",
    ["source"],
)
# Hybrid draft (--method hybrid): which side drafted each block
HYBRID_BLOCKS = Counter(
    "specdec_draft_hybrid_blocks",
    "Hybrid draft blocks by the side that drafted them (suffix: its match reached --hybrid-min-suffix tokens, by "
    "default any match; model: otherwise)",
    ["source"],
)
