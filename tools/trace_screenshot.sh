#!/usr/bin/env bash
# Reproduce docs/trace-screenshot.png: one real request's trace in Arize Phoenix.
#
# Needs: Phoenix running (`make trace-ui`, UI and REST API on :6006, OTLP gRPC on :4317),
# the real model (`make model`) and headless Chromium (`apt-get install chromium`).
# Usage: tools/trace_screenshot.sh [OUT.png]   (default docs/trace-screenshot.png)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/trace-screenshot.png}
PY=.venv/bin/python
PHOENIX=${PHOENIX:-http://localhost:6006}
MODEL=${MODEL:-.cache/models/smollm2-135m-instruct}
export PYTHONPATH=$PWD

curl -sf "$PHOENIX/healthz" >/dev/null || { echo "Phoenix is not answering on $PHOENIX: run 'make trace-ui' first" >&2; exit 1; }

# The stack on free ports, exporting to Phoenix; one chat request; then a graceful stop, which flushes every span.
# openinference.project.name on the resource puts the spans in Phoenix's "specdec" project.
export OTEL_EXPORTER_OTLP_ENDPOINT=${OTEL_EXPORTER_OTLP_ENDPOINT:-http://localhost:4317}
export OTEL_EXPORTER_OTLP_INSECURE=true
export OTEL_RESOURCE_ATTRIBUTES=${OTEL_RESOURCE_ATTRIBUTES:-openinference.project.name=specdec}
"$PY" - "$MODEL" <<'EOF'
import subprocess, sys
from devkit.stack import running_stack

with running_stack(sys.argv[1], method="ngram", verifier_args=["--dtype", "bfloat16"]) as services:
    subprocess.run([sys.executable, "-m", "gateway.cli", "--addr", services["gateway"].address, "--chat",
                    "--max-tokens", "32", "Give two short tips for writing clear Python code."], check=True)
EOF
sleep 2  # let Phoenix ingest the last batch

# The newest trace rooted at the gateway's Generate/GenerateStream span; select the verifier's Decode span.
URL=$("$PY" - "$PHOENIX" <<'EOF'
import json, sys, urllib.request
base = sys.argv[1]
get = lambda path: json.load(urllib.request.urlopen(base + path, timeout=10))
project = next(p for p in get("/v1/projects")["data"] if p["name"] == "specdec")
spans = get("/v1/projects/specdec/spans?limit=1000")["data"]
root = max((s for s in spans if s["parent_id"] is None and s["name"].startswith("/specdec.v1.Gateway/Generate")),
           key=lambda s: s["start_time"])
trace_id = root["context"]["trace_id"]
in_trace = [s for s in spans if s["context"]["trace_id"] == trace_id]
print(f"trace {trace_id}: " + ", ".join(sorted(f'{s["attributes"].get("service.name")} {s["name"]}' for s in in_trace)),
      file=sys.stderr)
selected = next((s for s in in_trace if s["attributes"].get("service.name") == "specdec-verifier"
                 and s["name"].endswith("/Decode")), root)
print(f'{base}/projects/{project["id"]}/traces/{trace_id}?selectedSpanNodeId={selected["id"]}')
EOF
)
echo "trace page: $URL"
chromium --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
  --disable-sync --no-first-run --hide-scrollbars --virtual-time-budget=15000 --window-size=1600,1000 \
  --screenshot="$OUT" "$URL" 2>/dev/null
ls -l "$OUT"
