"""Two draft replicas behind one verifier, four tenants: what tenant-affine routing buys, and a replica killed.

    python -m tools.draft_tier_probe [--model .cache/models/smollm2-135m-instruct] [--requests 6] [--max-tokens 48]
                                     [--out FILE]

Starts 2 draft replicas (suffix decoding, its memory per tenant), 1 verifier with `--draft A,B` and one gateway
with 4 API keys: 4 tenants. Each tenant plays its own repetitive workload (bench/workloads: extraction,
agent_loop, sql, faq; the first --requests of each) in order, the tenants at once, greedy. Prints one JSON
object:
- routing: acceptance (accepted / drafted tokens, from each request's statistics) with `--draft-routing
  random` and with `affine` (each on a fresh stack: the drafts start cold), and the outputs of both equal;
- killed: on the affine stack, the workload played again, and the replica that owns most tenants killed with
  SIGKILL once half of the tokens have streamed: requests completed, outputs identical to the undisturbed run
  (the affine run), the verifier's tenant moves (specdec_draft_tenant_moves) and its open sequences per
  replica (specdec_draft_replica_sequences) before and after.
--model is the target, and the suffix drafts' tokenizer (the workloads' prompts are longer than the tiny seeded
models' context; tests/e2e/test_draft_tier.py runs the same stack on those, with short prompts).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import pathlib
import sys
import tempfile
import threading
import time

import grpc

from devkit.stack import running_stack, scrape_metrics
from gateway.auth import tenant_of
from specdec.v1 import gateway_pb2, gateway_pb2_grpc
from tools.failover_probe import ENV
from verifier_service.draft import rendezvous

WORKLOADS = ["extraction", "agent_loop", "sql", "faq"]  # one per tenant
KEYS = [f"probe-key-{i}" for i in range(len(WORKLOADS))]


@dataclasses.dataclass
class Reply:
    """One request as the client saw it: token ids, text, finish reason, its speculation statistics, error."""

    token_ids: list[int] = dataclasses.field(default_factory=list)
    text: str = ""
    finish_reason: int = 0
    drafted: int = 0
    accepted: int = 0
    error: str = ""

    def output(self) -> tuple:
        return tuple(self.token_ids), self.text, self.finish_reason


def requests_of(workload: str, n: int, max_tokens: int) -> list[tuple[str, int]]:
    from bench.core.workloads import load_workload

    return [(p.text, min(p.max_tokens, max_tokens)) for p in load_workload(workload, max_prompts=n)]


def play(address: str, requests: dict[str, list[tuple[str, int]]], k: int | None = None,
         on_tokens=None, timeout_s: float = 600.0) -> dict[str, list[Reply]]:
    """Each key's requests in order, greedy, the keys at once; on_tokens(total tokens so far) after each message.
    k: the requests' num_speculative_tokens (None: the verifier's default)."""
    replies = {key: [] for key in requests}
    lock = threading.Lock()
    total = [0]
    channel = grpc.insecure_channel(address)
    stub = gateway_pb2_grpc.GatewayStub(channel)

    def run(key: str) -> None:
        for text, max_tokens in requests[key]:
            reply = Reply()
            replies[key].append(reply)
            request = gateway_pb2.GenerateRequest(prompt=text, max_tokens=max_tokens, temperature=0.0)
            if k is not None:
                request.num_speculative_tokens = k
            try:
                for message in stub.GenerateStream(request, timeout=timeout_s,
                                                   metadata=(("authorization", f"Bearer {key}"),)):
                    reply.token_ids.extend(message.token_ids)
                    reply.text += message.text
                    reply.finish_reason = message.finish_reason or reply.finish_reason
                    if message.HasField("speculation"):
                        reply.drafted = message.speculation.num_draft_tokens
                        reply.accepted = message.speculation.num_accepted_tokens
                    with lock:
                        total[0] += len(message.token_ids)
                        now = total[0]
                    if on_tokens is not None:
                        on_tokens(now)
            except grpc.RpcError as exc:
                reply.error = f"{exc.code().name}: {exc.details()}"

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        for future in [pool.submit(run, key) for key in requests]:
            future.result()
    channel.close()
    return replies


def acceptance(replies: dict[str, list[Reply]]) -> dict:
    drafted = sum(r.drafted for rs in replies.values() for r in rs)
    accepted = sum(r.accepted for rs in replies.values() for r in rs)
    tokens = sum(len(r.token_ids) for rs in replies.values() for r in rs)
    return {"drafted": drafted, "accepted": accepted, "acceptance": round(accepted / drafted, 4) if drafted else None,
            "accepted_per_output_token": round(accepted / tokens, 4) if tokens else None, "tokens": tokens}


def differing(replies: dict[str, list[Reply]], reference: dict[str, list[Reply]]) -> list[str]:
    """key/index of each request whose output differs from the reference's."""
    return [f"{key}/{i}" for key in reference for i, (a, b) in enumerate(zip(replies[key], reference[key]))
            if a.output() != b.output()] + [f"{key}: {len(replies[key])} of {len(reference[key])} requests"
                                              for key in reference if len(replies[key]) != len(reference[key])]


def tier_metrics(verifier) -> dict:
    """The verifier's tenant moves and open sequences per draft replica."""
    metrics = scrape_metrics(verifier.metrics_port)
    return {"tenant_moves": metrics.get(("specdec_draft_tenant_moves_total", ()), 0.0),
            "replica_sequences": {dict(labels)["replica"]: value for (name, labels), value in metrics.items()
                                  if name == "specdec_draft_replica_sequences"},
            "live_replicas": metrics.get(("specdec_draft_replicas_live", ()))}


def busiest_replica(services: dict, keys: list[str], drafts: list[str]) -> str:
    """The draft service (by name) that rendezvous hashing gives the most of the keys' tenants."""
    addresses = {services[name].address: name for name in drafts}
    owners = [rendezvous.owner(tenant_of(key), addresses) for key in keys]
    return addresses[max(addresses, key=owners.count)]


def tier_stack(target, draft, routing: str, log_dir, method: str = "suffix", verifier_args=(), timeout_s=300):
    return running_stack(target, draft, method=method, env=ENV, log_dir=log_dir, drafts=2,
                         verifier_args=["--threads", "1", "--draft-routing", routing, "--draft-check-s", "1",
                                        *verifier_args],
                         gateway_args=["--api-keys", ",".join(KEYS)], timeout_s=timeout_s)


def kill_when(half: int, victim, killed: list) -> callable:
    """on_tokens for `play`: SIGKILL `victim` once `half` tokens have streamed (once)."""
    guard = threading.Lock()

    def on_tokens(total: int) -> None:
        if total >= half:
            with guard:
                if not killed:
                    killed.append(time.monotonic())
                    victim.kill()
    return on_tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=".cache/models/smollm2-135m-instruct",
                        help="target (and draft tokenizer) directory")
    parser.add_argument("--requests", type=int, default=6, help="requests per tenant")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    from bench.core.machine import machine_info

    machine = machine_info(threads=1, omp_wait_policy="PASSIVE")  # each service's, as devkit.stack starts them
    requests = {key: requests_of(workload, args.requests, args.max_tokens) for key, workload in zip(KEYS, WORKLOADS)}
    result = {"model": pathlib.Path(args.model).name, "draft_method": "suffix",
              "draft_replicas": 2, "verifiers": 1, "tenants": dict(zip(WORKLOADS, (tenant_of(k) for k in KEYS))),
              "requests_per_tenant": args.requests, "max_tokens": args.max_tokens, "routing": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        target = draft = args.model
        runs = {}
        for routing in ("random", "affine"):
            with tier_stack(target, draft, routing, root) as services:
                started = time.monotonic()
                runs[routing] = play(services["gateway"].address, requests)
                result["routing"][routing] = {**acceptance(runs[routing]),
                                              "wall_s": round(time.monotonic() - started, 1),
                                              **tier_metrics(services["verifier"])}
                if routing != "affine":
                    continue
                victim = busiest_replica(services, KEYS, ["draft", "draft2"])
                half = result["routing"]["affine"]["tokens"] // 2
                before = tier_metrics(services["verifier"])
                killed: list[float] = []
                disturbed = play(services["gateway"].address, requests,
                                 on_tokens=kill_when(half, services[victim], killed))
                time.sleep(1.5)  # the watch's verdict settles
                after = tier_metrics(services["verifier"])
                owned = sum(rendezvous.owner(tenant_of(k), [services[n].address for n in ("draft", "draft2")])
                            == services[victim].address for k in KEYS)
                result["killed"] = {
                    "replica": f"{victim} ({services[victim].address}), SIGKILL after {half} streamed tokens",
                    "tenants_it_owned": owned,
                    "requests": sum(len(rs) for rs in disturbed.values()),
                    "requests_failed": [r.error for rs in disturbed.values() for r in rs if r.error],
                    "outputs_differing_from_undisturbed": differing(disturbed, runs["affine"]),
                    "tenant_moves": after["tenant_moves"] - before["tenant_moves"],
                    "replica_sequences_after": after["replica_sequences"], "live_replicas_after": after["live_replicas"],
                    **{f"disturbed_{name}": value for name, value in acceptance(disturbed).items()},
                }
        result["routing"]["outputs_random_equal_affine"] = not differing(runs["random"], runs["affine"])
    result["machine"] = machine
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(text + "\n")
    killed = result["killed"]
    ok = (not killed["requests_failed"] and not killed["outputs_differing_from_undisturbed"]
          and result["routing"]["outputs_random_equal_affine"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
