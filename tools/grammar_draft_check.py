"""The grammar as a drafter on schema-constrained workloads: off, suffix, grammar, grammar + suffix, and the same
requests unconstrained.

Four stacks up at once: suffix with --grammar-draft off, --method grammar, suffix with the grammar (the default),
and a second suffix with --grammar-draft off that serves the unconstrained requests (so its cache learns only
unconstrained outputs). For each prompt of each --workload (a workload whose lines carry a "schema":
extraction, agent_loop, function_calling), greedy, the line's schema as a strict JSON Schema constraint, after one
warm-up request per stack (the same on each, at a fixed k): speculation off (k = 0) constrained and unconstrained,
then the four drafts at adaptive k (three constrained, suffix unconstrained), their order rotating from prompt to
prompt. Before a prompt's runs, each stack serves it once for 2 tokens (with its schema where the stack serves
constrained requests), so that the schema's one-time compile, cached by its hash, is not timed as decoding (the
suffix stacks' caches learn those 2 tokens as a finished output, alike on each). Every
constrained output must be the constrained plain run's, and the unconstrained suffix run's the unconstrained plain
run's.

Prints a JSON line per run and, per workload, each mode's tokens/s summed over the prompts, its ratio to off, its
draft tokens verified, accepted and forced (of those verified, the ones the grammar forced), the share of the
output that came as accepted forced tokens (grammar alone: all its drafts are forced), the share of outputs that
parse and validate against the schema, and the ratios grammar + suffix / suffix and constrained / unconstrained
speculation, the latter also on the same text alone (`same_text`: the prompts whose unconstrained plain output is
the constrained one). --out writes it all with the machine (CPU model and flags). The machine may be shared: quote the
figures with that.

    python -m tools.grammar_draft_check --model .cache/models/smollm2-135m-instruct --prompts 8 \\
        --workload extraction,agent_loop,function_calling --out bench/results/grammar/speed.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import statistics
import tempfile
import time

import grpc
import jsonschema

from bench.core.machine import machine_info
from bench.core.workloads import SCHEMA_WORKLOADS, load_workload
from devkit.stack import running_stack
from specdec.v1 import gateway_pb2_grpc
from tools import pair_check
from tools.pair_check import cpu

# stack -> (--method, extra draft flags)
STACKS = {"suffix": ("suffix", ["--grammar-draft", "off"]), "grammar": ("grammar", []),
          "grammar+suffix": ("suffix", []), "free": ("suffix", ["--grammar-draft", "off"])}
# mode -> (stack, constrained, k): k None is adaptive
MODES = {"off": ("suffix", True, 0), "suffix": ("suffix", True, None), "grammar": ("grammar", True, None),
         "grammar+suffix": ("grammar+suffix", True, None),
         "off unconstrained": ("free", False, 0), "suffix unconstrained": ("free", False, None)}
SPECULATIVE = ("suffix", "grammar", "grammar+suffix", "suffix unconstrained")


def valid(text: str, schema: dict) -> bool:
    """The output parses as JSON and validates against the schema."""
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def run_mode(stub, prompt, mode: str, tokenizer) -> dict:
    _, constrained, k = MODES[mode]
    result = pair_check.run(stub, prompt.text, prompt.max_tokens, k, prompt.constraint() if constrained else None,
                            chat=False)
    result["valid"] = valid(tokenizer.decode(result["tokens"], skip_special_tokens=True), prompt.schema)
    return result


def summarize(runs: list[dict]) -> dict:
    """Per mode: tokens/s summed over the prompts and its ratio to off; the median of the per-prompt ratios (steadier
    on a machine whose load swings); the rounds (target forwards) and tokens per round, which no load changes."""
    summary = {}
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        tokens, seconds = sum(r["output_tokens"] for r in mine), sum(r["seconds"] for r in mine)
        drafted, accepted, forced, rounds = (sum(r[key] for r in mine)
                                             for key in ("drafted", "accepted", "forced", "rounds"))
        summary[mode] = {"tok_s": round(tokens / seconds, 3), "output_tokens": tokens, "rounds": rounds,
                         "tokens_per_round": round(tokens / rounds, 3),
                         "median_prompt_vs_off": round(statistics.median(r["vs_off"] for r in mine), 3),
                         "drafted": drafted, "accepted": accepted, "forced": forced,
                         "forced_share": round(forced / tokens, 3),
                         "valid_share": round(sum(r["valid"] for r in mine) / len(mine), 3),
                         "identical": all(r["identical"] for r in mine)}
    for mode in MODES:
        off = "off unconstrained" if mode.endswith("unconstrained") else "off"
        summary[mode]["vs_off"] = round(summary[mode]["tok_s"] / summary[off]["tok_s"], 3)
    # Grammar alone drafts nothing but forced tokens: its accepted tokens are the output the grammar forced.
    summary["grammar"]["accepted_forced_share"] = round(
        summary["grammar"]["accepted"] / summary["grammar"]["output_tokens"], 3)
    summary["same_text"] = same_text_ratios(runs)
    summary["ratios"] = {
        "grammar+suffix / suffix": round(summary["grammar+suffix"]["tok_s"] / summary["suffix"]["tok_s"], 3),
        "grammar / suffix": round(summary["grammar"]["tok_s"] / summary["suffix"]["tok_s"], 3),
        "grammar+suffix / suffix unconstrained": round(
            summary["grammar+suffix"]["tok_s"] / summary["suffix unconstrained"]["tok_s"], 3),
        "suffix / suffix unconstrained": round(summary["suffix"]["tok_s"] / summary["suffix unconstrained"]["tok_s"],
                                               3),
        "off / off unconstrained": round(summary["off"]["tok_s"] / summary["off unconstrained"]["tok_s"], 3),
        # the same comparisons by target forwards per output token (rounds / tokens): what no load swing changes
        "rounds: grammar+suffix / suffix": round(summary["grammar+suffix"]["tokens_per_round"]
                                                 / summary["suffix"]["tokens_per_round"], 3),
        "rounds: grammar+suffix / suffix unconstrained": round(summary["grammar+suffix"]["tokens_per_round"]
                                                               / summary["suffix unconstrained"]["tokens_per_round"], 3),
        "median prompt: grammar+suffix / suffix": round(summary["grammar+suffix"]["median_prompt_vs_off"]
                                                        / summary["suffix"]["median_prompt_vs_off"], 3)}
    return summary


def same_text_ratios(runs: list[dict]) -> dict:
    """Constrained against unconstrained speculation on the same text: only the prompts whose unconstrained plain
    output is the constrained one, token for token (the model followed the schema by itself), so that both
    decode the same tokens and only the constraint differs. Tokens/s summed over those prompts, and their count."""
    same = {r["prompt"] for r in runs if r["mode"] == "off" and r.get("same_text")}
    rate = {}
    for mode in ("off", "off unconstrained", "suffix", "grammar+suffix", "suffix unconstrained"):
        mine = [r for r in runs if r["mode"] == mode and r["prompt"] in same]
        seconds = sum(r["seconds"] for r in mine)
        rate[mode] = sum(r["output_tokens"] for r in mine) / seconds if seconds else None

    def ratio(a: str, b: str) -> float | None:
        return round(rate[a] / rate[b], 3) if rate[a] and rate[b] else None

    return {"prompts": len(same), "grammar+suffix / suffix unconstrained": ratio("grammar+suffix",
                                                                               "suffix unconstrained"),
            "suffix / suffix unconstrained": ratio("suffix", "suffix unconstrained"),
            "off / off unconstrained": ratio("off", "off unconstrained")}


def markdown(summaries: dict) -> str:
    """One table row per workload and mode: tokens/s and ratio to off, median per-prompt ratio, tokens per round,
    forced tokens, validity."""
    lines = ["| workload | mode | tok/s | vs off | median prompt vs off | tokens / round | draft tokens (forced) "
             "| accepted | valid |", "|---|---|---:|---:|---:|---:|---|---:|---:|"]
    for name, summary in summaries.items():
        for mode in MODES:
            r = summary[mode]
            lines.append(f"| {name} | {mode} | {r['tok_s']:.1f} | {r['vs_off']:.2f} | {r['median_prompt_vs_off']:.2f} | "
                         f"{r['tokens_per_round']:.2f} | {r['drafted']} ({r['forced']}) | {r['accepted']} | "
                         f"{r['valid_share']:.0%} |")
    return "\n".join(lines)


def grammar_over_suffix_model(record: dict) -> list[str]:
    """Per workload, the speedup model's grammar + suffix over suffix (bench/replay/grammar_rounds.py, as the advisor
    predicts it): suffix's measured rounds, the grammar's forced tokens (grammar alone's share, run and acceptance)
    drafted in suffix's rounds without a draft; and the ceiling, were every such round to vanish. Where verifying a
    block costs about one step (t(k)/t(1) near 1), the speedup ratio is the ratio of tokens per round."""
    from bench.replay.grammar_rounds import ForcedTokens, with_grammar

    lines = []
    for name, summary in record["summaries"].items():
        rows = record["runs"][name]
        suffix, grammar = summary["suffix"], summary["grammar"]
        drafts = sum(r["drafts"] for r in rows if r["mode"] == "suffix")
        grammar_drafts = sum(r["drafts"] for r in rows if r["mode"] == "grammar")
        forced = ForcedTokens(share=grammar["accepted"] / grammar["output_tokens"],
                              run=grammar["drafted"] / max(1, grammar_drafts),
                              acceptance=grammar["accepted"] / max(1, grammar["drafted"]))
        base = {0: float(suffix["rounds"] - drafts), suffix["drafted"] / max(1, drafts): float(drafts)}
        predicted = suffix["rounds"] / sum(with_grammar(suffix["output_tokens"], base, forced, k=8).values())
        lines.append(f"{name}: suffix {suffix['rounds']} rounds, {suffix['rounds'] - drafts} without a draft; grammar "
                     f"forced share {forced.share:.2f}, run {forced.run:.1f}, accepted {forced.acceptance:.2f}; "
                     f"grammar+suffix / suffix by tokens per round: model {predicted:.2f}x, measured "
                     f"{summary['ratios']['rounds: grammar+suffix / suffix']:.2f}x, ceiling {suffix['rounds'] / drafts:.2f}x")
    return lines


def resummarize(path: pathlib.Path) -> int:
    """Recompute the summaries of a written run from its rows (a row without output_tokens: tok_s x seconds)."""
    record = json.loads(path.read_text())
    for rows in record["runs"].values():
        for row in rows:
            row.setdefault("output_tokens", round(row["tok_s"] * row["seconds"]))
    record["summaries"] = {name: summarize(rows) for name, rows in record["runs"].items()}
    path.write_text(json.dumps(record, indent=1) + "\n")
    for name, summary in record["summaries"].items():
        print(json.dumps({"workload": name, "summary": summary}))
    print(markdown(record["summaries"]))
    print("\n".join(grammar_over_suffix_model(record)))
    return 0


def main(argv=None) -> int:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="target model directory (its tokenizer for the drafts)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each verifier")
    parser.add_argument("--workload", default="extraction",
                        help=f"comma-separated workloads whose lines carry a schema ({', '.join(SCHEMA_WORKLOADS)})")
    parser.add_argument("--prompts", type=int, default=8, help="how many of each workload's prompts (its first)")
    parser.add_argument("--max-tokens", type=int, default=0, help="cap each request's max_tokens (0: the workload's)")
    parser.add_argument("--out", default="")
    parser.add_argument("--summarize", default="", help="only recompute the summaries of a file this wrote, in place")
    args = parser.parse_args(argv)
    if args.summarize:
        return resummarize(pathlib.Path(args.summarize))
    workloads = {name: load_workload(name, args.prompts, args.max_tokens or None)
                 for name in (w.strip() for w in args.workload.split(",")) if name}
    for name, prompts in workloads.items():
        if any(p.schema is None for p in prompts):
            parser.error(f"workload {name}: every line needs a 'schema' (shipped: {', '.join(SCHEMA_WORKLOADS)})")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    print(f"cpu: {cpu()}", flush=True)
    env = {"OMP_WAIT_POLICY": "PASSIVE"}
    rotation = SPECULATIVE
    runs: dict[str, list[dict]] = {name: [] for name in workloads}
    with tempfile.TemporaryDirectory() as logs, contextlib.ExitStack() as stacks:
        started = time.monotonic()
        services = {name: stacks.enter_context(running_stack(
            args.model, method=method, verifier_args=["--threads", str(args.threads)], draft_args=flags, env=env,
            timeout_s=600, log_dir=pathlib.Path(logs)))
            for name, (method, flags) in STACKS.items()}
        print(f"stacks SERVING after {time.monotonic() - started:.0f} s", flush=True)
        stubs = {name: gateway_pb2_grpc.GatewayStub(stacks.enter_context(grpc.insecure_channel(s["gateway"].address)))
                 for name, s in services.items()}
        for stub in stubs.values():  # the same warm-up on each stack: first forwards, the verifier's compile
            pair_check.run(stub, "Say hi", 24, 4)  # a fixed k: no evidence for the policy to turn drafting off on
        for name, prompts in workloads.items():
            for i, prompt in enumerate(prompts):
                # the prompt's schema compiled on every stack first (a 2-token request, the same on each): a compile
                # is paid once per schema and cached by its hash, not a cost of the decoding compared
                for stack, stub in stubs.items():
                    pair_check.run(stub, prompt.text, 2, 4, prompt.constraint() if stack != "free" else None,
                                   chat=False)
                plain = {}
                for mode in ("off", "off unconstrained") if i % 2 == 0 else ("off unconstrained", "off"):
                    plain[mode] = run_mode(stubs[MODES[mode][0]], prompt, mode, tokenizer)
                order = [(m, plain[m]) for m in ("off", "off unconstrained")]
                for mode in rotation[i % len(rotation):] + rotation[:i % len(rotation)]:
                    order.append((mode, run_mode(stubs[MODES[mode][0]], prompt, mode, tokenizer)))
                for mode, result in order:
                    base = plain["off" if MODES[mode][1] else "off unconstrained"]
                    row = {"workload": name, "prompt": prompt.id, "mode": mode,
                           "identical": result["tokens"] == base["tokens"], "output_tokens": len(result["tokens"]),
                           "same_text": plain["off"]["tokens"] == plain["off unconstrained"]["tokens"],
                           "vs_off": round(result["tok_s"] / base["tok_s"], 3),
                           **{k: v for k, v in result.items() if k != "tokens"}}
                    print(json.dumps(row), flush=True)
                    runs[name].append({**row, "tokens": result["tokens"]})
    summaries = {name: summarize(rows) for name, rows in runs.items()}
    identical = all(r["identical"] for rows in runs.values() for r in rows)
    for name, summary in summaries.items():
        print(json.dumps({"workload": name, "summary": summary}), flush=True)
    print(markdown(summaries))
    print("greedy output identical to k = 0 on every run" if identical else "OUTPUT DIFFERS", flush=True)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps({
            "model": pathlib.Path(args.model).name, "prompts_per_workload": args.prompts,
            "max_tokens_cap": args.max_tokens or None,
            "machine": machine_info(args.threads, "PASSIVE"), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "identical": identical, "summaries": summaries,
            "schemas": {name: prompts[0].schema for name, prompts in workloads.items()},
            "runs": {name: [{k: v for k, v in r.items() if k != "tokens"} for r in rows]
                     for name, rows in runs.items()}}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
