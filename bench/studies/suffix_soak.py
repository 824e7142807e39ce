"""Soak the suffix draft: a bounded stream of requests through a real draft service process, small cache.

Each request opens a Propose stream, as the verifier does: `start` with a prompt, rounds of
`next` (keep what was accepted, append the target's tokens, ask for k), a last sync of the final
tokens, half-close. Outputs repeat a fixed record schema with varying values, so the cache keeps
learning and evicting. The draft's RSS is read from /proc after the cache first fills its budget
and at the end: it must stay flat. Evictions come from its /metrics.

    python -m bench suffix-soak --requests 2400     # "20 minutes" at 2 requests/s; writes bench/results/
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import time

import grpc
from tqdm import tqdm

from bench.core.machine import python_machine
from bench.core.paths import RESULTS_DIR
from devkit.stack import Service, scrape_metrics, wait_serving
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc

RESULTS = RESULTS_DIR


def rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def request_tokens(rng: random.Random, vocab: int) -> tuple[list[int], list[int]]:
    """(prompt, output): a record to extract and its JSON-like output with a fixed schema.

    Ids in [0, vocab): the low 16 are the schema's punctuation and field names, the rest values."""
    values = [[rng.randrange(16, vocab) for _ in range(rng.randint(1, 5))] for _ in range(8)]
    prompt = [0, 1, 2] + [t for v in values for t in v + [rng.randrange(16, vocab)]]
    output = [3]
    for field, value in enumerate(values):
        output += [4, 8 + field, 5] + value + [6]
    return prompt, output + [7]


def play(stub, rng: random.Random, vocab: int, k: int = 8) -> int:
    """One request, driven like the verifier drives it; returns the tokens the draft proposed."""
    prompt, output = request_tokens(rng, vocab)
    return sum(len(response.token_ids) for response in stub.Propose(messages(prompt, output, k)))


def messages(prompt: list[int], output: list[int], k: int):
    """start, then per round: drop the last proposal (keep the verified tokens), append the target's next
    4 tokens, ask for k; then the final sync (num_tokens 0) and the half-close that ends the iterator."""
    yield draft_pb2.ProposeRequest(start=draft_pb2.StartSequence(
        request_id="soak", prompt_token_ids=prompt, sampling=common_pb2.SamplingParams()))
    verified = len(prompt)
    for i in range(0, len(output), 4):
        step = output[i:i + 4]
        yield draft_pb2.ProposeRequest(next=draft_pb2.NextBlock(keep_length=verified, append_token_ids=step,
                                                                num_tokens=k))
        verified += len(step)
    yield draft_pb2.ProposeRequest(next=draft_pb2.NextBlock(keep_length=verified, num_tokens=0))


def soak(model_dir: str, requests: int, max_cached_tokens: int, seed: int = 0, log_dir=None) -> dict:
    service = Service("draft_service", ["--model", model_dir, "--method", "suffix", "--suffix-scope", "global",
                                        "--suffix-max-cached-tokens", str(max_cached_tokens)], None, log_dir, 0, 0)
    try:
        wait_serving(service.address, 120, service.process)
        channel = grpc.insecure_channel(service.address)
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        vocab = stub.GetDraftInfo(draft_pb2.GetDraftInfoRequest()).info.vocab_size
        rng = random.Random(seed)
        started, baseline, baseline_at, proposed = time.perf_counter(), None, 0, 0
        for i in tqdm(range(requests), desc="soak", unit="req"):
            proposed += play(stub, rng, vocab)
            if baseline is None and i >= 10:
                cached = scrape_metrics(service.metrics_port).get(("specdec_draft_suffix_cached_tokens", ()), 0)
                if cached >= 0.9 * max_cached_tokens:  # the cache is full: from here on it only evicts
                    baseline, baseline_at = rss_mib(service.process.pid), i + 1
        final = rss_mib(service.process.pid)
        metrics = scrape_metrics(service.metrics_port)
        channel.close()
    finally:
        service.stop()
    evictions = sum(v for (name, _), v in metrics.items() if name == "specdec_draft_suffix_evictions_total")
    return {
        "machine": python_machine(),  # the CPU and its flags, as bench.suffix_cost records them
        "requests": requests, "max_cached_tokens": max_cached_tokens, "seconds": round(time.perf_counter() - started, 1),
        "proposed_tokens": proposed, "cached_tokens": metrics.get(("specdec_draft_suffix_cached_tokens", ()), 0),
        "evictions": evictions, "rss_mib_when_full": baseline, "full_after_requests": baseline_at,
        "rss_mib_final": final, "rss_growth": None if baseline is None else round(final / baseline - 1, 4),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=".cache/models/smollm2-135m-instruct", help="tokenizer directory")
    parser.add_argument("--requests", type=int, default=2400)
    parser.add_argument("--max-cached-tokens", type=int, default=20_000)
    parser.add_argument("--out", default=str(RESULTS / "suffix_soak.json"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = soak(args.model, args.requests, args.max_cached_tokens)
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    growth = result["rss_growth"]
    if growth is None or growth > 0.05:
        print(f"FAIL: draft RSS grew {growth} after the cache filled (limit 5%)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
