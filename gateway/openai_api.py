"""The OpenAI-compatible HTTP API: a second front door over gateway.generation, beside the gRPC one.

    POST /v1/chat/completions   the chat template comes from the tokenizer
    POST /v1/completions        one prompt: text or token ids
    GET  /v1/models             the one served model
    GET  /health                200 while the verifier is usable, 503 with the reason otherwise (open, for probes):
                                the verdict gRPC health reports too (gateway/verifier_watch.py)
    GET  /openapi.json          the API's schema; needs the key when --api-keys is set (/docs and /redoc are off)

Every error is OpenAI's error object with the right status, whatever failed.

Streams are server-sent events (sse-starlette) ending in `data: [DONE]`. A
client that disconnects cancels its generation, which cancels the verifier's
Decode call and frees the sequence, also while the prompt is still in prefill.
The OpenTelemetry ASGI instrumentation makes each request a trace, joined to
the gRPC spans by the verifier channel's interceptors.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import time
import typing

import grpc
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException

from gateway.auth import presented_key
from gateway.body_limit import JSON_BYTES_PER_CHAR, OVERHEAD_BYTES, BodyLimit
from gateway.body_parse import BodyShape, max_values_for
from gateway.generation import Generation, GenerationError, Piece
from gateway.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    Reply,
    completion_prompt,
    default_max_tokens,
    error_from_grpc,
    error_from_validation,
    generate_request,
    unsupported,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ServedModel:
    """The model the API serves, as the verifier reports it: the gateway updates it when the verifier reports
    another name or context (gateway/__main__.py), and every response reads it then."""

    name: str
    max_context: int


def create_app(generation: Generation, model: ServedModel, api_keys: list[str]) -> FastAPI:
    keys = [key.encode() for key in api_keys]
    app = FastAPI(title="specdec gateway: OpenAI-compatible API", docs_url=None, redoc_url=None,
                  openapi_url=None if keys else "/openapi.json")  # with keys: the route below, behind the key
    limits_ = generation.limits
    # The middleware added last runs first: the body is bounded in bytes (BodyLimit) before its shape is walked.
    app.add_middleware(BodyShape, offload=generation.offload, max_values=max_values_for(limits_.prompt_tokens))
    app.add_middleware(BodyLimit, max_bytes=limits_.prompt_chars * JSON_BYTES_PER_CHAR + OVERHEAD_BYTES,
                       why=f"{limits_.prompt_limit_words()} and a token is at most {limits_.max_token_chars} "
                           "characters:")
    started = int(time.time())

    def authorized(request: Request) -> None:
        presented = presented_key(request.headers.items()).encode()
        if keys and not any(hmac.compare_digest(presented, key) for key in keys):
            raise OpenAIError(401, "missing or wrong API key: send `Authorization: Bearer <key>`",
                              code="invalid_api_key")

    @app.exception_handler(OpenAIError)
    async def openai_error(_request, exc: OpenAIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_request, exc: RequestValidationError):
        return error_response(error_from_validation(list(exc.errors())))

    @app.exception_handler(HTTPException)
    async def http_error(_request, exc: HTTPException):
        return error_response(OpenAIError(exc.status_code, str(exc.detail)), exc.headers)  # 405 keeps its Allow

    @app.exception_handler(Exception)
    async def unexpected(_request, exc: Exception):
        # a defect of this server, not of the request: logged with its traceback (by uvicorn), answered as OpenAI does
        return error_response(OpenAIError(500, f"internal error ({type(exc).__name__}); please report it"))

    if keys:
        @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(authorized)])
        async def openapi():
            return app.openapi()

    @app.get("/health")
    async def health():
        """The gateway's one verdict, which its gRPC health also reports: no probe of its own that could differ."""
        if generation.verifier_problem:
            raise OpenAIError(503, generation.verifier_problem, code="service_unavailable")
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models():
        return {"object": "list", "data": [{"id": model.name, "object": "model", "created": started,
                                            "owned_by": "specdec", "max_model_len": model.max_context}]}

    def reply(body, chat: bool) -> Reply:
        return Reply(chat, model.name, body.return_token_ids, body.include_usage(), body.num_speculative_tokens)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        check_body(body, model)
        prompt = await render_chat(generation, body)
        return await serve(generation, body, prompt, reply(body, chat=True), request)

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(body: CompletionRequest, request: Request):
        check_body(body, model)
        return await serve(generation, body, completion_prompt(body), reply(body, chat=False), request)

    FastAPIInstrumentor.instrument_app(app, excluded_urls="health", exclude_spans=["receive", "send"])
    return app


def check_body(body, model: ServedModel) -> None:
    problem = unsupported(body)
    if problem is not None:
        raise problem
    if body.model is not None and body.model != model.name:
        raise OpenAIError(404, f"the model {body.model!r} does not exist; this server serves {model.name!r} "
                               "(GET /v1/models)", "model", "model_not_found")


async def render_chat(generation: Generation, body: ChatCompletionRequest) -> str:
    """The conversation as prompt text, through the tokenizer's chat template (off the event loop)."""
    tokenizer = generation.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise OpenAIError(400, "the model's tokenizer has no chat template; use /v1/completions with a prompt",
                          "messages")
    messages = [{"role": message.role, "content": message.text(), **({"name": message.name} if message.name else {})}
                for message in body.messages]  # `name` as vLLM passes it: most templates ignore it
    too_long = generation.limits.messages_size_problem([message["content"] for message in messages])
    if too_long:
        raise OpenAIError(400, too_long, "messages")
    try:
        return await generation.offload.run(lambda: tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False))
    except Exception as exc:  # jinja2 raises TemplateError for conversations the template refuses
        raise OpenAIError(400, f"the chat template refused the messages: {exc}", "messages") from exc


async def serve(generation: Generation, body, prompt, reply: Reply, request: Request):
    try:
        decode = await generation.prepare(generate_request(body, prompt), presented_key(request.headers.items()),
                                          default_max_tokens(body))
        pieces = generation.run(decode)
        if not body.stream:
            return await until_disconnected(request, whole(pieces, reply, list(decode.prompt_token_ids)))
        # Before the 200, so that a refusal (429, 503) still gets its status; the prefill may take long, and a
        # client that leaves meanwhile ends the verifier's call now, not at the first token.
        first = await until_disconnected(request, anext(pieces, None))
        if first is None:
            raise GenerationError(grpc.StatusCode.UNAVAILABLE, "the verifier ended the stream early; retry")
    except GenerationError as exc:
        raise error_from_grpc(exc.code, exc.message, reply.chat) from None
    return EventSourceResponse(events(pieces, first, reply, list(decode.prompt_token_ids)), sep="\n")


def error_response(error: OpenAIError, headers: typing.Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers={**(headers or {}), **error.headers()})


async def whole(pieces: typing.AsyncIterator[Piece], reply: Reply, prompt_ids: list[int]) -> JSONResponse:
    text, token_ids, final = "", [], None
    async with contextlib.aclosing(pieces):
        async for piece in pieces:
            text += piece.text
            token_ids += piece.token_ids
            final = piece.final or final
    if final is None:
        raise GenerationError(grpc.StatusCode.UNAVAILABLE, "the verifier ended the stream early; retry")
    return JSONResponse(reply.full(text, token_ids, final, prompt_ids))


async def events(pieces, first: Piece, reply: Reply, prompt_ids: list[int]) -> typing.AsyncIterator[str]:
    """SSE data: one chunk per piece, then the usage chunk if asked, then [DONE]; an error after the 200 as an event."""
    async with contextlib.aclosing(pieces):
        yield json.dumps(reply.chunk(first.text, first.token_ids, first.final, prompt_ids))
        final = first.final
        try:
            async for piece in pieces:
                if piece.text or piece.token_ids or piece.final is not None:
                    yield json.dumps(reply.chunk(piece.text, piece.token_ids, piece.final))
                final = piece.final or final
        except GenerationError as exc:
            yield json.dumps(error_from_grpc(exc.code, exc.message, reply.chat).body())
        else:
            if reply.include_usage and final is not None:
                yield json.dumps(reply.usage_chunk(final))
    yield "[DONE]"


async def until_disconnected(request: Request, work: typing.Coroutine):
    """Await `work`, cancelling it if the client disconnects first (then the response goes nowhere)."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()  # closes the pieces, which cancels the verifier's Decode call
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise OpenAIError(499, "the client disconnected", code="cancelled")
    return task.result()
