"""The verifier's side of the draft stream: one bidirectional Propose call per sequence.

`DraftLink` owns the channel to the draft service and a shared back-off: when
the draft fails, every sequence decodes without it until the back-off expires,
then the next sequence to ask reconnects. `DraftSession` is one sequence's
stream. Any failure (the draft died, was too slow, or answered nonsense) raises
DraftUnavailable, and the decode loop carries on without speculation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import grpc
import numpy as np
import torch

from specdec import grpc_server, models
from specdec.config import ServerConfig
from specdec.sampling import SamplingParams, to_proto
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc

log = logging.getLogger(__name__)


# Errors about one request (the draft refused it), not about the draft: they do not back off other sequences.
REQUEST_ERRORS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                            grpc.StatusCode.OUT_OF_RANGE})


_DRAINING: set[asyncio.Task] = set()  # strong references to streams being closed


class DraftUnavailable(Exception):
    """The draft cannot serve this round; decode without it."""


# What a broken, slow or vanished stream raises: the round decodes without the draft.
STREAM_ERRORS = (grpc.aio.AioRpcError, asyncio.TimeoutError, asyncio.InvalidStateError, DraftUnavailable)


class DraftIncompatible(RuntimeError):
    """The draft's tokenizer differs from the target's; the message says what differs."""


@dataclasses.dataclass
class Block:
    token_ids: list[int]  # [k'] proposed tokens
    probs: torch.Tensor | None  # [k', V] q, or None for one-hot


class Backoff:
    """Exponential back-off between reconnection attempts, shared by all sequences."""

    def __init__(self, initial_s: float = 0.25, maximum_s: float = 5.0):
        self.initial_s, self.maximum_s = initial_s, maximum_s
        self.delay_s = 0.0
        self.retry_at = 0.0

    def ready(self) -> bool:
        return time.monotonic() >= self.retry_at

    def failed(self) -> None:
        self.delay_s = min(self.maximum_s, max(self.initial_s, self.delay_s * 2))
        self.retry_at = time.monotonic() + self.delay_s

    def succeeded(self) -> None:
        self.delay_s, self.retry_at = 0.0, 0.0


class DraftLink:
    def __init__(self, address: str, server_config: ServerConfig, target_info: common_pb2.ModelInfo,
                 timeout_s: float):
        self.address = address
        self.target_info = target_info
        self.timeout_s = timeout_s
        self.channel = grpc_server.open_channel(address, server_config)
        self.stub = draft_pb2_grpc.DraftServiceStub(self.channel)
        self.backoff = Backoff()
        self.checked = False  # tokenizer compatibility verified on this channel
        self.method = ""

    async def check_compatible(self, wait_s: float = 0.0) -> None:
        """Ask the draft for its tokenizer and refuse a mismatch (raises DraftIncompatible)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                reply = await self.stub.GetDraftInfo(draft_pb2.GetDraftInfoRequest(), timeout=5.0,
                                                     wait_for_ready=wait_s > 0)
                break
            except grpc.aio.AioRpcError as exc:
                if time.monotonic() >= deadline:
                    raise DraftUnavailable(f"draft at {self.address}: {exc.code().name}: {exc.details()}") from exc
                await asyncio.sleep(0.5)
        problem = models.tokenizer_mismatch(self.target_info, reply.info)
        if problem:
            raise DraftIncompatible(problem)
        self.method = reply.method
        self.checked = True

    def available(self) -> bool:
        return self.backoff.ready()

    async def open(self, request_id: str, tokens: list[int], sampling: SamplingParams) -> DraftSession:
        """Start a sequence on a new stream. Raises DraftUnavailable (and backs off) on failure."""
        try:
            if not self.checked:
                await asyncio.wait_for(self.check_compatible(), self.timeout_s)
            call = self.stub.Propose()
            start = draft_pb2.StartSequence(
                request_id=request_id, prompt_token_ids=tokens, sampling=to_proto(sampling),
                return_probs=not sampling.greedy,
            )
            await asyncio.wait_for(call.write(draft_pb2.ProposeRequest(start=start)), self.timeout_s)
        except DraftIncompatible as exc:
            # a draft restarted with another tokenizer: never speculate with it; say so, and keep checking
            log.error("%s", exc)
            self.failed()
            raise DraftUnavailable(f"the draft at {self.address} is incompatible") from exc
        except STREAM_ERRORS as exc:
            self.failed()
            raise DraftUnavailable(f"cannot open a draft stream: {exc!r}") from exc
        return DraftSession(self, call, len(tokens))

    def failed(self, exc: BaseException | None = None) -> None:
        """A draft call failed. Back off (every sequence) unless the draft only refused this one request."""
        if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in REQUEST_ERRORS:
            return
        self.backoff.failed()
        self.checked = False  # whatever answers after a failure may be another draft: check its tokenizer again

    async def close(self) -> None:
        await self.channel.close()


class DraftSession:
    """One sequence's stream. `length` is the draft's sequence length as last reported."""

    def __init__(self, link: DraftLink, call, length: int):
        self.link = link
        self.call = call
        self.length = length

    async def propose(self, keep_length: int, append: list[int], k: int) -> Block:
        request = draft_pb2.ProposeRequest(
            next=draft_pb2.NextBlock(keep_length=keep_length, append_token_ids=append, num_tokens=k)
        )
        try:
            response = await asyncio.wait_for(self._round_trip(request), self.link.timeout_s)
        except STREAM_ERRORS as exc:
            self.link.failed(exc)
            self.cancel()
            raise DraftUnavailable(f"draft round failed: {exc!r}") from exc
        self.link.backoff.succeeded()
        self.length = response.sequence_length
        return self._block(response, k)

    async def _round_trip(self, request):
        await self.call.write(request)
        response = await self.call.read()
        if response is grpc.aio.EOF:
            raise DraftUnavailable("the draft closed the stream")
        return response

    def _block(self, response: draft_pb2.ProposeResponse, k: int) -> Block:
        tokens = list(response.token_ids)
        vocab = self.link.target_info.vocab_size
        if len(tokens) > k or any(t < 0 or t >= vocab for t in tokens):
            self.cancel()
            raise DraftUnavailable(f"the draft sent an invalid block {tokens[:8]} for k={k}")
        if not response.probs:
            return Block(tokens, None)
        probs = np.frombuffer(response.probs, dtype="<f4")
        if probs.size % max(len(tokens), 1) or not tokens:
            self.cancel()
            raise DraftUnavailable("the draft sent probabilities that do not match its tokens")
        q = torch.from_numpy(probs.reshape(len(tokens), -1).copy())  # [k', V_draft]
        if q.shape[1] < vocab:  # a draft with a narrower output layer: pad q with zeros
            q = torch.nn.functional.pad(q, (0, vocab - q.shape[1]))
        return Block(tokens, q[:, :vocab])

    def cancel(self) -> None:
        self.call.cancel()

    def close(self) -> None:
        """Half-close the stream and drain it in the background, so the draft finishes the call cleanly
        (and the call's client span ends now, not at shutdown)."""
        task = asyncio.get_running_loop().create_task(self._drain())
        _DRAINING.add(task)
        task.add_done_callback(_DRAINING.discard)

    async def _drain(self) -> None:
        try:
            await asyncio.wait_for(self.call.done_writing(), 5.0)
            while await asyncio.wait_for(self.call.read(), 5.0) is not grpc.aio.EOF:
                pass
        except (grpc.aio.AioRpcError, asyncio.TimeoutError, asyncio.InvalidStateError, RuntimeError):
            self.call.cancel()
