"""Tracing set-up: the console exporter writes each span as one JSON line on standard error."""

import json
import os
import subprocess
import sys

SCRIPT = """
from specdec.runtime.telemetry import setup_tracing
provider = setup_tracing("specdec-test")
with provider.get_tracer("t").start_as_current_span("verify") as span:
    span.add_event("round", {"k": 4, "accepted": 3})
print("done")
"""


def run(env_extra: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)


def test_console_exporter_writes_a_span_a_line_with_its_events():
    result = run({"OTEL_TRACES_EXPORTER": "console"})
    assert result.returncode == 0, result.stderr
    spans = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert [s["name"] for s in spans] == ["verify"]
    assert spans[0]["events"][0]["attributes"] == {"k": 4, "accepted": 3}
    assert spans[0]["resource"]["attributes"]["service.name"] == "specdec-test"
    assert result.stdout.strip() == "done"  # spans never go to standard output


def test_without_the_variable_nothing_is_written():
    result = run({})
    assert result.returncode == 0, result.stderr
    assert not [line for line in result.stderr.splitlines() if line.startswith("{")]
