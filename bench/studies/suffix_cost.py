"""What suffix decoding costs the draft service: time per proposal with 100,000 tokens cached, and memory.

The draft runs its suffix proposer on its event loop, so each call must be cheap. This fills the
global cache with seeded synthetic outputs (half extraction records with one fixed JSON-like schema,
half unrepeated text; vocabulary 49,152), then times:
- a proposal (the request's own tree and the cache, as `SuffixSequence.propose` does), k=8, on
  contexts that match the cached records ("hit") and on unseen text ("miss"): wall-clock
  percentiles and the mean CPU time of the thread;
- the CPU time per token of indexing a 2,000-token prompt (at start), of caching an output (at
  finish), and of caching one while evicting the oldest;
- RSS per cached token, and RSS after churning 5x the budget through the cache (it must stay flat).

    python -m bench suffix-cost                      # writes bench/results/suffix_cost.json
    PYTHONPATH=. /tmp/arctic/bin/python -m bench suffix-cost --arctic   # also arctic-inference's C++ tree

Pure Python; imports neither torch nor gRPC, so it runs in any interpreter that has the repository on its path.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import random
import statistics
import time

from bench.core.machine import python_machine
from draft_service.suffix_cache import SuffixCache, SuffixTree

VOCAB = 49_152
SCHEMA = list(range(30_000, 30_012))  # the field-name tokens of the extraction schema


def record(rng: random.Random) -> list[int]:
    """One extraction output: the fixed schema with 1-6 value tokens per field (Zipf-like values)."""
    out = [123]
    for key in SCHEMA:
        out += [34, key, 34, 58, 34]
        out += [min(VOCAB - 1, int(rng.paretovariate(1.2)) + 1_000) for _ in range(rng.randint(1, 6))]
        out += [34, 44]
    return out + [125]


def prose(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(length)]


def outputs(seed: int):
    """An endless seeded stream of outputs: records and unrepeated text, alternating."""
    rng = random.Random(seed)
    while True:
        yield record(rng)
        yield prose(rng, rng.randint(60, 160))


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def contexts(seed: int, count: int) -> dict[str, list[list[int]]]:
    """Per kind, `count` (prompt, context) pairs: a 200-token prompt, then part of a new output."""
    rng = random.Random(seed)
    hit, miss = [], []
    for _ in range(count):
        prompt = prose(rng, 200)
        new = record(rng)
        hit.append((prompt, prompt + new[: rng.randint(8, len(new) - 8)]))
        miss.append((prompt, prompt + prose(rng, 40)))
    return {"hit": hit, "miss": miss}


def percentiles(samples_s: list[float], cpu_s: float) -> dict:
    """Wall-clock percentiles, and the mean CPU time of this thread (steadier on a shared machine)."""
    us = sorted(sample * 1e6 for sample in samples_s)
    return {"mean_us": round(statistics.fmean(us), 1), "p50_us": round(us[len(us) // 2], 1),
            "p99_us": round(us[int(len(us) * 0.99)], 1), "max_us": round(us[-1], 1),
            "cpu_mean_us": round(cpu_s / len(us) * 1e6, 1)}


def gc_pause_ms() -> float:
    """One full collection of Python's cyclic GC: the pause it would add to the event loop."""
    started = time.perf_counter()
    gc.collect()
    return round((time.perf_counter() - started) * 1000, 1)


def measure_ours(args) -> dict:
    gc_before = gc_pause_ms()
    rss_before = rss_bytes()
    cache = SuffixCache(args.depth, max_requests=10**9, max_tokens=args.tokens)
    stream = outputs(args.seed)
    insert_s, inserted = 0.0, 0
    while True:
        out = next(stream)
        if cache.cached_tokens + len(out) > args.tokens:
            break
        started = time.thread_time()
        cache.insert("", out)
        insert_s += time.thread_time() - started
        inserted += len(out)
    gc_full = gc_pause_ms()
    rss_full = rss_bytes()

    # Churn 5x the budget through the cache: oldest-first eviction must keep memory flat.
    churned, churn_s, rss_churn = 0, 0.0, []
    while churned < 5 * args.tokens:
        out = next(stream)
        started = time.thread_time()
        result = cache.insert("", out)
        churn_s += time.thread_time() - started
        churned += len(out)
        if result.cached != len(out):
            raise RuntimeError(f"an output of {len(out)} tokens was cut to {result.cached}: raise --tokens")
        if churned // args.tokens > len(rss_churn):
            gc.collect()
            rss_churn.append(round(rss_bytes() / 2**20, 1))

    proposals, drafted = {}, {}
    for kind, pairs in contexts(args.seed + 1, args.proposals).items():
        times, lengths, cpu = [], [], 0.0
        for prompt, context in pairs:
            own = SuffixTree(args.depth)
            own.track(context).index_to(len(context))
            cpu_started, started = time.thread_time(), time.perf_counter()
            mine = own.speculate(context, args.k, 1.0, 0.0, 0.1)
            cached = cache.speculate("", context, args.k, 1.0, 0.0, 0.1)
            times.append(time.perf_counter() - started)
            cpu += time.thread_time() - cpu_started
            lengths.append(len((mine if mine.score >= cached.score else cached).token_ids))
        proposals[kind] = percentiles(times, cpu)
        drafted[kind] = round(statistics.fmean(lengths), 2)

    rng = random.Random(args.seed + 2)
    prompt = prose(rng, 1_000) + [token for _ in range(4) for token in record(rng)]
    prompt += prose(rng, 2_000 - len(prompt))
    started = time.thread_time()
    SuffixTree(args.depth).track(prompt).index_to(len(prompt))
    prompt_us = (time.thread_time() - started) / len(prompt) * 1e6

    return {
        "cached_tokens": cache.cached_tokens, "cached_requests": cache.cached_requests,
        "proposal": proposals, "mean_draft_len": drafted,
        "insert_cpu_us_per_token": round(insert_s / inserted * 1e6, 2),
        "insert_with_eviction_cpu_us_per_token": round(churn_s / churned * 1e6, 2),
        "prompt_index_cpu_us_per_token": round(prompt_us, 2),
        "rss_mb_before": round(rss_before / 2**20, 1), "rss_mb_full": round(rss_full / 2**20, 1),
        "rss_mb_after_churning_1x_to_5x": rss_churn,
        "rss_bytes_per_cached_token": round((rss_full - rss_before) / cache.cached_tokens),
        "gc_full_collection_ms_empty": gc_before, "gc_full_collection_ms_full": gc_full,
    }


def measure_arctic(args) -> dict:
    """The same workload through arctic-inference's SuffixDecodingCache (request count limit only)."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    gc.collect()
    rss_before = rss_bytes()
    cache = SuffixDecodingCache(max_tree_depth=args.depth, max_cached_requests=-1)
    stream = outputs(args.seed)
    insert_s, inserted, request = 0.0, 0, 0
    while True:
        out = next(stream)
        if inserted + len(out) > args.tokens:
            break
        started = time.thread_time()
        cache.start_request(request, [0])
        cache.add_active_response(request, out)
        cache.stop_request(request)
        insert_s += time.thread_time() - started
        inserted += len(out)
        request += 1
    gc.collect()
    rss_full = rss_bytes()
    proposals, drafted = {}, {}
    for kind, pairs in contexts(args.seed + 1, args.proposals).items():
        times, lengths, cpu = [], [], 0.0
        for prompt, context in pairs:
            request += 1
            cache.start_request(request, context)
            cpu_started, started = time.thread_time(), time.perf_counter()
            draft = cache.speculate(request, context[-args.depth:], max_spec_tokens=args.k, max_spec_factor=1.0,
                                    min_token_prob=0.1)
            times.append(time.perf_counter() - started)
            cpu += time.thread_time() - cpu_started
            cache.stop_request(request)
            lengths.append(len(draft.token_ids))
        proposals[kind] = percentiles(times, cpu)
        drafted[kind] = round(statistics.fmean(lengths), 2)
    return {"cached_tokens": inserted, "proposal": proposals, "mean_draft_len": drafted,
            "insert_cpu_us_per_token": round(insert_s / inserted * 1e6, 2),
            "rss_bytes_per_cached_token": round((rss_full - rss_before) / inserted)}


def print_table(name: str, result: dict) -> None:
    print(f"{name}: {result['cached_tokens']:,} tokens cached")
    print(f"  {'proposal (k=8)':<16}{'mean us':>9}{'p50 us':>9}{'p99 us':>9}{'cpu us':>9}{'drafted':>9}")
    for kind, stats in result["proposal"].items():
        print(f"  {kind:<16}{stats['mean_us']:>9}{stats['p50_us']:>9}{stats['p99_us']:>9}{stats['cpu_mean_us']:>9}"
              f"{result['mean_draft_len'][kind]:>9}")
    for key, value in result.items():
        if key not in {"proposal", "mean_draft_len", "cached_tokens"}:
            print(f"  {key:<40}{value}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000, help="tokens to cache")
    parser.add_argument("--depth", type=int, default=24, help="suffix tree depth (--suffix-max-depth)")
    parser.add_argument("--k", type=int, default=8, help="tokens asked per proposal")
    parser.add_argument("--proposals", type=int, default=500, help="timed proposals per kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arctic", action="store_true", help="also measure arctic-inference (must be importable)")
    parser.add_argument("--out", default="bench/results/suffix_cost.json")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    result = {"machine": python_machine(), "settings": {key: value for key, value in vars(args).items() if key != "out"},
              "specdec": measure_ours(args)}
    print(f"machine: {result['machine']['cpu']}, load {result['machine']['load_avg_start']}, "
          f"a bare 3M-step Python loop takes {result['machine']['python_loop_3M_cpu_s']} s of CPU")
    print_table("specdec suffix_cache (pure Python)", result["specdec"])
    if args.arctic:
        result["arctic"] = measure_arctic(args)
        print_table("arctic-inference SuffixDecodingCache (C++)", result["arctic"])
    result["machine"]["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
