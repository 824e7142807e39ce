"""Refuse an HTTP request body whose JSON holds more values, or nests deeper, than any request that fits.

The web framework parses a body and validates it on the event loop, in C and Rust code that keeps the
interpreter lock until it is done, so one body of many small values (a chat of a quarter of a million
one-character messages) would stall every other request and the health checks for seconds. This ASGI
middleware first walks the body on a worker thread (gateway.prompt_tokens.Offload) with Python's own JSON
scanner, which yields the lock between values, counting values and nesting as it goes; it stops at the first
value past the bound. Only a body within the bounds reaches the framework, whose parse of it is then short.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner

from gateway.body_limit import replaying
from gateway.openai_protocol import OpenAIError
from gateway.prompt_tokens import Offload
from specdec.runtime.limits import MAX_CONSTRAINT_BYTES

# Our request bodies nest four deep (body, messages, a message, its content parts); this leaves room for
# fields that are refused later by name (response_format, logit_bias...).
MAX_DEPTH = 16
# Values (strings, numbers, objects, arrays) a fitting request can need per prompt token: one per token id,
# three per chat message, which renders to at least one token; and a margin for the other fields and a
# structured-outputs schema of up to MAX_CONSTRAINT_BYTES (a JSON value takes 2 bytes at least: "0,").
VALUES_PER_TOKEN = 4
VALUES_MARGIN = 1024 + MAX_CONSTRAINT_BYTES // 2


class BodyTooComplex(ValueError):
    """The body holds more values, or nests deeper, than a request that fits; `status` is the HTTP answer."""

    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def max_values_for(prompt_tokens: int) -> int:
    """The most JSON values a request whose prompt has at most `prompt_tokens` tokens can need."""
    return VALUES_PER_TOKEN * prompt_tokens + VALUES_MARGIN


class _CountingScanner:
    """The attributes json.scanner.py_make_scanner reads from a decoder, with counting parsers."""

    def __init__(self, max_values: int, max_depth: int):
        self.max_values, self.max_depth = max_values, max_depth
        self.values = self.depth = 0
        self.strict = True
        self.object_hook = self.object_pairs_hook = None
        self.memo: dict = {}
        self.parse_int = self.counted(int)
        self.parse_float = self.counted(float)
        self.parse_constant = json.decoder._CONSTANTS.__getitem__  # NaN, Infinity, -Infinity
        self.parse_string = self.counted(json.decoder.scanstring)  # the C scanner for one string: linear
        self.parse_object = self.container(json.decoder.JSONObject)
        self.parse_array = self.container(json.decoder.JSONArray)
        self.scan_once = json.scanner.py_make_scanner(self)

    def count(self, n: int = 1) -> None:
        self.values += n
        if self.values > self.max_values:
            raise BodyTooComplex(413, f"the request body holds more than {self.max_values:,} JSON values, more "
                                      "than any request that fits the model's context", "body_too_large")

    def counted(self, parse):
        def parse_counted(*args):
            self.count()
            return parse(*args)
        return parse_counted

    def container(self, parse):
        def parse_container(*args):
            self.count()
            self.depth += 1
            if self.depth > self.max_depth:
                raise BodyTooComplex(400, f"the request body nests deeper than {self.max_depth} levels",
                                     "body_too_deep")
            try:
                value, end = parse(*args)
            finally:
                self.depth -= 1
            if len(value) > self.max_values:  # members that are true, false or null are not counted one by one
                self.count(len(value))
            # Only the shape is wanted: drop the value, so that no container outlives its parse (a walk that kept
            # them would also set off the garbage collector's full passes, which hold the interpreter lock).
            return None, end
        return parse_container


def check_shape(body: bytes, max_values: int, max_depth: int = MAX_DEPTH) -> None:
    """Walk the JSON `body`; raise BodyTooComplex at the first value past the bounds. A body that is not
    JSON passes: the framework refuses it, and within these bounds that costs it little."""
    try:
        text = body.decode(json.detect_encoding(body))
        scanner = _CountingScanner(max_values, max_depth)
        scanner.scan_once(text, json.decoder.WHITESPACE.match(text, 0).end())
    except BodyTooComplex:
        raise
    except (StopIteration, ValueError, RecursionError):
        return


class BodyShape:
    """ASGI middleware: a POST body past the bounds is answered with an OpenAI error object, unparsed."""

    def __init__(self, app, offload: Offload, max_values: int, max_depth: int = MAX_DEPTH):
        self.app, self.offload, self.max_values, self.max_depth = app, offload, max_values, max_depth

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        if body["body"]:
            try:
                await self.offload.run(check_shape, body["body"], self.max_values, self.max_depth)
            except BodyTooComplex as exc:
                return await send_error(send, OpenAIError(exc.status, exc.message, code=exc.code))

        await self.app(scope, replaying(body, receive), send)


async def send_error(send, error: OpenAIError) -> None:
    """Answer with OpenAI's error object and close the connection (the rest of the body is not wanted)."""
    payload = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})
