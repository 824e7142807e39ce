"""The efficiency surface: measured speedup against the speedup model's prediction, over alpha and k (issue 36).

    python -m bench efficiency --model .cache/models/smollm2-135m-instruct          # this CPU, fp32, as `make run`
    python -m bench efficiency --config llama-8b --device cuda --dtype bfloat16 --ks policy,4 --concurrency 1,8 \\
        --anchor --out bench/results/gpu/NAME                                       # tools/gpu_check.sh
    python -m bench efficiency --config llama-tiny --prompts 2 --max-tokens 16      # a dry run (seconds)

Acceptance is set, not found: the draft is the replay draft (draft_service/replay.py, a benchmarking tool), which
proposes the target's own recorded greedy continuation with each token independently corrupted with
probability 1 - alpha. So the surface can be measured at any alpha, with real weights or random ones.

1. The services run as real processes: one replay draft, two verifiers (serial: --draft-ahead false; pipelined:
   the default), a gateway in front of each. Requests go through the gateways (GenerateStream, token ids).
2. Record: each prompt's greedy continuation with speculation off (k = 0), written as the replay file.
3. The verify-cost curve t(n)/t(1) of the same target, measured in-process before and after the sweep, the two
   averaged (bench.studies.verify_cost; on a CPU with the linears prepacked, as the verifier runs them).
4. For each alpha: the draft restarts at that alpha (the verifiers stay up), then, --repeats times, every
   prompt (or every batch of --concurrency prompts) runs off and every k on both verifiers, the order
   rotating from turn to turn, so a slow spell of a shared machine falls on all of them.
5. Per cell (mode, concurrency, alpha, k): measured speedup = tokens/s over off's on the same verifier at the same
   alpha; the round split from the verifier's histograms: forward, draft wait, and the rest of the round
   ("transport": the round's wall time less the two, measured at the client); and the model's prediction
   S = E(alpha^, k) (1 + rho_off) / (w / t1 + v(k + 1) + rho), with prefill's share of off's time kept as is:
   t1 = off's forward per round, v = the in-process curve, w = the draft wait per round, rho and rho_off the
   transport per round of the cell and of off, over t1, and alpha^ the measured per-token acceptance
   (accepted / (accepted + rejected blocks); see `alpha_hat`). Measured / predicted says how much of what the
   model promises from the measured times the stack delivers. `ideal` is the same model with no split costs
   (w = rho = rho_off = 0).

Writes OUT/efficiency.json, efficiency.md and efficiency.png (default bench/results/efficiency/).
"""

from __future__ import annotations

import os

# OpenMP threads that spin while waiting starve the services on a shared CPU, and this process measures the verify
# cost in-process: OpenMP reads the policy when torch loads, so it is set before anything here imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import concurrent.futures  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from bench.core import prom  # noqa: E402
from bench.core.speedup_model import expected_tokens, rate_from_alpha, verify_cost, with_prefill  # noqa: E402
from draft_service.replay import prompt_key, replayed_token, write_replay_file  # noqa: E402
from specdec.runtime.config import ModelConfig, choices, model_dir  # noqa: E402
from devkit.stack import Service, stop_all, wait_serving  # noqa: E402

MODES = {"serial": ["--draft-ahead", "false"], "pipelined": ["--draft-ahead", "true"]}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", type=model_dir, help="target model directory")
    source.add_argument("--config", help="a random-initialised target of this shape (bench.studies.verify_cost "
                                         "CONFIGS: llama-8b, qwen2.5-coder-1.5b, llama-tiny, qwen2-tiny)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="the verifiers' device")
    parser.add_argument("--dtype", default="float32", choices=choices(ModelConfig, "dtype"))
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each verifier (CPU)")
    parser.add_argument("--alphas", default="0.5,0.7,0.9", help="the replay draft's set acceptances")
    parser.add_argument("--ks", default="2,4,8", help="block lengths; `policy` leaves k to the verifier's policy")
    parser.add_argument("--modes", default="serial,pipelined", help="serial, pipelined or both")
    parser.add_argument("--concurrency", default="1", help="streams at a time, e.g. 1,8")
    parser.add_argument("--workloads", default="chat,extraction,sql", help="prompts from these (--model)")
    parser.add_argument("--prompts", type=int, default=3, help="prompts (round-robin over the workloads)")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="--config: random prompts of this length")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="the replay draft's corruption seed (and random prompts)")
    parser.add_argument("--anchor", action="store_true",
                        help="also HF transformers' assisted generation in-process with the same replayed drafts "
                             "(k = 4 or the first fixed k), against its own plain generate")
    parser.add_argument("--out", default="bench/results/efficiency", help="results folder")
    parser.add_argument("--replot", metavar="DIR", help="only redraw DIR/efficiency.{md,png} from its JSON")
    return parser


# ---- the model and its in-process measurements ------------------------------------------------------------------


def load_target(args, work_dir: pathlib.Path):
    """(model dir the services load, the model in-process): a local model, or a random one of --config's shape
    saved to work_dir."""
    from bench.studies.verify_cost import CONFIGS, build_random_model, save_random_model
    from specdec.modeling.models import load_causal_lm

    if args.model:
        return args.model, load_causal_lm(args.model, args.device, args.dtype)
    if args.config not in CONFIGS:
        raise SystemExit(f"--config {args.config!r}: one of {', '.join(sorted(CONFIGS))}")
    import torch

    torch.manual_seed(args.seed)
    model = build_random_model(args.config, args.device, args.dtype)
    return str(save_random_model(model, work_dir / args.config)), model


def prompts(args, tokenizer, vocab_size: int) -> list[list[int]]:
    """The prompts' token ids: workload prompts (chat-formatted, as sent) or, for a random target, random ids."""
    if args.config:
        rng = random.Random(args.seed)
        return [[rng.randrange(3, vocab_size) for _ in range(args.prompt_tokens)] for _ in range(args.prompts)]
    from bench.core.workloads import load_workload

    by_workload = [load_workload(name) for name in args.workloads.split(",")]
    chosen = [by_workload[i % len(by_workload)][i // len(by_workload)] for i in range(args.prompts)]
    return [tokenizer.encode(p.text, add_special_tokens=False) for p in chosen]


def verify_curve(model, args, context: int, ns: list[int]) -> dict:
    """t(n)/t(1) of the target in-process, as the verifier runs it (CPU: linears prepacked)."""
    import torch

    from bench.studies import verify_cost

    if args.device == "cpu":
        if args.threads:
            torch.set_num_threads(args.threads)
        return verify_cost.measure_for_run(model, context, ns, repeats=24, warmup=2)
    curve = verify_cost.measure(model, args.device, context, ns, repeats=10, warmup=3)
    return {"source": "measured in-process at the start of this run", "repeats": 10, **curve}


# ---- the stack: one replay draft, a serial and a pipelined verifier, a gateway each --------------------------------


class Stack:
    """The services as real processes. The draft can restart at another alpha on the same ports; the verifiers
    reconnect to it."""

    def __init__(self, target_dir: str, args, replay_path: pathlib.Path, log_dir: pathlib.Path, modes: list[str]):
        self.target_dir, self.args, self.replay_path, self.log_dir = target_dir, args, replay_path, log_dir
        self.services: list[Service] = []
        try:
            self.draft = self._draft(args.alphas_list[0])
            self.verifiers, self.gateways = {}, {}
            env = {"OMP_WAIT_POLICY": "PASSIVE"}
            for mode in modes:
                verifier_args = ["--model", target_dir, "--device", args.device, "--dtype", args.dtype,
                                 "--draft", self.draft.address, "--draft-timeout-ms", "2000", *MODES[mode]]
                if args.device == "cpu":
                    verifier_args += ["--threads", str(args.threads)]
                self.verifiers[mode] = self._start("verifier_service", verifier_args, env)
            for mode, verifier in self.verifiers.items():
                self.gateways[mode] = self._start("gateway", [
                    "--model", target_dir, "--verifier", verifier.address, "--draft", self.draft.address,
                    "--peer-wait-s", "600"], env)
            for service in self.services:
                self._wait(service)
        except BaseException:
            self.close()  # stop what did start
            raise

    def _start(self, module: str, service_args: list[str], env: dict, port: int = 0, metrics_port: int = 0) -> Service:
        service = Service(module, service_args, env, self.log_dir, port, metrics_port)
        self.services.append(service)
        return service

    @staticmethod
    def _wait(service: Service) -> None:
        try:
            wait_serving(service.address, 600, service.process)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}\n--- {service.module} log ---\n{service.log()[-3000:]}") from exc

    def _draft(self, alpha: float, port: int = 0, metrics_port: int = 0) -> Service:
        return self._start("draft_service", [
            "--model", self.target_dir, "--method", "replay", "--enable-benchmark-drafts", "true",
            "--replay-file", str(self.replay_path), "--replay-acceptance", str(alpha),
            "--replay-seed", str(self.args.seed)], {}, port, metrics_port)

    def restart_draft(self, alpha: float) -> None:
        """The draft at another alpha (it rereads the replay file), on the same ports."""
        port, metrics_port = self.draft.port, self.draft.metrics_port
        self.draft.stop()
        self.services.remove(self.draft)
        self.draft = self._draft(alpha, port, metrics_port)
        self._wait(self.draft)

    def close(self) -> None:
        stop_all(self.services)


@contextlib.contextmanager
def running(target_dir: str, args, replay_path: pathlib.Path, log_dir: pathlib.Path, modes: list[str]):
    stack = Stack(target_dir, args, replay_path, log_dir, modes)
    try:
        yield stack
    finally:
        stack.close()


# ---- requests ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """One request through a gateway."""

    tokens: list[int]
    wall_s: float
    ttft_s: float
    rounds: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = dataclasses.field(default_factory=list)


def generate(address: str, prompt_ids: list[int], max_tokens: int, k: int | None) -> Run:
    import grpc

    from specdec.v1 import gateway_pb2, gateway_pb2_grpc

    request = gateway_pb2.GenerateRequest(prompt_token_ids=gateway_pb2.TokenIds(ids=prompt_ids),
                                          max_tokens=max_tokens, temperature=0.0)
    if k is not None:
        request.num_speculative_tokens = k
    tokens, ttft, last = [], None, None
    with grpc.insecure_channel(address) as channel:
        started = time.perf_counter()
        for piece in gateway_pb2_grpc.GatewayStub(channel).GenerateStream(request, timeout=600):
            if ttft is None and piece.token_ids:
                ttft = time.perf_counter() - started
            tokens.extend(piece.token_ids)
            last = piece
        wall = time.perf_counter() - started
    stats = last.speculation
    return Run(tokens, wall, ttft if ttft is not None else wall, stats.num_rounds, stats.num_drafts,
               stats.num_draft_tokens, stats.num_accepted_tokens, list(stats.accepted_per_position))


def run_turn(gateway: Service, verifier: Service, turn: list[list[int]], max_tokens: int, k: int | None) -> dict:
    """A turn's prompts at once through one gateway; the requests, the turn's wall time, and the verifier's
    forward and draft-wait time over the turn (Prometheus histogram deltas)."""
    before = prom.scrape(verifier.metrics_port)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(turn)) as pool:
        runs = list(pool.map(lambda ids: generate(gateway.address, ids, max_tokens, k), turn))
    wall = time.perf_counter() - started
    after = prom.scrape(verifier.metrics_port)
    forward_s, forward_count = prom.histogram_delta(before, after, "specdec_verify_forward_seconds")
    wait_s, _ = prom.histogram_delta(before, after, "specdec_draft_wait_seconds")
    return {"runs": runs, "wall_s": wall, "forward_s": forward_s, "forward_count": forward_count, "wait_s": wait_s}


# ---- the arithmetic ----------------------------------------------------------------------------------------------


def alpha_hat(accepted: int, drafts: int, accepted_per_position: list[int], k: int) -> float | None:
    """The model's alpha measured: P(a draft token is accepted | the ones before it were), pooled over positions.

    Each drafted round is a run of accepted tokens ended by a rejection, unless all k were accepted: alpha^ =
    accepted / (accepted + rejections), rejections = drafts - rounds with all k accepted (the per-position counter
    at position k - 1). Rounds whose block was cut short of k (the last of a request, near max_tokens) and were
    accepted whole count as a rejection: at most one per request. None without a drafted round."""
    if not drafts:
        return None
    full = accepted_per_position[k - 1] if 0 < k <= len(accepted_per_position) else 0
    trials = accepted + drafts - full
    return accepted / trials if trials else None


def tokens_per_s(turns: list[dict], concurrency: int) -> float:
    """One stream's tokens/s (tokens over request time); with several streams, aggregate (over the turns' wall)."""
    tokens = sum(len(r.tokens) for t in turns for r in t["runs"])
    seconds = (sum(r.wall_s for t in turns for r in t["runs"]) if concurrency == 1
               else sum(t["wall_s"] for t in turns))
    return tokens / seconds if seconds else 0.0


def split(turns: list[dict]) -> dict:
    """A cell's round, split: forward, draft wait and the rest ("transport") per round, in seconds.

    A round's wall time is taken after the first tokens arrive (prefill and the first round are the time to first
    token): (wall - ttft) / (rounds - 1) per request, pooled."""
    runs = [r for t in turns for r in t["runs"]]
    rounds = sum(r.rounds for r in runs)
    decode_wall = sum(r.wall_s - r.ttft_s for r in runs)
    decode_rounds = sum(max(0, r.rounds - 1) for r in runs)
    forward_count = sum(t["forward_count"] for t in turns)
    forward = sum(t["forward_s"] for t in turns) / forward_count if forward_count else 0.0
    wait = sum(t["wait_s"] for t in turns) / rounds if rounds else 0.0
    round_wall = decode_wall / decode_rounds if decode_rounds else 0.0
    wall = sum(r.wall_s for r in runs)
    return {"rounds": rounds, "forward_s": forward, "draft_wait_s": wait, "round_s": round_wall,
            "transport_s": max(0.0, round_wall - forward - wait),
            "prefill_share": sum(r.ttft_s for r in runs) / wall if wall else 0.0}


def predict(alpha: float, k: int, curve: dict[int, float] | None, t1: float, wait: float, transport: float,
            transport_off: float, prefill_share: float, forward_ratio: float | None = None) -> dict:
    """The speedup model from the measured times: E(alpha, k) (1 + rho_off) / (w / t1 + v(k + 1) + rho), prefill's
    share kept as is; `ideal`, the same with no split costs; and `predicted_stack`, the same with v(k + 1) the
    forward's cost in the stack (forward / t1) instead of the in-process curve's, which leaves only the round's
    accounting (E, the wait, the transport) to explain the speedup."""
    e = expected_tokens(alpha, k)
    v = verify_cost(curve, k + 1)
    rho, rho_off, c_k = transport / t1, transport_off / t1, wait / t1
    predicted = with_prefill(e * (1 + rho_off) / (c_k + v + rho), prefill_share)
    ideal = with_prefill(e / v, prefill_share)
    out = {"E": round(e, 3), "v": round(v, 3), "c_k": round(c_k, 3), "rho": round(rho, 3), "rho_off": round(rho_off, 3),
           "predicted": round(predicted, 3), "ideal": round(ideal, 3)}
    if forward_ratio:
        out["predicted_stack"] = round(with_prefill(e * (1 + rho_off) / (c_k + forward_ratio + rho), prefill_share), 3)
    return out


def cell(mode: str, concurrency: int, alpha: float, k: int | None, turns: list[dict], off_turns: list[dict],
         curve: dict[int, float] | None) -> dict:
    """One cell's row: measured speedup, the round split, alpha measured, the prediction and the ratio."""
    runs = [r for t in turns for r in t["runs"]]
    drafts, accepted = sum(r.drafts for r in runs), sum(r.accepted for r in runs)
    draft_tokens = sum(r.draft_tokens for r in runs)
    longest = max((len(r.accepted_per_position) for r in runs), default=0)
    per_position = [sum(r.accepted_per_position[i] for r in runs if i < len(r.accepted_per_position))
                    for i in range(longest)]
    mine, off = split(turns), split(off_turns)
    speedup = tokens_per_s(turns, concurrency) / tokens_per_s(off_turns, concurrency)
    mean_block = draft_tokens / drafts if drafts else 0.0
    fixed_k = k if k is not None else max(1, round(mean_block))
    measured_alpha = alpha_hat(accepted, drafts, per_position, fixed_k) if k is not None else None
    row = {"mode": mode, "concurrency": concurrency, "alpha": alpha, "k": k if k is not None else "policy",
           "speedup": round(speedup, 3),
           "tokens": sum(len(r.tokens) for r in runs), "requests": len(runs),
           "alpha_measured": round(measured_alpha, 4) if measured_alpha is not None else None,
           "acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens else None,
           "acceptance_rate_model": round(rate_from_alpha(alpha, fixed_k), 4),
           "mean_accepted_length": round(1 + accepted / drafts, 3) if drafts else None,
           "mean_block": round(mean_block, 2), "drafts": drafts, "rounds": mine["rounds"],
           # rounds with no block: a request's last round (k cut to 0), or the draft had nothing: the target left
           # the recording (bf16 near-ties can make its speculative output differ from the recorded plain one)
           "rounds_without_draft": mine["rounds"] - drafts,
           "t1_ms": round(off["forward_s"] * 1e3, 3), "forward_ms": round(mine["forward_s"] * 1e3, 3),
           "forward_ratio": round(mine["forward_s"] / off["forward_s"], 3) if off["forward_s"] else None,
           "draft_wait_ms": round(mine["draft_wait_s"] * 1e3, 3), "transport_ms": round(mine["transport_s"] * 1e3, 3),
           "round_ms": round(mine["round_s"] * 1e3, 3), "off_round_ms": round(off["round_s"] * 1e3, 3),
           "off_transport_ms": round(off["transport_s"] * 1e3, 3), "prefill_share_off": round(off["prefill_share"], 3)}
    return repredict(row, curve) if off["forward_s"] and drafts else row


def repredict(row: dict, curve: dict[int, float] | None) -> dict:
    """A row's prediction and ratios from its measured split and a verify-cost curve (alpha^ where k is fixed;
    the set alpha and the mean block under the policy)."""
    if not row["t1_ms"] or not row["drafts"]:
        return row
    alpha = row["alpha_measured"] if row["alpha_measured"] is not None else row["alpha"]
    k = row["k"] if row["k"] != "policy" else row["mean_block"]
    row.update(predict(alpha, k, curve, row["t1_ms"], row["draft_wait_ms"], row["transport_ms"],
                       row["off_transport_ms"], row["prefill_share_off"], row["forward_ratio"]))
    row["measured_over_predicted"] = round(row["speedup"] / row["predicted"], 3)
    row["measured_over_predicted_stack"] = round(row["speedup"] / row["predicted_stack"], 3)
    row["measured_over_ideal"] = round(row["speedup"] / row["ideal"], 3)
    return row


# ---- the replay draft's acceptance, offline ------------------------------------------------------------------------


def replay_acceptance_check(alphas: list[float], ks: list[int], sequences: int = 200, length: int = 256,
                            vocab_size: int = 49152, seed: int = 0) -> list[dict]:
    """The replay draft (draft_service.replay) driven by a greedy verifier in-process over many positions:
    per (alpha, k), alpha^ (accepted / (accepted + rejections)) and the acceptance rate, against alpha and the
    model's rate. Random continuations stand for the recorded ones; the verifier accepts a proposed token iff it is
    the recorded one and emits the recorded token after the block."""
    from draft_service.replay import ReplayProposer
    from specdec.decoding.sampling import SamplingParams

    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab_size) for _ in range(8)] for _ in range(sequences)]
    continuations = [[rng.randrange(vocab_size) for _ in range(length)] for _ in range(sequences)]
    table = {prompt_key(p): c for p, c in zip(prompts, continuations)}
    rows = []
    for alpha in alphas:
        proposer = ReplayProposer(table, alpha, seed, vocab_size)
        for k in ks:
            accepted = drafted = rejections = 0
            for prompt, continuation in zip(prompts, continuations):
                sequence = proposer.start(prompt, SamplingParams(), False)
                position = 0
                while position < length - 1:
                    block = sequence.propose(min(k, length - 1 - position)).token_ids
                    taken = next((i for i, t in enumerate(block) if t != continuation[position + i]), len(block))
                    accepted, drafted = accepted + taken, drafted + len(block)
                    rejections += taken < len(block)
                    position += taken
                    sequence.update(len(prompt) + position, [continuation[position]])
                    position += 1
            measured = accepted / (accepted + rejections)
            rows.append({"alpha": alpha, "k": k, "alpha_measured": round(measured, 4),
                         "within_0.02": abs(measured - alpha) <= 0.02, "trials": accepted + rejections,
                         "acceptance_rate": round(accepted / drafted, 4),
                         "acceptance_rate_model": round(rate_from_alpha(alpha, k), 4)})
    return rows


# ---- the anchor: HF assisted generation with the same replayed drafts -------------------------------------------


def anchor(model, prompt_list: list[list[int]], max_tokens: int, alpha: float, k: int, seed: int) -> dict:
    """transformers' assisted generation in-process, its candidates the replay draft's (same rule, seed and key),
    over its own plain greedy continuation (its numerics may differ from the service's): tokens/s against plain
    `generate`."""
    import torch
    from transformers.generation.candidate_generator import CandidateGenerator

    vocab = model.config.vocab_size
    device = next(model.parameters()).device

    class ReplayCandidates(CandidateGenerator):
        def __init__(self, prompt_length: int, key: str, continuation: list[int]):
            self.prompt_length, self.key, self.continuation = prompt_length, key, continuation

        def get_candidates(self, input_ids, **kwargs):  # input_ids: [1, length]
            position = input_ids.shape[1] - self.prompt_length
            end = min(position + k, len(self.continuation), max_tokens - 1)
            if position >= end or input_ids[0, self.prompt_length:].tolist() != self.continuation[:position]:
                return input_ids, None
            block = [replayed_token(self.continuation, self.key, p, alpha, seed, vocab) for p in range(position, end)]
            return torch.cat([input_ids, torch.tensor([block], device=input_ids.device)], dim=1), None  # [1, length + n]

    def run(ids: list[int], replay: list[int] | None) -> tuple[list[int], float]:
        inputs = torch.tensor([ids], device=device)  # [1, prompt]
        kwargs = dict(max_new_tokens=max_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
                      pad_token_id=0, eos_token_id=model.generation_config.eos_token_id)
        if replay is not None:
            kwargs["prompt_lookup_num_tokens"] = k  # the assisted path; its candidate generator is replaced
            model._get_candidate_generator = lambda **_: ReplayCandidates(len(ids), prompt_key(ids), replay)
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(inputs, attention_mask=torch.ones_like(inputs), **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        if replay is not None:
            del model._get_candidate_generator
        return out[0, len(ids):].tolist(), seconds

    plain_s = assisted_s = 0.0
    tokens = same = 0
    run(prompt_list[0], None)  # warm-up
    for ids in prompt_list:
        plain, seconds = run(ids, None)
        plain_s += seconds
        assisted, seconds = run(ids, plain)
        assisted_s += seconds
        tokens += len(plain)
        same += assisted == plain
    return {"alpha": alpha, "k": k, "tokens": tokens, "plain_tokens_per_s": round(tokens / plain_s, 2),
            "assisted_tokens_per_s": round(tokens / assisted_s, 2), "speedup": round(plain_s / assisted_s, 3),
            "outputs_equal": f"{same}/{len(prompt_list)}"}


# ---- the sweep ---------------------------------------------------------------------------------------------------


def record(stack: Stack, mode: str, prompt_list: list[list[int]], max_tokens: int, path: pathlib.Path) -> list:
    """Each prompt's greedy continuation with speculation off, through the stack, written as the replay file."""
    continuations = [generate(stack.gateways[mode].address, ids, max_tokens, 0).tokens for ids in prompt_list]
    write_replay_file(path, zip(prompt_list, continuations))
    return continuations


def warm(stack: Stack, prompt_list: list[list[int]], tries: int = 40) -> None:
    """After a (re)start: every verifier gets drafts from the new draft (its channel has reconnected)."""
    for mode in stack.verifiers:
        for _ in range(tries):
            if generate(stack.gateways[mode].address, prompt_list[0], 8, 2).drafts:
                break
            time.sleep(0.25)
        else:
            raise RuntimeError(f"the {mode} verifier got no drafts from the replay draft after {tries} tries")


def sweep(args, stack: Stack, prompt_list: list[list[int]], curve, result: dict, out: pathlib.Path) -> None:
    from tqdm import tqdm

    ks = args.ks_list
    runs = [(mode, k) for mode in stack.verifiers for k in [0, *ks]]
    turns_of = {c: ([[ids] for ids in prompt_list] if c == 1
                    else [[prompt_list[i % len(prompt_list)] for i in range(c)]]) for c in args.concurrency_list}
    total = len(args.alphas_list) * args.repeats * sum(len(t) for t in turns_of.values()) * len(runs)
    n = 0
    with tqdm(total=total, desc="efficiency", unit="run") as progress:
        for alpha in args.alphas_list:
            stack.restart_draft(alpha)
            warm(stack, prompt_list)
            measured: dict[tuple, list[dict]] = {}
            for _ in range(args.repeats):
                for concurrency, turns in turns_of.items():
                    for turn in turns:
                        order = runs[n % len(runs):] + runs[:n % len(runs)]  # rotate which runs first
                        n += 1
                        for mode, k in order:
                            measured.setdefault((mode, concurrency, k), []).append(run_turn(
                                stack.gateways[mode], stack.verifiers[mode], turn, args.max_tokens,
                                None if k == "policy" else k))
                            progress.update(1)
            for mode in stack.verifiers:
                for concurrency in turns_of:
                    for k in ks:
                        result["rows"].append(cell(mode, concurrency, alpha, None if k == "policy" else k,
                                                   measured[(mode, concurrency, k)], measured[(mode, concurrency, 0)],
                                                   curve))
            write(result, out)  # what is done so far survives a timeout


def parse_lists(args) -> None:
    args.alphas_list = [float(a) for a in args.alphas.split(",")]
    args.ks_list = [k if k == "policy" else int(k) for k in args.ks.split(",")]
    args.concurrency_list = [int(c) for c in args.concurrency.split(",")]
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES) or not modes:
        raise SystemExit(f"--modes {args.modes!r}: serial, pipelined or both")
    args.modes_list = modes
    if any(not 0 <= a <= 1 for a in args.alphas_list) or any(k != "policy" and k < 1 for k in args.ks_list):
        raise SystemExit("--alphas must be in [0, 1] and --ks at least 1 (or `policy`)")


def main(argv=None) -> int:
    import torch

    from bench.core.machine import machine_info
    from specdec.modeling.models import load_tokenizer

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.replot:
        write(json.loads((pathlib.Path(args.replot) / "efficiency.json").read_text()), pathlib.Path(args.replot))
        return 0
    if not (args.model or args.config):
        parser.error("one of --model or --config is required")
    parse_lists(args)
    # `timeout` (tools/gpu_check.sh) sends SIGTERM: leave through the finally blocks, which stop the services
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for, but torch sees no CUDA device")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-efficiency-") as work:
        work_dir = pathlib.Path(work)
        target_dir, model = load_target(args, work_dir)
        prompt_list = prompts(args, load_tokenizer(target_dir), model.config.vocab_size)
        fixed = [k for k in args.ks_list if k != "policy"]
        ns = sorted({1, *(k + 1 for k in fixed), *([2, 3, 5, 9, 17] if "policy" in args.ks_list else [])})
        context = sum(map(len, prompt_list)) // len(prompt_list) + args.max_tokens // 2
        curve_record = verify_curve(model, args, context, ns)
        curve = {int(n): float(v) for n, v in curve_record["ratio"].items()}
        result = {
            "what": "measured speedup over off against the speedup model's prediction, per (mode, concurrency, "
                    "alpha, k), with the replay draft (independent per-token corruption)",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": "python -m bench efficiency " + " ".join(argv if argv is not None else sys.argv[1:]),
            "target": args.model or f"{args.config} (random init)", "device": args.device, "dtype": args.dtype,
            "device_name": torch.cuda.get_device_name() if args.device == "cuda" else None,
            "params": sum(p.numel() for p in model.parameters()), "prompts": len(prompt_list),
            "prompt_tokens_mean": context - args.max_tokens // 2, "max_tokens": args.max_tokens,
            "repeats": args.repeats, "seed": args.seed,
            "machine": machine_info(args.threads, os.environ.get("OMP_WAIT_POLICY", "default")), "verify_cost": curve_record,
            "replay_check": replay_acceptance_check(args.alphas_list, fixed or [4], sequences=60, length=200,
                                                    vocab_size=model.config.vocab_size, seed=args.seed),
            "rows": [], "anchor": [],
        }
        replay_path = work_dir / "replay.jsonl"
        replay_path.write_text("")
        log_dir = out / "logs"
        log_dir.mkdir(exist_ok=True)
        with running(target_dir, args, replay_path, log_dir, args.modes_list) as stack:
            continuations = record(stack, args.modes_list[0], prompt_list, args.max_tokens, replay_path)
            result["continuation_tokens"] = [len(c) for c in continuations]
            (out / "replay.jsonl").write_text(replay_path.read_text())
            sweep(args, stack, prompt_list, curve, result, out)
        # the curve again now the services are stopped: the predictions use the mean of the two (a shared machine's
        # load moves a single curve)
        after = verify_curve(model, args, context, ns)
        curve = {n: round((v + float(after["ratio"][str(n)])) / 2, 3) for n, v in curve.items()}
        result["verify_cost"] = {**curve_record, "ratio": {str(n): v for n, v in curve.items()},
                                 "before": curve_record, "after": after,
                                 "statistic": "mean of the ratios measured before and after the sweep"}
        result["rows"] = [repredict(row, curve) for row in result["rows"]]
        if args.anchor:
            k = 4 if 4 in fixed or not fixed else fixed[0]
            result["anchor"] = [anchor(model, prompt_list, args.max_tokens, alpha, k, args.seed)
                                for alpha in args.alphas_list]
    result["machine"]["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["wall_s"] = round(time.perf_counter() - started, 1)
    write(result, out)
    print(markdown(result))
    print(f"wrote {out / 'efficiency.json'}, efficiency.md and efficiency.png")
    return 0


# ---- reports -----------------------------------------------------------------------------------------------------


def write(result: dict, out: pathlib.Path) -> None:
    (out / "efficiency.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "efficiency.md").write_text(markdown(result) + "\n")
    if result["rows"]:
        try:
            plot(result, out / "efficiency.png")
        except ImportError as exc:  # a GPU host may have torch and transformers but not matplotlib
            print(f"no plot: {exc}; `python -m bench efficiency --replot {out}` draws it where matplotlib is")


def _f(value, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown(result: dict) -> str:
    machine = result["machine"]
    lines = [f"# Efficiency surface: {result['target']}, {result['dtype']} on {result['device_name'] or machine['cpu']}",
             "", f"`{result['command']}`", "",
             f"Machine: {machine['cpu']}, {machine['cores']} cores, flags {', '.join(machine['cpu_flags'])}, torch "
             f"{machine['torch']}, load average {machine['load_avg_start']} at the start"
             + (f", {machine['load_avg_end']} at the end" if "load_avg_end" in machine else "") + ".",
             f"Prompts: {result['prompts']} ({result['prompt_tokens_mean']} tokens on average), max_tokens "
             f"{result['max_tokens']}, {result['repeats']} repeats. Verify cost t(n)/t(1) in-process: "
             + ", ".join(f"{n}: {v}" for n, v in result["verify_cost"]["ratio"].items()) + ".", "",
             "The replay draft's acceptance, offline (a greedy verifier in-process over many positions):", "",
             "| alpha | k | alpha measured | within 0.02 | acceptance rate | model's rate |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['alpha']} | {r['k']} | {r['alpha_measured']:.4f} | {'yes' if r['within_0.02'] else 'NO'} | "
              f"{r['acceptance_rate']:.3f} | {r['acceptance_rate_model']:.3f} |" for r in result["replay_check"]]
    lines += ["", "Through the stack (speedup over off on the same verifier; times per round in ms; predicted = "
              "E(alpha^, k) (1 + rho_off) / (w/t1 + v(k+1) + rho), prefill kept; ideal = E / v(k+1); 'with it': v(k+1) = the stack's forward / t1):", "",
              "| mode | streams | alpha | k | alpha^ | rate | speedup | predicted | measured/predicted | ideal | "
              "v(k+1) curve | forward/t1 stack | measured/predicted with it | t1 | forward | draft wait | transport | "
              "off transport |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(
            f"| {r['mode']} | {r['concurrency']} | {r['alpha']} | {r['k']} | {_f(r['alpha_measured'], '.3f')} | "
            f"{_f(r['acceptance_rate'], '.3f')} | {r['speedup']:.3f}x | {_f(r.get('predicted'), '.3f', 'x')} | "
            f"**{_f(r.get('measured_over_predicted'), '.3f')}** | {_f(r.get('ideal'), '.3f', 'x')} | "
            f"{_f(r.get('v'), '.3f')} | {_f(r['forward_ratio'], '.3f')} | "
            f"{_f(r.get('measured_over_predicted_stack'), '.3f')} | {r['t1_ms']:.1f} | {r['forward_ms']:.1f} | {r['draft_wait_ms']:.2f} | {r['transport_ms']:.2f} | "
            f"{r['off_transport_ms']:.2f} |")
    if result.get("anchor"):
        lines += ["", "Anchor: HF transformers' assisted generation in-process, the same replayed drafts:", "",
                  "| alpha | k | plain tok/s | assisted tok/s | speedup | outputs equal |", "|---|---|---|---|---|---|"]
        lines += [f"| {a['alpha']} | {a['k']} | {a['plain_tokens_per_s']} | {a['assisted_tokens_per_s']} | "
                  f"{a['speedup']:.3f}x | {a['outputs_equal']} |" for a in result["anchor"]]
    return "\n".join(lines)


def plot(result: dict, path: pathlib.Path) -> None:
    """Heatmaps of measured/predicted per (alpha, k), one column per (mode, streams), the measured speedup written in
    each cell: the top row with the in-process verify-cost curve, the bottom row with the stack's own forward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r.get("measured_over_predicted") is not None]
    if not rows:
        return
    panels = sorted({(r["mode"], r["concurrency"]) for r in rows}, key=lambda p: (p[1], p[0] != "serial"))
    alphas = sorted({r["alpha"] for r in rows})
    ks = list(dict.fromkeys(r["k"] for r in rows))
    ratios = [("measured_over_predicted", "v(k+1) from the in-process curve"),
              ("measured_over_predicted_stack", "v(k+1) = the stack's forward / t1")]
    fig, axes = plt.subplots(2, len(panels), figsize=(3.9 * len(panels) + 1, 6.8), squeeze=False)
    for row_index, (line_axes, (key, what)) in enumerate(zip(axes, ratios)):
        for col, (ax, (mode, concurrency)) in enumerate(zip(line_axes, panels)):
            grid = [[next((r for r in rows if r["mode"] == mode and r["concurrency"] == concurrency
                           and r["alpha"] == a and r["k"] == k), None) for k in ks] for a in alphas]
            values = [[c.get(key, float("nan")) if c else float("nan") for c in line] for line in grid]
            image = ax.imshow(values, cmap="RdYlGn", vmin=0.6, vmax=1.2, origin="lower")
            for i, line in enumerate(grid):
                for j, c in enumerate(line):
                    if c and c.get(key) is not None:
                        ax.text(j, i, f"{c[key]:.2f}\n({c['speedup']:.2f}x)", ha="center", va="center", fontsize=8)
            ax.set_xticks(range(len(ks)), [str(k) for k in ks])
            ax.set_yticks(range(len(alphas)), [str(a) for a in alphas])
            if row_index == len(ratios) - 1:
                ax.set_xlabel("k")
            if col == 0:
                ax.set_ylabel(f"alpha (set)\n{what}", fontsize=8)
            ax.set_title(f"{mode}, {concurrency} stream{'s' if concurrency > 1 else ''}", fontsize=10)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="measured / predicted")
    fig.suptitle(f"measured/predicted (measured speedup over off): {result['target']}, {result['dtype']}, "
                 f"{result['device_name'] or result['machine']['cpu']}", fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
