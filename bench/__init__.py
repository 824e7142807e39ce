"""specdec benchmark: does speculation pay for my workload?

    python -m bench --model DIR [--quick] [--draft-model DIR] [--out bench/results]
    python -m bench.advise --target DIR [--draft DIR] [--method ngram|suffix|model] --prompts FILE

See docs/benchmark.md for what is measured and how.
"""
