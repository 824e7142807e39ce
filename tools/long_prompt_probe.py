"""Long prompts against one short stream (issue 32, item 1): does every request finish, and does the short one flow?

    python -m tools.long_prompt_probe --model .cache/models/smollm2-135m-instruct            # starts a stack
    python -m tools.long_prompt_probe --model ... --sequence-ttl-s 30                        # verifier's TTL
    python -m tools.long_prompt_probe --gateway HOST:PORT                                    # one already running

Starts the default stack (suffix draft, transformers verifier, as `make run`) unless given a gateway, then sends
--num-long prompts of --prompt-tokens token ids each, all at once, while one short streaming client sends
short requests back to back until the long ones are done. Prints whether every request completed, the short
client's longest gap between messages (a request's start to its first message counts as a gap), and every call
that ended with an error (a reaped call ends DEADLINE_EXCEEDED naming --sequence-ttl-s). Every call has a
deadline of --timeout-s, so a run ends within about that long after the stack is up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import random
import tempfile
import threading
import time

import grpc

from specdec.v1 import gateway_pb2, gateway_pb2_grpc

SHORT_PROMPT = "List the days of the week, one per line, then the months of the year."


def long_prompt(index: int, num_tokens: int, vocab_low: int = 200, vocab_high: int = 40000) -> list[int]:
    """Token ids that no two prompts share as a prefix (each its own seed), so no cache can shortcut them."""
    rng = random.Random(1000 + index)
    return [rng.randrange(vocab_low, vocab_high) for _ in range(num_tokens)]


class Probe:
    def __init__(self, address: str, args):
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 16 << 20)])
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)
        self.args = args
        self.long_done = threading.Event()
        self.results: list[dict] = []
        self.short = {"requests": 0, "completed": 0, "messages": 0, "max_gap_s": 0.0, "gaps_over_5s": 0,
                      "errors": []}
        self.lock = threading.Lock()

    def run_long(self, index: int) -> None:
        request = gateway_pb2.GenerateRequest(
            prompt_token_ids=gateway_pb2.TokenIds(ids=long_prompt(index, self.args.prompt_tokens)),
            max_tokens=self.args.max_tokens)
        started = time.monotonic()
        outcome = {"request": f"long-{index}", "completed": False}
        first = None
        try:
            for message in self.stub.GenerateStream(request, timeout=self.args.timeout_s):
                if first is None:
                    first = time.monotonic() - started
                if message.finish_reason:
                    outcome["completed"] = True
                    outcome["completion_tokens"] = message.usage.completion_tokens
        except grpc.RpcError as exc:
            outcome["error"] = f"{exc.code().name}: {exc.details()}"
        except Exception as exc:  # noqa: BLE001 (the probe reports it with the rest)
            outcome["error"] = repr(exc)
        outcome["first_message_s"] = None if first is None else round(first, 2)
        outcome["seconds"] = round(time.monotonic() - started, 2)
        with self.lock:
            self.results.append(outcome)

    def run_short(self, started_long: threading.Event) -> None:
        request = gateway_pb2.GenerateRequest(prompt=SHORT_PROMPT, max_tokens=self.args.short_max_tokens)
        while True:
            self.short["requests"] += 1
            last = time.monotonic()
            finished = False
            try:
                for message in self.stub.GenerateStream(request, timeout=self.args.timeout_s):
                    now = time.monotonic()
                    gap = now - last
                    last = now
                    self.short["messages"] += 1
                    if started_long.is_set():  # gaps before the long prompts arrive are not the question
                        self.short["max_gap_s"] = max(self.short["max_gap_s"], gap)
                        self.short["gaps_over_5s"] += gap > 5
                    finished = finished or bool(message.finish_reason)
            except grpc.RpcError as exc:
                if started_long.is_set():  # the wait for a message that never came is a gap too
                    self.short["max_gap_s"] = max(self.short["max_gap_s"], time.monotonic() - last)
                self.short["errors"].append(f"{exc.code().name}: {exc.details()}")
                time.sleep(0.5)
            self.short["completed"] += finished
            started_long.set()
            if self.long_done.is_set():
                return

    def run(self) -> dict:
        started_long = threading.Event()
        short = threading.Thread(target=self.run_short, args=(started_long,))
        short.start()
        started_long.wait(self.args.timeout_s)  # the short client's first request is through: the stack is warm
        started = time.monotonic()
        longs = [threading.Thread(target=self.run_long, args=(i,)) for i in range(self.args.num_long)]
        for thread in longs:
            thread.start()
        for thread in longs:
            thread.join()
        self.long_done.set()
        short.join()
        self.channel.close()
        errors = [r["error"] for r in self.results if "error" in r] + self.short["errors"]
        return {
            "long_prompts": self.args.num_long, "prompt_tokens": self.args.prompt_tokens,
            "max_tokens": self.args.max_tokens, "seconds": round(time.monotonic() - started, 1),
            "every_request_completed": (len(self.results) == self.args.num_long and not self.short["errors"]
                                        and all(r["completed"] for r in self.results)),
            "short_stream_longest_gap_s": round(self.short["max_gap_s"], 3),
            "short": self.short, "long": sorted(self.results, key=lambda r: r["request"]),
            "errors": errors,
            "reaped": sum("--sequence-ttl-s" in e for e in errors),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--model", help="target model directory: start the default stack (suffix draft) on it")
    where.add_argument("--gateway", help="HOST:PORT of a running gateway")
    parser.add_argument("--sequence-ttl-s", type=float, default=0.0, help="passed to the verifier (0: its default)")
    parser.add_argument("--verifier-arg", action="append", default=[], help="another verifier flag (repeatable)")
    parser.add_argument("--num-long", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    parser.add_argument("--max-tokens", type=int, default=8, help="each long prompt's max_tokens")
    parser.add_argument("--short-max-tokens", type=int, default=48)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="every call's deadline")
    parser.add_argument("--log-dir", default="", help="the services' logs (default: a temporary directory)")
    parser.add_argument("--json", default="", help="also write the result here")
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        if args.gateway:
            address, verifier_log = args.gateway, None
        else:
            from devkit.stack import running_stack

            log_dir = pathlib.Path(args.log_dir or stack.enter_context(tempfile.TemporaryDirectory()))
            verifier_args = [*(["--sequence-ttl-s", f"{args.sequence_ttl_s:g}"] if args.sequence_ttl_s else []),
                             *args.verifier_arg]
            services = stack.enter_context(running_stack(args.model, method="suffix", verifier_args=verifier_args,
                                                         log_dir=log_dir, timeout_s=300))
            address, verifier_log = services["gateway"].address, services["verifier"]
            print(f"stack up; verifier args {verifier_args or '(defaults)'}; logs in {log_dir}", flush=True)
        result = Probe(address, args).run()
        if verifier_log is not None:
            result["verifier_reaped_log_lines"] = [line for line in verifier_log.log().splitlines()
                                                   if "dropping its sequence" in line]
    print(json.dumps(result, indent=1))
    print(f"every request completed: {result['every_request_completed']}; short stream's longest gap "
          f"{result['short_stream_longest_gap_s']:.2f} s; reaped {result['reaped']}; errors {len(result['errors'])}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if result["every_request_completed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
