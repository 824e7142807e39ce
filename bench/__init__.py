"""specdec benchmark: does speculation pay for my workload?

    python -m bench speedup --model DIR [--quick] [--draft-model DIR] [--out bench/results]
    python -m bench advise --target DIR [--draft DIR] [--method ngram|suffix|model] --prompts FILE
    python -m bench --help      (every study)

Layout: core/ (machine info, methods, workloads, the speedup model, reports), replay/ (offline replays of
recorded outputs: the replay loop, the policy simulator, the advisor), studies/ (one module per study).
See docs/benchmark.md for what is measured and how.
"""

# study name -> (module with main(argv), one line for --help)
STUDIES = {
    "speedup": ("bench.studies.speedup", "does speculation pay? every method on every workload through the stack"),
    "advise": ("bench.replay.advise", "which draft and k pay for your prompts, from one plain run and the speedup model"),
    "verify-cost": ("bench.studies.verify_cost", "the target's verify-cost curve t(n)/t(1) on this machine"),
    "pipeline": ("bench.studies.pipeline", "pipelined vs serial drafting behind an injected round trip"),
    "efficiency": ("bench.studies.efficiency", "measured speedup against the speedup model over alpha and k, with the "
                                               "replay draft (a set acceptance)"),
    "load": ("bench.studies.load", "capacity under load over HTTP: TTFT, ITL, tok/s per request rate"),
    "concurrency": ("bench.studies.concurrency", "speedup against the number of concurrent streams"),
    "context": ("bench.studies.context", "speedup against the prompt length"),
    "policy-sim": ("bench.replay.policy_sim", "replay the k policy on recorded outputs and a verify-cost curve"),
    "suffix-cost": ("bench.studies.suffix_cost", "the suffix draft's cost per proposal (and arctic-inference's)"),
    "claims": ("bench.studies.claims", "the talk's claims on a draft and target of one family: temperature, prompt "
                                       "length, memory"),
    "suffix-soak": ("bench.studies.suffix_soak", "the suffix cache's memory over a long run of requests"),
    "grammar-cost": ("bench.studies.grammar_cost", "a constrained round's grammar work (matcher walk, mask, "
                                                   "rollback) against the target's forward"),
}
