"""Does pipelined drafting hide the network between the verifier and the draft? (issue 14)

    python -m bench pipeline --model .cache/models/smollm2-135m-instruct --dtype float32    # make bench-pipeline
    python -m bench pipeline --model DIR --delays 0 --concurrency 8 --name ngram-8-streams
    python -m bench pipeline --model DIR --method model --draft-model DIR --pin-cores --delays 0,20

One draft service behind bench.core.latency_proxy (its one-way delay set for each step of the sweep), and two
verifiers that reach the draft through the proxy: one drafting serially (--draft-ahead false), one
pipelined (the default). The bench calls the verifiers' Decode directly (greedy, the server's adaptive k,
the workloads' chat-formatted prompts, in the same order) at each round-trip delay:

    off        speculation off (k = 0), on the serial verifier
    serial     the adaptive policy, no drafting ahead: a round waits for its block (draft + round trip), or, for a
               far draft, decodes a plain step meanwhile (--far-draft auto, the default: "stepped")
    pipelined  the same, and a round whose outcome the draft guessed finds its block already there
    waited     (--compare-wait) pipelined with --far-draft wait: every round without a block waits for it

Per (delay, workload, mode): tokens/s (completion tokens over request wall time, summed over prompts and
--repeats; the modes take turns on each prompt (on each batch with --concurrency > 1), so a slow spell of
the machine falls on all of them), speedup against off, the paired speedup (the geometric mean over turns of
a mode's tokens/s over off's in the same turn on the same verifier process, with a bootstrap 90% interval:
the machine's drift between turns, up to 2x on a shared host, taken out; off runs on both verifiers, and
the row `off@pipelined` is the two processes' own difference), mean round time (wall time / rounds), hit rate (rounds served by a
block drafted ahead / rounds with a draft block), the no-wait rate (those and the blocks asked during a plain
step, over rounds with a draft block), stepped rounds, acceptance, and rounds that fell back to plain decoding.
Off never reaches the draft, so the round trip cannot change it: its runs at every delay are one
measurement, pooled per workload and verifier process, and every pooled speedup of a workload is against
that baseline on the mode's own process (each delay's own off row is kept beside it, to show the
machine's drift).
--concurrency N sends N requests at a time (aggregate tokens/s). --pin-cores puts the verifiers on core 0
and the draft on core 1 (taskset), one thread each. Writes bench/results/pipeline/<name>.json and .png.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import datetime
import json
import math
import pathlib
import random
import tempfile
import time

import grpc

from bench.core.latency_proxy import LatencyProxy
from bench.core.workloads import load_workload
from draft_service.config import MODEL_METHODS
from specdec.runtime.config import ModelConfig, choices, model_dir, optional_model_dir
from devkit.stack import Service, scrape_metrics, wait_serving
from specdec.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc

# Each verifier is its own process, and two processes running the same forwards can differ by a few percent
# for the whole run (memory placement, which core their threads settle on). Off runs on both, and each mode is
# paired with off on its own process; "off@pipelined" over "off" is that process difference.
RUNS = {"off": ("serial", 0), "serial": ("serial", None), "pipelined": ("pipelined", None),
        "off@pipelined": ("pipelined", 0)}  # run -> (verifier, k: 0 off, None the adaptive policy)
BASELINE = {"off": "off", "serial": "off", "pipelined": "off@pipelined", "off@pipelined": "off"}
# --compare-wait: a third verifier, pipelined with --far-draft wait (every round waits for its block, the behaviour
# before a far draft could be asked during a plain step), paired with off on its own process
WAIT_RUNS = {"waited": ("waited", None), "off@waited": ("waited", 0)}
WAIT_BASELINE = {"waited": "off@waited", "off@waited": "off"}
VERIFIERS = {"serial": ["--draft-ahead", "false"], "pipelined": ["--draft-ahead", "true"],
             "waited": ["--draft-ahead", "true", "--far-draft", "wait"]}


def runs_of(args) -> dict[str, tuple[str, int | None]]:
    return {**RUNS, **WAIT_RUNS} if getattr(args, "compare_wait", False) else RUNS


def baseline_of(args) -> dict[str, str]:
    return {**BASELINE, **WAIT_BASELINE} if getattr(args, "compare_wait", False) else BASELINE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=model_dir, help="target model directory")
    parser.add_argument("--method", default="ngram", choices=["ngram", "suffix", "model", "hybrid"])
    parser.add_argument("--draft-model", default="", type=optional_model_dir,
                        help="the draft LM for --method model or hybrid (default: --model)")
    parser.add_argument("--dtype", default="float32", choices=choices(ModelConfig, "dtype"))
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each verifier")
    parser.add_argument("--delays", default="0,5,20", help="round trips to sweep, ms (the proxy adds half each way)")
    parser.add_argument("--workloads", default="copy_heavy,extraction")
    parser.add_argument("--prompts-per-workload", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=64, help="cap on every prompt's max_tokens")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each (delay, workload, mode), interleaved")
    parser.add_argument("--compare-wait", action="store_true",
                        help="also a pipelined verifier whose rounds always wait for their block (--far-draft wait)")
    parser.add_argument("--pin-cores", action="store_true", help="verifiers on core 0, draft on core 1 (taskset)")
    parser.add_argument("--name", default="", help="results name (default: <method>-c<concurrency>)")
    parser.add_argument("--results-dir", default="bench/results/pipeline")
    return parser


@contextlib.contextmanager
def split_stack(args, log_dir: pathlib.Path):
    """(proxy, {"serial": verifier address, "pipelined": verifier address}) over one draft behind the proxy."""
    env = {"OMP_WAIT_POLICY": "PASSIVE"}
    draft_model = args.draft_model or args.model
    pin = (lambda core: ["taskset", "-c", str(core)]) if args.pin_cores else (lambda core: [])
    threads = "1" if args.pin_cores else str(args.threads)
    services = []
    try:
        draft_args = ["--model", draft_model if args.method in MODEL_METHODS else args.model, "--method", args.method]
        if args.method in MODEL_METHODS:  # a model draft drafts ahead only when told (--propose-ahead)
            draft_args += ["--dtype", args.dtype, "--propose-ahead", "always"]
        services.append(Service("draft_service", draft_args, {**env, "OMP_NUM_THREADS": threads}, log_dir,
                                launcher=pin(1)))
        wait_serving(services[0].address, 300, services[0].process)
        with LatencyProxy(services[0].address) as proxy:
            verifiers = {}  # mode -> the verifier's Service
            for mode in sorted({verifier for verifier, _k in runs_of(args).values()}):
                service = Service("verifier_service", [
                    "--model", args.model, "--dtype", args.dtype, "--threads", threads, "--draft", proxy.address,
                    *VERIFIERS[mode], "--draft-timeout-ms", "2000"], env, log_dir, launcher=pin(0))
                services.append(service)
                verifiers[mode] = service
            for service in services[1:]:
                wait_serving(service.address, 300, service.process)
            yield proxy, verifiers
    finally:
        for service in services:
            service.stop()


def prompts(args, tokenizer) -> dict[str, list[tuple[list[int], int]]]:
    """Per workload: (prompt ids, max_tokens) of its first --prompts-per-workload prompts."""
    out = {}
    for name in args.workloads.split(","):
        chosen = load_workload(name)[: args.prompts_per_workload]
        out[name] = [(tokenizer.encode(p.text, add_special_tokens=False), min(p.max_tokens, args.max_tokens))
                     for p in chosen]
    return out


def decode(address: str, ids: list[int], max_tokens: int, k: int | None, tenant: str = "") -> dict:
    request = verifier_pb2.DecodeRequest(request_id="bench", prompt_token_ids=ids, max_tokens=max_tokens,
                                         sampling=common_pb2.SamplingParams(), tenant=tenant)
    if k is not None:
        request.num_speculative_tokens = k
    with grpc.insecure_channel(address) as channel:
        started = time.perf_counter()
        last = None
        for last in verifier_pb2_grpc.VerifierServiceStub(channel).Decode(request, timeout=600):
            pass
        seconds = time.perf_counter() - started
    stats = last.speculation
    return {"seconds": seconds, "tokens": last.usage.completion_tokens, "rounds": stats.num_rounds,
            "drafts": stats.num_drafts, "draft_tokens": stats.num_draft_tokens,
            "accepted": stats.num_accepted_tokens, "fallback": stats.num_fallback_rounds,
            "ahead_used": stats.num_ahead_used, "ahead_discarded": stats.num_ahead_discarded,
            "stepped": stats.num_stepped_rounds, "prefetched_used": stats.num_prefetched_used}


def fallback_reasons(verifier) -> collections.Counter:
    """The verifier's plain rounds so far, by why the round had no block (its /metrics)."""
    return collections.Counter({dict(labels)["reason"]: value for (name, labels), value
                                in scrape_metrics(verifier.metrics_port).items()
                                if name == "specdec_fallback_rounds_total"})


def run_mode(verifier, batch: list[tuple[list[int], int]], k: int | None, concurrency: int, tenant: str = "") -> dict:
    """All prompts of a workload through one verifier; summed counts, the wall time of the whole batch, and
    the plain rounds by reason. tenant: whose outputs a suffix draft learns from (each mode its own, so that no
    mode drafts from another's output of the same prompt)."""
    before = fallback_reasons(verifier)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda item: decode(verifier.address, item[0], item[1], k, tenant), batch))
    wall = time.perf_counter() - started
    total = {key: sum(r[key] for r in results) for key in results[0]}
    total["wall"] = wall
    total["fallback_reasons"] = fallback_reasons(verifier) - before
    return total


def pooled(runs: list[dict]) -> dict:
    """Counts and times of several runs, summed."""
    return {key: sum((r[key] for r in runs), collections.Counter() if isinstance(runs[0][key], dict) else 0)
            for key in runs[0]}


def tokens_per_s(measured: dict, concurrency: int) -> float:
    """One stream's speed (tokens over request time); with several in flight, aggregate (over the wall)."""
    return measured["tokens"] / (measured["seconds"] if concurrency == 1 else measured["wall"])


def row(delay: float, workload: str, mode: str, measured: dict, off: dict, concurrency: int) -> dict:
    tps = tokens_per_s(measured, concurrency)
    return {"rtt_ms": delay, "workload": workload, "mode": mode, "tokens_per_s": round(tps, 2),
            "speedup": round(tps / tokens_per_s(off, concurrency), 3),
            "round_ms": round(1000 * measured["seconds"] / measured["rounds"], 1),
            "hit_rate": round(measured["ahead_used"] / measured["drafts"], 3) if measured["drafts"] else 0.0,
            # blocks verified with no wait: drafted ahead, or asked during the plain step before (a far draft)
            "no_wait_rate": round((measured["ahead_used"] + measured.get("prefetched_used", 0)) / measured["drafts"], 3)
            if measured["drafts"] else 0.0,
            "stepped_rounds": measured.get("stepped", 0),
            "acceptance": round(measured["accepted"] / measured["draft_tokens"], 3) if measured["draft_tokens"] else 0,
            "fallback_rounds": measured["fallback"],
            "fallback_reasons": {reason: int(n) for reason, n in sorted(measured.get("fallback_reasons", {}).items())},
            "rounds": measured["rounds"], "drafts": measured["drafts"],
            "tokens": measured["tokens"]}


def run_as(mode: str, verifiers: dict, batch, concurrency: int) -> dict:
    """One run of RUNS (or WAIT_RUNS): its verifier, at its k."""
    verifier, k = {**RUNS, **WAIT_RUNS}[mode]
    return run_mode(verifiers[verifier], batch, k, concurrency, tenant=mode)


def turns(batch: list[tuple[list[int], int]], concurrency: int) -> list[list[tuple[list[int], int]]]:
    """The units the modes take turns on: each prompt alone (one stream), or the whole batch (several at a time).

    A turn lasts seconds, not the batch's half minute, so a slow spell of a shared machine falls on every run
    of a turn instead of on one mode's whole batch."""
    return [[item] for item in batch] if concurrency == 1 else [batch]


def paired(ratios: list[float], resamples: int = 2000, seed: int = 0) -> dict:
    """The geometric mean of per-turn speedups (a mode's tokens/s over off's in the same turn) and a bootstrap
    90% interval over turns: what a mode is worth with the machine's drift between turns taken out."""
    logs = [math.log(r) for r in ratios if r > 0]
    if not logs:
        return {"paired_speedup": None, "paired_low": None, "paired_high": None, "turns": 0}
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(logs, k=len(logs))) / len(logs) for _ in range(resamples))
    return {"paired_speedup": round(math.exp(sum(logs) / len(logs)), 3),
            "paired_low": round(math.exp(means[int(0.05 * resamples)]), 3),
            "paired_high": round(math.exp(means[int(0.95 * resamples) - 1]), 3), "turns": len(logs)}


def sweep(args, proxy, verifiers, batches) -> list[dict]:
    """Every (delay, workload, mode), --repeats times with the modes taking turns (per prompt with one stream);
    rows with pooled speedups, and paired ones (each turn's mode against off in the same turn)."""
    from tqdm import tqdm

    modes, baseline = runs_of(args), baseline_of(args)
    runs: dict[tuple[float, str, str], list[dict]] = {}
    ratios: dict[tuple[float, str, str], list[float]] = {}
    delays = [float(d) for d in args.delays.split(",")]
    for workload, batch in batches.items():  # warm-up: the first forwards, and the policy's server-wide round costs
        for mode in modes:
            run_as(mode, verifiers, batch[:2], args.concurrency)
    steps = [(delay, workload, rep) for delay in delays for workload in batches for rep in range(args.repeats)]
    n = 0
    for delay, workload, rep in tqdm(steps, desc="pipeline sweep", unit="step"):
        proxy.delay_ms = delay / 2
        for turn in turns(batches[workload], args.concurrency):
            order = list(modes)[n % len(modes):] + list(modes)[:n % len(modes)]  # rotate which runs first
            n += 1
            measured = {mode: run_as(mode, verifiers, turn, args.concurrency) for mode in order}
            for mode in modes:
                runs.setdefault((delay, workload, mode), []).append(measured[mode])
                ratios.setdefault((delay, workload, mode), []).append(
                    tokens_per_s(measured[mode], args.concurrency)
                    / tokens_per_s(measured[baseline[mode]], args.concurrency))
    rows = []
    for workload in batches:
        offs = {base: pooled([r for (_, w, mode), rs in runs.items() if w == workload and mode == base for r in rs])
                for base in set(baseline.values())}
        for delay in delays:
            for mode in modes:
                rows.append(row(delay, workload, mode, pooled(runs[(delay, workload, mode)]), offs[baseline[mode]],
                                args.concurrency))
                rows[-1].update(paired(ratios[(delay, workload, mode)]))
                print(f"rtt {delay:g} ms {workload:<12} {mode:<13} {rows[-1]['tokens_per_s']:6.2f} tok/s "
                      f"speedup {rows[-1]['speedup']:.2f}x paired {rows[-1]['paired_speedup']:.3f}x "
                      f"[{rows[-1]['paired_low']:.3f}, {rows[-1]['paired_high']:.3f}] over {rows[-1]['turns']} turns, "
                      f"round {rows[-1]['round_ms']:.0f} ms hit rate {rows[-1]['hit_rate']:.2f} "
                      f"no wait {rows[-1]['no_wait_rate']:.2f} stepped {rows[-1]['stepped_rounds']} "
                      f"fallback {rows[-1]['fallback_rounds']} {rows[-1]['fallback_reasons']}", flush=True)
    return rows


def summary(rows: list[dict]) -> dict:
    """Per workload and mode: the speedup kept at the largest delay, against its own at 0 ms."""
    out = {}
    for workload in sorted({r["workload"] for r in rows}):
        for mode in ("serial", "pipelined", "waited"):
            points = {r["rtt_ms"]: r for r in rows if r["workload"] == workload and r["mode"] == mode}
            if 0.0 in points and len(points) > 1:
                worst = max(points)
                out[f"{workload}/{mode}"] = {
                    "speedup_at_0": points[0.0]["speedup"], f"speedup_at_{worst:g}": points[worst]["speedup"],
                    "kept": round(points[worst]["speedup"] / points[0.0]["speedup"], 3)}
                if all(p.get("paired_speedup") for p in points.values()):
                    out[f"{workload}/{mode}"].update({
                        "paired_at_0": points[0.0]["paired_speedup"],
                        f"paired_at_{worst:g}": points[worst]["paired_speedup"],
                        "paired_kept": round(points[worst]["paired_speedup"] / points[0.0]["paired_speedup"], 3),
                        "paired_lowest": min(p["paired_speedup"] for p in points.values())})
    return out


def curve(rows: list[dict], workload: str, mode: str) -> dict[str, list[float]]:
    """One mode's points against the round trip, as the tables report them: the paired speedup with its 90%
    interval (the pooled one where no turn was paired) and the mean round time."""
    points = sorted((r["rtt_ms"], r) for r in rows if r["workload"] == workload and r["mode"] == mode)
    paired_or_pooled = [(r.get("paired_speedup") or r["speedup"], r.get("paired_low") or r["speedup"],
                         r.get("paired_high") or r["speedup"]) for _, r in points]
    return {"rtt_ms": [x for x, _ in points], "speedup": [s for s, _, _ in paired_or_pooled],
            "low": [lo for _, lo, _ in paired_or_pooled], "high": [hi for _, _, hi in paired_or_pooled],
            "round_ms": [r["round_ms"] for _, r in points]}


def plot(rows: list[dict], title: str, path: pathlib.Path) -> None:
    """Per workload: the paired speedup of serial and pipelined against the round trip, with its 90% interval and
    the line 3% below off that issue 14 holds every configuration to; below it, the mean round time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(2, len(workloads), figsize=(5.5 * len(workloads), 7), squeeze=False)
    for col, workload in enumerate(workloads):
        modes = [m for m in ("serial", "pipelined", "waited") if any(r["mode"] == m for r in rows)]
        for offset, mode in zip((-0.3, 0.3, 0.9), modes):
            points = curve(rows, workload, mode)
            xs = [x + offset for x in points["rtt_ms"]]  # side by side, so the intervals do not hide each other
            errors = [[s - lo for s, lo in zip(points["speedup"], points["low"])],
                      [hi - s for s, hi in zip(points["speedup"], points["high"])]]
            axes[0][col].errorbar(xs, points["speedup"], yerr=errors, marker="o", capsize=3, label=mode)
            axes[1][col].plot(points["rtt_ms"], points["round_ms"], marker="o", label=mode)
        off = curve(rows, workload, "off")
        axes[1][col].plot(off["rtt_ms"], off["round_ms"], marker="o", color="grey", label="off")
        axes[0][col].axhline(1.0, color="grey", linewidth=0.8)
        axes[0][col].axhline(0.97, color="grey", linewidth=0.8, linestyle="--", label="3% below off")
        axes[0][col].set_title(f"{workload}: paired speedup vs off (90% interval)", fontsize=10)
        axes[1][col].set_title(f"{workload}: mean round time (ms)", fontsize=10)
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xlabel("round trip verifier <-> draft (ms)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    axes[1][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def title(result: dict) -> str:
    return (f"pipelined drafting, {result['method']} draft, {result['dtype']}, concurrency {result['concurrency']}"
            + (", pinned cores" if result.get("pin_cores") else ""))


def replot(path: pathlib.Path) -> None:
    """Draw a results JSON's plot again (`python -c "import bench.studies.pipeline as p, pathlib; p.replot(pathlib.Path(F))"`)."""
    plot(json.loads(path.read_text())["rows"], title(json.loads(path.read_text())), path.with_suffix(".png"))


def main(argv=None) -> int:
    from bench.core.machine import machine_info
    from specdec.modeling.models import load_tokenizer

    args = build_parser().parse_args(argv)
    name = args.name or f"{args.method}-c{args.concurrency}" + ("-pinned" if args.pin_cores else "")
    out_dir = pathlib.Path(args.results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    batches = prompts(args, load_tokenizer(args.model))
    from bench.core.steadiness import probe

    started = time.perf_counter()
    steadiness = {"before": probe()}
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as log_dir, \
            split_stack(args, pathlib.Path(log_dir)) as (proxy, verifiers):
        rows = sweep(args, proxy, verifiers, batches)
    steadiness["after"] = probe()
    result = {
        "what": "verifier Decode (greedy, adaptive k) through a draft behind a latency proxy: off, serial, pipelined",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "model": args.model, "dtype": args.dtype, "method": args.method, "draft_model": args.draft_model,
        "concurrency": args.concurrency, "pin_cores": args.pin_cores, "compare_wait": args.compare_wait, "workloads": args.workloads,
        "prompts_per_workload": args.prompts_per_workload, "max_tokens": args.max_tokens, "repeats": args.repeats,
        "baseline": "off pooled over every delay per workload (off never reaches the draft)",
        "machine": machine_info(1 if args.pin_cores else args.threads, "PASSIVE"),
        "wall_s": round(time.perf_counter() - started, 1), "cpu_steadiness": steadiness,
        "rows": rows, "summary": summary(rows),
    }
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(rows, title(result), out_dir / f"{name}.png")
    print(json.dumps(result["summary"], indent=1))
    print(f"CPU steadiness (the same matmuls timed 8 times, slowest/fastest): {steadiness['before']['spread']} "
          f"before the sweep, {steadiness['after']['spread']} after")
    print(f"wrote {out_dir / name}.json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
