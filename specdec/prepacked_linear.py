"""Linear layers with weights laid out once for CPU kernels, so that verifying a block costs less against one step.

Speculation pays where verifying a block costs little more than one decode step (the speedup model,
docs/design.md). On CPU, torch's `F.linear` hands each call to MKL's sgemm, which repacks the weight
matrix on every call for a few rows of input and picks a different kernel for each row count. On a
2-core AVX2 EPYC, for SmolLM2-135M in float32 over a 200-token cache, a forward of 2 tokens then took
1.8x one of 1 token, and of 4 tokens 2.1x, though each reads the same weights once. oneDNN's linear over
a weight reordered once at load (`torch.ops.mkldnn._reorder_linear_weight`, `_linear_pointwise`: what
Inductor emits for a frozen CPU linear with a dynamic batch) reads it as it is, for any number of rows.
For a single row, oneDNN's kernel was no faster than `F.linear`'s (0.96-1.06x in three interleaved
runs), while the row times W^T stored contiguous ([in, out], streamed in order) took 0.83-0.94x: a
plain decode step uses that. Both models' forwards interleaved (`python -m bench.verify_cost --prepack
both`, bench/results/prepack/): t(1) 106 -> 95 ms, t(4) 224 -> 153 ms. Both layouts replace the
module's weight, so the linears take twice their memory (SmolLM2-135M in float32: about +0.5 GB).

Lossless as any kernel choice is: the logits agree with `F.linear`'s to float rounding (the tests hold
them to 1e-4), the same rounding by which `F.linear`'s own kernels for 1 and for 5 rows already differ.
Greedy equality is checked against plain `generate` on the unpacked model (tests/e2e).

Only float32 on CPU: oneDNN's bfloat16 kernels need bf16 units (avx512_bf16, AMX), and CUDA has its own.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


class PrepackedLinear(torch.nn.Module):
    """y = x W^T + b, with W laid out once for each kind of call: oneDNN's blocked layout for a block of rows,
    W^T for a single row (a plain decode step)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()  # [out, in]
        # oneDNN's blocked layout (an opaque tensor), for any number of rows (no batch size hint)
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.weight_t = weight.t().contiguous()  # [in, out]
        self.bias = None if linear.bias is None else linear.bias.detach()  # [out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., out]
        rows = x.reshape(-1, self.in_features)  # [N, in]
        if rows.shape[0] == 1:
            y = rows @ self.weight_t if self.bias is None else torch.addmm(self.bias, rows, self.weight_t)  # [1, out]
        else:
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
    log.info("prepacked %d linear layers (oneDNN's layout for blocks, transposed for single rows)", replaced)
    return replaced
