"""specd: a command-line client for the gateway.

    python -m gateway.cli "Write a haiku about caches" --max-tokens 64
    python -m gateway.cli --chat "What is speculative decoding?" --temperature 0.7 --seed 1
    python -m gateway.cli "..." --no-speculation

Streams the text to stdout and prints the speculation statistics to stderr.
Exits 1 with one line when the gateway is unreachable or refuses the request.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc

from specdec.chat_format import chatml
from specdec.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

EXIT_RPC_ERROR = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gateway.cli", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("prompt", help="prompt text")
    parser.add_argument("--addr", default=os.environ.get("SPECDEC_GATEWAY", "localhost:50051"),
                        help="gateway HOST:PORT (env SPECDEC_GATEWAY)")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a ChatML user turn")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=None, help="draft block length")
    parser.add_argument("--no-speculation", action="store_true", help="decode without a draft (k = 0)")
    parser.add_argument("--no-stream", action="store_true", help="one unary Generate call")
    parser.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY", ""), help="env SPECDEC_API_KEY")
    parser.add_argument("--tls-ca", default=os.environ.get("SPECDEC_TLS_CA", ""), help="PEM CA for a TLS gateway")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds")
    return parser


def build_request(args: argparse.Namespace) -> gateway_pb2.GenerateRequest:
    request = gateway_pb2.GenerateRequest(
        prompt=chatml(args.prompt) if args.chat else args.prompt, max_tokens=args.max_tokens,
        temperature=args.temperature, top_k=args.top_k, stop=args.stop)
    if args.top_p is not None:
        request.top_p = args.top_p
    if args.seed is not None:
        request.seed = args.seed
    if args.no_speculation:
        request.num_speculative_tokens = 0
    elif args.num_speculative_tokens is not None:
        request.num_speculative_tokens = args.num_speculative_tokens
    return request


def format_stats(response: gateway_pb2.GenerateResponse) -> str:
    stats, usage = response.speculation, response.usage
    return (f"[{common_pb2.FinishReason.Name(response.finish_reason).removeprefix('FINISH_REASON_').lower()}] "
            f"prompt {usage.prompt_tokens} + completion {usage.completion_tokens} tokens | rounds {stats.num_rounds}, "
            f"drafted {stats.num_draft_tokens}, accepted {stats.num_accepted_tokens} "
            f"(acceptance {stats.acceptance_rate:.2f}, mean accepted length {stats.mean_accepted_length:.2f}), "
            f"fallback rounds {stats.num_fallback_rounds}")


def open_channel(args: argparse.Namespace) -> grpc.Channel:
    if args.tls_ca:
        with open(args.tls_ca, "rb") as handle:
            return grpc.secure_channel(args.addr, grpc.ssl_channel_credentials(handle.read()))
    return grpc.insecure_channel(args.addr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    metadata = [("authorization", f"Bearer {args.api_key}")] if args.api_key else []
    request = build_request(args)
    with open_channel(args) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        try:
            if args.no_stream:
                last = stub.Generate(request, timeout=args.timeout, metadata=metadata)
                sys.stdout.write(last.text)
            else:
                for last in stub.GenerateStream(request, timeout=args.timeout, metadata=metadata):
                    sys.stdout.write(last.text)
                    sys.stdout.flush()
        except grpc.RpcError as exc:
            hint = " (is the stack running? `make run`)" if exc.code() == grpc.StatusCode.UNAVAILABLE else ""
            print(f"\nerror: {exc.code().name}: {exc.details()}{hint}", file=sys.stderr)
            return EXIT_RPC_ERROR
    print("\n" + format_stats(last), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
