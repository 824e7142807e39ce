"""Client-streaming calls in tests, written so that a server that ends the call early reports its own status.

Fed from a request iterator, grpc.aio writes the messages in the background; a write that races the
server's end of the call surfaced as INTERNAL ("Internal error from Core") instead of the server's
status (seen in make test on INVALID_ARGUMENT and UNAUTHENTICATED). Writing one message at a time and
stopping once the call has ended leaves the server's status to the read.
"""

from __future__ import annotations

import asyncio

import grpc


async def replies(call, messages) -> list:
    """The replies of a stream-stream `call` (opened without a request iterator) to `messages`; raises
    AioRpcError with the server's status where it ends the call with one."""
    try:
        for message in messages:
            await call.write(message)
        await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        pass  # the server ended the call; reading gives its status
    return [reply async for reply in call]
