"""Generate and GenerateStream through real processes: statistics add up, streams reassemble."""

import grpc
import pytest

from specdec.v1 import common_pb2, gateway_pb2

pytestmark = pytest.mark.slow


def check_stats_add_up(response, num_tokens=None):
    stats, usage = response.speculation, response.usage
    assert stats.num_accepted_tokens <= stats.num_draft_tokens
    assert sum(stats.accepted_per_position) == stats.num_accepted_tokens
    # each round emits its accepted drafts plus one target token; only a stop inside the last round cuts it short
    if response.finish_reason == common_pb2.FINISH_REASON_LENGTH:
        assert usage.completion_tokens == stats.num_accepted_tokens + stats.num_rounds
    else:
        assert usage.completion_tokens <= stats.num_accepted_tokens + stats.num_rounds
    assert usage.completion_tokens == (len(response.token_ids) if num_tokens is None else num_tokens)
    if stats.num_drafts:
        assert stats.mean_accepted_length == pytest.approx(1 + stats.num_accepted_tokens / stats.num_drafts)
        assert stats.acceptance_rate == pytest.approx(stats.num_accepted_tokens / stats.num_draft_tokens)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_generate_statistics_add_up(stack, temperature):
    _method, _services, gateway = stack
    response = gateway.Generate(gateway_pb2.GenerateRequest(
        prompt="The quick brown fox jumps over the lazy dog. The quick", max_tokens=30, temperature=temperature,
        seed=3, num_speculative_tokens=4))
    assert response.finish_reason in (common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_STOP)
    assert response.usage.prompt_tokens > 0
    check_stats_add_up(response)


def test_stream_reassembles_to_the_unary_response(stack):
    _method, _services, gateway = stack
    request = gateway_pb2.GenerateRequest(prompt="Hello, café 東京", max_tokens=30, num_speculative_tokens=4)
    unary = gateway.Generate(request)
    pieces = list(gateway.GenerateStream(request))
    assert [p.finish_reason for p in pieces[:-1]] == [0] * (len(pieces) - 1)
    assert pieces[-1].finish_reason == unary.finish_reason
    assert [t for p in pieces for t in p.token_ids] == list(unary.token_ids)
    assert "".join(p.text for p in pieces) == unary.text
    check_stats_add_up(pieces[-1], num_tokens=len(unary.token_ids))


def test_speculation_off_drafts_nothing(stack):
    _method, _services, gateway = stack
    response = gateway.Generate(gateway_pb2.GenerateRequest(prompt="Hello", max_tokens=10, num_speculative_tokens=0))
    assert response.speculation.num_draft_tokens == 0
    assert response.speculation.num_rounds == response.usage.completion_tokens == 10


def test_seed_makes_sampling_reproducible(stack):
    """With an explicit k, as the seed's contract says (an adaptive k follows server-wide state: docs/reliability.md)."""
    _method, _services, gateway = stack
    request = gateway_pb2.GenerateRequest(prompt="Hello", max_tokens=20, temperature=1.0, seed=42,
                                          num_speculative_tokens=4)
    assert gateway.Generate(request).token_ids == gateway.Generate(request).token_ids


def test_stop_string_ends_generation_and_is_cut_from_the_text(stack):
    _method, _services, gateway = stack
    free = gateway.Generate(gateway_pb2.GenerateRequest(prompt="Hello", max_tokens=30, num_speculative_tokens=4))
    text = free.text
    stop = next((text[i:i + 2] for i in range(3, len(text) - 2) if "\ufffd" not in text[i:i + 2]
                 and text[i:i + 2].strip()), None)
    if stop is None:
        pytest.skip("the tiny model produced no usable stop string")
    cut = gateway.Generate(gateway_pb2.GenerateRequest(prompt="Hello", max_tokens=30, num_speculative_tokens=4,
                                                       stop=[stop]))
    assert cut.finish_reason == common_pb2.FINISH_REASON_STOP and cut.matched_stop == stop
    assert cut.text == text[: text.find(stop)]
    assert list(cut.token_ids) == list(free.token_ids[: len(cut.token_ids)])
    streamed = "".join(p.text for p in gateway.GenerateStream(gateway_pb2.GenerateRequest(
        prompt="Hello", max_tokens=30, num_speculative_tokens=4, stop=[stop])))
    assert streamed == cut.text


def test_max_tokens_inside_a_block_emits_nothing_past_it(stack):
    _method, _services, gateway = stack
    for max_tokens in (1, 2, 3, 5):
        response = gateway.Generate(gateway_pb2.GenerateRequest(prompt="The quick brown", max_tokens=max_tokens,
                                                                num_speculative_tokens=8))
        assert len(response.token_ids) <= max_tokens
        if response.finish_reason == common_pb2.FINISH_REASON_LENGTH:
            assert len(response.token_ids) == max_tokens


BAD_REQUESTS = {
    "prompt": gateway_pb2.GenerateRequest(prompt=""),
    "prompt or prompt_token_ids": gateway_pb2.GenerateRequest(),
    "prompt_token_ids": gateway_pb2.GenerateRequest(prompt_token_ids=gateway_pb2.TokenIds(ids=[1, 10_000_000])),
    "prompt_token_ids ": gateway_pb2.GenerateRequest(prompt_token_ids=gateway_pb2.TokenIds(ids=[-1])),
    "temperature": gateway_pb2.GenerateRequest(prompt="hi", temperature=-1.0),
    "temperature ": gateway_pb2.GenerateRequest(prompt="hi", temperature=float("nan")),
    "temperature  ": gateway_pb2.GenerateRequest(prompt="hi", temperature=float("inf")),
    "top_p": gateway_pb2.GenerateRequest(prompt="hi", temperature=1.0, top_p=0.0),
    "top_p ": gateway_pb2.GenerateRequest(prompt="hi", temperature=1.0, top_p=1.5),
    "top_k": gateway_pb2.GenerateRequest(prompt="hi", top_k=-3),
    "max_tokens": gateway_pb2.GenerateRequest(prompt="hi", max_tokens=1_000_000),
    "stop": gateway_pb2.GenerateRequest(prompt="hi", stop=[""]),
    "stop ": gateway_pb2.GenerateRequest(prompt="hi", stop=["x"] * 100),
    "num_speculative_tokens": gateway_pb2.GenerateRequest(prompt="hi", num_speculative_tokens=1000),
}


@pytest.mark.parametrize("field", BAD_REQUESTS)
def test_bad_input_is_invalid_argument_naming_the_field(stack, field):
    _method, _services, gateway = stack
    with pytest.raises(grpc.RpcError) as raised:
        gateway.Generate(BAD_REQUESTS[field], timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field.strip() in raised.value.details()
    # and the service keeps serving
    assert gateway.Generate(gateway_pb2.GenerateRequest(prompt="ok", max_tokens=2), timeout=30).usage.completion_tokens
