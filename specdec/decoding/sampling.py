"""Turn logits into the distribution a token is drawn from.

The draft (q) and the verifier (p) call the same function with the same
parameters, so that temperature, top-k and top-p shape both distributions the
same way; exact rejection sampling then yields the target's shaped distribution.

A seeded request draws each token with noise keyed by (seed, position) instead of
from a per-request random stream (`keyed_sample`): the token at a position is then
fixed by the seed, the position and the distribution alone, however the rounds are
cut and whatever the draft proposed (see verifier_service/speculation/rejection_sampler.py).
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


_MASK64 = 2**64 - 1


def _splitmix64(x: int) -> int:
    """A 64-bit mixing function (splitmix64's finaliser): nearby inputs give unrelated outputs."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def position_key(seed: int, position: int) -> int:
    """The generator seed of the draw at `position` (an index into prompt + completion) of a request seeded
    `seed`: a function of the two alone, so the draw does not depend on what was drawn before it."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ (position & _MASK64))


def keyed_gumbel(seed: int, position: int, vocab_size: int) -> torch.Tensor:
    """Standard Gumbel noise for one position, fixed by (seed, position): [vocab_size] float32, on the CPU.

    A fresh counter-seeded generator per position, so the noise is the same whichever round, block or process
    draws it; a smaller vocabulary gets a prefix of a larger one's noise.
    """
    generator = torch.Generator(device="cpu")
    generator.manual_seed(position_key(seed, position))
    uniform = torch.rand(vocab_size, generator=generator)  # [V] in [0, 1)
    return -torch.log(-torch.log(uniform))  # [V]; uniform == 0 gives -inf: that token is never drawn


def keyed_sample(probs: torch.Tensor, seed: int, position: int) -> int:
    """Gumbel-max draw of the token at `position`: argmax(log p + g), g = keyed_gumbel(seed, position).

    probs: [V], sums to 1 (tokens with p == 0 are never drawn). The result is distributed as p over seeds, and
    two distributions drawn at the same (seed, position) share their noise: a draft that samples its q this way
    proposes the target's own token whenever q and p are close (Gumbel coupling).
    """
    probs = probs.float().cpu()  # [V]
    noise = keyed_gumbel(seed, position, probs.shape[-1])  # [V]
    return int((probs.log() + noise).argmax())
