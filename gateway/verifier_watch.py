"""Keep checking that the verifier is usable: answering, with the gateway's tokenizer, and the same model.

At start-up the gateway refuses a verifier with another tokenizer (`check_peers`), and pins the model the
verifier serves (its ModelInfo.model_fingerprint). A verifier can be replaced while the gateway runs (a
rollout, a wrong image), so the watch asks GetModelInfo again whenever the channel reconnects, and every
--peer-check-s. A verifier with another tokenizer, or another model under the same tokenizer (its output
would be served under the pinned model's name), is unusable until the pinned model is back or the gateway
restarts. While the verifier is unusable:
- the gateway's health is NOT_SERVING, so probes and balancers take it out. The watch's verdict is the
  gateway's one health truth: gRPC health and HTTP /health both report it, and nothing else;
- requests are refused with UNAVAILABLE and the reason, before they are tokenized.

The watch is for health and clear errors. Correctness does not wait for it: every Decode carries the
gateway's tokenizer fingerprint, which the verifier checks (FAILED_PRECONDITION on a mismatch).
"""

from __future__ import annotations

import asyncio
import logging
import typing

import grpc

from specdec.modeling import models
from specdec.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc

log = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 5.0
GATEWAY_ADVICE = "The gateway tokenizes for the verifier: run both with the same model (--model)."


class VerifierWatch:
    """The verifier's usability, kept current; `problem` is None while it is usable, else why not."""

    def __init__(self, channel: grpc.aio.Channel, address: str, tokenizer: common_pb2.ModelInfo, period_s: float,
                 on_change: typing.Callable[[str | None, common_pb2.ModelInfo | None], typing.Awaitable[None]],
                 model: common_pb2.ModelInfo | None = None):
        """tokenizer: the gateway's own; model: the verifier's ModelInfo at start-up (its model is pinned)."""
        self.channel = channel
        self.stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        self.address, self.tokenizer, self.period_s = address, tokenizer, period_s
        self.model = model or common_pb2.ModelInfo()
        self.on_change = on_change
        self.problem: str | None = None
        self.info: common_pb2.ModelInfo | None = None
        self.reported = False  # on_change has been called at least once

    async def check(self) -> tuple[str | None, common_pb2.ModelInfo | None]:
        """(None, the verifier's ModelInfo) when it answers with our tokenizer and model; (why not, None) otherwise."""
        try:
            reply = await self.stub.GetModelInfo(verifier_pb2.GetModelInfoRequest(), timeout=CHECK_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            return (f"the verifier at {self.address} is not answering ({exc.code().name}: {exc.details()}); "
                    "retry shortly"), None
        problem = models.tokenizer_mismatch(reply.info, self.tokenizer, role="the gateway's --model",
                                            target_role="the verifier", advice=GATEWAY_ADVICE)
        if problem:
            return f"the verifier at {self.address} was replaced by an incompatible one: {problem}", None
        problem = models.model_mismatch(self.model, reply.info)
        if problem:
            return (f"the verifier at {self.address} was replaced by another model: {problem}. Put the model back, "
                    "or restart the gateway to serve the new one"), None
        return None, reply.info

    async def check_and_report(self) -> None:
        """Check, and tell the gateway when the verdict or the verifier's model info changed (only then)."""
        problem, info = await self.check()
        if self.reported and (problem, info) == (self.problem, self.info):
            return
        if problem != self.problem:
            if problem:
                log.error("%s; health NOT_SERVING until it is fixed", problem)
            elif self.problem:
                log.info("the verifier at %s is usable again", self.address)
        self.problem, self.info, self.reported = problem, info, True
        await self.on_change(problem, info)

    async def run(self) -> None:
        """Check at every connectivity change of the channel (a reconnect is one) and every period_s."""
        while True:
            await self.check_and_report()
            state = self.channel.get_state(try_to_connect=True)
            try:
                await asyncio.wait_for(self.channel.wait_for_state_change(state), self.period_s)
            except TimeoutError:
                pass
