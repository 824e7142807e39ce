"""One linear layer's cost against the rows it computes: torch's F.linear against the prepacked oneDNN linear.

A large vocabulary's output head is the biggest single matrix of a small model (Qwen2.5's is 151,936 x 1,536,
0.93 GB in float32). This times it alone, random weights, for 1, 2, 4 and 8 rows (a step, and blocks), with the
median of --repeats, so that a verify-cost curve of the whole model can be read against it. The machine may be
shared: quote the figures with that.

    python tools/head_cost.py --out-features 151936 --in-features 1536 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec.modeling.prepacked_linear import PrepackedLinear


def median_ms(layer, rows: int, in_features: int, repeats: int) -> float:
    x = torch.randn(1, rows, in_features)  # [1, rows, in]
    with torch.inference_mode():
        for _ in range(3):
            layer(x)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            layer(x)
            times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-features", type=int, default=151936)
    parser.add_argument("--in-features", type=int, default=1536)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 keeps torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    linear = torch.nn.Linear(args.in_features, args.out_features, bias=False)
    packed = PrepackedLinear(linear)
    print(f"{args.out_features} x {args.in_features} float32, {torch.get_num_threads()} threads")
    for rows in args.rows:
        plain = median_ms(linear, rows, args.in_features, args.repeats)
        prepacked = median_ms(packed, rows, args.in_features, args.repeats)
        print(f"{rows} rows: F.linear {plain:.1f} ms, prepacked {prepacked:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
