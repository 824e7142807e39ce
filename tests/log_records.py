"""Log records a test may assert on, less grpc.aio's own noise.

grpc.aio binds one process-wide PollerCompletionQueue to every event loop that used it. Each `asyncio.run`
in a test makes a new loop; when a later loop handles a completion meant for an earlier, closed one, asyncio
logs "Exception in callback PollerCompletionQueue._handle_events ... RuntimeError: Event loop is closed"
(grpc/grpc#25364 is the family; it seldom happens, and never in a server, which keeps one loop). The calls
themselves are unaffected, so a test that checks "no error was logged" must not fail on it.
"""

from __future__ import annotations

import logging


def is_grpc_poller_noise(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return (
        record.name == "asyncio"
        and "PollerCompletionQueue._handle_events" in record.getMessage()
        and isinstance(exc, RuntimeError)
        and "Event loop is closed" in str(exc)
    )


def logged_errors(records: list[logging.LogRecord]) -> list[str]:
    """Messages of the records at ERROR or above, less grpc.aio's poller noise."""
    return [r.getMessage() for r in records if r.levelno >= logging.ERROR and not is_grpc_poller_noise(r)]


def asyncio_messages(records: list[logging.LogRecord]) -> list[str]:
    """Messages that asyncio logged (a task destroyed while pending, ...), less grpc.aio's poller noise."""
    return [r.getMessage() for r in records if r.name == "asyncio" and not is_grpc_poller_noise(r)]
