"""specd: a command-line client for the gateway.

    python -m gateway.cli "Write a haiku about caches" --max-tokens 64
    python -m gateway.cli --chat "What is speculative decoding?" --temperature 0.7 --seed 1
    python -m gateway.cli "..." --no-speculation

Streams the text to stdout and prints the speculation statistics to stderr.
Exits 1 with one line when the gateway is unreachable or refuses the request,
and 2 with one line on a flag it cannot send (out of the wire's range).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import grpc

from specdec.decoding.chat_format import chatml
from specdec.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

EXIT_RPC_ERROR = 1
EXIT_USAGE = 2
INT32_MAX, UINT32_MAX, UINT64_MAX = 2**31 - 1, 2**32 - 1, 2**64 - 1


class Parser(argparse.ArgumentParser):
    """Usage errors in one line (exit 2), not argparse's usage block."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def integer(low: int, high: int):
    """An argparse type: an integer in [low, high], the range the request's field can carry."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range: use {low}..{high}")
        return value

    return parse


def number(low: float, high: float = math.inf, low_open: bool = False):
    """An argparse type: a finite number in [low, high] ((low, high] with low_open)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if value < low or (low_open and value == low) or value > high:
            bracket = "(" if low_open else "["
            raise argparse.ArgumentTypeError(f"{value} is out of range: use {bracket}{low:g}, {high:g}]")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m gateway.cli", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("prompt", help="prompt text")
    parser.add_argument("--addr", default=os.environ.get("SPECDEC_GATEWAY", "localhost:50051"),
                        help="gateway HOST:PORT (env SPECDEC_GATEWAY)")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a ChatML user turn")
    parser.add_argument("--max-tokens", type=integer(1, UINT32_MAX), default=128)
    parser.add_argument("--temperature", type=number(0.0), default=0.0, help="0 is greedy")
    parser.add_argument("--top-p", type=number(0.0, 1.0, low_open=True), default=None)
    parser.add_argument("--top-k", type=integer(0, INT32_MAX), default=0, help="0 keeps every token")
    parser.add_argument("--seed", type=integer(0, UINT64_MAX), default=None,
                        help="reproducible sampling with an explicit -k (see SamplingParams.seed in common.proto)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("-k", "--num-speculative-tokens", type=integer(0, UINT32_MAX), default=None,
                        help="draft block length")
    parser.add_argument("--no-speculation", action="store_true", help="decode without a draft (k = 0)")
    parser.add_argument("--no-stream", action="store_true", help="one unary Generate call")
    parser.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY", ""), help="env SPECDEC_API_KEY")
    parser.add_argument("--tls-ca", default=os.environ.get("SPECDEC_TLS_CA", ""), help="PEM CA for a TLS gateway")
    parser.add_argument("--timeout", type=number(0.0, low_open=True), default=600.0, help="seconds")
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tls_ca and not os.path.isfile(args.tls_ca):
        parser.error(f"argument --tls-ca: no such file: {args.tls_ca}")
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
