"""The server's interceptors (specdec/runtime/interceptors.py) on a real server: a response stream that a handler
writes through `context.write` (grpc health's Watch) passes `CloseStreams` as well as an async generator does."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.runtime import grpc_server
from specdec.runtime.config import ServerConfig


def test_health_watch_streams_every_change_through_the_interceptors():
    """Watch answers SERVING, then NOT_SERVING when the server drains (it raised TypeError in CloseStreams)."""
    async def main():
        running = await grpc_server.start_server(ServerConfig(host="127.0.0.1"), lambda server: None, ["x.Service"])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
                first = await asyncio.wait_for(watch.read(), 5)
                await running.set_serving(False)
                second = await asyncio.wait_for(watch.read(), 5)
                watch.cancel()
                return first.status, second.status
        finally:
            await running.stop(0)

    assert asyncio.run(main()) == (health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING)
