"""Suffix decoding: propose the most frequent continuation of the longest match in this request or in past outputs.

SuffixDecoding (Oliaro et al., arXiv 2411.04975; vLLM's `suffix` method, backed by Snowflake's
arctic-inference). No model. Two kinds of suffix tree (`draft_service/suffix_cache.py`):
- the request's own: its prompt and the tokens the target has verified so far;
- the global cache: the outputs of finished requests, one tree per scope (`--suffix-scope`: per tenant by
  default), each scope under its own budget, so one tenant's traffic never evicts another's outputs.
Each proposal takes the request's own draft unless the cache matched a longer tail of the context
(`prefer_own`; Arctic takes the better score). Its length adapts to the evidence: at most
`max_spec_factor * match_len` tokens, and it stops where the continuation's estimated probability
falls below `min_token_prob`, so a weak match drafts fewer tokens or none. The verifier's k is the
maximum.

What enters the global cache, and when: only at `finish()` (the verifier ended the stream
normally), and only tokens the target verified (`tokens[prompt:verified]`). A cancelled or failed
request (`close()` without `finish()`) adds nothing, at no cost; inserting as tokens were verified
would have to undo them on close, and would break the cache's oldest-first order that lets
eviction free memory without per-node bookkeeping. The price: a request's output helps other
requests only once it finishes (its own tree has it at once).

Chaining (`--suffix-chain`, not in Arctic). A draft stops where its match's evidence ends: at
`max_spec_factor * match_len` tokens, or where the continuation turns uncertain. On repetitive
traffic that is often where one source of text hands over to another: an extraction's JSON keys come
from past outputs, its values from the prompt. So where a draft stops short of k, the draft matches
again on the context plus what it drafted, and goes on while the new match is at least
CHAIN_MIN_MATCH tokens and the running probability (the product of each part's) stays above
`min_token_prob`. The chained tokens are the block's last `num_chained`: the verifier judges them
apart from the rest and verifies them only as far as their own acceptance pays on its measured
round times (`SpeculationPolicy.cut_block`). Whether chained tokens pay depends on the machine: nearly
free where a block of 16 costs about what one of 4 does, a loss where each token costs a good part of a
step. So the draft only marks them, and the verifier, which knows its round times, decides.

Proposed tokens are appended to `tokens` (the proposer contract) but indexed only once an update
keeps them, so unverified tokens never enter any tree. Drafting ahead, the draft syncs itself to its
own guess of the verifier's next sync (`update(..., assumed=True)`); those tokens are indexed only when
the real sync matches (`confirm`). Indexing them at once would make every miss a rollback into indexed
tokens, which the tree cannot undo: a rebuild of the request's tree from the whole sequence, on the
draft's event loop, where a proposal is a walk down the tree.
"""

from __future__ import annotations

import dataclasses

from draft_service.proposer import DraftSequence, Proposer, ProposerError
from draft_service.suffix_cache import DEFAULT_MAX_SCOPES, Draft, Insertion, SuffixCache, SuffixTree
from specdec.runtime import metrics
from specdec.runtime.config import option
from specdec.decoding.draft_block import DraftBlock
from specdec.decoding.sampling import SamplingParams

SCOPES = ("global", "tenant")
# A chained part must rest on a match of at least this many tokens: chaining on one-token matches drafts tokens that
# low-repetition text (chat) rejects, and gains repetitive text nothing that two-token matches do not.
CHAIN_MIN_MATCH = 2


@dataclasses.dataclass(frozen=True)
class SuffixConfig:
    """Suffix decoding (--method suffix)"""

    suffix_max_depth: int = option(24, "suffix tree depth: the longest match plus draft, in tokens (vLLM's default; "
                                       "Arctic's is 64)")
    suffix_max_cached_requests: int = option(10000, "finished outputs each tenant's cache keeps (the one cache's, "
                                                    "with --suffix-scope global), its own oldest evicted first "
                                                    "(vLLM's default; 0 turns the global cache off)")
    suffix_max_cached_tokens: int = option(200_000, "output tokens each tenant's cache keeps (the one cache's, with "
                                                    "--suffix-scope global), its own oldest evicted first, so no "
                                                    "tenant's traffic evicts another's (0 turns it off). All caches "
                                                    "hold at most --suffix-max-tenants x this many tokens, each at "
                                                    "most 2 tree nodes")
    suffix_max_tenants: int = option(
        DEFAULT_MAX_SCOPES, "tenants whose caches are kept (--suffix-scope tenant): a new tenant beyond this evicts the "
                            "whole cache of the tenant that drafted or finished a request least recently, so memory "
                            "stays bounded and a newcomer still gets a cache. At least the number of API keys: then "
                            "no tenant's cache is ever evicted for another's")
    suffix_scope: str = option("tenant", "share the global cache across all requests, or keep one per tenant "
                                         "(a shared cache lets one tenant's speed reveal what others generated)",
                               choices=list(SCOPES))
    suffix_max_spec_factor: float = option(1.0, "draft at most this many tokens per matched token "
                                                "(Arctic's and vLLM's default)")
    suffix_max_spec_offset: float = option(0.0, "plus this many (Arctic's default)")
    # Arctic's and vLLM's default is 0.1. On a CPU, where verifying a token costs a good part of a step, a
    # continuation seen less than 3 times in 10 is more often a rejected token than its verification is worth.
    suffix_min_token_prob: float = option(0.3, "stop the draft where the continuation's estimated probability falls "
                                               "below this (Arctic's and vLLM's default: 0.1)")
    suffix_chain: bool = option(True, "where a draft stops short of k, match again on the context plus the draft and "
                                      "go on (an output's schema from past outputs, then a value from the prompt); "
                                      "the verifier verifies the chained tokens only while they pay")

    def __post_init__(self):
        problems = []
        if self.suffix_max_depth < 2:
            problems.append(f"--suffix-max-depth must be at least 2, got {self.suffix_max_depth}")
        if self.suffix_max_cached_requests < 0:
            problems.append(f"--suffix-max-cached-requests must be >= 0, got {self.suffix_max_cached_requests}")
        if self.suffix_max_cached_tokens < 0:
            problems.append(f"--suffix-max-cached-tokens must be >= 0, got {self.suffix_max_cached_tokens}")
        if self.suffix_max_tenants < 1:
            problems.append(f"--suffix-max-tenants must be at least 1, got {self.suffix_max_tenants}")
        if self.suffix_scope not in SCOPES:
            problems.append(f"--suffix-scope must be one of {', '.join(SCOPES)}, got {self.suffix_scope!r}")
        if not self.suffix_max_spec_factor > 0:
            problems.append(f"--suffix-max-spec-factor must be > 0, got {self.suffix_max_spec_factor}")
        if not 0.0 <= self.suffix_min_token_prob <= 1.0:
            problems.append(f"--suffix-min-token-prob must be in [0, 1], got {self.suffix_min_token_prob}")
        if problems:
            raise ValueError("; ".join(problems))


class SuffixSequence(DraftSequence):
    def __init__(self, prompt_ids: list[int], proposer: SuffixProposer, scope: str):
        self._config = proposer.config
        self._cache = proposer.cache
        self._scope = scope
        self._tree = SuffixTree(self._config.suffix_max_depth)
        self._track = None  # set on the first _extend, once `tokens` exists
        self._finished = self._closed = False
        super().__init__(prompt_ids)
        self._prompt_length = len(self.tokens)

    @property
    def verified_length(self) -> int:
        """tokens[:verified_length] are the prompt and what the target verified: all indexed."""
        return self._track.length

    def update(self, keep_length: int, append_token_ids: list[int], assumed: bool = False) -> None:
        if self._closed:
            raise ProposerError("the sequence is closed")
        super().update(keep_length, append_token_ids)
        if not assumed:
            self._track.index_to(len(self.tokens))  # a kept proposal is verified: index it too

    def confirm(self, length: int) -> None:
        if not self._closed:
            self._track.index_to(min(length, len(self.tokens)))

    def propose(self, k: int) -> DraftBlock:
        if k <= 0 or self._closed:
            return DraftBlock.empty()
        config = self._config
        draft, source = self._draft(self.tokens, k)
        metrics.SUFFIX_PROPOSALS.inc()
        if draft.token_ids:
            metrics.SUFFIX_PROPOSALS_MATCHED.labels(source=source).inc()
        token_ids, matched = list(draft.token_ids), len(draft.token_ids)
        prob = draft.probs[-1] if draft.probs else 0.0
        while config.suffix_chain and token_ids and len(token_ids) < k:
            more, _ = self._draft(self.tokens[-config.suffix_max_depth:] + token_ids, k - len(token_ids))
            if more.match_len < CHAIN_MIN_MATCH:
                break
            taken = 0
            while taken < len(more.token_ids) and prob * more.probs[taken] >= config.suffix_min_token_prob:
                taken += 1
            if not taken:
                break
            prob *= more.probs[taken - 1]
            token_ids += more.token_ids[:taken]
        if len(token_ids) > matched:
            metrics.SUFFIX_CHAINED_TOKENS.inc(len(token_ids) - matched)
        self.tokens.extend(token_ids)  # unverified: indexed only if an update keeps them
        return DraftBlock(token_ids, None, num_chained=len(token_ids) - matched)

    def _draft(self, tokens: list[int], k: int) -> tuple[Draft, str]:
        """The better of the request's own draft and the cache's for the context `tokens`, and its source."""
        config = self._config
        context = tokens[-config.suffix_max_depth:]
        args = (k, config.suffix_max_spec_factor, config.suffix_max_spec_offset, config.suffix_min_token_prob)
        own = self._tree.speculate(context, *args)
        cached = self._cache.speculate(self._scope, context, *args)
        return (own, "request") if prefer_own(own, cached) else (cached, "cache")

    def finish(self) -> None:
        """The stream ended normally: cache the verified output for later requests (once)."""
        if self._finished or self._closed:
            return
        self._finished = True
        output = self.tokens[self._prompt_length: self.verified_length]
        record_insertion(self._cache, self._cache.insert(self._scope, output))

    def close(self) -> None:
        """Free the request's tree. Without finish() first, nothing of this request is cached."""
        self._closed = True
        self._tree = self._track = None  # drop the nodes now; a late propose returns nothing

    def _extend(self, token_ids: list[int]) -> None:
        """Append; only the prompt is indexed here, the rest by `update` or `confirm` once the verifier has it."""
        self.tokens.extend(token_ids)
        if self._track is None:
            self._track = self._tree.track(self.tokens)
            self._track.index_to(len(self.tokens))

    def _truncate(self, length: int) -> None:
        del self.tokens[length:]
        if length < self._track.length:
            # Only proposals and assumed syncs are ever rolled back, and neither is indexed; a rollback into
            # verified tokens (not something the verifier does) rebuilds the tree from what is left: O(sequence).
            self._tree = SuffixTree(self._config.suffix_max_depth)
            self._track = self._tree.track(self.tokens)
            self._track.index_to(length)


def prefer_own(own: Draft, cached: Draft) -> bool:
    """The request's own draft, unless the cache's rests on a strictly longer match (or the request has none).

    Arctic (and vLLM's `suffix`) take the higher score, a sum of continuation frequencies. On an equal
    match that favours the cache, whose frequencies pool many other outputs, over the request's own
    text, which predicts the request better: where each prompt differs (JSON, code), a draft from the cache
    proposes more tokens and has fewer accepted than one from the request's text alone. A longer match in the
    cache is more specific evidence than the request has, and wins.
    """
    if not own.token_ids:
        return not cached.token_ids
    return own.match_len >= cached.match_len


def record_insertion(cache: SuffixCache, insertion: Insertion) -> None:
    if insertion.truncated:
        metrics.SUFFIX_EVICTIONS.labels(reason="oversized").inc()
    if insertion.evicted_for_requests:
        metrics.SUFFIX_EVICTIONS.labels(reason="requests").inc(insertion.evicted_for_requests)
    if insertion.evicted_for_tokens:
        metrics.SUFFIX_EVICTIONS.labels(reason="tokens").inc(insertion.evicted_for_tokens)
    if insertion.evicted_for_scopes:
        metrics.SUFFIX_EVICTIONS.labels(reason="tenants").inc(insertion.evicted_for_scopes)
    metrics.SUFFIX_CACHED_REQUESTS.set(cache.cached_requests)
    metrics.SUFFIX_CACHED_TOKENS.set(cache.cached_tokens)


class SuffixProposer(Proposer):
    method = "suffix"
    inline = True  # a proposal costs tens of microseconds; all cache access stays on one thread
    sizes_blocks = True  # drafts as far as the match's evidence goes (max_spec_factor, min_token_prob)

    def __init__(self, config: SuffixConfig | None = None):
        self.config = config or SuffixConfig()
        self.cache = SuffixCache(self.config.suffix_max_depth, self.config.suffix_max_cached_requests,
                                 self.config.suffix_max_cached_tokens,
                                 self.config.suffix_max_tenants if self.config.suffix_scope == "tenant" else 1)

    def start(self, prompt_ids: list[int], sampling: SamplingParams, return_probs: bool,
              tenant: str = "") -> SuffixSequence:
        # Deterministic proposals: q is one-hot, whatever the sampling parameters.
        scope = tenant if self.config.suffix_scope == "tenant" else ""
        return SuffixSequence(prompt_ids, self, scope)
