"""Turn logits into the distribution a token is drawn from.

The draft (q) and the verifier (p) call the same function with the same
parameters, so that temperature, top-k and top-p shape both distributions the
same way; exact rejection sampling then yields the target's shaped distribution.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from specdec.v1 import common_pb2

# Below this, logits / temperature overflows float32 and the distribution turns into NaN; 0 is greedy.
MIN_TEMPERATURE = 1e-5


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. temperature == 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def problems(self) -> list[str]:
        """Human-readable problems with the values; empty when they are valid."""
        found = []
        if not math.isfinite(self.temperature) or self.temperature < 0:
            found.append(f"temperature must be a finite number >= 0, got {self.temperature}")
        elif 0.0 < self.temperature < MIN_TEMPERATURE * 0.999:  # the tolerance: the wire value is a float32
            found.append(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {self.temperature:g}")
        if not math.isfinite(self.top_p) or not 0.0 < self.top_p <= 1.0:
            found.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            found.append(f"top_k must be >= 0 (0 keeps every token), got {self.top_k}")
        return found


def from_proto(message: common_pb2.SamplingParams) -> SamplingParams:
    return SamplingParams(
        temperature=message.temperature,
        top_p=message.top_p if message.HasField("top_p") else 1.0,
        top_k=message.top_k,
        seed=message.seed if message.HasField("seed") else None,
    )


def to_proto(params: SamplingParams) -> common_pb2.SamplingParams:
    message = common_pb2.SamplingParams(temperature=params.temperature, top_k=params.top_k)
    if params.top_p < 1.0:
        message.top_p = params.top_p
    if params.seed is not None:
        message.seed = params.seed
    return message


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Shaped probabilities, float32.

    logits: [n, V] raw scores. Returns [n, V]; each row sums to 1. Greedy
    parameters give a one-hot row on the argmax.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [n, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [n, V]
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [n, V] exclusive cumsum
        drop_sorted = mass_before >= params.top_p  # never drops the top token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def make_generator(seed: int | None, device: str | torch.device = "cpu") -> torch.Generator:
    """A per-request generator: seeded when the request has a seed, else random."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id. probs: [V], sums to 1."""
    return int(torch.multinomial(probs, 1, generator=generator).item())
