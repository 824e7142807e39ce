"""A real draft server in this process (n-gram: no model) on a free loopback port.

For the draft's own rules (limits, idle TTL, GetDraftInfo) and for the verifier's
DraftLink against a real DraftService, without starting processes.
"""

from __future__ import annotations

import contextlib

from draft_service.config import DraftConfig
from draft_service.ngram import NgramProposer
from draft_service.server import DraftServicer
from specdec.runtime import grpc_server
from specdec.runtime.config import ServerConfig
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc

VOCAB = 100
# The draft and the target share this description (a DraftLink checks the tokenizer fingerprint).
INFO = common_pb2.ModelInfo(model="in-process", vocab_size=VOCAB, tokenizer_fingerprint="fp", tokenizer_class="T",
                            tokenizer_vocab_size=VOCAB)


@contextlib.asynccontextmanager
async def draft_server(server_config: ServerConfig | None = None, proposer=None, info=INFO, **draft_config):
    """Yield (address, servicer) of a running DraftService (n-gram unless `proposer` is given);
    `draft_config` sets DraftConfig fields."""
    servicer = DraftServicer(proposer or NgramProposer(), info, DraftConfig(**draft_config))
    running = await grpc_server.start_server(
        server_config or ServerConfig(host="127.0.0.1"),
        lambda server: draft_pb2_grpc.add_DraftServiceServicer_to_server(servicer, server),
        [draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name],
    )
    try:
        yield f"127.0.0.1:{running.port}", servicer
    finally:
        await running.stop(0)
