"""What every server and channel of ours wraps around calls: parsing, stream clean-up, the internal token.

Server side, outermost first (see `specdec.runtime.grpc_server.start_server`):
- `CloseStreams`: a response stream is closed in its own call's task when the call ends for any
  reason (a client's cancel included). Left to the garbage collector, a suspended stream is closed
  in another task, where OpenTelemetry's span context cannot be detached ("Failed to detach
  context") and the handler's clean-up races the event loop ("Task was destroyed but it is pending").
- `RequireInternalToken`: calls to the internal services (verifier, draft) need the shared token.
- `TenantFromAuthenticatedPeers` (servers without the token): a `tenant` is kept only from a caller that
  proved itself (a verified client certificate) or came over loopback; anyone else's falls back to the
  shared tenant "", so an open port cannot be used to read another tenant's learnt outputs.
- `ParseRequests`: a message that does not parse (say, invalid UTF-8 in a string field) is answered
  INVALID_ARGUMENT with the parser's reason, instead of UNKNOWN and an ERROR traceback; so is one larger
  than any request the service can serve (`RequestSizeLimit`), before it is parsed.
Client side: `internal_token_interceptors` attach the token to every call of a channel.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hmac
import inspect
import logging
import typing

import grpc
from google.protobuf.message import DecodeError

from specdec.runtime import loopback
from specdec.v1 import draft_pb2, verifier_pb2

INTERNAL_TOKEN_KEY = "x-specdec-internal-token"
# The services only our own services call. Health checks and reflection stay open for probes.
INTERNAL_SERVICES = ("/specdec.v1.VerifierService/", "/specdec.v1.DraftService/")
INTERNAL_TOKEN_REFUSED = (f"this is an internal service: calls need the shared internal token in `{INTERNAL_TOKEN_KEY}` "
                          "metadata (the peer must run with the same --internal-token-file); clients call the gateway")

_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}
# The response streams a call opened, innermost last: CloseStreams closes them in the call's own task.
_OPEN_STREAMS: contextvars.ContextVar[list] = contextvars.ContextVar("specdec_open_streams")


def _behavior(handler: grpc.RpcMethodHandler) -> typing.Callable:
    return handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream


def _rebuilt(handler: grpc.RpcMethodHandler, behavior: typing.Callable, request_deserializer=None):
    """The same kind of handler with another behavior (and, optionally, another request parser)."""
    factory = _FACTORIES[(handler.request_streaming, handler.response_streaming)]
    return factory(behavior, request_deserializer=request_deserializer or handler.request_deserializer,
                   response_serializer=handler.response_serializer)


def refusing(handler: grpc.RpcMethodHandler | None, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind that ends every call with `code` and `message`, reading nothing."""

    async def unary(request, context):
        await context.abort(code, message)

    async def streaming(request, context):
        await context.abort(code, message)
        yield  # pragma: no cover  (makes this an async generator)

    if handler is None:
        return grpc.unary_unary_rpc_method_handler(unary)
    return _rebuilt(handler, streaming if handler.response_streaming else unary)


class CloseStreams(grpc.aio.ServerInterceptor):
    """Serve response streams through `context.write`, and close them in the call's task when it ends."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or not handler.response_streaming:
            return handler
        stream = _behavior(handler)

        async def behavior(request, context):
            opened = []
            _OPEN_STREAMS.set(opened)  # this call's task runs in its own copy of the context
            responses = stream(request, context)
            try:
                if inspect.isawaitable(responses):  # a handler that writes through context.write (grpc health's Watch)
                    await responses
                    return
                async for response in responses:
                    await context.write(response)
            finally:
                # innermost first: the servicer frees what it holds, then the tracing span ends
                for opened_stream in [*reversed(opened), responses]:
                    close = getattr(opened_stream, "aclose", None)
                    if close is not None:
                        await close()

        return _rebuilt(handler, behavior)


class Undecodable:
    """A request message that did not parse; `ParseRequests` answers it with INVALID_ARGUMENT."""

    def __init__(self, reason: str):
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class RequestSizeLimit:
    """Messages larger than `max_bytes` are refused unread; `why` says what bounds them, for the client."""

    max_bytes: int = 0  # 0: no limit but gRPC's own (--max-message-mb)
    why: str = ""


def _tolerant(deserializer, size: RequestSizeLimit):
    if deserializer is None:
        return None

    def parse(data: bytes):
        if size.max_bytes and len(data) > size.max_bytes:
            return Undecodable(f"the request is {len(data):,} bytes, refused unread: {size.why} no request whose "
                               f"prompt fits is larger than {size.max_bytes:,} bytes; shorten the prompt")
        try:
            return deserializer(data)
        except DecodeError as exc:
            return Undecodable(str(exc))

    return parse


class _CheckedRequests:
    """A request stream that ends the call with INVALID_ARGUMENT at the first message that did not parse."""

    def __init__(self, requests, context):
        self._requests, self._context, self._iterator = requests, context, None

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._iterator is None:
            self._iterator = self._requests.__aiter__()
        message = await self._iterator.__anext__()
        if isinstance(message, Undecodable):
            await self._context.abort(grpc.StatusCode.INVALID_ARGUMENT, message.reason)
        return message


async def _refused_stream(context, reason: str):
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)
    yield  # pragma: no cover  (makes this an async generator)


class ParseRequests(grpc.aio.ServerInterceptor):
    """Innermost: parse requests without raising, refuse the ones that did not parse, and register the
    servicer's response stream with `CloseStreams`. A message over the size limit is refused before parsing:
    a request that cannot fit costs the server a length comparison, not a parse and a copy."""

    def __init__(self, size: RequestSizeLimit | None = None):
        self.size = size or RequestSizeLimit()

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        servicer = _behavior(handler)
        parse = _tolerant(handler.request_deserializer, self.size)
        if handler.response_streaming:
            def stream(request, context):
                if handler.request_streaming:
                    responses = servicer(_CheckedRequests(request, context), context)
                elif isinstance(request, Undecodable):
                    responses = _refused_stream(context, request.reason)
                else:
                    responses = servicer(request, context)
                opened = _OPEN_STREAMS.get(None)
                if opened is not None:
                    opened.append(responses)
                return responses

            return _rebuilt(handler, stream, parse)

        async def unary(request, context):
            if handler.request_streaming:
                return await servicer(_CheckedRequests(request, context), context)
            if isinstance(request, Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
            return await servicer(request, context)

        return _rebuilt(handler, unary, parse)


class RequireInternalToken(grpc.aio.ServerInterceptor):
    """Calls to the internal services must carry the shared token (compared in constant time, never logged)."""

    def __init__(self, token: str):
        self._token = token.encode()

    def _presented(self, metadata) -> bool:
        for key, value in metadata or ():
            if key == INTERNAL_TOKEN_KEY:
                return hmac.compare_digest(str(value).encode(), self._token)
        return False

    async def intercept_service(self, continuation, handler_call_details):
        if (not handler_call_details.method.startswith(INTERNAL_SERVICES)
                or self._presented(handler_call_details.invocation_metadata)):
            return await continuation(handler_call_details)
        return refusing(await continuation(handler_call_details), grpc.StatusCode.UNAUTHENTICATED,
                        INTERNAL_TOKEN_REFUSED)


def _drop_tenant(message) -> bool:
    """Clear the tenant a request claims (DecodeRequest.tenant, ProposeRequest.start.tenant); whether it had one."""
    if isinstance(message, verifier_pb2.DecodeRequest):
        holder = message
    elif isinstance(message, draft_pb2.ProposeRequest) and message.HasField("start"):
        holder = message.start
    else:
        return False
    claimed = bool(holder.tenant)
    holder.tenant = ""
    return claimed


class TenantFromAuthenticatedPeers(grpc.aio.ServerInterceptor):
    """On a server that does not require the internal token, trust a request's `tenant` only from a caller
    with a verified client certificate (mTLS) or on loopback (the boundary a loopback bind already draws);
    from anyone else it becomes the shared tenant "", and that is logged once. Shared rather than refused: a
    tenant only keeps the draft's learnt outputs apart, the shared one is what any caller of an open port
    reaches anyway, and the output is the same either way."""

    def __init__(self, log: logging.Logger):
        self._log = log
        self._logged = False

    def _trusted(self, context) -> bool:
        return context.peer_identities() is not None or loopback.is_loopback_peer(context.peer())

    def _distrust(self, message, context) -> None:
        if _drop_tenant(message) and not self._logged:
            self._logged = True
            self._log.warning("a call from %s set a tenant, but nothing authenticates it (no --internal-token-file, "
                              "no client certificate, not loopback): it shares the tenant \"\" instead. Set "
                              "--internal-token-file on every service to keep tenants apart (logged once)",
                              context.peer())

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(INTERNAL_SERVICES):
            return handler
        servicer = _behavior(handler)

        def distrusted(request, context):
            if handler.request_streaming:
                return _Distrusted(request, context, self) if not self._trusted(context) else request
            if not self._trusted(context):
                self._distrust(request, context)
            return request

        if handler.response_streaming:
            def stream(request, context):  # returns the servicer's own stream: CloseStreams closes that one
                return servicer(distrusted(request, context), context)

            return _rebuilt(handler, stream)

        async def unary(request, context):
            return await servicer(distrusted(request, context), context)

        return _rebuilt(handler, unary)


class _Distrusted:
    """A request stream whose messages' tenant is cleared (the caller is not authenticated)."""

    def __init__(self, requests, context, guard: TenantFromAuthenticatedPeers):
        self._requests, self._context, self._guard, self._iterator = requests, context, guard, None

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._iterator is None:
            self._iterator = self._requests.__aiter__()
        message = await self._iterator.__anext__()
        self._guard._distrust(message, self._context)
        return message


class _WithToken:
    def __init__(self, token: str):
        self._token = token

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(INTERNAL_TOKEN_KEY, self._token)
        return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials,
                                          details.wait_for_ready)


class _UnaryUnary(_WithToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _UnaryStream(_WithToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _StreamUnary(_WithToken, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


class _StreamStream(_WithToken, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


def internal_token_interceptors(token: str) -> list:
    """aio client interceptors (one per call kind: grpc.aio files each under one kind) that send the token."""
    return [kind(token) for kind in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]
