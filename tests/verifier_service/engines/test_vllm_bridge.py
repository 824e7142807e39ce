"""StepDrafter bookkeeping: what vLLM's step emitted becomes the round statistics, row by row."""

import asyncio

import pytest
from opentelemetry import context as otel_context

from specdec.runtime.config import ServerConfig
from specdec.decoding.sampling import SamplingParams
from specdec.v1 import common_pb2
from verifier_service.engines.decode_loop import DecodeSpec
from verifier_service.draft.client import DraftLink
from verifier_service.speculation.request import RequestSpeculation
from verifier_service.speculation.policy import SpeculationPolicy
from verifier_service.engines.vllm_bridge import StepDrafter, StepRows, StepSequence


@pytest.fixture
def link_and_bridge():
    """A draft link (to nowhere) and a bridge, on an event loop of their own."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # the gRPC channel binds to it
    link = DraftLink("127.0.0.1:1", ServerConfig(), common_pb2.ModelInfo(vocab_size=10), timeout_s=0.2)
    yield link, StepDrafter(loop, max_context=64, timeout_s=0.2)
    loop.run_until_complete(link.close())
    asyncio.set_event_loop(None)
    loop.close()


def sequence(link, prompt):
    spec = DecodeSpec("r", prompt, SamplingParams(temperature=1.0), 16, [], 4)
    speculation = RequestSpeculation(SpeculationPolicy(4, 16, 4), link.session("r", SamplingParams()))
    return StepSequence(spec, speculation, otel_context.get_current())


def test_rows_record_accepted_tokens_and_skip_prefill_and_foreign_rows(link_and_bridge):
    link, bridge = link_and_bridge
    ours, prefilling = sequence(link, [1, 2, 3]), sequence(link, [4, 5])
    bridge.add("a", ours)
    bridge.add("b", prefilling)
    ours.fallback = ""
    # the step verified 3 drafts for row "a"; "b" prefilled; "c" is not ours
    rows = StepRows(["a", "b", "c"], [[7, 8], [], [9]], [3, 0, 0], step_tokens=4 + 2 + 1)
    blocks = bridge.propose(rows, lambda request_id: [0] * 5, max_k=0)
    assert blocks == [[], [], []]  # k = 0: nothing asked of the draft
    stats = ours.speculation.stats
    assert (stats.num_rounds, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 1)
    assert stats.accepted_per_position == [1, 0, 0]
    assert ours.speculation.draft.synced == 1  # the draft holds the accepted token too
    assert prefilling.speculation.stats.num_rounds == 0  # still prefilling: nothing emitted yet
    bridge.remove("a")
    assert "a" not in bridge.sequences


def test_a_fallback_step_counts_in_the_request_and_in_prometheus(link_and_bridge):
    from specdec.runtime import metrics

    link, bridge = link_and_bridge
    ours = sequence(link, [1, 2, 3])
    bridge.add("a", ours)
    ours.fallback, ours.draft_wait_s = "timeout", 0.25
    before = metrics.FALLBACK_ROUNDS.labels(reason="timeout")._value.get()
    waits = metrics.DRAFT_WAIT_TIME._sum.get()
    bridge.propose(StepRows(["a"], [[7]], [0], 1), lambda request_id: [0] * 4, max_k=0)
    assert ours.speculation.stats.num_fallback_rounds == 1
    assert metrics.FALLBACK_ROUNDS.labels(reason="timeout")._value.get() == before + 1
    assert metrics.DRAFT_WAIT_TIME._sum.get() >= waits + 0.25


def test_an_engine_that_takes_no_q_gets_greedy_drafts():
    """vLLM's custom proposers pass no q, so the draft must propose greedily (one-hot q is then exact)."""
    from verifier_service.config import VerifierConfig
    from verifier_service.server import VerifierServicer
    from verifier_service.engines.vllm_engine import VllmEngine

    class NoQEngine:
        name, vocab_size, max_context = "test", 10, 64
        takes_draft_probs = VllmEngine.takes_draft_probs

    async def scenario():
        link = DraftLink("127.0.0.1:1", ServerConfig(), common_pb2.ModelInfo(vocab_size=10), timeout_s=0.2)
        servicer = VerifierServicer(NoQEngine(), None, common_pb2.ModelInfo(), VerifierConfig(), link)
        spec = DecodeSpec("r", [1, 2], SamplingParams(temperature=0.8, top_p=0.9), 8, [], None)
        speculation = servicer._speculation(spec)
        assert speculation.draft.sampling.greedy and not spec.sampling.greedy
        await link.close()

    asyncio.run(scenario())


def test_decode_only_steps_teach_the_step_cost_and_shared_steps_stay_out_of_round_times(link_and_bridge):
    link, bridge = link_and_bridge
    a, b = sequence(link, [1, 2, 3]), sequence(link, [4, 5])
    bridge.add("a", a)
    bridge.add("b", b)
    context = {"a": [0] * 5, "b": [0] * 3}.get
    # the step verified row a's 2 draft tokens: 1 + 2 + 1 tokens computed
    bridge.propose(StepRows(["a", "b"], [[7, 8], [9]], [2, 0], step_tokens=4), context, max_k=0)
    bridge.step_done(0.2)
    assert bridge.step_cost.sums[:3] == [1.0, 4, 0.2]  # one step: 4 tokens in 200 ms
    bridge.propose(StepRows(["a", "b"], [[7], [9]], [0, 0], step_tokens=40), context, max_k=0)  # a prefill rode along
    bridge.step_done(0.9)
    assert bridge.step_cost.sums[:3] == [1.0, 4, 0.2]  # not observed
    assert a.speculation.policy.cost.seconds == {}  # both steps were the batch's, not row a's round time
    bridge.remove("b")
    bridge.propose(StepRows(["a"], [[7]], [0], step_tokens=1), context, max_k=0)
    assert 0 in a.speculation.policy.cost.seconds  # alone in its step: its own round time


def test_a_row_that_finished_in_the_step_is_recorded_and_not_drafted_for(link_and_bridge):
    link, bridge = link_and_bridge
    ours = sequence(link, [1, 2, 3])
    bridge.add("a", ours)
    blocks = bridge.propose(StepRows(["a"], [[7, 8, 9]], [2], step_tokens=3), lambda request_id: None, max_k=4)
    assert blocks == [[]]
    stats = ours.speculation.stats
    assert (stats.num_rounds, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 2, 2)
    assert ours.speculation.draft.stream is None  # nothing was asked of the draft
