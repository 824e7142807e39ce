"""OpenTelemetry set-up shared by the three services.

Tracing is always wired (so context propagates through every hop), and spans
are exported over OTLP only when the standard OTEL_EXPORTER_OTLP_ENDPOINT (or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) variable is set; with the standard
OTEL_TRACES_EXPORTER=console they are also written to standard error, one JSON
object per span (a round's events with no collector at hand). W3C traceparent travels in
gRPC metadata through the official gRPC instrumentation's interceptors. Health
checks are kept out of traces.
"""

from __future__ import annotations

import logging
import os
import sys

from opentelemetry import trace
from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor, filters
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

log = logging.getLogger(__name__)

NOT_HEALTH = filters.negate(filters.health_check())
SPAN_QUEUE_SIZE = 16384  # the default 2048 dropped spans under load


class ServiceNameOnSpans(SpanProcessor):
    """Copy service.name onto every span: some UIs (Arize Phoenix) drop resource attributes."""

    def __init__(self, service_name: str):
        self._attributes = {"service.name": service_name, "openinference.project.name": "specdec"}

    def on_start(self, span, parent_context=None):
        span.set_attributes(self._attributes)


def setup_tracing(default_service_name: str) -> TracerProvider:
    """Install the global tracer provider for this process and return it."""
    service_name = os.environ.get("OTEL_SERVICE_NAME", default_service_name)
    # Phoenix groups traces by openinference.project.name, read from the resource.
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name,
                                                        "openinference.project.name": "specdec"}))
    provider.add_span_processor(ServiceNameOnSpans(service_name))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), max_queue_size=SPAN_QUEUE_SIZE))
        log.info("exporting traces over OTLP to %s", os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                 or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    if "console" in os.environ.get("OTEL_TRACES_EXPORTER", "").split(","):
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
            out=sys.stderr, formatter=lambda span: span.to_json(indent=None) + "\n")))
    trace.set_tracer_provider(provider)
    return provider


def server_interceptors() -> list:
    return [aio_server_interceptor(filter_=NOT_HEALTH)]


def client_interceptors() -> list:
    return aio_client_interceptors(filter_=NOT_HEALTH)


def tracer(name: str):
    return trace.get_tracer(name)
