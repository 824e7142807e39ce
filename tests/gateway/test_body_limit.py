"""gateway.body_limit: a refused body is drained before its 413, within a bound."""

from __future__ import annotations

import asyncio

from gateway import body_limit
from gateway.body_limit import BodyLimit


def refused(headers: list[tuple[bytes, bytes]], chunks: int, chunk_bytes: int) -> tuple[list[str], int]:
    """Send a body of `chunks` messages of `chunk_bytes` through a BodyLimit of 1,000 bytes: the order of what
    happened (each chunk received, the response started), and how many chunks were never received."""
    events: list[str] = []
    pending = [{"type": "http.request", "body": b"x" * chunk_bytes, "more_body": i < chunks - 1}
               for i in range(chunks)]

    async def receive():
        events.append("received")
        return pending.pop(0)

    async def send(message):
        if message["type"] == "http.response.start":
            events.append(f"answered {message['status']}")

    async def app(scope, receive, send):
        raise AssertionError("a refused body never reaches the app")

    scope = {"type": "http", "headers": headers}
    asyncio.run(BodyLimit(app, 1000, "test:")(scope, receive, send))
    return events, len(pending)


def test_a_refused_body_is_drained_before_its_413_so_the_close_does_not_reset_the_client():
    """Announced (Content-Length) or chunked, a body over the limit is received to its end and dropped, then
    answered 413: closing with its bytes unread reset the connection, and the openai client saw a reset instead of
    the 413."""
    announced, left = refused([(b"content-length", b"5000")], 5, 1000)
    assert announced == ["received"] * 5 + ["answered 413"] and left == 0
    chunked, left = refused([], 5, 1000)
    assert chunked == ["received"] * 5 + ["answered 413"] and left == 0


def test_draining_stops_at_its_bound(monkeypatch):
    """A body far past DRAIN_BYTES is drained only that far: the gateway spends no more on it."""
    monkeypatch.setattr(body_limit, "DRAIN_BYTES", 3000)
    events, left = refused([(b"content-length", b"10000")], 10, 1000)
    assert events == ["received"] * 3 + ["answered 413"] and left == 7
