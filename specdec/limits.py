"""Boundary checks shared by the gateway and the verifier. Each returns problems that name the field."""

from __future__ import annotations

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_PROMPT_CHARS = 1_000_000
# A proposer with no context limit of its own (n-gram) keeps at most this many tokens per sequence.
MAX_DRAFT_SEQUENCE_TOKENS = 1 << 20


def prompt_ids_problems(ids: list[int], vocab_size: int, field: str) -> list[str]:
    if not ids:
        return [f"{field} must not be empty"]
    return token_ids_problems(ids, vocab_size, field)


def token_ids_problems(ids: list[int], vocab_size: int, field: str) -> list[str]:
    bad = [t for t in ids if t < 0 or t >= vocab_size]
    if bad:
        return [f"{field} has {len(bad)} ids outside the vocabulary [0, {vocab_size}), e.g. {bad[:5]}"]
    return []


def stop_problems(stop: list[str], field: str) -> list[str]:
    if len(stop) > MAX_STOP_STRINGS:
        return [f"{field} has {len(stop)} strings; at most {MAX_STOP_STRINGS} are allowed"]
    if any(not s for s in stop):
        return [f"{field} must not contain empty strings"]
    if any(len(s) > MAX_STOP_LENGTH for s in stop):
        return [f"{field} strings must be at most {MAX_STOP_LENGTH} characters"]
    return []

