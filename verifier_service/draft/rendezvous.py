"""Rendezvous (highest-random-weight) hashing: which replica a key (a tenant) belongs to.

Every (key, replica) pair gets a pseudo-random weight; the key belongs to the replica with the highest
weight among those offered. Two properties follow, and the draft tier relies on both:
- stable: the same key over the same replicas always gets the same one, in any process, in any order the
  replicas are listed (the weight is a keyed hash, not Python's per-process `hash`);
- minimal movement: when a replica leaves, only the keys it owned move, each to its own next-highest
  replica (spread over the rest, not piled on one); when one joins, it takes only the keys it now wins.
"""

from __future__ import annotations

import hashlib
import typing


def weight(key: str, replica: str) -> int:
    """The pair's weight: 64 bits of BLAKE2b over both (separated, so ("ab", "c") and ("a", "bc") differ)."""
    digest = hashlib.blake2b(f"{len(key)}:{key}|{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranked(key: str, replicas: typing.Iterable[str]) -> list[str]:
    """The replicas in the key's order of preference: its owner first, then where it moves if that one leaves."""
    return sorted(set(replicas), key=lambda replica: (weight(key, replica), replica), reverse=True)


def owner(key: str, replicas: typing.Iterable[str]) -> str | None:
    """The replica the key belongs to; None when there is none."""
    return max(set(replicas), key=lambda replica: (weight(key, replica), replica), default=None)
