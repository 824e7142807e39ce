"""Refuse HTTP request bodies larger than any request the model can serve, before they are read whole.

ASGI middleware: a body announced larger than the limit (Content-Length) is answered 413 without reading
it; a chunked body is counted as it arrives and refused as soon as it passes the limit. Either way the
gateway holds at most `max_bytes` of one request, and never parses or tokenizes what cannot fit.

A refused body's rest is drained (received and dropped, up to DRAIN_BYTES or DRAIN_S) before the 413 is sent. The
answer closes the connection, and closing a socket with unread bytes resets it: a client still sending, or one
whose bytes were still unread, then got "connection reset" instead of the 413 and its message (the openai client
does not read a response before its upload ends).
"""

from __future__ import annotations

import asyncio
import json

from gateway.openai_protocol import OpenAIError
from specdec.runtime.limits import MAX_CONSTRAINT_BYTES

# JSON can spell one character in 12 bytes ("\ud83d\ude00"): a body this many times the prompt's
# characters, plus the rest of the request, still holds a prompt that fits.
JSON_BYTES_PER_CHAR = 12
# The rest: the other fields, and a structured-outputs constraint of up to MAX_CONSTRAINT_BYTES (a schema sent as
# a JSON string spells each of its bytes in up to 6: "\u001f").
OVERHEAD_BYTES = 256 * 1024 + 6 * MAX_CONSTRAINT_BYTES
# A refused body is drained up to this many bytes, or for this long, before its 413: past that the client may see a
# reset, and the gateway spends no more on it
DRAIN_BYTES = 16 * 1024 * 1024
DRAIN_S = 5.0


def replaying(body: dict, receive):
    """An ASGI receive that gives the body message already read, then the connection's own messages."""
    pending = [body]

    async def replay():
        return pending.pop() if pending else await receive()

    return replay


class BodyLimit:
    def __init__(self, app, max_bytes: int, why: str):
        self.app, self.max_bytes, self.why = app, max_bytes, why

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await drain(receive)
            return await self.refuse(send, int(length))
        # Read the body here, bounded, then hand it to the app as one message; later receives (the
        # disconnect a streaming response waits for) go to the server as before.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                if message.get("more_body", False):
                    await drain(receive)
                return await self.refuse(send, size)
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replaying(body, receive), send)

    async def refuse(self, send, size: int) -> None:
        error = OpenAIError(413, f"the request body is {size:,} bytes or more, refused unread: {self.why} no "
                                 f"request that fits is larger than {self.max_bytes:,} bytes", code="body_too_large")
        body = json.dumps(error.body()).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


async def drain(receive) -> None:
    """Receive and drop the rest of a request body, up to DRAIN_BYTES or DRAIN_S."""
    drained = 0
    try:
        async with asyncio.timeout(DRAIN_S):
            while drained < DRAIN_BYTES:
                message = await receive()
                if message["type"] != "http.request":  # the client left
                    break
                drained += len(message.get("body", b""))
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        pass
