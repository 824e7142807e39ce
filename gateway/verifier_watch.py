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

With several verifiers (gateway.verifier_pool), each has its own watch, and one that is unusable only leaves
the pool: `PoolWatch` runs the watches, follows a DNS name's addresses, and the gateway is NOT_SERVING only
while no verifier is usable. A verifier is also unusable while its own grpc.health.v1 says NOT_SERVING (it is
draining: SIGTERM); the watch follows its health with a Watch stream, so a drain takes it out of the pool at
once, and a request that lost its verifier takes it out too (`VerifierWatch.suspect`) until a check passes.
The watching itself (health, reconnects, suspicion, DNS) is specdec.runtime.peer_watch's, shared with the
verifier's draft tier; this module adds what makes a verifier usable: its tokenizer and model.
"""

from __future__ import annotations

import functools
import typing

import grpc

from gateway.verifier_pool import Verifier, VerifierPool, VerifierTargets
from specdec.modeling import models
from specdec.runtime import peer_watch
from specdec.runtime.peer_watch import CHECK_TIMEOUT_S
from specdec.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc

GATEWAY_ADVICE = "The gateway tokenizes for the verifier: run both with the same model (--model)."


class VerifierWatch(peer_watch.PeerWatch):
    """The verifier's usability, kept current; `problem` is None while it is usable, else why not."""

    role = "verifier"

    def __init__(self, channel: grpc.aio.Channel, address: str, tokenizer: common_pb2.ModelInfo, period_s: float,
                 on_change: typing.Callable[[str | None, common_pb2.ModelInfo | None], typing.Awaitable[None]],
                 model: common_pb2.ModelInfo | None = None):
        """tokenizer: the gateway's own; model: the verifier's ModelInfo at start-up (its model is pinned)."""
        super().__init__(channel, address, period_s, on_change)
        self.stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        self.tokenizer = tokenizer
        self.model = model or common_pb2.ModelInfo()

    async def check_peer(self) -> tuple[str | None, common_pb2.ModelInfo | None]:
        """(None, the verifier's ModelInfo) when it answers with our tokenizer and model; (why not, None) otherwise."""
        try:
            reply = await self.stub.GetModelInfo(verifier_pb2.GetModelInfoRequest(), timeout=CHECK_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            return self.not_answering(exc), None
        problem = models.tokenizer_mismatch(reply.info, self.tokenizer, role="the gateway's --model",
                                            target_role="the verifier", advice=GATEWAY_ADVICE)
        if problem:
            return f"the verifier at {self.address} was replaced by an incompatible one: {problem}", None
        problem = models.model_mismatch(self.model, reply.info)
        if problem:
            return (f"the verifier at {self.address} was replaced by another model: {problem}. Put the model back, "
                    "or restart the gateway to serve the new one"), None
        return None, reply.info


class PoolWatch(peer_watch.PoolWatch):
    """The verifiers of a pool, watched: one VerifierWatch each; with a DNS target, verifiers join and leave as
    the name's addresses change (looked up every period_s). `on_change` is awaited whenever a verifier's
    verdict or model info changes; the pool's verdict is then `pool.problem()`."""

    role = "verifier"
    flag = "--verifier"

    def __init__(self, pool: VerifierPool, targets: VerifierTargets,
                 open_channel: typing.Callable[[str], grpc.aio.Channel], tokenizer: common_pb2.ModelInfo,
                 period_s: float, on_change: typing.Callable[[], typing.Awaitable[None]]):
        super().__init__(pool, targets, period_s, on_change)
        self.open_channel, self.tokenizer = open_channel, tokenizer
        self.model = common_pb2.ModelInfo()  # pinned by `pin`, from the first verifier that answered

    def pin(self, model: common_pb2.ModelInfo) -> None:
        """The model the gateway serves: every verifier must serve it (the same model fingerprint)."""
        self.model = model
        for watch in self.watches.values():
            watch.model = model

    def member_for(self, address: str) -> Verifier:
        return Verifier(address, self.open_channel(address))

    def watch_for(self, verifier: Verifier) -> VerifierWatch:
        return VerifierWatch(verifier.channel, verifier.address, self.tokenizer, self.period_s,
                             functools.partial(self.changed, verifier), model=self.model)
