"""Draft service settings."""

from __future__ import annotations

import dataclasses

from draft_service.faults import FaultInjection
from draft_service.hybrid import HybridConfig
from draft_service.replay import BenchmarkDrafts
from draft_service.suffix import SuffixConfig
from specdec.decoding.grammar import GrammarCompileConfig
from specdec.runtime.config import InternalServiceConfig, ModelConfig, option

# The methods that run a draft model: --model is its directory (for the others, the target's tokenizer)
MODEL_METHODS = ("model", "hybrid")


@dataclasses.dataclass(frozen=True)
class DraftConfig(ModelConfig, SuffixConfig, HybridConfig, GrammarCompileConfig, FaultInjection, BenchmarkDrafts,
                  InternalServiceConfig):
    """Draft proposer"""

    model: str = option("", "draft model dir (method=model or hybrid), or the tokenizer dir the n-gram proposer "
                            "reports")
    method: str = option("ngram", "proposer: a small causal LM, n-gram lookup in the request, suffix decoding "
                                  "over the request and earlier outputs, hybrid (suffix where it matches, the "
                                  "model otherwise), or only the text a constrained request's grammar forces "
                                  "(replay: a benchmarking tool, needs --enable-benchmark-drafts)",
                         choices=["model", "ngram", "suffix", "hybrid", "grammar", "replay"])
    ngram_min: int = option(1, "shortest n-gram the lookup matches")
    ngram_max: int = option(4, "longest n-gram the lookup matches")
    max_sequences: int = option(256, "live sequences at most; more get RESOURCE_EXHAUSTED")
    sequence_ttl_s: float = option(60.0, "a stream that sends nothing for this long is ended (ABORTED) and its "
                                         "sequence freed, so idle streams cannot hold the slots (0: no limit)")
    max_speculative_tokens: int = option(32, "largest block a round may ask for")
    propose_ahead: str = option("cheap", "pipelined drafting, when the verifier asks for it: draft the next block "
                                         "ahead with cheap proposers only (ngram, suffix: a model draft busy drafting "
                                         "ahead answers every miss only after finishing that block), "
                                         "with every proposer, or never", choices=["cheap", "always", "never"])
    grammar_draft: str = option("on", "structured outputs: the request's grammar cuts each block at its first "
                                      "forbidden token and drafts the text it forces (off: the proposer alone; the "
                                      "verifier enforces the constraint either way)", choices=["on", "off"])

    def __post_init__(self):
        SuffixConfig.__post_init__(self)
        HybridConfig.__post_init__(self)
        GrammarCompileConfig.__post_init__(self)
        FaultInjection.__post_init__(self)
        BenchmarkDrafts.__post_init__(self)
