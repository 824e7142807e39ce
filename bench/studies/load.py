"""Capacity under load, measured with a standard tool through the OpenAI-compatible HTTP API.

    python -m bench load --model .cache/models/smollm2-135m-instruct        # make bench-load
    python -m bench load --model DIR --rates 0.25,0.5,1,2 --num-prompts 32 --spec-max-concurrency 4
    python -m bench load --model DIR --rates 2,4,8,32 --num-prompts 48 --repeats 2   # past the crossover

Starts the stack once (n-gram draft, the chosen verifier engine; the gateway's
HTTP port), writes the shipped workloads (bench/workloads/, chat-formatted) as
one dataset file in vLLM's ShareGPT format (its "custom" JSONL loader needs
pandas, which .venv-vllm does not have), and drives POST /v1/completions with vLLM's serving
benchmark (`vllm bench serve`, from .venv-vllm: bench/load_vllm.py) at each
request rate (Poisson arrivals, the same prompts and arrival times for every
mode), in each mode:

    off       num_speculative_tokens=0 on every request
    fixed     num_speculative_tokens=K on every request: speculation with no policy
    adaptive  the server's default: the adaptive policy (and --spec-max-concurrency when given)

All requests are greedy. Reports TTFT, inter-token latency (ITL: between
streamed chunks, and a chunk holds all the tokens a round accepted), time per
output token (TPOT: the per-token speed a user sees) and output tokens/s, and what the verifier did
for each point (its /metrics before and after: drafted rounds, draft and accepted tokens, rounds
decoded without speculation by reason, e.g. "load" above --spec-max-concurrency).
Speculation pays while it lowers TPOT; the crossover is the request rate at
which fixed-k speculation's median TPOT meets speculation off's (log-rate
interpolation), and the adaptive policy is then compared with off above it.
Writes bench/results/load/<name>.json and <name>.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import statistics
import subprocess
import tempfile

from bench.core.methods import add_stack_options, stack_kwargs
from bench.core.workloads import load_workload
from bench.studies.load_vllm import COUNTERS, GAUGES
from devkit.stack import REPO_ROOT

MODES = ("off", "fixed", "adaptive")
DEFAULT_WORKLOADS = "copy_heavy,structured,chat,creative"
# (result key, label) of what is plotted and tabulated per rate and mode
METRICS = [("median_ttft_ms", "TTFT, median (ms)"), ("median_tpot_ms", "time per output token, median (ms)"),
           ("median_itl_ms", "inter-token latency, median (ms)"), ("output_throughput", "output tokens/s")]
CROSSOVER_METRIC = "median_tpot_ms"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_stack_options(parser, repeats=1, max_tokens=64)
    parser.add_argument("--rates", default="0.125,0.25,0.5,1,2", help="request rates to sweep, requests/s")
    parser.add_argument("--num-prompts", type=int, default=24, help="requests per rate and mode")
    parser.add_argument("--modes", default=",".join(MODES), help=f"a subset of {','.join(MODES)}")
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=4, help="k of the fixed mode")
    parser.add_argument("--spec-max-concurrency", type=int, default=0,
                        help="passed to the verifier: speculation off while more sequences are live (0: no cap)")
    parser.add_argument("--workloads", default=DEFAULT_WORKLOADS, help="comma-separated bench/workloads names")
    parser.add_argument("--name", default="", help="results name (default: <engine>-<model dir name>)")
    parser.add_argument("--results-dir", default="bench/results/load")
    return parser


def write_dataset(path: pathlib.Path, workloads: list[str]) -> int:
    """The workloads' prompts as a ShareGPT-format dataset (the prompt is the first turn). Returns the count."""
    prompts = [p for name in workloads for p in load_workload(name)]
    path.write_text(json.dumps([{"id": f"{p.workload}/{p.id}", "conversations": [
        {"from": "human", "value": p.text}, {"from": "gpt", "value": ""}]} for p in prompts]))
    return len(prompts)


def mode_body(mode: str, k: int) -> dict:
    return {"off": {"num_speculative_tokens": 0}, "fixed": {"num_speculative_tokens": k}, "adaptive": {}}[mode]


def bench_argv(args, http_port: int, dataset: pathlib.Path, rate: float, mode: str) -> list[str]:
    """`vllm bench serve` flags for one point of the sweep."""
    argv = ["--backend", "openai", "--endpoint", "/v1/completions", "--base-url", f"http://127.0.0.1:{http_port}",
            "--model", str(args.model), "--tokenizer", str(args.model),
            # the prompts are chat-formatted already; every request asks for --max-tokens tokens
            "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--sharegpt-output-len", str(args.max_tokens),
            "--num-prompts", str(args.num_prompts), "--request-rate", str(rate), "--seed", "0",
            "--temperature", "0", "--num-warmups", "1", "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99"]
    body = mode_body(mode, args.num_speculative_tokens)
    return argv + (["--extra-body", json.dumps(body)] if body else [])


def run_sweep(args, modes: list[str], rates: list[float], workdir: pathlib.Path) -> list[dict]:
    """Start the stack, run vLLM's benchmark for every (rate, mode); the points with vLLM's results."""
    from devkit.stack import running_stack

    dataset = workdir / "workloads.json"
    count = write_dataset(dataset, args.workloads.split(","))
    print(f"dataset: {count} prompts from {args.workloads} -> {dataset}")
    kwargs = stack_kwargs(args, ["--spec-max-concurrency", str(args.spec_max_concurrency)])
    with running_stack(args.model, log_dir=workdir, **kwargs) as services:
        http_port = services["gateway"].http_port
        # the same order of modes at every rate (or repeat) would favour one: alternate it
        sweep = [{"mode": mode, "rate": rate, "repeat": repeat, "metrics_port": services["verifier"].metrics_port,
                  "argv": bench_argv(args, http_port, dataset, rate, mode)}
                 for repeat in range(args.repeats) for i, rate in enumerate(rates)
                 for mode in (modes if (i + repeat) % 2 == 0 else modes[::-1])]
        sweep_path, results_path = workdir / "sweep.json", workdir / "results.json"
        sweep_path.write_text(json.dumps(sweep))
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "VLLM_CACHE_ROOT": str(REPO_ROOT / ".cache" / "vllm")}
        subprocess.run([args.vllm_python, "-m", "bench.studies.load_vllm", str(sweep_path), str(results_path)],
                       cwd=REPO_ROOT, env=env, check=True)
    return json.loads(results_path.read_text())


SUMMED = ["completed", "failed", "total_output_tokens"]
MEDIAN_OF_REPEATS = ["duration", "request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms",
                     "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms",
                     "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms"]


def summarize(points: list[dict]) -> list[dict]:
    """One row per (rate, mode): counts summed over the repeats, every other metric their median; the
    per-repeat values of the plotted metrics under "by_repeat"."""
    groups: dict[tuple[float, str], list[dict]] = {}
    for point in points:
        groups.setdefault((point["rate"], point["mode"]), []).append(point)
    rows = []
    for (rate, mode), repeats in groups.items():
        results = [p["result"] for p in repeats]
        row = {"rate": rate, "mode": mode, "repeats": len(results)}
        row.update({k: sum(r.get(k) or 0 for r in results) for k in SUMMED})
        for k in MEDIAN_OF_REPEATS:
            values = [r[k] for r in results if r.get(k) is not None]
            row[k] = statistics.median(values) if values else None
        row["by_repeat"] = {k: [r.get(k) for r in results] for k, _label in METRICS}
        row["verifier"] = verifier_totals([p.get("verifier") for p in repeats])
        rows.append(row)
    return sorted(rows, key=lambda r: (r["rate"], MODES.index(r["mode"])))


def verifier_totals(changes: list[dict | None]) -> dict | None:
    """The verifier's counters summed over a point's repeats (None when they were not scraped), and its gauges
    (the engine step's fitted cost line) as each repeat left them."""
    if not changes or any(c is None for c in changes):
        return None
    total = {key: sum(c[key] for c in changes) for key in COUNTERS.values()}
    total.update({key: [c.get(key) for c in changes] for key in GAUGES.values() if any(key in c for c in changes)})
    total["fallback_rounds"] = {}
    for change in changes:
        for reason, n in change["fallback_rounds"].items():
            total["fallback_rounds"][reason] = total["fallback_rounds"].get(reason, 0) + n
    return total


def by_mode(rows: list[dict], mode: str, key: str) -> dict[float, float]:
    return {r["rate"]: r[key] for r in rows if r["mode"] == mode and r[key] is not None}


def crossover(rows: list[dict], spec_mode: str, key: str = CROSSOVER_METRIC) -> dict:
    """Where spec_mode's latency meets off's: ratio off/spec falls through 1 (interpolated in log rate)."""
    off, spec = by_mode(rows, "off", key), by_mode(rows, spec_mode, key)
    rates = sorted(set(off) & set(spec))
    ratios = {rate: off[rate] / spec[rate] for rate in rates if spec[rate] > 0}
    found = {"metric": key, "speculation": spec_mode, "off_over_on": {str(r): round(v, 3) for r, v in ratios.items()},
             "rate": None}
    paying = [rate for rate in rates if ratios.get(rate, 0) >= 1]
    if not paying:
        found["note"] = "speculation did not pay at any swept rate"
        return found
    for low, high in zip(rates, rates[1:]):
        if ratios[low] >= 1 > ratios[high]:
            t = (ratios[low] - 1) / (ratios[low] - ratios[high])
            found["rate"] = round(2 ** (math.log2(low) + t * (math.log2(high) - math.log2(low))), 4)
            found["between"] = [low, high]
            return found
    found["note"] = "no swept rate at which speculation stopped paying after it paid: the crossover is above the range"
    return found


def policy_above(rows: list[dict], rate: float | None) -> list[dict]:
    """The adaptive policy against off at each swept rate above the crossover (all rates when there is none)."""
    out = []
    for key in (CROSSOVER_METRIC, "output_throughput"):
        off, adaptive = by_mode(rows, "off", key), by_mode(rows, "adaptive", key)
        for r in sorted(set(off) & set(adaptive)):
            if (rate is None or r > rate) and off[r]:
                out.append({"rate": r, "metric": key, "adaptive_over_off": round(adaptive[r] / off[r], 3)})
    return out


def plot(rows: list[dict], cross: dict, title: str, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, (key, label) in zip(axes.flat, METRICS):
        for mode in MODES:
            values = by_mode(rows, mode, key)
            if values:
                line, = ax.plot(list(values), list(values.values()), marker="o", label=mode)
                spread = [(r["rate"], v) for r in rows if r["mode"] == mode and r.get("by_repeat")
                          for v in r["by_repeat"][key] if v is not None and r["repeats"] > 1]
                if spread:  # each repeat, faint, around the median
                    ax.scatter(*zip(*spread), color=line.get_color(), alpha=0.3, s=12)
        if cross.get("rate"):
            ax.axvline(cross["rate"], color="grey", linestyle="--", label=f"crossover {cross['rate']:.3g} req/s")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["rate"] for r in rows}))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_xlabel("request rate (requests/s)")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    from bench.core.machine import machine_info

    args = build_parser().parse_args(argv)
    modes = [m for m in MODES if m in args.modes.split(",")]
    if "off" not in modes or len(modes) < 2:
        raise SystemExit("--modes needs off and at least one of fixed, adaptive")
    rates = sorted(float(r) for r in args.rates.split(","))
    name = args.name or f"{args.engine}-{pathlib.Path(args.model).name}"
    out_dir = pathlib.Path(args.results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-load-") as workdir:
        points = run_sweep(args, modes, rates, pathlib.Path(workdir))
    rows = summarize(points)
    cross = crossover(rows, "fixed" if "fixed" in modes else "adaptive")
    result = {
        "what": "vllm bench serve (vllm.benchmarks.serve) against the gateway's /v1/completions, per request rate: "
                "speculation off, fixed k, adaptive policy",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "setup": {"model": pathlib.Path(args.model).name, "engine": args.engine, "dtype": args.dtype,
                  "draft": "ngram", "workloads": args.workloads, "num_prompts_per_point": args.num_prompts,
                  "repeats": args.repeats,
                  "max_tokens": args.max_tokens, "k_fixed": args.num_speculative_tokens,
                  "spec_max_concurrency": args.spec_max_concurrency, "temperature": 0, "rates": rates,
                  "modes": modes, "machine": machine_info(args.threads, "PASSIVE")},
        "crossover": cross,
        "adaptive_vs_off_above_crossover": policy_above(rows, cross.get("rate")) if "adaptive" in modes else [],
        "rows": rows,
    }
    json_path, png_path = out_dir / f"{name}.json", out_dir / f"{name}.png"
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    labels = {"off": "speculation off", "fixed": f"fixed k={args.num_speculative_tokens}", "adaptive": "adaptive"}
    plot(rows, cross, f"{name} via vllm bench serve: {' / '.join(labels[m] for m in modes)}, "
                      f"{args.num_prompts} requests per point, greedy"
                      + (f", median of {args.repeats} sweeps" if args.repeats > 1 else ""), png_path)
    for row in rows:
        print(f"{row['rate']:>7g} req/s {row['mode']:>8}: TTFT {row['median_ttft_ms'] or 0:8.1f} ms, "
              f"TPOT {row['median_tpot_ms'] or 0:7.1f} ms, ITL {row['median_itl_ms'] or 0:7.1f} ms, "
              f"{row['output_throughput'] or 0:7.1f} tok/s ({row['completed']} ok, {row['failed']} failed)"
              + (f"; tok/s by repeat {[round(v or 0, 1) for v in row['by_repeat']['output_throughput']]}"
                 if row["repeats"] > 1 else "")
              + (f"; verifier: {row['verifier']['drafts']:g} drafted rounds, fallback rounds "
                 f"{ {k: int(v) for k, v in row['verifier']['fallback_rounds'].items()} }" if row["verifier"] else ""))
    print(f"crossover ({cross['metric']}): {cross.get('rate') or cross.get('note')}; wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
