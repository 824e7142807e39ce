"""VerifierWatch against a real gRPC verifier stand-in (GetModelInfo, and grpc.health.v1 where a test adds it, in
this process): it tells the gateway when the verdict or the verifier's model info changes, and only then; a
draining verifier is out at once. PoolWatch: the verifiers a DNS name stands for."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gateway.verifier_pool import VerifierPool, parse_targets
from gateway.verifier_watch import PoolWatch, VerifierWatch
from specdec.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc

OURS = common_pb2.ModelInfo(model="m", vocab_size=64, max_context=512, eos_token_ids=[2],
                            tokenizer_fingerprint="abc", tokenizer_class="Fast", tokenizer_vocab_size=64,
                            model_fingerprint="1234")


class ModelInfoOnly(verifier_pb2_grpc.VerifierServiceServicer):
    def __init__(self):
        self.info = common_pb2.ModelInfo()
        self.info.CopyFrom(OURS)

    async def GetModelInfo(self, request, context):  # noqa: N802 (gRPC method name)
        return verifier_pb2.GetModelInfoResponse(info=self.info)


async def model_info_server() -> tuple[grpc.aio.Server, "ModelInfoOnly", int]:
    """A started verifier stand-in that only answers GetModelInfo, on a free port."""
    server = grpc.aio.server()
    servicer = ModelInfoOnly()
    verifier_pb2_grpc.add_VerifierServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, servicer, port


def test_reports_each_change_once_and_nothing_while_nothing_changes():
    async def scenario():
        server, servicer, port = await model_info_server()
        reports = []

        async def on_change(problem, info):
            reports.append((problem, info.max_context if info is not None else None))

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            watch = VerifierWatch(channel, f"127.0.0.1:{port}", OURS, period_s=60, on_change=on_change)
            for _ in range(3):
                await watch.check_and_report()
            assert reports == [(None, 512)]  # the first verdict, then nothing: the same verifier, the same info
            servicer.info.max_context = 1024  # a verifier with the same tokenizer and a longer context
            await watch.check_and_report()
            await watch.check_and_report()
            assert reports[1:] == [(None, 1024)]
            servicer.info.tokenizer_fingerprint = "other"  # replaced by one with another tokenizer
            await watch.check_and_report()
            await watch.check_and_report()
            assert len(reports) == 3 and "incompatible" in reports[2][0] and reports[2][1] is None
            await server.stop(None)
            await watch.check_and_report()  # down: a new verdict
            assert len(reports) == 4 and "not answering" in reports[3][0]

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_the_first_check_is_always_reported():
    async def scenario():
        reports = []

        async def on_change(problem, info):
            reports.append(problem)

        async with grpc.aio.insecure_channel("127.0.0.1:1") as channel:  # nothing listens on port 1
            watch = VerifierWatch(channel, "127.0.0.1:1", OURS, period_s=60, on_change=on_change)
            await watch.check_and_report()
        assert len(reports) == 1 and "not answering" in reports[0]

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_another_model_with_the_same_tokenizer_is_unusable_until_the_pinned_one_is_back():
    async def scenario():
        server, servicer, port = await model_info_server()
        reports = []

        async def on_change(problem, info):
            reports.append((problem, info.model if info is not None else None))

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            watch = VerifierWatch(channel, f"127.0.0.1:{port}", OURS, 60, on_change, model=OURS)
            await watch.check_and_report()
            servicer.info.model, servicer.info.model_fingerprint = "other-model", "5678"
            await watch.check_and_report()
            servicer.info.model, servicer.info.model_fingerprint = "m-copy", "1234"  # the same weights, renamed
            await watch.check_and_report()
            await server.stop(None)
        assert reports[0] == (None, "m")
        problem = reports[1][0]
        assert reports[1][1] is None and "another model" in problem
        assert all(part in problem for part in ("other-model", "5678", "m", "1234"))
        assert reports[2] == (None, "m-copy")

    asyncio.run(asyncio.wait_for(scenario(), 30))


async def healthy_model_info_server() -> tuple[grpc.aio.Server, "ModelInfoOnly", health.aio.HealthServicer, int]:
    """The stand-in with grpc.health.v1 too, SERVING."""
    server = grpc.aio.server()
    servicer, health_servicer = ModelInfoOnly(), health.aio.HealthServicer()
    verifier_pb2_grpc.add_VerifierServiceServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, servicer, health_servicer, port


async def until(condition, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "not within the time"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def watching_a_healthy_verifier():
    """A running VerifierWatch (60 s period) over the healthy stand-in, after its first report:
    yields (watch, the stand-in's health servicer, the problems reported so far)."""
    server, _, health_servicer, port = await healthy_model_info_server()
    reports = []

    async def on_change(problem, info):
        reports.append(problem)

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        watch = VerifierWatch(channel, f"127.0.0.1:{port}", OURS, period_s=60, on_change=on_change)
        task = asyncio.create_task(watch.run())
        try:
            await until(lambda: reports == [None])
            yield watch, health_servicer, reports
        finally:
            task.cancel()
    await server.stop(None)


def test_a_draining_verifier_is_unusable_at_once_and_usable_again_when_it_serves():
    async def scenario():
        async with watching_a_healthy_verifier() as (_, health_servicer, reports):
            await health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)  # SIGTERM: draining
            await until(lambda: len(reports) == 2)  # the health Watch stream woke the check: no 60 s period
            assert "reports health NOT_SERVING" in reports[1]
            await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
            await until(lambda: len(reports) == 3)
            assert reports[2] is None

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_suspected_verifier_leaves_at_once_and_comes_back_when_the_check_passes():
    async def scenario():
        async with watching_a_healthy_verifier() as (watch, _, reports):
            await watch.suspect("UNAVAILABLE: Socket closed")
            assert "dropped a request (UNAVAILABLE: Socket closed)" in reports[1]
            await until(lambda: len(reports) == 3)  # checked at once: it answers, so it is back
            assert reports[2] is None

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_pool_watch_follows_a_dns_name_and_reports_the_pool():
    async def scenario():
        server, _, _, port = await healthy_model_info_server()
        pool, changes = VerifierPool(), []

        async def on_change():
            changes.append(pool.problem())

        channels = []

        def open_channel(address):
            channels.append(grpc.aio.insecure_channel(address))
            return channels[-1]

        watch = PoolWatch(pool, parse_targets(f"dns:///localhost:{port}"), open_channel, OURS, 60, on_change)
        watch.pin(OURS)
        await watch.refresh()
        assert f"127.0.0.1:{port}" in pool.members
        assert all(v.problem == "not checked yet" for v in pool.members.values())
        await watch.check_all()
        assert pool.members[f"127.0.0.1:{port}"].problem is None and changes[-1] is None
        watch.targets = parse_targets(f"127.0.0.1:{port}")  # the name now answers with one address only
        await watch.refresh()
        assert list(pool.members) == [f"127.0.0.1:{port}"]
        await watch.close()
        await server.stop(None)

    asyncio.run(asyncio.wait_for(scenario(), 30))
