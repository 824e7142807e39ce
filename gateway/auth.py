"""Optional API-key auth: `authorization: Bearer KEY` (or `x-api-key: KEY`) on every Gateway call.

Health checks and reflection stay open, so probes work. Keys are compared in
constant time and never logged.
"""

from __future__ import annotations

import hmac

import grpc

OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


def parse_keys(text: str) -> list[str]:
    return [key.strip() for key in text.split(",") if key.strip()]


def presented_key(metadata) -> str:
    for key, value in metadata or ():
        if key == "authorization" and value.lower().startswith("bearer "):
            return value[7:].strip()
        if key == "x-api-key":
            return value.strip()
    return ""


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, keys: list[str]):
        self._keys = [key.encode() for key in keys]

    def _allowed(self, key: str) -> bool:
        candidate = key.encode()
        return any(hmac.compare_digest(candidate, known) for known in self._keys)

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(OPEN_PREFIXES) or self._allowed(presented_key(handler_call_details.invocation_metadata)):
            return await continuation(handler_call_details)
        return _deny(await continuation(handler_call_details))


def _deny(handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler:
    message = "missing or wrong API key: send `authorization: Bearer <key>`"

    async def unary(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def streaming(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover  (makes this an async generator)

    if handler is not None and handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            streaming, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(
        unary, request_deserializer=handler.request_deserializer if handler else None,
        response_serializer=handler.response_serializer if handler else None)
