"""specdec.v1.Gateway: the public gRPC API, a thin mapping over gateway.generation.

Per request: prepare (check, tokenize), run one Decode stream through the
verifier, and return the text with usage and speculation statistics. The gRPC
server span is the root of the request's trace.
"""

from __future__ import annotations

import contextlib

import grpc

from gateway.auth import presented_key
from gateway.generation import Generation, GenerationError, Piece
from specdec.v1 import gateway_pb2, gateway_pb2_grpc


def to_response(piece: Piece) -> gateway_pb2.GenerateResponse:
    response = gateway_pb2.GenerateResponse(text=piece.text, token_ids=piece.token_ids)
    if piece.final is not None:
        response.finish_reason = piece.final.finish_reason
        response.matched_stop = piece.final.matched_stop
        response.usage.CopyFrom(piece.final.usage)
        response.speculation.CopyFrom(piece.final.speculation)
    return response


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, generation: Generation):
        self.generation = generation

    async def Generate(self, request: gateway_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
        response = gateway_pb2.GenerateResponse()
        async with contextlib.aclosing(self._generate(request, context)) as pieces:  # a cancel frees it at once
            async for piece in pieces:
                response.text += piece.text
                response.token_ids.extend(piece.token_ids)
                if piece.finish_reason:
                    response.finish_reason = piece.finish_reason
                    response.matched_stop = piece.matched_stop
                    response.usage.CopyFrom(piece.usage)
                    response.speculation.CopyFrom(piece.speculation)
        return response

    async def GenerateStream(self, request: gateway_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
        async with contextlib.aclosing(self._generate(request, context)) as pieces:
            async for piece in pieces:
                yield piece

    async def _generate(self, request: gateway_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
        try:
            decode = await self.generation.prepare(request, presented_key(context.invocation_metadata()))
            async with contextlib.aclosing(self.generation.run(decode)) as pieces:
                async for piece in pieces:
                    yield to_response(piece)
        except GenerationError as exc:
            await context.abort(exc.code, exc.message)
