"""gateway.verifier_pool: what --verifier names, and which verifier takes the next request (least outstanding)."""

from __future__ import annotations

import asyncio
import collections
from unittest import mock

import pytest

from gateway.verifier_pool import Verifier, VerifierPool, VerifierTargets, parse_targets, resolve
from specdec.runtime.grpc_server import ConfigError


def pool_of(n: int) -> tuple[VerifierPool, list[Verifier]]:
    verifiers = [Verifier(f"10.0.0.{i}:50052", mock.MagicMock()) for i in range(n)]  # no calls: stand-in channels
    return VerifierPool(verifiers), verifiers


@pytest.mark.parametrize(("text", "expected"), [
    ("localhost:50052", VerifierTargets(addresses=("localhost:50052",))),
    (" a:1, b:2 ,a:1,", VerifierTargets(addresses=("a:1", "b:2"))),  # spaces, a repeat and a trailing comma
    ("dns:///verifier-headless:50052", VerifierTargets(dns_host="verifier-headless", dns_port=50052)),
    ("dns://8.8.8.8/verifier.specdec.svc:50052", VerifierTargets(dns_host="verifier.specdec.svc", dns_port=50052)),
    ("dns:verifier:7", VerifierTargets(dns_host="verifier", dns_port=7)),
])
def test_targets_parse(text, expected):
    assert parse_targets(text) == expected
    assert str(parse_targets(str(expected))) == str(expected)


@pytest.mark.parametrize(("text", "words"), [
    ("", "is empty"),
    (" , ", "is empty"),
    ("dns:///verifier", "dns:///NAME:PORT"),
    ("dns:///verifier:port", "dns:///NAME:PORT"),
    ("dns:///a:1,dns:///b:1", "dns:///NAME:PORT"),
    ("a:1,dns:///b:1", "given alone"),
    ("http://a:1", "not HOST:PORT"),
])
def test_targets_that_cannot_work_are_refused_with_the_form_to_use(text, words):
    with pytest.raises(ConfigError, match=words):
        parse_targets(text)


def test_a_dns_name_resolves_to_its_addresses_and_a_list_to_itself():
    loop = asyncio.new_event_loop()
    try:
        found = loop.run_until_complete(resolve(parse_targets("dns:///localhost:50052"), loop))
        assert "127.0.0.1:50052" in found and found == sorted(set(found))
        assert all(a in ("127.0.0.1:50052", "[::1]:50052") for a in found)
        assert loop.run_until_complete(resolve(parse_targets("b:1,a:2"), loop)) == ["b:1", "a:2"]
    finally:
        loop.close()


def test_the_next_request_goes_to_the_verifier_with_the_fewest_open_ones():
    pool, (a, b, c) = pool_of(3)
    a.outstanding, b.outstanding, c.outstanding = 5, 1, 3
    assert pool.pick() is b
    with pool.lease(b) as stub:
        assert stub is b.stub and b.outstanding == 2
        assert pool.pick() is b  # 2 is still the fewest
        with pool.lease(b):
            assert {pool.pick(), pool.pick()} == {b, c}  # b 3, c 3: a tie, taken in turn
    assert b.outstanding == 1


def test_ties_are_taken_in_turn_so_an_idle_fleet_fills_evenly():
    pool, verifiers = pool_of(3)
    leases = []
    counts = collections.Counter()
    for _ in range(9):  # nine long streams, none ending: each verifier gets three
        verifier = pool.pick()
        counts[verifier.address] += 1
        lease = pool.lease(verifier)
        lease.__enter__()
        leases.append(lease)
    assert sorted(counts.values()) == [3, 3, 3]
    assert all(v.outstanding == 3 for v in verifiers)
    for lease in leases:
        lease.__exit__(None, None, None)
    assert all(v.outstanding == 0 for v in verifiers)


def test_long_streams_do_not_pile_up_where_round_robin_would_put_them():
    """Every 3rd request is long (never ends here), the rest end at once: round robin would give one verifier
    every long stream; least-outstanding spreads them."""
    pool, verifiers = pool_of(3)
    held = []
    for i in range(30):
        verifier = pool.pick()
        lease = pool.lease(verifier)
        lease.__enter__()
        if i % 3 == 0:
            held.append(lease)
        else:
            lease.__exit__(None, None, None)
    assert max(v.outstanding for v in verifiers) - min(v.outstanding for v in verifiers) <= 1


def test_unusable_and_avoided_verifiers_take_nothing():
    pool, (a, b, c) = pool_of(3)
    a.problem = "the verifier at a is not answering"
    b.outstanding = 9
    assert pool.pick() is c
    assert pool.pick(avoid=[c]) is b
    assert pool.pick(avoid=[b, c]) is None
    assert pool.problem() is None
    b.problem = c.problem = "draining"
    assert pool.pick() is None
    assert pool.problem().startswith("none of the 3 verifiers is usable") and "not answering" in pool.problem()


def test_the_pool_problem_is_the_one_verifier_s_own_when_there_is_one():
    pool, (a,) = pool_of(1)
    a.problem = "the verifier at a is not answering (UNAVAILABLE: x); retry shortly"
    assert pool.problem() == a.problem
    pool.remove(a.address)
    assert "no verifier is known" in pool.problem()
