"""The engine contract, and the decode loop every request runs through it.

An engine generates one sequence in rounds. Each round it asks the request's speculation
for k, gets a block of up to k draft tokens, verifies the block in one forward pass with
the exact accept/reject rule, rolls its cache back to the accepted length, records the
round, and yields what the round emitted:

    for emitted in engine.rounds(spec, speculation):  # per round (the engine's loop):
        ...                                            #   k     = speculation.block_size(...)
        ...                                            #   block = await speculation.propose(tokens, k)
        ...                                            #   verdict = verify(block); rollback; record
        checked = stopper.check(emitted)               # no token past EOS, a stop string or max_tokens
        yield checked                                  # closing the engine's iterator frees the sequence

The transformers engine (engine.py) runs that loop itself; the vLLM engine (vllm_engine.py)
runs it as vLLM's batched steps. Either way the servicer only sees `decode` below.
If the draft is missing, failing or slow, a round verifies an empty block: plain decoding,
the same tokens, just not sped up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import typing

from specdec.decoding.sampling import SamplingParams
from specdec.decoding.stopping import StopChecker
from verifier_service.speculation.request import RequestSpeculation


@dataclasses.dataclass
class DecodeSpec:
    """One validated request."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    max_tokens: int
    stop: list[str]
    num_speculative_tokens: int | None  # None: the server's default, adapted
    tenant: str = ""  # opaque tenant id from the gateway; the draft keeps tenants' learnt outputs apart
    grammar: object | None = None  # specdec.decoding.grammar.SequenceGrammar: structured outputs; None: none
    constraint: object | None = None  # common_pb2.Constraint, with grammar: for an engine that enforces it itself


@dataclasses.dataclass
class RoundOutput:
    token_ids: list[int]
    finish_reason: str | None = None
    matched_stop: str = ""


class Engine(typing.Protocol):
    """What the verifier needs of an engine. Both engines implement it; the servicer knows no other."""

    name: str
    vocab_size: int
    max_context: int
    takes_draft_probs: bool  # whether rejection sampling uses the draft's q (else drafts are asked to be greedy)
    takes_constraints: bool  # whether it enforces a constraint (DecodeSpec.grammar/.constraint); else refused
    # Optional: time_forwards(sizes) -> [(n, seconds)], a round's forward over n draft tokens timed before serving
    # (the transformers engine's; `verifier_service.forward_calibration`). vLLM's steps are batched: StepCost learns them.

    def rounds(self, spec: DecodeSpec, speculation: RequestSpeculation) -> typing.AsyncIterator[list[int]]:
        """Generate spec's sequence; yield the tokens each round emitted (accepted drafts + the target's token).

        Every verified round goes through `speculation.record`. The caller stops iterating when the
        sequence ends and closes the iterator, which must free everything the sequence holds.
        """
        ...


async def decode(engine: Engine, spec: DecodeSpec, speculation: RequestSpeculation,
                 stopper: StopChecker) -> typing.AsyncIterator[RoundOutput]:
    """One sequence, round by round, cut at its first stop condition.

    At the end the draft stream is closed: after a normal finish with the final tokens (a draft that
    learns from finished outputs keeps them), after a cancel or failure without (it keeps nothing).
    """
    tokens, finished = list(spec.prompt_ids), False
    try:
        async with contextlib.aclosing(engine.rounds(spec, speculation)) as rounds:
            async for emitted in rounds:
                checked = stopper.check(emitted)
                tokens += checked.kept
                finished = checked.finish_reason is not None
                yield RoundOutput(checked.kept, checked.finish_reason, checked.matched_stop)
                if finished:
                    return
    finally:
        speculation.close(tokens if finished else None)
