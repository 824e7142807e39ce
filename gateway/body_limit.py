"""Refuse HTTP request bodies larger than any request the model can serve, before they are read whole.

ASGI middleware: a body announced larger than the limit (Content-Length) is answered 413 without reading
it; a chunked body is counted as it arrives and refused as soon as it passes the limit. Either way the
gateway holds at most `max_bytes` of one request, and never parses or tokenizes what cannot fit.
"""

from __future__ import annotations

import json

from gateway.openai_protocol import OpenAIError
from specdec.runtime.limits import MAX_CONSTRAINT_BYTES

# JSON can spell one character in 12 bytes ("\ud83d\ude00"): a body this many times the prompt's
# characters, plus the rest of the request, still holds a prompt that fits.
JSON_BYTES_PER_CHAR = 12
# The rest: the other fields, and a structured-outputs constraint of up to MAX_CONSTRAINT_BYTES (a schema sent as
# a JSON string spells each of its bytes in up to 6: "\u001f").
OVERHEAD_BYTES = 256 * 1024 + 6 * MAX_CONSTRAINT_BYTES


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
