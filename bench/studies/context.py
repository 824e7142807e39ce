"""Does a round cost more at a longer context? Round time and transport overhead at 200 vs 1,500 tokens.

    python -m bench context --model .cache/models/smollm2-135m-instruct [--engine vllm]

Starts the stack (n-gram draft, fixed k), sends prompts of each context length, and reports
per request: the wall time per decode round, and the round's transport overhead (wall time
outside the target's forward passes, from the verifier's histograms; transformers engine only,
since vLLM's steps are batched). Medians over the repeats, interleaved. Writes OUT.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics

from bench.core.methods import StackMethod, add_stack_options, stack_kwargs
from bench.core.workloads import Prompt

FILLER = ("The verifier keeps the target model and its KV cache; each round it scores a block of draft tokens "
          "in one forward pass and keeps the longest prefix the target agrees with. ")


def prompt_of_length(tokenizer, length: int) -> Prompt:
    """A plain-text prompt of about `length` tokens (a repeated paragraph)."""
    ids = tokenizer(FILLER * (length // 20 + 2), add_special_tokens=False)["input_ids"][:length]
    return Prompt("context", str(length), tokenizer.decode(ids), max_tokens=0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_stack_options(parser, repeats=5)
    parser.add_argument("--lengths", default="200,1500")
    parser.add_argument("--ks", default="0,4", help="fixed block sizes; 0 is plain decoding (one token a round)")
    return parser


def main(argv=None) -> int:
    from tqdm import tqdm

    from specdec.modeling.models import load_tokenizer
    from devkit.stack import running_stack

    args = build_parser().parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    tokenizer = load_tokenizer(args.model)
    prompts = [prompt_of_length(tokenizer, n) for n in lengths]
    ks = [int(k) for k in args.ks.split(",")]
    samples: dict[tuple[int, int], list] = {(k, n): [] for k in ks for n in lengths}
    with running_stack(args.model, **stack_kwargs(args)) as services:
        methods = [StackMethod(f"k{k}", services["gateway"].address, services["verifier"].metrics_port, k=k)
                   for k in ks]
        methods[0].run(prompts[0], repeat=-1, max_tokens=8)  # warm-up
        with tqdm(total=args.repeats * len(prompts) * len(ks), desc="context", unit="req") as bar:
            for repeat in range(args.repeats):
                for prompt in (prompts if repeat % 2 == 0 else prompts[::-1]):
                    for method in methods:
                        sample = method.run(prompt, repeat, max_tokens=args.max_tokens)
                        samples[(method.k, int(prompt.id))].append(sample)
                        bar.update(1)
        for method in methods:
            method.close()
    rows = [summarize(k, n, samples[(k, n)], args.engine) for k in ks for n in lengths]
    result = {"what": "decode round time and transport overhead against context length",
              "engine": args.engine, "model": pathlib.Path(args.model).name, "dtype": args.dtype,
              "max_tokens": args.max_tokens, "repeats": args.repeats, "cores": os.cpu_count(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "rows": rows,
              "ratios": {}}
    for k in ks:
        first, last = [r for r in rows if r["k"] == k][0], [r for r in rows if r["k"] == k][-1]
        ratio = {"round": round(last["round_ms_median"] / first["round_ms_median"], 3)}
        if first["transport_overhead_ms_median"] and last["transport_overhead_ms_median"] is not None:
            ratio["overhead"] = round(last["transport_overhead_ms_median"] / first["transport_overhead_ms_median"], 3)
        result["ratios"][f"k={k}"] = ratio
    out = pathlib.Path(args.out or f"bench/results/context_{args.engine}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for row in rows:
        print(row)
    print(f"{lengths[-1]} vs {lengths[0]} tokens: {result['ratios']}; wrote {out}")
    return 0


def summarize(k: int, length: int, runs: list, engine: str) -> dict:
    round_ms = [(s.wall_s - s.ttft_s) / (s.num_rounds - 1) * 1e3 for s in runs if s.num_rounds > 1]
    # vLLM's forward histogram times whole batched steps (with sampling): no per-request overhead to derive
    overhead = [] if engine == "vllm" else [o * 1e3 for o in (s.overhead_per_round_s() for s in runs) if o is not None]
    drafted = [s for s in runs if s.num_drafts]
    return {"k": k, "context_tokens": length, "round_ms_median": round(statistics.median(round_ms), 3),
            "transport_overhead_ms_median": round(statistics.median(overhead), 3) if overhead else None,
            "ttft_ms_median": round(statistics.median(s.ttft_s for s in runs) * 1e3, 1),
            "tokens_per_round": round(statistics.mean(s.completion_tokens / s.num_rounds for s in runs), 3),
            "mean_accepted_length": round(statistics.mean(1 + s.num_accepted_tokens / s.num_drafts
                                                          for s in drafted), 3) if drafted else None}


if __name__ == "__main__":
    raise SystemExit(main())
