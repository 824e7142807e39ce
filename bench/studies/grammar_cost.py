"""What a constrained round costs besides the forward: the grammar's own work per round, against the forward.

Per round that verifies k draft tokens, a constrained request adds to the target's forward (over k + 1 tokens):
- on the verifier (`specdec.decoding.grammar.SequenceGrammar`): the matcher's walk over the block, filling one
  bitmask row per position (`walk`), the mask applied to the k + 1 rows of logits, [k + 1, V] (`mask`), and the
  commit: a rollback of the rejected tokens and the round's own token accepted (`commit`);
- on the draft: its own matcher following the same tokens (the same walk and commit, without the mask) and, where
  the inner draft ends, the jump-forward string (`find_jump_forward_string`).

This times them in process, on the workload's first prompt and its schema, along a valid output the target
itself decodes greedily under the constraint (so the matcher walks the states a real request walks), for
k = 0..max-k, whole blocks accepted and whole blocks rejected, beside the target's forward over k + 1 tokens on a
cached prefix of the prompt's length (`bench.studies.verify_cost.measure_for_run`, prepacked in fp32 as the
verifier runs it). The mask's cost grows with the vocabulary (V / 32 words a row), so a 151,936-token model pays
about three times what a 49,152-token one does.

    python -m bench grammar-cost --model .cache/models/smollm2-135m-instruct \\
        --out bench/results/grammar/cost_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import time

import torch

from bench.core.machine import machine_info
from bench.core.workloads import load_workload
from bench.studies.verify_cost import measure_for_run
from specdec.decoding.grammar import GrammarCompiler
from specdec.modeling.models import load_causal_lm, load_tokenizer


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench grammar-cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="target model directory")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--workload", default="extraction", help="a bench/workloads/*.jsonl whose lines carry a schema")
    parser.add_argument("--max-tokens", type=int, default=64, help="length of the output the matcher walks")
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--passes", type=int, default=20, help="walks along the output per k and outcome")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="", help="JSON to write")
    return parser


@torch.inference_mode()
def constrained_greedy(model, compiler: GrammarCompiler, ids: list[int], constraint, max_tokens: int) -> list[int]:
    """The target's greedy output after the prompt `ids` under the constraint: what a request walks."""
    grammar = compiler.matcher(compiler.compile_now(constraint), constraint)
    input_ids = torch.tensor([ids])  # [1, prompt]
    out: list[int] = []
    past = None
    for _ in range(max_tokens):
        result = model(input_ids=input_ids, past_key_values=past, use_cache=True)
        past = result.past_key_values
        logits = result.logits[0, -1:].float()  # [1, V]
        grammar.walk([])
        grammar.mask(logits)
        token = int(logits.argmax())
        grammar.commit(0, token)
        out.append(token)
        if token in compiler.stop_token_ids or grammar.matcher.is_terminated():
            break
        input_ids = torch.tensor([[token]])  # [1, 1]
    return out


def time_rounds(compiler: GrammarCompiler, compiled, constraint, output: list[int], k: int, accepted: bool,
                passes: int, vocab_size: int) -> dict:
    """Mean milliseconds a round, verifier side (walk + mask + commit) and draft side (walk + commit + the
    jump-forward string), walking `output` in rounds of k draft tokens taken from it: all accepted (the next
    round starts k + 1 further) or all rejected (rolled back; the next round starts one further)."""
    logits = torch.zeros(k + 1, vocab_size)  # [k + 1, V] float32: the mask's cost does not depend on the values
    verifier, draft, rounds = [], [], 0
    for _ in range(passes):
        grammar = compiler.matcher(compiled, constraint)
        follower = compiler.matcher(compiled, constraint)  # the draft's matcher, no mask
        p = 0
        while p + k < len(output):
            block, token = output[p:p + k], output[p + k] if accepted else output[p]
            start = time.perf_counter()
            n = grammar.walk(block)
            grammar.mask(logits[:n + 1])
            grammar.commit(n if accepted else 0, token)
            verifier.append(time.perf_counter() - start)
            start = time.perf_counter()
            m = follower.walk(block)
            follower.commit(m if accepted else 0, token)
            follower.matcher.find_jump_forward_string()
            draft.append(time.perf_counter() - start)
            if n != k:
                raise RuntimeError(f"the grammar refused its own output at position {p + n}")
            p += k + 1 if accepted else 1
            rounds += 1
    return {"rounds": rounds, "verifier_ms": round(statistics.fmean(verifier) * 1e3, 4),
            "draft_ms": round(statistics.fmean(draft) * 1e3, 4)}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    line = next((p for p in load_workload(args.workload) if getattr(p, "schema", None)), None)
    if line is None:
        raise SystemExit(f"bench/workloads/{args.workload}.jsonl has no line with a schema")
    tokenizer = load_tokenizer(args.model)
    model = load_causal_lm(args.model, dtype=args.dtype)
    vocab_size = model.config.vocab_size
    stop = [t for t in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")} if t is not None]
    compiler = GrammarCompiler(tokenizer, vocab_size, stop)
    constraint = line.constraint()
    start = time.perf_counter()
    compiled = compiler.compile_now(constraint)
    compile_s = time.perf_counter() - start
    prompt_ids = tokenizer(line.text, add_special_tokens=False)["input_ids"]  # the prompt as the gateway sends it
    output = constrained_greedy(model, compiler, prompt_ids, constraint, args.max_tokens)
    text = tokenizer.decode(output, skip_special_tokens=True)
    print(f"output ({len(output)} tokens): {text}", flush=True)
    context = len(prompt_ids)
    ns = list(range(1, args.max_k + 2))
    forward = measure_for_run(model, context, ns=ns, repeats=8, prepack=args.dtype == "float32")
    rows = []
    for k in range(args.max_k + 1):
        row = {"k": k, "forward_ms": forward["t_ms"][str(k + 1)]}
        for outcome in (True, False):
            if not outcome and k == 0:
                continue
            timed = time_rounds(compiler, compiled, constraint, output, k, outcome, args.passes, vocab_size)
            tag = "accepted" if outcome else "rejected"
            row[f"verifier_ms_{tag}"], row[f"draft_ms_{tag}"] = timed["verifier_ms"], timed["draft_ms"]
        worst = max(row.get("verifier_ms_accepted", 0.0), row.get("verifier_ms_rejected", 0.0))
        row["verifier_share"] = round(worst / row["forward_ms"], 4)
        rows.append(row)
        print(json.dumps(row), flush=True)
    compiler.close()
    result = {"model": pathlib.Path(args.model).name, "dtype": args.dtype, "vocab_size": vocab_size,
              "workload": args.workload, "prompt": line.id, "context": context, "output_tokens": len(output),
              "output": text, "compile_s": round(compile_s, 3), "threads": args.threads, "passes": args.passes,
              "forward": forward, "rounds": rows, "machine": machine_info(args.threads, os.environ.get("OMP_WAIT_POLICY", "")),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    shares = [r["verifier_share"] for r in rows]
    print(f"verifier's grammar work: {min(shares):.1%}-{max(shares):.1%} of the forward over k + 1 tokens "
          f"(k = 0..{args.max_k}); compile {compile_s:.2f} s")
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
