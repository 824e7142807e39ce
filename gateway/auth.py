"""Optional API-key auth: `authorization: Bearer KEY` (or `x-api-key: KEY`) on every Gateway call.

Health checks and reflection stay open, so probes work. Keys are compared in
constant time and never logged.
"""

from __future__ import annotations

import hashlib
import hmac

import grpc

from specdec.runtime.grpc_server import ConfigError
from specdec.runtime.interceptors import refusing

OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")
REFUSED = "missing or wrong API key: send `authorization: Bearer <key>`"


def parse_keys(text: str) -> list[str]:
    """The comma-separated keys of --api-keys. Empty text turns auth off; text that names no key is refused
    (`" , "` must not silently mean "auth off")."""
    keys = [key.strip() for key in text.split(",") if key.strip()]
    if text.strip() and not keys:
        raise ConfigError(f"--api-keys {text!r} names no key: give comma-separated keys, or leave it empty to turn "
                          "authentication off")
    return keys


def presented_key(metadata) -> str:
    for key, value in metadata or ():
        if key == "authorization" and value.lower().startswith("bearer "):
            return value[7:].strip()
        if key == "x-api-key":
            return value.strip()
    return ""


def tenant_of(key: str) -> str:
    """The opaque tenant id of an API key, for per-tenant state downstream (the suffix draft's cache).
    A hash, so the key itself never leaves the gateway."""
    return hashlib.sha256(b"specdec-tenant:" + key.encode()).hexdigest()[:16] if key else ""


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, keys: list[str]):
        self._keys = [key.encode() for key in keys]

    def _allowed(self, key: str) -> bool:
        candidate = key.encode()
        return any(hmac.compare_digest(candidate, known) for known in self._keys)

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(OPEN_PREFIXES) or self._allowed(presented_key(handler_call_details.invocation_metadata)):
            return await continuation(handler_call_details)
        return refusing(await continuation(handler_call_details), grpc.StatusCode.UNAUTHENTICATED, REFUSED)
