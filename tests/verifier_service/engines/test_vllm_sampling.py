"""The torch replacement for vLLM's expand_batch_to_tokens (the CPU kernel broke float inputs)."""

import torch

from verifier_service.engines.vllm_sampling import expand_batch_to_tokens


def test_expands_each_request_to_its_tokens_and_keeps_float_values():
    x = torch.tensor([0.7, 0.0, 1.3])  # [batch] temperatures; 0 is greedy
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)  # 2, 3 and 1 draft tokens
    out = expand_batch_to_tokens(x, cu, 6, replace_from=0, replace_to=1)
    assert out.dtype == torch.float32
    assert out.tolist() == torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0, 1.3]).tolist()


def test_requests_without_draft_tokens_take_no_slots():
    x = torch.tensor([5, 7, 9])  # [batch] top-k values
    cu = torch.tensor([0, 2, 2])  # only the second request drafted
    assert expand_batch_to_tokens(x, cu, 2).tolist() == [7, 7]
