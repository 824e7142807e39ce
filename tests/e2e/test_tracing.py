"""One request, one trace: the three real processes export to an in-test OTLP receiver.

The receiver is a minimal opentelemetry.proto.collector.trace.v1.TraceService
on a free port; the services find it through the standard OTEL_EXPORTER_OTLP_*
variables, exactly as they would find a collector or Arize Phoenix.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import typing

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from devkit.stack import running_stack
from specdec.v1 import gateway_pb2, gateway_pb2_grpc

pytestmark = pytest.mark.slow

PROMPT = "Tracing canary: the quick brown fox jumps over the lazy dog. The quick brown fox"
SERVER = trace_pb2.Span.SpanKind.SPAN_KIND_SERVER
GATEWAY, VERIFIER, DRAFT = "specdec-gateway", "specdec-verifier", "specdec-draft"


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every exported span in memory, each with its service.name."""

    def __init__(self):
        self.spans: list[tuple[str, trace_pb2.Span]] = []
        self._lock = threading.Lock()
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def Export(self, request, context):  # noqa: N802 (gRPC method name)
        with self._lock:
            for resource_spans in request.resource_spans:
                resource_service = attributes(resource_spans.resource.attributes).get("service.name", "")
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append((attributes(span.attributes).get("service.name", resource_service), span))
        return trace_service_pb2.ExportTraceServiceResponse()

    def snapshot(self) -> list[tuple[str, trace_pb2.Span]]:
        with self._lock:
            return list(self.spans)


def attributes(key_values) -> dict:
    """OTLP KeyValue list -> plain dict."""
    out = {}
    for kv in key_values:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


@pytest.fixture(scope="module")
def receiver():
    recv = OtlpReceiver()
    recv.server.start()
    yield recv
    recv.server.stop(0)


@pytest.fixture(scope="module")
def traced_stack(receiver, tiny_pair, tmp_path_factory):
    """One stack for the module, exporting to the receiver; each test's request has a trace of its own."""
    target, draft = tiny_pair
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    # a generous draft timeout: a block that comes too late (a busy machine) would reopen the draft stream
    with running_stack(target, draft, method="model", env=env, verifier_args=["--draft-timeout-ms", "10000"],
                       log_dir=tmp_path_factory.mktemp("logs")) as services:
        yield services


def settled(receiver: OtlpReceiver, trace_id: bytes, quiet_s: float = 1.0, timeout_s: float = 10.0) -> list:
    """The trace's spans once no new one has arrived for quiet_s (5 export periods): the draft's stream span
    ends when the verifier half-closes it, after the response."""
    deadline = time.monotonic() + timeout_s
    count, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        spans = [(svc, s) for svc, s in receiver.snapshot() if s.trace_id == trace_id]
        if len(spans) != count:
            count, since = len(spans), time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        time.sleep(0.1)
    return spans


@pytest.fixture(scope="module")
def traced(receiver, traced_stack):
    """Run one Generate through the real processes; return (response, spans of its trace, all spans)."""
    with grpc.insecure_channel(traced_stack["gateway"].address) as channel:
        response = gateway_pb2_grpc.GatewayStub(channel).Generate(gateway_pb2.GenerateRequest(
            prompt=PROMPT, max_tokens=24, num_speculative_tokens=4), timeout=60)
    root = wait_for_trace(receiver, timeout_s=15)
    live = wait_for_parents(receiver, root.trace_id, timeout_s=3)
    trace_spans = settled(receiver, root.trace_id)
    return Traced(response, trace_spans, receiver.snapshot(), live)


class Traced(typing.NamedTuple):
    response: gateway_pb2.GenerateResponse
    trace_spans: list  # [(service, span)] of the request's trace, once no more arrive
    all_spans: list  # every span received
    live_trace_spans: list  # the request's trace as it stood while the services were still running


def wait_for_parents(receiver: OtlpReceiver, trace_id: bytes, timeout_s: float) -> list:
    """The trace's spans once every parent has arrived too (or as they are after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = [(svc, s) for svc, s in receiver.snapshot() if s.trace_id == trace_id]
        ids = {s.span_id for _svc, s in spans}
        if all(not s.parent_span_id or s.parent_span_id in ids for _svc, s in spans) or time.monotonic() > deadline:
            return spans
        time.sleep(0.1)


def wait_for_trace(receiver: OtlpReceiver, timeout_s: float) -> trace_pb2.Span:
    """The Generate server span, once its trace also holds the verifier's and the draft's server spans."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = receiver.snapshot()
        roots = [s for svc, s in spans if svc == GATEWAY and s.kind == SERVER and s.name.endswith("/Generate")]
        if roots:
            services = {svc for svc, s in spans if s.trace_id == roots[0].trace_id and s.kind == SERVER}
            if {GATEWAY, VERIFIER, DRAFT} <= services:
                return roots[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no complete trace within {timeout_s} s; got "
                                 f"{sorted({(svc, s.name) for svc, s in spans})}")
        time.sleep(0.1)


def server_spans(trace_spans, service: str, method: str) -> list[trace_pb2.Span]:
    found = [s for svc, s in trace_spans if svc == service and s.kind == SERVER and s.name.endswith(method)]
    assert found, f"no {service} {method} span: {[s.name for _svc, s in trace_spans]}"
    return found


def server_span(trace_spans, service: str, method: str) -> trace_pb2.Span:
    found = server_spans(trace_spans, service, method)
    assert len(found) == 1, f"{service} {method}: {[s.name for _svc, s in trace_spans]}"
    return found[0]


def ancestors(span: trace_pb2.Span, by_id: dict) -> list[bytes]:
    chain = []
    while span.parent_span_id:
        chain.append(span.parent_span_id)
        span = by_id.get(span.parent_span_id)
        if span is None:
            break
    return chain


def test_one_trace_covers_all_three_services(traced):
    response, trace_spans, _all, _live = traced
    assert response.usage.completion_tokens > 0
    assert {svc for svc, _s in trace_spans} >= {GATEWAY, VERIFIER, DRAFT}


def test_parent_chain_runs_gateway_to_verifier_to_draft(traced):
    _response, trace_spans, _all, _live = traced
    by_id = {s.span_id: s for _svc, s in trace_spans}
    gateway = server_span(trace_spans, GATEWAY, "/specdec.v1.Gateway/Generate")
    verifier = server_span(trace_spans, VERIFIER, "/specdec.v1.VerifierService/Decode")
    assert gateway.parent_span_id == b""  # the root
    roots = [s for _svc, s in trace_spans if not s.parent_span_id]
    assert roots == [gateway]
    verifier_chain = ancestors(verifier, by_id)
    assert verifier_chain[-1] == gateway.span_id, "the verifier's span does not reach the gateway's"
    # one Propose stream per sequence (a second one only if the first failed)
    for draft in server_spans(trace_spans, DRAFT, "/specdec.v1.DraftService/Propose"):
        draft_chain = ancestors(draft, by_id)
        assert verifier.span_id in draft_chain, "the draft's span does not reach the verifier's"
        assert draft_chain[-1] == gateway.span_id
    # every span of the trace hangs off a span that arrived (no broken links)
    for _svc, span in trace_spans:
        assert not span.parent_span_id or span.parent_span_id in by_id, span.name


def test_verifier_span_has_a_round_event_per_round(traced):
    response, trace_spans, _all, _live = traced
    verifier = server_span(trace_spans, VERIFIER, "/specdec.v1.VerifierService/Decode")
    rounds = [attributes(e.attributes) for e in verifier.events if e.name == "round"]
    assert len(rounds) == response.speculation.num_rounds > 0
    for event in rounds:
        assert {"k", "accepted", "target_token", "forward_ms", "draft_wait_ms"} <= event.keys()
        assert 0 <= event["accepted"] <= event["k"]
        assert event["forward_ms"] >= 0
    assert sum(e["k"] for e in rounds) == response.speculation.num_draft_tokens
    assert sum(e["accepted"] for e in rounds) == response.speculation.num_accepted_tokens


def test_draft_span_has_a_propose_event_per_block(traced):
    response, trace_spans, _all, _live = traced
    drafts = server_spans(trace_spans, DRAFT, "/specdec.v1.DraftService/Propose")
    blocks = [attributes(e.attributes) for draft in drafts for e in draft.events if e.name == "propose"]
    assert blocks, "the draft's Propose span has no propose events"
    for event in blocks:
        assert {"k", "proposed", "ms"} <= event.keys()
        assert 0 <= event["proposed"] <= event["k"]
    assert sum(e["proposed"] for e in blocks) >= response.speculation.num_draft_tokens


def test_gateway_span_carries_request_attributes_but_not_the_prompt(traced):
    response, trace_spans, all_spans, _live = traced
    gateway = attributes(server_span(trace_spans, GATEWAY, "/specdec.v1.Gateway/Generate").attributes)
    assert gateway["specdec.completion_tokens"] == response.usage.completion_tokens
    assert gateway["specdec.num_draft_tokens"] == response.speculation.num_draft_tokens
    assert "specdec.prompt" not in gateway
    for _svc, span in all_spans:
        blobs = [repr(v) for v in attributes(span.attributes).values()]
        blobs += [repr(v) for e in span.events for v in attributes(e.attributes).values()]
        assert not any("Tracing canary" in b or "lazy dog" in b for b in blobs), span.name


def test_no_health_check_spans(traced):
    _response, _trace_spans, all_spans, _live = traced
    assert all_spans
    assert not [s.name for _svc, s in all_spans if "grpc.health" in s.name]


def test_the_whole_trace_arrives_while_the_services_run(traced):
    """A live UI shows the draft's span under the verifier's, not as a detached root."""
    live = traced.live_trace_spans
    ids = {s.span_id for _svc, s in live}
    missing = [(svc, s.name) for svc, s in live if s.parent_span_id and s.parent_span_id not in ids]
    assert not missing, f"spans whose parent had not arrived while the services ran: {missing}"


# ---------------------------------------------------------------- the HTTP front door

HTTP_PROMPT = "HTTP tracing: def add(a, b):"


@pytest.fixture(scope="module")
def http_traced(receiver, traced_stack):
    """One /v1/completions request through the real processes; (its usage, the spans of its trace)."""
    import openai

    base_url = f"http://127.0.0.1:{traced_stack['gateway'].http_port}/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        model = client.models.list().data[0].id
        completion = client.completions.create(model=model, prompt=HTTP_PROMPT, max_tokens=16, temperature=0,
                                               extra_body={"num_speculative_tokens": 3})
    deadline = time.monotonic() + 15
    while True:
        spans = receiver.snapshot()
        roots = [s for svc, s in spans if svc == GATEWAY and s.kind == SERVER and s.name == "POST /v1/completions"]
        trace_spans = [(svc, s) for svc, s in spans if roots and s.trace_id == roots[0].trace_id]
        if {svc for svc, s in trace_spans if s.kind == SERVER} >= {GATEWAY, VERIFIER, DRAFT}:
            break
        assert time.monotonic() < deadline, f"no complete HTTP trace: {sorted({(svc, s.name) for svc, s in spans})}"
        time.sleep(0.1)
    return completion.usage, wait_for_parents(receiver, roots[0].trace_id, timeout_s=3)


def test_one_http_request_is_one_trace_through_all_three_services(http_traced):
    usage, trace_spans = http_traced
    by_id = {s.span_id: s for _svc, s in trace_spans}
    http = server_span(trace_spans, GATEWAY, "POST /v1/completions")
    assert [s for _svc, s in trace_spans if not s.parent_span_id] == [http]  # the HTTP span is the root
    verifier = server_span(trace_spans, VERIFIER, "/specdec.v1.VerifierService/Decode")
    assert ancestors(verifier, by_id)[-1] == http.span_id
    for draft in server_spans(trace_spans, DRAFT, "/specdec.v1.DraftService/Propose"):
        assert verifier.span_id in ancestors(draft, by_id) and ancestors(draft, by_id)[-1] == http.span_id
    http_attributes = attributes(http.attributes)
    assert http_attributes["specdec.completion_tokens"] == usage.completion_tokens
    assert http_attributes["specdec.prompt_tokens"] == usage.prompt_tokens
    assert http_attributes.get("http.route") == "/v1/completions"
    assert "specdec.prompt" not in http_attributes
    # the ASGI send/receive events stay out of the trace: one span per request at the gateway, plus its gRPC call
    assert {s.name for svc, s in trace_spans if svc == GATEWAY} == {"POST /v1/completions",
                                                                   "/specdec.v1.VerifierService/Decode"}
