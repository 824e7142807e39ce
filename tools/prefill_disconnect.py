"""How long a streaming HTTP client that leaves during the prefill keeps its sequence live (issue 32, defect 8).

Starts the stack on a real model, sends one streamed /v1/completions request with a long prompt, closes the
socket `--leave-after-s` seconds later (before the first token), and polls both services'
specdec_live_sequences until they are 0. For reference it first times the same prompt's time to first token.

    python -m tools.prefill_disconnect --model .cache/models/smollm2-135m-instruct --prompt-tokens 1400
"""

from __future__ import annotations

import argparse
import json
import pathlib
import socket
import tempfile
import time
import urllib.request

from devkit.stack import running_stack, scrape_metrics

WORDS = "the quick brown fox jumps over the lazy dog while speculative decoding drafts and verifies tokens".split()


def live(service) -> float:
    return sum(value for (name, _labels), value in scrape_metrics(service.metrics_port).items()
               if name == "specdec_live_sequences")


def long_prompt(tokenizer_dir: str, tokens: int) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    words = []
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < tokens:
        words += WORDS
    return " ".join(words)


def time_to_first_token(port: int, prompt: str) -> float:
    body = json.dumps({"prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=600) as reply:
        reply.readline()
        return time.monotonic() - started


def leave_during_prefill(port: int, prompt: str, leave_after_s: float, verifier) -> bool:
    """Send the request, close the socket after `leave_after_s`; whether the verifier held the sequence then."""
    body = json.dumps({"prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(leave_after_s)
        return live(verifier) > 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=".cache/models/smollm2-135m-instruct")
    parser.add_argument("--prompt-tokens", type=int, default=1400)
    parser.add_argument("--leave-after-s", type=float, default=0.3)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    prompt = long_prompt(args.model, args.prompt_tokens)
    with tempfile.TemporaryDirectory() as logs, running_stack(pathlib.Path(args.model), method="ngram",
                                                              log_dir=pathlib.Path(logs)) as services:
        gateway, verifier = services["gateway"], services["verifier"]
        ttft = time_to_first_token(gateway.http_port, prompt)
        print(f"time to first token, {args.prompt_tokens}-token prompt: {ttft:.2f} s")
        held = leave_during_prefill(gateway.http_port, prompt, args.leave_after_s, verifier)
        left = time.monotonic()
        print(f"the verifier held the sequence when the client left: {held}")
        freed = {}
        while len(freed) < 2 and time.monotonic() - left < args.timeout_s:
            for name, service in (("gateway", gateway), ("verifier", verifier)):
                if name not in freed and live(service) == 0:
                    freed[name] = time.monotonic() - left
            time.sleep(0.05)
        for name in ("gateway", "verifier"):
            after = f"{freed[name]:.2f} s" if name in freed else f"not within {args.timeout_s:.0f} s"
            print(f"{name}: specdec_live_sequences back to 0 {after} after the client left "
                  f"({args.leave_after_s:.1f} s into the prefill)")


if __name__ == "__main__":
    main()
