"""A TCP proxy on loopback that adds a one-way delay in each direction: a network between verifier and draft.

    python -m bench.core.latency_proxy --target 127.0.0.1:50053 --delay-ms 10 --port 50063   # 20 ms round trip

Linux netem is not available on these machines, so tests and benchmarks put this between the verifier and
the draft. Every byte is held `delay_ms` before it is passed on, in order; bandwidth is not limited. The
delay can be changed while it runs (`LatencyProxy.delay_ms`). It forwards only to loopback addresses, and
`LatencyProxy` runs in a thread of its own and stops with its `with` block.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ipaddress
import socket
import threading
import time

CHUNK = 64 * 1024


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


class LatencyProxy:
    """Listen on 127.0.0.1 (port 0: a free one); forward each connection to `target` with the delay."""

    def __init__(self, target: str, delay_ms: float = 0.0, port: int = 0):
        host, _, port_text = target.rpartition(":")
        if not _loopback(host):
            raise ValueError(f"the latency proxy forwards only to loopback, not {target}")
        self.target_host, self.target_port = host, int(port_text)
        self.delay_ms = delay_ms  # one way; change it at any time
        self.listen_port = port
        self.port = 0
        self.bytes_forwarded = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="latency-proxy")
        self._server: asyncio.base_events.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> LatencyProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self):
        return await asyncio.start_server(self._connect, "127.0.0.1", self.listen_port)

    async def _stop(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _connect(self, client_reader, client_writer) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            client_writer.close()
            return
        try:
            await asyncio.gather(self._pipe(client_reader, target_writer), self._pipe(target_reader, client_writer),
                                 return_exceptions=True)
        except asyncio.CancelledError:  # the proxy is stopping: the connection just ends (no traceback)
            client_writer.close()
            target_writer.close()

    async def _pipe(self, reader, writer) -> None:
        """Read as bytes arrive; write each chunk delay_ms after it arrived, in order."""
        held: collections.deque[tuple[float, bytes]] = collections.deque()
        arrived = asyncio.Event()
        done = False

        async def release():
            while held or not done:
                if not held:
                    arrived.clear()
                    await arrived.wait()
                    continue
                due, data = held[0]
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                held.popleft()
                writer.write(data)
                await writer.drain()
                self.bytes_forwarded += len(data)

        sender = asyncio.create_task(release())
        try:
            while data := await reader.read(CHUNK):
                held.append((time.monotonic() + self.delay_ms / 1000, data))
                arrived.set()
        finally:
            done = True
            arrived.set()
            try:
                await sender
            finally:
                writer.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="HOST:PORT on loopback to forward to")
    parser.add_argument("--delay-ms", type=float, default=10.0, help="one-way delay (round trip: twice this)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on, 127.0.0.1 (0: a free one)")
    args = parser.parse_args(argv)
    with LatencyProxy(args.target, args.delay_ms, args.port) as proxy:
        print(f"forwarding {proxy.address} -> {args.target} with {args.delay_ms:g} ms each way; Ctrl-C stops",
              flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
