"""gateway.generation: what preparing one request may cost before any decoding (issue 32, defect 4); a request
whose verifier goes away resumes on another (issue 35)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider

from devkit.testing import build_tokenizer
from gateway.config import GatewayConfig
from gateway.generation import Generation, GenerationError
from gateway.prompt_tokens import PIECE_CHARS
from gateway.validation import ModelLimits
from gateway.verifier_pool import Verifier, VerifierPool
from specdec.decoding.stopping import STOP, StopChecker
from specdec.runtime import metrics
from specdec.v1 import common_pb2, gateway_pb2, verifier_pb2, verifier_pb2_grpc


class DenseTokenizer:
    """Three tokens per character, as random CJK text is for byte-level BPE; records what it is given."""

    def __init__(self):
        self.seen: list[int] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.seen.append(len(text))
        return [5] * (3 * len(text))


def test_a_prompt_that_tokenizes_far_past_the_context_is_refused_without_tokenizing_it_whole():
    tokenizer = DenseTokenizer()
    limits = ModelLimits(vocab_size=100, max_context=2048, max_token_chars=64)  # passes 131,072 characters
    generation = Generation(tokenizer, None, limits, GatewayConfig())
    prompt = "字" * 120_000  # under the character bound: 360,000 tokens, 175 times the context
    assert limits.prompt_size_problem(gateway_pb2.GenerateRequest(prompt=prompt)) is None
    with pytest.raises(GenerationError) as raised:
        asyncio.run(generation.prompt_ids(gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=4)))
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.message.startswith("prompt has more than 2048 tokens")
    assert "the model's context is 2048 tokens" in raised.value.message
    assert max(tokenizer.seen) <= PIECE_CHARS, "the whole prompt was tokenized"


def test_a_prompt_that_fits_is_tokenized_whole():
    tokenizer = DenseTokenizer()
    generation = Generation(tokenizer, None, ModelLimits(vocab_size=100, max_context=64), GatewayConfig())
    ids = asyncio.run(generation.prompt_ids(gateway_pb2.GenerateRequest(prompt="abc")))
    assert ids == [5] * 9 and tokenizer.seen == [3]


# ---------------------------------------------------------------- resuming on another verifier


TEXT = "The quick brown fox jumps over the lazy dog. def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


class Scripted(verifier_pb2_grpc.VerifierServiceServicer):
    """A deterministic verifier: it continues PROMPT + any prefix of `truth` with the rest of `truth`, one token
    per message, ending at stop strings and max_tokens as the real one does (StopChecker over its own completion).
    With `die_after` it goes away (UNAVAILABLE, as a killed process reads) after sending that many tokens; with
    `refuse`, it ends every call at once with that status."""

    def __init__(self, tokenizer, prompt: list[int], truth: list[int], die_after: int | None = None,
                 refuse: tuple[grpc.StatusCode, str] | None = None):
        self.tokenizer, self.prompt, self.truth, self.die_after, self.refuse = tokenizer, prompt, truth, die_after, refuse
        self.requests: list[verifier_pb2.DecodeRequest] = []

    async def Decode(self, request, context):  # noqa: N802 (gRPC method name)
        self.requests.append(request)
        if self.refuse:
            await context.abort(*self.refuse)
        prompt = list(request.prompt_token_ids)
        assert prompt[:len(self.prompt)] == self.prompt and prompt[len(self.prompt):] == \
            self.truth[:len(prompt) - len(self.prompt)], "not a prefix of the one true output"
        stopper = StopChecker([], request.max_tokens, list(request.stop), self.tokenizer, prompt)
        for sent, token in enumerate(self.truth[len(prompt) - len(self.prompt):]):
            if self.die_after is not None and sent >= self.die_after:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
            checked = stopper.check([token])
            message = verifier_pb2.DecodeResponse(token_ids=checked.kept)
            if checked.finish_reason:
                message.finish_reason = (common_pb2.FINISH_REASON_STOP if checked.finish_reason == STOP
                                         else common_pb2.FINISH_REASON_LENGTH)
                message.matched_stop = checked.matched_stop
                message.usage.CopyFrom(common_pb2.Usage(prompt_tokens=len(prompt), completion_tokens=sent + 1))
                yield message
                return
            yield message
        raise AssertionError("max_tokens past the scripted output")


async def run_on(tokenizer, verifiers: list[Scripted], decode: verifier_pb2.DecodeRequest, **config):
    """Generation over a pool of the scripted verifiers (in this process); returns (pieces, error or None)."""
    servers, pool = [], VerifierPool()
    for servicer in verifiers:
        server = grpc.aio.server()
        verifier_pb2_grpc.add_VerifierServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        pool.add(Verifier(f"127.0.0.1:{port}", grpc.aio.insecure_channel(f"127.0.0.1:{port}")))
    generation = Generation(tokenizer, pool, ModelLimits(len(tokenizer), 512), GatewayConfig(**config))
    pieces, error = [], None
    try:
        async for piece in generation.run(decode):
            pieces.append(piece)
    except GenerationError as exc:
        error = exc
    finally:
        for verifier in pool.members.values():
            await verifier.channel.close()
        for server in servers:
            await server.stop(None)
    return pieces, error


def setup(tokenizer, max_tokens: int = 20, **fields):
    prompt = tokenizer.encode("Hello", add_special_tokens=False)
    truth = tokenizer.encode(TEXT, add_special_tokens=False)
    decode = verifier_pb2.DecodeRequest(request_id="r1", prompt_token_ids=prompt, max_tokens=max_tokens,
                                        sampling=common_pb2.SamplingParams(temperature=0.7, seed=5), tenant="t",
                                        **fields)
    return prompt, truth, decode


def resumes(code: str = "UNAVAILABLE") -> float:
    return metrics.RESUMES.labels(code=code)._value.get()


def test_a_request_whose_verifier_dies_goes_on_on_another_with_no_token_lost_or_repeated(tokenizer):
    prompt, truth, decode = setup(tokenizer)
    dying, other = Scripted(tokenizer, prompt, truth, die_after=7), Scripted(tokenizer, prompt, truth)
    before = resumes()
    with TracerProvider().get_tracer("test").start_as_current_span("request") as span:
        pieces, error = asyncio.run(run_on(tokenizer, [dying, other], decode))
    assert error is None
    (event,) = [e for e in span.events if e.name == "specdec.resume"]
    assert event.attributes["specdec.tokens_emitted"] == 7 and event.attributes["specdec.code"] == "UNAVAILABLE"
    assert [t for p in pieces for t in p.token_ids] == truth[:20]
    assert "".join(p.text for p in pieces) == tokenizer.decode(truth[:20])
    final = pieces[-1].final
    assert final.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (len(prompt), 20)  # the whole request
    assert resumes() == before + 1
    assert len(dying.requests) == 1 and len(other.requests) == 1  # an idle pool's first pick is its first member
    first, again = dying.requests + other.requests
    assert list(again.prompt_token_ids) == prompt + truth[:7] and again.max_tokens == 13
    for field in ("request_id", "sampling", "tenant", "stop"):
        assert getattr(again, field) == getattr(first, field)


def test_a_stop_string_across_the_resume_still_ends_the_output(tokenizer):
    prompt, truth, decode = setup(tokenizer, max_tokens=30)
    text = tokenizer.decode(truth[:6])
    stop = text[-2:] + tokenizer.decode(truth[6:8])[:2]  # two characters each side of the cut after token 6
    decode.stop.append(stop)
    dying, other = Scripted(tokenizer, prompt, truth, die_after=6), Scripted(tokenizer, prompt, truth)
    pieces, error = asyncio.run(run_on(tokenizer, [dying, other], decode))
    assert error is None and len(other.requests) == 1  # the second one did not see the match: the gateway did
    whole = tokenizer.decode(truth)
    assert "".join(p.text for p in pieces) == whole[:whole.find(stop)]
    assert pieces[-1].final.finish_reason == common_pb2.FINISH_REASON_STOP
    assert pieces[-1].final.matched_stop == stop
    assert len([t for p in pieces for t in p.token_ids]) <= 8  # nothing past the token that completed it


def test_a_refusal_is_not_resumed(tokenizer):
    prompt, truth, decode = setup(tokenizer)
    refusing = Scripted(tokenizer, prompt, truth, refuse=(grpc.StatusCode.INVALID_ARGUMENT, "max_tokens too big"))
    other = Scripted(tokenizer, prompt, truth)
    pieces, error = asyncio.run(run_on(tokenizer, [refusing, other], decode))  # the first member is picked first
    assert len(refusing.requests) == 1
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and error.message == "max_tokens too big"
    assert not other.requests


def test_resumes_are_bounded(tokenizer):
    prompt, truth, decode = setup(tokenizer)
    dying = [Scripted(tokenizer, prompt, truth, die_after=3) for _ in range(3)]
    pieces, error = asyncio.run(run_on(tokenizer, dying, decode, max_resumes=1))
    assert error.code == grpc.StatusCode.UNAVAILABLE and "after 1 resumes" in error.message
    assert [t for p in pieces for t in p.token_ids] == truth[:6]  # what was sent stays sent
    assert sum(len(v.requests) for v in dying) == 2


def test_with_no_other_verifier_the_request_fails_as_unavailable(tokenizer):
    prompt, truth, decode = setup(tokenizer)
    pieces, error = asyncio.run(run_on(tokenizer, [Scripted(tokenizer, prompt, truth, die_after=3)], decode))
    assert error.code == grpc.StatusCode.UNAVAILABLE and "no other verifier is usable" in error.message


def test_a_constrained_request_resumes_only_before_its_first_token(tokenizer):
    prompt, truth, decode = setup(tokenizer, constraint=common_pb2.Constraint(regex="[a-z ]+"))
    pieces, error = asyncio.run(run_on(
        tokenizer, [Scripted(tokenizer, prompt, truth, die_after=3), Scripted(tokenizer, prompt, truth, die_after=3)],
        decode))
    assert error.code == grpc.StatusCode.UNAVAILABLE
    dead, other = Scripted(tokenizer, prompt, truth, die_after=0), Scripted(tokenizer, prompt, truth)
    pieces, error = asyncio.run(run_on(tokenizer, [dead, other], decode))  # dies before any token: moves whole
    assert error is None and len(dead.requests) == 1 and list(other.requests[0].prompt_token_ids) == prompt
    assert [t for p in pieces for t in p.token_ids] == truth[:20]
