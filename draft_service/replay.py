"""Replay draft, for benchmarks only: the target's own recorded continuation, each token corrupted at a set rate.

Acceptance cannot be measured with random weights, and a real draft's acceptance is whatever it is. This draft
sets it: it knows each prompt's greedy continuation (a file a plain run wrote, keyed by the prompt's token ids,
`prompt_key`), and proposes the continuation from the sequence's current position with each token replaced, with
probability 1 - alpha, by another token. Under greedy verification a replaced token is always rejected and a
kept one always accepted, so the verifier accepts the prefix up to the first replaced token.

Corruption is independent per token (not run-length shaped): whether position p of a prompt's continuation is
replaced is a hash of (seed, prompt key, p), drawn once, so every mode, k and repeat of a benchmark sees the same
pattern, and the draws of the tokens of one block are independent. That is the speedup model's i.i.d. alpha:
P(token j accepted | tokens before it accepted) = alpha, so a round at block length k emits
E = (1 - alpha^(k+1)) / (1 - alpha) tokens, and the verifier's acceptance *rate* (accepted / drafted) is
(E - 1) / k, not alpha (bench.core.speedup_model.rate_from_alpha).

A sequence that leaves the recording (another prompt, other numerics, a sampled token) proposes nothing.
Refused unless --enable-benchmark-drafts is set (`BenchmarkDrafts`), as the fault-injection options are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
import typing

from draft_service.proposer import DraftSequence, Proposer
from specdec.runtime.config import option
from specdec.decoding.draft_block import DraftBlock
from specdec.decoding.sampling import SamplingParams

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BenchmarkDrafts:
    """Benchmark drafts (benchmarks only)"""

    enable_benchmark_drafts: bool = option(False, "allow --method replay and the --replay-* options (benchmarks "
                                                  "only: the replay draft proposes a recorded answer)")
    replay_file: str = option("", "--method replay: JSONL of the target's recorded greedy continuations, keyed by "
                                  "prompt (`python -m bench efficiency` writes one)")
    replay_acceptance: float = option(0.7, "--method replay: alpha, the chance each proposed token is the recorded "
                                           "one, drawn independently per token (else another token, which greedy "
                                           "verification rejects)")
    replay_seed: int = option(0, "--method replay: seed of which positions are corrupted")

    def __post_init__(self):
        asked = [flag for flag, on in (("--method replay", getattr(self, "method", "") == "replay"),
                                       ("--replay-file", self.replay_file)) if on]
        if asked and not self.enable_benchmark_drafts:
            raise ValueError(f"{' and '.join(asked)} is a benchmarking tool (a draft that replays a recorded answer); "
                             "add --enable-benchmark-drafts true to use it")
        if not 0.0 <= self.replay_acceptance <= 1.0:
            raise ValueError(f"--replay-acceptance {self.replay_acceptance} must be in [0, 1]")
        if getattr(self, "method", "") == "replay" and not self.replay_file:
            raise ValueError("--method replay needs --replay-file: the recorded continuations it replays")


def prompt_key(prompt_ids: typing.Sequence[int]) -> str:
    """The key of a prompt in a replay file: a hash of its token ids, as the draft receives them at start."""
    return hashlib.sha256(",".join(map(str, prompt_ids)).encode()).hexdigest()[:32]


def write_replay_file(path: str | pathlib.Path, records: typing.Iterable[tuple[typing.Sequence[int],
                                                                                typing.Sequence[int]]]) -> int:
    """Write (prompt ids, the target's greedy continuation) pairs as JSONL; returns how many."""
    lines = [json.dumps({"prompt_key": prompt_key(prompt), "prompt_length": len(prompt),
                         "continuation": [int(t) for t in continuation]}) for prompt, continuation in records]
    pathlib.Path(path).write_text("".join(line + "\n" for line in lines))
    return len(lines)


def read_replay_file(path: str | pathlib.Path) -> dict[str, list[int]]:
    """prompt key -> continuation. Raises ValueError naming the line that is not a replay record."""
    out = {}
    for number, line in enumerate(pathlib.Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            out[str(record["prompt_key"])] = [int(t) for t in record["continuation"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a replay record ({{prompt_key, continuation}}): {exc}") from exc
    return out


def replayed_token(continuation: typing.Sequence[int], key: str, position: int, alpha: float, seed: int,
                   vocab_size: int) -> int:
    """The token the replay draft proposes at `position` of a continuation: the recorded one with probability
    alpha, else another id in the vocabulary. A hash of (seed, key, position): the same on every call."""
    true = int(continuation[position])
    digest = hashlib.blake2b(f"{seed}:{key}:{position}".encode(), digest_size=16).digest()
    draw = int.from_bytes(digest[:8], "little") / 2.0 ** 64  # uniform in [0, 1)
    if draw < alpha or vocab_size < 2:
        return true
    return (true + 1 + int.from_bytes(digest[8:], "little") % (vocab_size - 1)) % vocab_size  # never `true`


class ReplaySequence(DraftSequence):
    def __init__(self, prompt_ids: list[int], continuation: list[int] | None, key: str, alpha: float, seed: int,
                 vocab_size: int):
        self.prompt_length = len(prompt_ids)
        self.continuation, self.key = continuation, key
        self.alpha, self.seed, self.vocab_size = alpha, seed, vocab_size
        self.on_record = 0  # generated tokens (after the prompt) that equal the recording's, from the start
        super().__init__(prompt_ids)

    def propose(self, k: int) -> DraftBlock:
        position = len(self.tokens) - self.prompt_length
        if self.continuation is None or self.on_record < position:
            return DraftBlock.empty()  # off the recording: nothing to replay
        end = min(position + k, len(self.continuation))
        proposal = [replayed_token(self.continuation, self.key, p, self.alpha, self.seed, self.vocab_size)
                    for p in range(position, end)]
        self._extend(proposal)
        return DraftBlock(proposal, None)

    def _extend(self, token_ids: list[int]) -> None:
        for token in token_ids:
            position = len(self.tokens) - self.prompt_length
            self.tokens.append(token)
            if (self.continuation is not None and 0 <= position == self.on_record
                    and position < len(self.continuation) and self.continuation[position] == token):
                self.on_record += 1

    def _truncate(self, length: int) -> None:
        del self.tokens[length:]
        self.on_record = min(self.on_record, max(0, length - self.prompt_length))


class ReplayProposer(Proposer):
    method = "replay"
    inline = True

    def __init__(self, continuations: dict[str, list[int]], alpha: float, seed: int, vocab_size: int):
        self.continuations, self.alpha, self.seed, self.vocab_size = continuations, alpha, seed, vocab_size

    @classmethod
    def from_file(cls, path: str, alpha: float, seed: int, vocab_size: int) -> "ReplayProposer":
        return cls(read_replay_file(path), alpha, seed, vocab_size)

    def start(self, prompt_ids: list[int], sampling: SamplingParams, return_probs: bool,
              tenant: str = "") -> ReplaySequence:
        key = prompt_key(prompt_ids)
        continuation = self.continuations.get(key)
        if continuation is None:
            log.warning("replay: a prompt of %d tokens (key %s) is not in --replay-file: proposing nothing",
                        len(prompt_ids), key)
        # Deterministic proposals: q is one-hot, whatever the sampling parameters.
        return ReplaySequence(prompt_ids, continuation, key, self.alpha, self.seed, self.vocab_size)
