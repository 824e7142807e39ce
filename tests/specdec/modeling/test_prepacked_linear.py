"""specdec/modeling/prepacked_linear.py: oneDNN-prepacked linears compute what torch.nn.Linear does, for any row count."""

import copy

import pytest
import torch

from specdec.modeling.kv_cache import new_cache, rollback_cache
from specdec.modeling.models import load_causal_lm
from specdec.modeling.prepacked_linear import PrepackedLinear, is_prepacked, prepack_linears, why_not


def linears(model) -> list[str]:
    return [name for name, module in model.named_modules() if type(module) is torch.nn.Linear]


@pytest.mark.parametrize("bias", [False, True])
def test_a_prepacked_linear_matches_torch_for_every_row_count(bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80, bias=bias)
    packed = PrepackedLinear(linear)
    with torch.inference_mode():
        for rows in (1, 2, 3, 4, 5, 8, 17):
            x = torch.randn(1, rows, 48)  # [batch, tokens, in], as a decoder layer calls it
            y = packed(x)
            assert y.shape == (1, rows, 80)
            torch.testing.assert_close(y, linear(x), atol=1e-5, rtol=1e-5)


def test_a_row_comes_out_bitwise_the_same_alone_and_in_a_block():
    """What makes a plain step and a verification agree: oneDNN computes each row alike for any row count
    (F.linear's kernels for 1 row and for more differ in the last bits)."""
    torch.manual_seed(0)
    packed = PrepackedLinear(torch.nn.Linear(96, 160, bias=True))
    x = torch.randn(300, 96)  # [rows, in]
    with torch.inference_mode():
        alone = torch.cat([packed(x[i:i + 1]) for i in (0, 1, 7, 299)])  # [4, out], one row at a time
        for rows in (2, 8, 17, 300):
            block = packed(x[:rows])  # [rows, out]
            assert torch.equal(block[0], alone[0]) and torch.equal(block[1], alone[1])
        assert torch.equal(block[7], alone[2]) and torch.equal(block[299], alone[3])


def test_the_models_logits_over_a_cache_match_for_every_block_length(tiny_pair):
    """The verifier's forward: k tokens after a cached prefix, rolled back, for k = 1..9."""
    plain = load_causal_lm(str(tiny_pair[0]))
    packed = copy.deepcopy(plain)
    replaced = prepack_linears(packed)
    assert replaced == len(linears(plain)) > 0 and linears(packed) == []
    assert isinstance(packed.lm_head, PrepackedLinear)
    prefix = torch.randint(3, plain.config.vocab_size, (1, 40))  # [1, 40]
    with torch.inference_mode():
        caches = {}
        for name, model in (("plain", plain), ("packed", packed)):
            caches[name] = new_cache(model)
            model(input_ids=prefix, past_key_values=caches[name], use_cache=True)
        for k in range(1, 10):
            block = torch.randint(3, plain.config.vocab_size, (1, k))  # [1, k]
            logits = {}
            for name, model in (("plain", plain), ("packed", packed)):
                logits[name] = model(input_ids=block, past_key_values=caches[name], use_cache=True).logits[0]
                rollback_cache(caches[name], 40)
            torch.testing.assert_close(logits["packed"], logits["plain"], atol=1e-4, rtol=1e-4)
            assert torch.equal(logits["packed"].argmax(-1), logits["plain"].argmax(-1))


def test_greedy_generation_is_unchanged(tiny_pair):
    plain = load_causal_lm(str(tiny_pair[0]))
    packed = copy.deepcopy(plain)
    prepack_linears(packed)
    eos = plain.config.eos_token_id
    with torch.inference_mode():
        for seed in range(4):
            ids = torch.randint(3, plain.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(seed))
            outputs = [model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                      eos_token_id=eos, pad_token_id=eos).tolist() for model in (plain, packed)]
            assert outputs[0] == outputs[1]


def test_a_model_that_cannot_be_prepacked_is_left_as_it_is(tiny_pair):
    model = load_causal_lm(str(tiny_pair[0]), dtype="bfloat16")
    assert "bfloat16" in why_not(model)
    before = linears(model)
    assert prepack_linears(model) == 0
    assert linears(model) == before
    assert why_not(torch.nn.Module()) == "the model has no parameters"


def test_is_prepacked_tells_a_prepacked_model_from_a_plain_one(tiny_pair):
    model = load_causal_lm(str(tiny_pair[0]))
    assert not is_prepacked(model)
    assert prepack_linears(model) > 0
    assert is_prepacked(model)


def test_the_verifier_prepacks_by_default_and_not_when_told(tiny_pair):
    from verifier_service.__main__ import build_engine
    from verifier_service.config import VerifierConfig

    engine, parameters = build_engine(VerifierConfig(model=str(tiny_pair[0])), info=None)
    assert isinstance(engine.model.lm_head, PrepackedLinear) and linears(engine.model) == []
    unpacked, unpacked_parameters = build_engine(VerifierConfig(model=str(tiny_pair[0]), prepack_weights=False), None)
    assert type(unpacked.model.lm_head) is torch.nn.Linear
    assert parameters == unpacked_parameters  # counted before the weights leave the parameters
