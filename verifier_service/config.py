"""Verifier service settings."""

from __future__ import annotations

import dataclasses

from specdec.decoding.grammar import GrammarCompileConfig
from specdec.runtime.config import InternalServiceConfig, ModelConfig, option


@dataclasses.dataclass(frozen=True)
class VerifierConfig(ModelConfig, GrammarCompileConfig, InternalServiceConfig):
    """Target model and speculation"""

    model: str = option("", "target model: a local directory (or a hub id where a hub is reachable)")
    engine: str = option("transformers", "verifier engine", choices=["transformers", "vllm"])
    prepack_weights: bool = option(
        True, "on CPU in float32: reorder the target's linear weights once for oneDNN, so that verifying a block "
              "costs far less against one decode step and a row comes out bitwise the same alone or in a block; "
              "costs the linears' size in anonymous memory")
    draft: str = option(
        "", "draft service HOST:PORT; or a draft tier: a list A:PORT,B:PORT, or dns:///NAME:PORT (a headless Service, "
            "looked up again every --draft-check-s); empty decodes without speculation")
    draft_routing: str = option(
        "affine", "with several draft replicas, which one a sequence drafts on: affine, its tenant's by rendezvous "
                  "hashing over the live replicas (a tenant's suffix memory stays on one); random, any live one",
        choices=["affine", "random"])
    draft_check_s: float = option(5.0, "check each draft replica (answering, SERVING, same tokenizer) this often, "
                                       "besides at once when a stream to it fails or its health changes")
    num_speculative_tokens: int = option(4, "default block length k when a request leaves it unset")
    max_speculative_tokens: int = option(16, "largest k a request may ask for")
    spec_max_concurrency: int = option(
        0, "adaptive requests decode without speculation while more sequences than this are live (0: no cap; the "
           "vLLM engine charges each block to the batched step it joins either way)")
    draft_timeout_ms: float = option(
        1000.0, "a round waits at least this long for its draft block, then decodes without it; a draft measured "
                "slower is waited for as long as its block can pay (twice its measured answer time)")
    draft_ahead: bool = option(True, "pipelined drafting: the draft drafts the next block while this one is verified "
                                     "and sends it ahead; a round whose outcome it assumed waits for no round trip")
    far_draft: str = option(
        "auto", "a round with no block at hand: auto weighs waiting for the draft's answer against decoding a plain "
                "step meanwhile and verifying the block after it (only where the answer takes over 1/20 of a step); "
                "wait always waits; step always steps (any draft, any k)", choices=["auto", "wait", "step"])
    hybrid_threshold: str = option(
        "draft", "a draft that sizes some blocks at no forward's cost (--method hybrid: its suffix side): draft leaves "
                 "the choice between its suffix and model blocks to the draft's own rule (--hybrid-min-suffix); "
                 "priced sends, each round, the shortest match whose block this verifier's measured prices put above "
                 "the model's (NextBlock.min_sized; docs/design.md)", choices=["draft", "priced"])
    draft_wait_s: float = option(30.0, "at start-up, wait this long for the draft to check its tokenizer")
    calibrate_forward: bool = option(
        True, "at start-up, time the target's forward over a few block sizes (--engine transformers) before serving: "
              "the first requests' blocks are priced on those times, and the kernels are warm")
    max_sequences: int = option(64, "live sequences at most; more get RESOURCE_EXHAUSTED")
    max_cache_tokens: int = option(262144, "tokens (prompt + max_tokens, reserved) in all KV caches at most")
    sequence_ttl_s: float = option(
        300.0, "a call whose client has not taken its next message for this long (the response write blocked by "
               "flow control: the client stopped reading) is ended with DEADLINE_EXCEEDED and its cache freed; "
               "time spent waiting for compute, for the draft or for prefill admission never counts")
    prefill_chunk_tokens: int = option(
        128, "--engine transformers: prompt tokens per prefill job on the compute thread; other sequences' rounds "
             "run between a long prompt's chunks, so it delays them by about one chunk's forward pass, and a "
             "cancelled call stops between chunks (0: the whole prompt in one job)")
    max_prefill_tokens: int = option(
        1024, "--engine transformers: prompt tokens prefilling at once at most (prompts that fit in one chunk are "
              "not counted); a request past it waits, first come first served, without a status and without "
              "being reaped, until earlier prefills finish; a larger prompt is admitted alone (0: no limit)")
    vllm_kv_cache_gib: int = option(1, "--engine vllm on CPU: KV cache space in GiB (VLLM_CPU_KVCACHE_SPACE)")
    vllm_max_model_len: int = option(0, "--engine vllm: context length (0: the model's)")
    vllm_compile: bool = option(False, "--engine vllm: torch.compile / CUDA graphs (slower start, faster steps)")
    vllm_tensor_parallel_size: int = option(
        1, "--engine vllm: GPUs that split each layer (tensor parallel; within one node). With --draft: 1")
    vllm_pipeline_parallel_size: int = option(
        1, "--engine vllm: stages that split the layers (pipeline parallel; may span nodes). With --draft: 1")
    vllm_gpu_memory_utilization: float = option(
        0.9, "--engine vllm: fraction of each GPU's memory vLLM may use (weights, activations, then KV cache)")
    vllm_distributed_executor_backend: str = option(
        "", "--engine vllm: how vLLM runs its workers: mp (processes on this node), ray (several nodes), "
            "empty: vLLM's choice (in-process for 1 GPU, else mp)", choices=["", "mp", "ray"])
