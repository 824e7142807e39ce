"""specdec/modeling/gqa_attention.py: attention over grouped key/value heads without copies gives bitwise sdpa's result."""

import copy

import pytest
import torch

from specdec.modeling.gqa_attention import NAME, use_sdpa_gqa
from specdec.modeling.kv_cache import new_cache, rollback_cache
from specdec.modeling.models import load_causal_lm
from specdec.modeling.prepacked_linear import prepack_linears


def test_the_verifiers_model_loads_with_it(tiny_pair):
    model = load_causal_lm(str(tiny_pair[0]))
    assert model.config.num_attention_heads != model.config.num_key_value_heads
    assert model.config._attn_implementation == NAME


@pytest.mark.parametrize("dtype,prepacked", [("float32", False), ("float32", True), ("bfloat16", False)])
def test_a_blocks_logits_over_a_cache_are_bitwise_sdpas(tiny_pair, dtype, prepacked):
    """The verifier's forward (k tokens after a cached prefix, rolled back) and a first prefill, both ways."""
    ours = load_causal_lm(str(tiny_pair[0]), dtype=dtype)
    theirs = copy.deepcopy(ours)
    theirs.set_attn_implementation("sdpa")
    if prepacked:  # as the verifier runs it (a prepacked model cannot be copied)
        prepack_linears(ours)
        prepack_linears(theirs)
    prefix = torch.randint(3, ours.config.vocab_size, (1, 60), generator=torch.Generator().manual_seed(1))  # [1, 60]
    with torch.inference_mode():
        caches, logits = {}, {}
        for name, model in (("ours", ours), ("theirs", theirs)):
            caches[name] = new_cache(model)
            logits[name] = model(input_ids=prefix, past_key_values=caches[name], use_cache=True).logits
        assert torch.equal(logits["ours"], logits["theirs"])
        for k in (1, 2, 5, 9, 17):
            block = torch.randint(3, ours.config.vocab_size, (1, k))  # [1, k]
            for name, model in (("ours", ours), ("theirs", theirs)):
                logits[name] = model(input_ids=block, past_key_values=caches[name], use_cache=True).logits[0]
                rollback_cache(caches[name], 60)
            assert torch.equal(logits["ours"], logits["theirs"]), f"block of {k}"


def test_greedy_generation_is_unchanged(tiny_pair):
    ours = load_causal_lm(str(tiny_pair[0]))
    theirs = copy.deepcopy(ours)
    theirs.set_attn_implementation("sdpa")
    eos = ours.config.eos_token_id
    with torch.inference_mode():
        ids = torch.randint(3, ours.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(ids)
        mask[1, :3] = 0  # a padded row: a mask in every step, not only in verification
        outputs = [model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=eos,
                                  pad_token_id=eos).tolist() for model in (ours, theirs)]
    assert outputs[0] == outputs[1]


def test_a_model_without_grouped_heads_stays_on_sdpa(tiny_pair):
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, vocab_size=64)).eval()
    model.set_attn_implementation("sdpa")
    assert not use_sdpa_gqa(model)
    assert model.config._attn_implementation == "sdpa"
