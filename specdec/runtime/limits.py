"""Boundary checks shared by the gateway and the verifier. Each returns problems that name the field."""

from __future__ import annotations

import re

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_PROMPT_CHARS = 1_000_000
MAX_TENANT_LENGTH = 128
MAX_REQUEST_ID_LENGTH = 128
# A draft keeps at most this many tokens per sequence when neither the caller (StartSequence.max_context: the
# target's context) nor its own model sets a limit (n-gram, suffix).
MAX_DRAFT_SEQUENCE_TOKENS = 1 << 17
# A structured-outputs constraint's text (schema, regex, grammar, choices) above this is refused before compiling:
# compile time and memory grow with it, and no real schema comes close.
MAX_CONSTRAINT_BYTES = 64 * 1024
# What a request carries besides its prompt, at most: stop strings (UTF-8), a constraint, sampling fields, ids,
# framing.
REQUEST_OVERHEAD_BYTES = MAX_STOP_STRINGS * (MAX_STOP_LENGTH * 4 + 8) + MAX_CONSTRAINT_BYTES + 64 * 1024
TOKEN_ID_BYTES = 5  # the longest varint of an int32 id
# Characters that break a log line or fake a new one: C0 and C1 controls (newline, CR, ESC...), U+2028, U+2029.
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def text_problems(text: str, field: str, max_length: int) -> list[str]:
    """A client's string that may reach a log (request_id, tenant): bounded, and no control characters."""
    if len(text) > max_length:
        return [f"{field} must be at most {max_length} characters"]
    bad = CONTROL_CHARACTERS.search(text)
    if bad:
        return [f"{field} must not contain control characters (found U+{ord(bad.group()):04X})"]
    return []


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



def constraint_size(constraint) -> int:
    """The bytes of a common_pb2.Constraint's text: its schema, regex or grammar, or its choices together."""
    kind = constraint.WhichOneof("kind")
    if kind == "choice":
        return sum(len(v.encode()) for v in constraint.choice.values)
    if kind in (None, "json_object"):
        return 0
    return len(getattr(constraint, kind).encode())


def constraint_problems(constraint, field: str = "constraint") -> list[str]:
    """A constraint too large to compile, named by its kind (the cheap check: before any compile)."""
    size = constraint_size(constraint)
    if size > MAX_CONSTRAINT_BYTES:
        kind = constraint.WhichOneof("kind")
        return [f"{field}.{kind} is {size:,} bytes, over the limit of {MAX_CONSTRAINT_BYTES} bytes (structured "
                "outputs compile time grows with it; no real schema comes close)"]
    return []
