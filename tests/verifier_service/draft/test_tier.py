"""verifier_service.draft.tier: which replica a sequence drafts on, and tenants moved when one leaves; a link
that fails as if its replica went away takes it out of the live set (its watch checks it at once)."""

from __future__ import annotations

import asyncio
import collections
import types

import grpc
import pytest

from specdec.runtime import config as specdec_config
from specdec.runtime.grpc_server import ConfigError
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from tests.verifier_service.draft.test_client_backoff import FakeError
from verifier_service.draft.client import DraftLink, DraftUnavailable
from verifier_service.draft import rendezvous
from verifier_service.draft.tier import DraftTier, parse_drafts

ADDRESSES = ["10.0.0.1:50051", "10.0.0.2:50051"]
TENANTS = [f"tenant-{i}" for i in range(40)]


def tier_of(routing: str = "affine") -> DraftTier:
    tier = DraftTier(parse_drafts(",".join(ADDRESSES)), open_link=None, routing=routing)
    for address in ADDRESSES:  # stand-ins: routing reads only the address and the watch's verdict
        tier.add(types.SimpleNamespace(address=address, problem=None, sizes_blocks=False))
    return tier


def test_affine_routing_keeps_each_tenant_on_its_rendezvous_replica():
    tier = tier_of()
    for _ in range(3):
        assert all(tier.pick(t, f"r{i}").address == rendezvous.owner(t, ADDRESSES) for i, t in enumerate(TENANTS))
    assert set(collections.Counter(tier.pick(t, "r").address for t in TENANTS)) == set(ADDRESSES)
    assert tier.moves == 0


def test_a_replica_that_leaves_moves_only_its_tenants_and_they_are_counted():
    tier = tier_of()
    before = {t: tier.pick(t, "r").address for t in TENANTS}
    gone, left = ADDRESSES
    tier.members[gone].problem = "the draft replica at ... dropped a request (UNAVAILABLE); checking it"
    after = {t: tier.pick(t, "r").address for t in TENANTS}
    assert set(after.values()) == {left}
    moved = [t for t in TENANTS if before[t] == gone]
    assert moved and tier.moves == len(moved)
    tier.pick(moved[0], "r")  # asked again: still there, not moved twice
    assert tier.moves == len(moved)
    tier.members[gone].problem = None  # back: its tenants return, and that is a move too
    assert {t: tier.pick(t, "r").address for t in TENANTS} == before
    assert tier.moves == 2 * len(moved)


def test_with_no_replica_live_the_hash_picks_over_all_without_counting_moves():
    tier = tier_of()
    for link in tier.members.values():
        link.problem = "down"
    assert tier.pick("tenant-0", "r").address == rendezvous.owner("tenant-0", ADDRESSES)
    assert tier.moves == 0
    assert DraftTier(parse_drafts("a:1"), None).pick("t", "r") is None  # nothing known yet


def test_requests_without_a_tenant_spread_by_request_id():
    tier = tier_of()
    picked = collections.Counter(tier.pick("", f"request-{i}").address for i in range(200))
    assert set(picked) == set(ADDRESSES) and min(picked.values()) > 60
    assert not tier.placed


def test_random_routing_spreads_a_tenant_and_keeps_a_sessions_replica_while_live():
    tier = tier_of("random")
    assert {tier.pick("tenant-0", "r").address for _ in range(100)} == set(ADDRESSES)
    session = types.SimpleNamespace(link=tier.members[ADDRESSES[0]], tenant="tenant-0", request_id="r")
    assert all(tier.route(session) is session.link for _ in range(20))
    session.link.problem = "down"
    assert all(tier.route(session).address == ADDRESSES[1] for _ in range(20))


@pytest.mark.parametrize("text", ["", "dns:///draft", "a:1,dns:///b:1"])
def test_draft_targets_that_cannot_work_name_the_flag(text):
    with pytest.raises(ConfigError, match="--draft"):
        parse_drafts(text)


def test_unknown_routing_is_refused():
    with pytest.raises(ValueError, match="affine"):
        DraftTier(parse_drafts("a:1"), None, routing="nearest")


def test_a_link_suspects_its_replica_only_when_it_looks_gone():
    async def scenario():
        link = DraftLink("127.0.0.1:1", specdec_config.ServerConfig(), common_pb2.ModelInfo(vocab_size=10), 0.1)
        suspected = []

        async def suspect(reason):
            suspected.append(reason)
        link.suspect = suspect
        for exc in (FakeError(grpc.StatusCode.INVALID_ARGUMENT), TimeoutError(), FakeError(grpc.StatusCode.INTERNAL)):
            link.failed(exc)  # refused one request, slow, or an error that is not the replica going away
        await asyncio.sleep(0)
        assert suspected == []
        link.failed(FakeError(grpc.StatusCode.UNAVAILABLE))
        link.failed(DraftUnavailable("cannot connect"))
        await asyncio.sleep(0)
        assert suspected == ["UNAVAILABLE: UNAVAILABLE", "cannot connect"]
        link.opened(1)
        link.opened(1)
        link.opened(-1)
        assert link.outstanding == 1
        await link.close()
    asyncio.run(scenario())


class InfoOnly(draft_pb2_grpc.DraftServiceServicer):
    async def GetDraftInfo(self, request, context):  # noqa: N802 (gRPC method name)
        return draft_pb2.GetDraftInfoResponse(info=TARGET, method="suffix", sizes_blocks=True)


TARGET = common_pb2.ModelInfo(model="m", vocab_size=64, max_context=512, eos_token_ids=[2],
                              tokenizer_fingerprint="abc", tokenizer_class="Fast", tokenizer_vocab_size=64)


def test_a_dns_tier_finds_its_replicas_and_routes_around_one_that_goes_away():
    async def scenario():
        server = grpc.aio.server()
        draft_pb2_grpc.add_DraftServiceServicer_to_server(InfoOnly(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        tier = DraftTier(parse_drafts(f"dns:///localhost:{port}"),
                         lambda address: DraftLink(address, specdec_config.ServerConfig(), TARGET, 1.0), period_s=60)
        answered = await tier.start(wait_s=1.0)
        address = f"127.0.0.1:{port}"
        assert [link.address for link in answered] == [address]  # ([::1], if localhost has it, does not answer)
        assert [link.address for link in tier.live()] == [address] and tier.sizes_blocks
        session = tier.session("r1", None, tenant="t")
        assert session.link.address == address and session.router is tier
        await server.stop(None)
        tier.members[address].failed(FakeError(grpc.StatusCode.UNAVAILABLE))  # a stream to it broke
        for _ in range(100):
            if not tier.live():
                break
            await asyncio.sleep(0.01)
        # out at once: the failed stream's suspicion, or the watch (its channel and health stream saw it first)
        assert tier.live() == [] and any(why in tier.members[address].problem
                                         for why in ("dropped a request", "not answering"))
        await tier.close()
    asyncio.run(scenario())
