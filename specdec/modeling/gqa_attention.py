"""Grouped-query attention over a masked block on CPU without copying the cache: transformers' SDPA, minus repeat_kv.

A verification runs k + 1 query tokens after a cached context, so it needs a causal mask (a plain
step of one token needs none). With a mask, transformers' `sdpa` attention copies each layer's keys
and values once per query head that shares them (`repeat_kv`: 3x for SmolLM2, 9 query heads over 3
key/value heads) before calling `scaled_dot_product_attention`, because CUDA's fused kernels take
grouped heads only without a mask. torch's CPU kernel takes them with one (`enable_gqa=True`), and
gives bitwise the same result (a test). The copies grow with the context, so skipping them takes the
most off a verification over a long one.

`sdpa_gqa` is registered with transformers' AttentionInterface (its own extension point) and does
exactly what `sdpa` does in every other case: no mask (a plain step, a first prefill), CUDA, a position
bias, a paged cache, or heads that are not grouped.
"""

from __future__ import annotations

import torch

NAME = "sdpa_gqa"


def sdpa_gqa_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                               **kwargs) -> tuple[torch.Tensor, None]:
    """query: [B, H, q, D]; key, value: [B, H_kv, S, D]; attention_mask: [B, 1, q, S] or None.
    Returns the attention output [B, q, H, D] (transformers' attention contract)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = query.shape[1] != key.shape[1]
    if (attention_mask is None or not grouped or query.device.type != "cpu"
            or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    output = torch.nn.functional.scaled_dot_product_attention(  # [B, H, q, D]
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False,
        enable_gqa=True)
    return output.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make `sdpa_gqa` an attention implementation transformers knows (its masks are sdpa's). Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, sdpa_gqa_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use_sdpa_gqa(model: torch.nn.Module) -> bool:
    """Switch a model on transformers' `sdpa` to `sdpa_gqa` in place; True if it was switched.

    Only where it changes something: on CPU, for a model whose query heads share key/value heads.
    """
    config = model.config
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    device = next(model.parameters()).device
    if config._attn_implementation != "sdpa" or device.type != "cpu" or not heads or not kv_heads or heads == kv_heads:
        return False
    register()
    model.set_attn_implementation(NAME)
    return True
