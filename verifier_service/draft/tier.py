"""The draft tier: several draft replicas behind one verifier, each tenant on one of them.

--draft names the replicas as specdec.runtime.targets reads a fleet (`A,B` or `dns:///draft:50053`).
Each replica has its own DraftLink (channel, back-off, measured pace) and its own watch
(specdec.runtime.peer_watch: grpc.health.v1, its tokenizer through GetDraftInfo, reconnects, and a failed call's
suspicion), so the tier knows which replicas are live.

Routing (--draft-routing):
- affine (default): a sequence's stream opens on the replica that rendezvous hashing
  (verifier_service.draft.rendezvous) gives its tenant among the live replicas. A suffix draft learns a
  tenant's outputs per replica, so keeping a tenant on one replica keeps its memory in one place, warm,
  and not duplicated. A replica that dies (its health watch, or a stream that fails as if it went away)
  leaves the live set at once: its tenants go to their next replica by the same hash, where they start
  cold; nobody else's tenant moves. Each change of a tenant's replica is counted
  (specdec_draft_tenant_moves). A request without a tenant (auth off) has no memory of its own to keep
  warm: it is hashed by its request id, which spreads such requests over the replicas.
- random: any live replica, drawn per sequence (for comparison: the tenant's memory is spread thin).
A sequence that lost its stream opens a new one on the next round, on the replica routing gives then; the
draft only proposes, so which replica drafts (or none) never changes the output.
With no replica live, a sequence tries the replica the hash gives over all of them, behind that replica's
back-off (one replica behaves as a single --draft always did: back off, then reconnect).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import random
import typing

from specdec.decoding.sampling import SamplingParams
from specdec.runtime import metrics, peer_watch
from specdec.runtime.targets import Targets, parse_targets
from verifier_service.draft import rendezvous
from verifier_service.draft.client import Constrained, DraftIncompatible, DraftLink, DraftSession, DraftUnavailable

log = logging.getLogger(__name__)
ROUTINGS = ("affine", "random")
MAX_PLACED_TENANTS = 100_000  # tenants whose last replica is remembered (to count moves), least recent dropped


def parse_drafts(text: str) -> Targets:
    """--draft -> Targets; ConfigError on one that cannot work."""
    return parse_targets(text, "--draft", "draft:50053")


class DraftWatch(peer_watch.PeerWatch):
    """One replica's usability: answering, SERVING, and with the target's tokenizer (GetDraftInfo)."""

    role = "draft replica"

    def __init__(self, link: DraftLink, period_s: float, on_change):
        super().__init__(link.channel, link.address, period_s, on_change)
        self.link = link

    async def check_peer(self):
        try:
            return None, await self.link.check_compatible()
        except DraftUnavailable as exc:
            return f"the draft replica is not answering ({exc}); retry shortly", None
        except DraftIncompatible as exc:
            return f"the draft replica at {self.address} is incompatible: {exc}", None


class TierWatch(peer_watch.PoolWatch):
    role = "draft replica"
    flag = "--draft"

    def __init__(self, tier: DraftTier, targets: Targets, open_link: typing.Callable[[str], DraftLink],
                 period_s: float):
        super().__init__(tier, targets, period_s, tier.changed)
        self.open_link = open_link

    def member_for(self, address: str) -> DraftLink:
        return self.open_link(address)

    def watch_for(self, link: DraftLink) -> DraftWatch:
        return DraftWatch(link, self.period_s, functools.partial(self.changed, link))


class DraftTier:
    """The draft replicas (members: address -> DraftLink) and which one each sequence's stream opens on."""

    def __init__(self, targets: Targets, open_link: typing.Callable[[str], DraftLink], routing: str = "affine",
                 period_s: float = 5.0):
        if routing not in ROUTINGS:
            raise ValueError(f"routing {routing!r}: one of {', '.join(ROUTINGS)}")
        self.targets = targets
        self.routing = routing
        self.members: dict[str, DraftLink] = {}
        self.placed: collections.OrderedDict[str, str] = collections.OrderedDict()  # tenant -> its last replica
        self.moves = 0
        self.watch = TierWatch(self, targets, open_link, period_s)
        self._watching: asyncio.Task | None = None

    # the pool the watch keeps (specdec.runtime.peer_watch.PoolWatch)
    def add(self, link: DraftLink) -> None:
        self.members[link.address] = link

    def remove(self, address: str) -> DraftLink | None:
        return self.members.pop(address, None)

    async def changed(self) -> None:
        metrics.LIVE_DRAFT_REPLICAS.set(len(self.live()))

    def live(self) -> list[DraftLink]:
        return [link for link in self.members.values() if link.problem is None]

    @property
    def sizes_blocks(self) -> bool:
        """Whether the drafts cut their blocks to their evidence (every replica runs the same method)."""
        return any(link.sizes_blocks for link in self.members.values())

    def pick(self, tenant: str, request_id: str) -> DraftLink | None:
        """The replica for a sequence of `tenant` (request_id: the key of a request without one); None if none is
        known. Counts a tenant move when a tenant's live replica differs from its last one."""
        live = self.live()
        candidates = live or list(self.members.values())
        if not candidates:
            return None
        if self.routing == "random":
            return random.choice(candidates)
        address = rendezvous.owner(tenant or request_id, (link.address for link in candidates))
        if tenant and live:
            self._place(tenant, address)
        return self.members[address]

    def _place(self, tenant: str, address: str) -> None:
        previous = self.placed.get(tenant)
        if previous is not None and previous != address:
            self.moves += 1
            metrics.DRAFT_TENANT_MOVES.inc()
            log.info("tenant %s moves from draft replica %s to %s", tenant, previous, address)
        self.placed[tenant] = address
        self.placed.move_to_end(tenant)
        if len(self.placed) > MAX_PLACED_TENANTS:
            self.placed.popitem(last=False)

    def route(self, session: DraftSession) -> DraftLink | None:
        """Where `session` opens its next stream (DraftSession's router): affine, the tenant's replica now;
        random, the session's replica while it is live, else another drawn."""
        if self.routing == "random" and session.link.problem is None and session.link.address in self.members:
            return session.link
        return self.pick(session.tenant, session.request_id)

    def session(self, request_id: str, sampling: SamplingParams, tenant: str = "",
                constraint: Constrained | None = None) -> DraftSession | None:
        """A handle for one sequence (None while no replica is known: it decodes without speculation)."""
        link = self.pick(tenant, request_id)
        if link is None:
            return None
        return DraftSession(link, request_id, sampling, tenant, constraint, router=self)

    async def start(self, wait_s: float) -> list[DraftLink]:
        """Find the replicas, wait up to wait_s for each to answer with the target's tokenizer (raises
        DraftIncompatible on a mismatch), take the first verdicts and start watching. The replicas that answered."""
        await self.watch.refresh()
        links = list(self.members.values())
        answers = await asyncio.gather(*(link.check_compatible(wait_s) for link in links), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, DraftIncompatible):
                raise answer
        for link, answer in zip(links, answers):
            if isinstance(answer, BaseException):
                log.warning("draft replica %s not reachable yet (%s); sequences go to the others until it is",
                            link.address, answer)
        await self.watch.check_all()
        await self.changed()
        self._watching = asyncio.get_running_loop().create_task(self.watch.run())
        return [link for link, answer in zip(links, answers) if not isinstance(answer, BaseException)]

    async def close(self) -> None:
        if self._watching is not None:
            self._watching.cancel()
        await self.watch.close()
