"""Linear layers with weights laid out once for oneDNN, so that verifying a block costs less against one step.

Speculation pays where verifying a block costs little more than one decode step (the speedup model,
docs/design.md). On CPU, torch's `F.linear` hands each call to MKL's sgemm, which repacks the weight
matrix on every call for a few rows of input and picks a different kernel for each row count, so a
forward over a few tokens costs far more than one over a single token, though each reads the same
weights once. oneDNN's linear over a weight reordered once at load (`torch.ops.mkldnn._reorder_linear_weight`,
`_linear_pointwise`: what Inductor emits for a frozen CPU linear with a dynamic batch) reads it as it is,
for any number of rows.

And it computes each row alike whatever the number of rows: a row's output is bitwise the same alone
(a plain step) as in a block (a verification, a prefill), where `F.linear`'s differ between 1 row and
more. A block's logits then differ from one-at-a-time decoding only by attention's rounding, so greedy
speculation reproduces plain decoding at least as closely as with `F.linear`. (Keeping W^T for single
rows made a plain step a little faster but gave that equality up and took twice the memory.)

The cost is memory: the reordered weights are anonymous memory, where the loaded ones were pages of
the safetensors file (which stay mapped while the embedding lives), so resident memory grows by about
the linears' size.

Only float32 on CPU: oneDNN's bfloat16 kernels need bf16 units (avx512_bf16, AMX), and CUDA has its own.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


class PrepackedLinear(torch.nn.Module):
    """y = x W^T + b, with W reordered once into oneDNN's blocked layout."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()  # [out, in]
        # oneDNN's blocked layout (an opaque tensor), for any number of rows (no batch size hint)
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.bias = None if linear.bias is None else linear.bias.detach()  # [out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., out]
        rows = x.reshape(-1, self.in_features)  # [N, in]
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, "none", [], "")  # [N, out]
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def why_not(model: torch.nn.Module) -> str:
    """Why this model's linears cannot be prepacked here, or "" if they can."""
    parameter = next(model.parameters(), None)
    if parameter is None:
        return "the model has no parameters"
    if parameter.device.type != "cpu":
        return f"the model is on {parameter.device.type}, and prepacking is for CPU"
    if parameter.dtype != torch.float32:
        return f"the model is in {str(parameter.dtype).removeprefix('torch.')}, and prepacking is for float32"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    return ""


def is_prepacked(model: torch.nn.Module) -> bool:
    """Whether prepack_linears() has already run on `model`."""
    return any(isinstance(module, PrepackedLinear) for module in model.modules())


def prepack_linears(model: torch.nn.Module) -> int:
    """Replace every torch.nn.Linear in `model` by a PrepackedLinear, in place; the number replaced.

    Leaves the model as it is (0) where why_not() says it cannot be done, and logs why.
    """
    reason = why_not(model)
    if reason:
        log.info("linear weights not prepacked: %s", reason)
        return 0
    replaced = 0
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear:
                    setattr(parent, name, PrepackedLinear(child))
                    replaced += 1
    log.info("prepacked %d linear layers for oneDNN", replaced)
    return replaced
