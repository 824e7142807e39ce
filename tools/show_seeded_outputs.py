"""Show that a seed means what it says on the real stack: the same seeded sampled request through the suffix,
n-gram and model drafts, with k fixed, adaptive and 0 (speculation off), repeated, gives the same tokens.

Starts one stack per draft method (the model draft is --draft-model, by default the target itself), sends each
prompt at --temperature with --seed for every k and repeat, prints one line per response and a verdict.

    python tools/show_seeded_outputs.py --model .cache/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import sys
import tempfile

import grpc

from specdec.decoding.chat_format import chatml
from devkit.stack import running_stack
from specdec.v1 import gateway_pb2, gateway_pb2_grpc

PROMPTS = [
    'Extract the person as JSON with keys "name", "city", "job". Text: Maria Lopez lives in Seville and works as '
    "a nurse.",
    "Write a haiku about autumn leaves.",
    "Explain what a KV cache is in two sentences.",
]
KS = [4, 1, None, 0]  # None: the server adapts k; 0: speculation off


def digest(tokens: list[int]) -> str:
    return hashlib.sha256(repr(tokens).encode()).hexdigest()[:12]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft-model", help="the model draft (default: the target)")
    parser.add_argument("--methods", nargs="+", default=["suffix", "ngram", "model"])
    parser.add_argument("--temperature", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    outputs: dict[str, set[tuple[int, ...]]] = {prompt: set() for prompt in PROMPTS}
    for method in args.methods:
        with tempfile.TemporaryDirectory() as logs, running_stack(
                args.model, args.draft_model or args.model, method=method, log_dir=pathlib.Path(logs), timeout_s=300) as services:
            with grpc.insecure_channel(services["gateway"].address) as channel:
                stub = gateway_pb2_grpc.GatewayStub(channel)
                for p, prompt in enumerate(PROMPTS):
                    for k in KS:
                        for repeat in range(args.repeats):
                            request = gateway_pb2.GenerateRequest(
                                prompt=chatml(prompt), max_tokens=args.max_tokens, temperature=args.temperature,
                                seed=args.seed)
                            if k is not None:
                                request.num_speculative_tokens = k
                            response = stub.Generate(request, timeout=600)
                            tokens = tuple(response.token_ids)
                            outputs[prompt].add(tokens)
                            stats = response.speculation
                            print(f"{method:6} prompt {p} k={'adaptive' if k is None else k!s:8} repeat {repeat} "
                                  f"tokens {digest(list(tokens))} drafted {stats.num_draft_tokens:3} accepted "
                                  f"{stats.num_accepted_tokens:3} fallback rounds {stats.num_fallback_rounds} "
                                  f"{response.text[:40]!r}", flush=True)
    distinct = {p: len(found) for p, found in enumerate(outputs.values())}
    print(f"distinct outputs per prompt over methods x k x repeats: {distinct}")
    same = all(n == 1 for n in distinct.values())
    print("SAME tokens for the same seed everywhere" if same else "DIFFERENT tokens for the same seed")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
