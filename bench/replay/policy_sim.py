"""The verifier's speculation policy, replayed over known greedy continuations: adaptive k against every fixed k.

python -m bench policy-sim continuations --model DIR --out DIR   (once: the target's greedy outputs)
python -m bench policy-sim compare [--continuations DIR] [--verify-cost FILE]  (default: the shipped ones)
python -m bench policy-sim bound [--continuations DIR] [--verify-cost FILE]    (what any copying draft could reach)
python -m bench policy-sim lengths [--continuations DIR]   (a suffix draft's acceptance by the length of its block)

Greedy verification accepts exactly the longest prefix of a block that matches the target's own
continuation (`bench.replay.loop`), so with the continuations known, every round a request would run is
known too, without the target: the block the proposer returns for the k the policy asks, and how
much of it is accepted. A round's wall time is the speedup model's (specdec/decoding/speedup.py): the
machine's measured verify cost v(k + 1) in target steps, plus the draft's cost and the transport,
with seeded noise so that the policy's running averages see jitter like a real server's. The
policy is the verifier's own class (`verifier_service.speculation.policy`), one server-wide
`RoundCost` per workload and method, requests in the workload's order, as the benchmark plays them.

It answers in seconds what a benchmark run answers in half an hour, and without the run's noise:
whether the adaptive policy reaches the best fixed k (issue 15 asks >= 0.97x) on each workload and
proposer, and where it loses. It does not replace the benchmark: real round times have structure
(cache growth, the draft's cold start) that the model does not.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import random
import sys

from bench.core.paths import RESULTS_DIR
from bench.core.workloads import DEFAULT_WORKLOADS
from bench.replay import loop as replay
from specdec.decoding.draft_block import DraftBlock
from specdec.decoding.speedup import VerifyCurve, round_cost

DEFAULT_FIXED_K = (1, 2, 3, 4, 6, 8)
RESULTS = RESULTS_DIR
DEFAULT_VERIFY_COST = RESULTS / "suffix_fp32" / "latest.json"  # this Xeon in fp32, measured by `python -m bench`
# SmolLM2-135M-Instruct's greedy outputs (fp32, 48 tokens, up to 24 prompts a workload), by `continuations`
SHIPPED_CONTINUATIONS = RESULTS / "policy_sim" / "continuations"


@dataclasses.dataclass
class SimResult:
    tokens: int = 0
    steps: float = 0.0  # wall time in target steps
    drafted: int = 0
    accepted: int = 0
    plain_rounds: int = 0

    @property
    def speedup(self) -> float:
        """Tokens per step against plain decoding's one."""
        return self.tokens / self.steps if self.steps else 0.0


def simulate(runs: list[tuple[list[int], list[int]]], drafts: replay.Drafts, curve: VerifyCurve | None,
             fixed_k: int | None, default_k: int = 4, max_k: int = 16, c: float = 0.0, rho: float = 0.0,
             noise: float = 0.05, seed: int = 0, far_draft: str = "auto") -> SimResult:
    """Run the workload's requests in order through the policy (fixed_k None: adaptive).

    A round goes as in `RequestSpeculation.propose`: the block asked during the last plain step, if the step's
    token was its first (no wait: neither the draft's time nor the transport is paid again); else, where the policy
    steps while a far draft drafts (`step_while_drafting`, far_draft as --far-draft), a plain step that asks for
    k + 1 tokens; else a round that waits for its block."""
    from verifier_service.speculation.policy import RoundCost, SpeculationPolicy

    rng = random.Random(seed)
    cost = RoundCost()
    open_sequence = drafts.new_pass()
    result = SimResult()
    for prompt_ids, continuation in runs:
        policy = SpeculationPolicy(default_k, max_k, fixed_k, cost=cost, draft_sizes_blocks=drafts.sizes_blocks,
                                   far_draft=far_draft)
        sequence = open_sequence(list(prompt_ids))
        pos, end = 0, len(continuation)
        prefetched: tuple[int, DraftBlock] | None = None  # (position asked at, the draft's answer)
        while pos < end:
            k = policy.block_size(end - pos, 1 << 30)
            committed, rest = len(prompt_ids) + pos, continuation[pos:]
            at_hand = DraftBlock.empty()
            if k and prefetched is not None:
                (base, answer), prefetched = prefetched, None
                decoded, drafted = continuation[base:pos], answer.token_ids
                if decoded and drafted:
                    policy.observe_first_token(drafted[0] == decoded[0])
                    if len(decoded) < len(drafted) and drafted[:len(decoded)] == decoded:
                        at_hand = answer.window(len(decoded), k)
                        at_hand = at_hand.cut(policy.cut_block(len(at_hand.token_ids), at_hand.num_chained))
            jitter = rng.lognormvariate(0.0, noise)
            if at_hand.token_ids:
                block, matched = at_hand.token_ids, replay.accept_greedy(at_hand.token_ids, rest)
                emitted = rest[:matched + 1]
                sequence.update(committed, emitted)
                steps = round_cost(len(block), curve) * jitter  # the block was here: no wait
                policy.observe(len(block), matched, steps, num_chained=at_hand.num_chained)
            elif k and policy.step_while_drafting(k):
                prefetched = (pos, sequence.propose(k + 1))
                block, matched, emitted = [], 0, rest[:1]
                sequence.update(committed, emitted)  # the plain step's token; the next sync rolls the answer back
                steps = round_cost(0, curve) * jitter
                policy.observe(0, 0, steps)
            else:
                drafted, matched, emitted = replay.greedy_round(sequence, committed, rest, k, policy.cut_block)
                block = drafted.token_ids
                # A round pays the draft and the transport when it asked the draft, whatever came back.
                steps = round_cost(len(block), curve, c, rho if k else 0.0) * jitter
                # as the verifier times it: an ask with nothing to verify is a plain step, less the wait
                timed = steps if block or not k else round_cost(0, curve) * jitter
                policy.observe(len(block), matched, timed, asked_k=k, num_chained=drafted.num_chained)
                if k:
                    cost.observe_wait((c * len(block) + rho) * jitter)
            result.steps += steps
            result.tokens += len(emitted)
            result.drafted += len(block)
            result.accepted += matched
            result.plain_rounds += not block
            pos += len(emitted)
        sequence.finish()
        sequence.close()
    return result


def load_runs(path: pathlib.Path) -> list[tuple[list[int], list[int]]]:
    return [(list(p), list(c)) for p, c in json.loads(path.read_text())["runs"]]


def load_curve(path: pathlib.Path) -> dict[int, float]:
    """t(n)/t(1) from a benchmark result (its "verify_cost") or a `python -m bench verify-cost` JSON (its first
    curve)."""
    data = json.loads(path.read_text())
    data = data.get("verify_cost", data)
    ratio = data.get("ratio") or (data.get("curves") or [{}])[0].get("ratio")
    if not ratio:
        raise ValueError(f"{path}: no verify-cost ratio in it")
    return {int(n): float(v) for n, v in ratio.items()}


def generate(model_path: str, out: pathlib.Path, workloads: list[str], max_prompts: int, max_tokens: int) -> None:
    """The target's greedy continuation of each workload prompt, one JSON per workload."""
    import torch
    from transformers import AutoModelForCausalLM

    from bench.core.workloads import load_workload
    from bench.replay.advise import greedy_continuations
    from specdec.modeling.models import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    out.mkdir(parents=True, exist_ok=True)
    for workload in workloads:
        prompts = load_workload(workload, max_prompts, max_tokens)
        runs, _, _ = greedy_continuations(model, tokenizer, prompts, tokenizer.eos_token_id)
        (out / f"{workload}.json").write_text(json.dumps({"workload": workload, "ids": [p.id for p in prompts],
                                                          "runs": runs}))
        print(f"{workload}: {len(runs)} prompts", flush=True)


def compare(continuations: pathlib.Path, workloads: list[str], curve: dict[int, float], fixed: tuple[int, ...],
            seeds: int, c: float, rho: float, noise: float, far_draft: str = "auto") -> list[dict]:
    rows = []
    for workload in workloads:
        runs = load_runs(continuations / f"{workload}.json")
        for drafts in (replay.ngram_drafts(), replay.suffix_drafts()):
            def mean(fixed_k):
                results = [simulate(runs, drafts, curve, fixed_k, c=c, rho=rho, noise=noise, seed=s,
                                    far_draft=far_draft) for s in range(seeds)]
                return sum(r.speedup for r in results) / len(results), results[0]
            adaptive, sample = mean(None)
            by_k = {k: mean(k)[0] for k in fixed}
            best = max(by_k, key=by_k.get)
            rows.append({"workload": workload, "method": drafts.name, "adaptive": adaptive, "best_k": best,
                         "best_fixed": by_k[best], "ratio": adaptive / by_k[best], "by_k": by_k,
                         "acceptance": sample.accepted / sample.drafted if sample.drafted else 0.0,
                         "plain_rounds": sample.plain_rounds})
    return rows


def lookup_oracle(runs: list[tuple[list[int], list[int]]], context: int = 0, max_block: int = 16) -> list[list[int]]:
    """For each request, position by position: the longest run of the coming output that was seen before.

    Seen text is every earlier request of the workload (prompt and output), the request's own prompt and
    its output so far. An n-gram or suffix draft proposes a run of seen text, so it can never have more
    accepted at a position than this: the bound holds for every draft that copies, however it matches.
    context > 0: the run must also have followed the last `context` tokens where it was seen: an oracle
    that matches that much context, then always picks the right one of the continuations it finds.
    """
    seen: set[tuple[int, ...]] = set()

    def learn(tokens: list[int], end: int) -> None:  # every run of up to context + max_block tokens ending at `end`
        for m in range(1, context + max_block + 1):
            if end - m >= 0:
                seen.add(tuple(tokens[end - m:end]))

    longest = []
    for prompt_ids, continuation in runs:
        text = list(prompt_ids)
        for end in range(1, len(text) + 1):
            learn(text, end)
        own = []
        for i, token in enumerate(continuation):
            tail = tuple(text[len(text) - context:]) if context else ()
            m = 0
            while m < max_block and i + m < len(continuation) and tail + tuple(continuation[i:i + m + 1]) in seen:
                m += 1
            own.append(m)
            text.append(token)
            learn(text, len(text))
        longest.append(own)
    return longest


def oracle_steps(own: list[int], curve: VerifyCurve | None) -> float:
    """The fewest target steps to emit a continuation when each round may draft up to own[i] tokens, all
    accepted (a round drafting a emits a + 1 at v(a + 1); a = 0 is a plain step). Exact, by dynamic
    programming from the end; no draft cost and no transport."""
    n = len(own)
    best = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        best[i] = min(round_cost(a, curve) + best[i + a + 1] for a in range(0, min(own[i], n - i - 1) + 1))
    return best[0]


def bound(continuations: pathlib.Path, workloads: list[str], curve: dict[int, float],
          contexts: tuple[int, ...] = (0, 1, 2, 4, 6), skip: int = 4) -> list[dict]:
    """Per workload: the copying oracle's speedup at each context length, over all requests and over those
    after the first `skip` (the figure's "after the first 4")."""
    rows = []
    for workload in workloads:
        runs = load_runs(continuations / f"{workload}.json")
        tokens = [len(c) for _, c in runs]
        row = {"workload": workload, "requests": len(runs), "oracle": {}, "oracle_after": {}}
        for context in contexts:
            steps = [oracle_steps(own, curve) for own in lookup_oracle(runs, context)]
            row["oracle"][context] = sum(tokens) / sum(steps)
            row["oracle_after"][context] = sum(tokens[skip:]) / sum(steps[skip:]) if len(runs) > skip else None
        rows.append(row)
    return rows


def acceptance_by_length(runs: list[tuple[list[int], list[int]]], drafts: replay.Drafts, k: int = 16,
                         longest: int = 9) -> dict[int, tuple[int, int, int]]:
    """Every block verified whole at k (`replay.replay`): by its matched length (longer ones counted at `longest`),
    the blocks, and the draft tokens judged and accepted (to the first rejection). The evidence behind
    `RoundCost.by_length`."""
    stats = replay.replay(runs, k, drafts.new_pass())
    counts: dict[int, list[int]] = {}
    for n in sorted(length for length in stats.rounds_by_block if length):
        row = counts.setdefault(min(n, longest), [0, 0, 0])
        row[0] += stats.rounds_by_block[n]
        row[1] += stats.judged_by_block[n]
        row[2] += stats.accepted_by_block[n]
    return {n: (blocks, judged, accepted) for n, (blocks, judged, accepted) in counts.items()}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench policy-sim", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("continuations", help="the target's greedy continuations of the workloads")
    g.add_argument("--model", required=True)
    g.add_argument("--out", required=True, type=pathlib.Path)
    g.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    g.add_argument("--max-prompts", type=int, default=24)
    g.add_argument("--max-tokens", type=int, default=48)
    s = sub.add_parser("compare", help="adaptive k against each fixed k, per workload and proposer")
    s.add_argument("--continuations", type=pathlib.Path, default=SHIPPED_CONTINUATIONS)
    s.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    s.add_argument("--verify-cost", type=pathlib.Path, default=DEFAULT_VERIFY_COST)
    s.add_argument("--fixed-k", type=int, nargs="+", default=list(DEFAULT_FIXED_K))
    s.add_argument("--seeds", type=int, default=5, help="noise draws per configuration")
    s.add_argument("--noise", type=float, default=0.05, help="lognormal sigma of a round's time")
    s.add_argument("--c", type=float, default=0.0, help="draft cost per token, in target steps")
    s.add_argument("--rho", type=float, default=0.03, help="transport per drafted round, in target steps")
    s.add_argument("--far-draft", default="auto", choices=["auto", "wait", "step"],
                   help="the verifier's --far-draft: whether a round may decode a plain step while the draft drafts")
    s.add_argument("--json", type=pathlib.Path, help="also write the rows here")
    b = sub.add_parser("bound", help="the speedup of an oracle that drafts the longest run of seen text the output "
                                     "continues with: the ceiling for n-gram and suffix drafts")
    b.add_argument("--continuations", type=pathlib.Path, default=SHIPPED_CONTINUATIONS)
    b.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    b.add_argument("--verify-cost", type=pathlib.Path, default=DEFAULT_VERIFY_COST)
    b.add_argument("--against", type=pathlib.Path, help="a `compare --json` result: print oracle / n-gram adaptive")
    b.add_argument("--json", type=pathlib.Path, help="also write the rows here")
    n = sub.add_parser("lengths", help="a suffix draft's acceptance by the matched length of its block, at k = 16")
    n.add_argument("--continuations", type=pathlib.Path, default=SHIPPED_CONTINUATIONS)
    n.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "continuations":
        generate(args.model, args.out, args.workloads, args.max_prompts, args.max_tokens)
        return 0
    if args.command == "lengths":
        print("acceptance (accepted / judged draft tokens) of a suffix draft's blocks by their length, "
              "cell = length: acceptance (blocks); 9 = 9 or more")
        for workload in args.workloads:
            rows = acceptance_by_length(load_runs(args.continuations / f"{workload}.json"), replay.suffix_drafts())
            print(f"{workload:<12} " + "  ".join(f"{length}: {accepted / judged:.2f} ({blocks})"
                                                 for length, (blocks, judged, accepted) in rows.items()))
        return 0
    curve = load_curve(args.verify_cost)
    if args.command == "bound":
        return print_bound(bound(args.continuations, args.workloads, curve), curve, args.against, args.json)
    rows = compare(args.continuations, args.workloads, curve, tuple(args.fixed_k), args.seeds, args.c, args.rho,
                   args.noise, args.far_draft)
    print_curve(curve)
    print(f"{'workload':<12} {'method':<7} {'adaptive':>8} {'best k':>6} {'fixed':>6} {'ratio':>6} {'accept':>6}  "
          + " ".join(f"k={k:<4}" for k in args.fixed_k))
    for r in rows:
        flag = "" if r["ratio"] >= 0.97 else "  <0.97"
        print(f"{r['workload']:<12} {r['method']:<7} {r['adaptive']:>8.3f} {r['best_k']:>6} {r['best_fixed']:>6.3f} "
              f"{r['ratio']:>6.3f} {r['acceptance']:>6.2f}  " + " ".join(f"{r['by_k'][k]:<6.3f}" for k in args.fixed_k)
              + flag)
    adaptive = {(r["workload"], r["method"]): r["adaptive"] for r in rows}
    print("suffix / ngram, adaptive (issue 15: >= 1.5 on the repetitive workloads, >= 0.97 on the others): "
          + ", ".join(f"{w} {adaptive[w, 'suffix'] / adaptive[w, 'ngram']:.2f}" for w in args.workloads))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def print_curve(curve: dict[int, float]) -> None:
    print(f"verify cost t(n)/t(1): {', '.join(f'{n}: {v:.2f}' for n, v in sorted(curve.items()))}")


def print_bound(rows: list[dict], curve: dict[int, float], against: pathlib.Path | None,
                out: pathlib.Path | None) -> int:
    measured = {}
    if against:
        measured = {(r["workload"], r["method"]): r["adaptive"] for r in json.loads(against.read_text())}
    contexts = list(rows[0]["oracle"]) if rows else []
    print_curve(curve)
    print("speedup of an oracle that drafts the longest run of seen text the output goes on with, having matched "
          "c tokens of context (all requests / after the first 4)")
    print(f"{'workload':<12} " + " ".join(f"{f'c={c}':>11}" for c in contexts)
          + (f" {'ngram':>6} {'suffix':>6}  c at which the oracle reaches 1.5x ngram" if measured else ""))
    for r in rows:
        cells = []
        for c in contexts:
            after = r["oracle_after"][c]
            cells.append(f"{r['oracle'][c]:.2f}/{after:.2f}" if after else f"{r['oracle'][c]:.2f}/-")
        line = f"{r['workload']:<12} " + " ".join(f"{cell:>11}" for cell in cells)
        ngram, suffix = measured.get((r["workload"], "ngram")), measured.get((r["workload"], "suffix"))
        if ngram and suffix:
            reach = [c for c in contexts if r["oracle"][c] >= 1.5 * ngram]
            r.update(ngram_adaptive=ngram, suffix_adaptive=suffix, longest_context_reaching_1_5x=max(reach, default=None))
            line += f" {ngram:>6.3f} {suffix:>6.3f}  {max(reach) if reach else 'none'}"
        print(line)
    if out:
        out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
