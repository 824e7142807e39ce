"""Measure how often speculative greedy output diverges from plain greedy output, per dtype.

In-process on the real target (no services): plain `model.generate(do_sample=False)`
versus the verifier's own round (`verify_block`) fed by the n-gram proposer.
fp32 should never diverge; bf16 may, because a k-token forward pass rounds
differently from a one-token pass.

    python tools/measure_divergence.py --model .cache/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch
from tqdm import tqdm

from draft_service.ngram import NgramProposer
from specdec.decoding.chat_format import chatml
from specdec.decoding.draft_block import DraftBlock
from specdec.modeling.models import load_causal_lm, load_tokenizer
from specdec.decoding.sampling import SamplingParams, make_generator
from verifier_service.engines.transformers_engine import TransformersEngine, verify_block

ROOT = pathlib.Path(__file__).resolve().parent.parent

PROMPTS = [
    "Convert this JSON to YAML: {\"name\": \"Ada\", \"langs\": [\"python\", \"c\"], \"age\": 36}",
    "Rewrite this SQL with uppercase keywords: select id, name from users where age > 30 order by name",
    "Explain what a KV cache is in two sentences.",
    "Write a Python function that reverses a string.",
    "List three fruits and their colors as a JSON array.",
    "What is the capital of France? Answer briefly.",
    "Write a haiku about autumn leaves.",
    "Fix the typo: 'The quick brwn fox jumps ovr the lazy dog.'",
    "Summarize: Speculative decoding uses a small draft model to propose tokens that a large model verifies.",
    "Give a short SQL query counting rows in a table named orders.",
    "Translate to French: Good morning, how are you?",
    "Write a bash one-liner that counts lines in all .py files.",
    "What are the three states of matter?",
    "Repeat exactly: alpha beta gamma delta epsilon zeta eta theta",
    "Describe a cat in one sentence.",
    "Write a JSON object with keys id, title and done for a todo item.",
    "Name two sorting algorithms and their time complexity.",
    "Complete the sequence: 2, 4, 8, 16,",
    "Write a Python dataclass for a 2D point.",
    "Why is the sky blue? One sentence.",
]


def speculative_greedy(engine, prompt_ids, max_tokens, k, eos):
    proposer = NgramProposer(1, 4)
    sequence = proposer.start(prompt_ids, SamplingParams(), False)
    state = engine.start(prompt_ids)
    generator = make_generator(0)
    out = []
    while len(out) < max_tokens:
        room = max_tokens - len(out) - 1
        proposal = sequence.propose(min(k, room)) if room > 0 else None
        tokens = proposal.token_ids if proposal else []
        before = len(state.tokens)
        verdict, _ = verify_block(engine, state, DraftBlock(tokens, None), SamplingParams(), generator)
        emitted = verdict.emitted(tokens)
        sequence.update(before + verdict.num_accepted, [verdict.next_token])
        for token in emitted:
            out.append(token)
            if token == eos or len(out) >= max_tokens:
                return out
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="use the first N prompts")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "divergence.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    eos = tokenizer.eos_token_id
    results = {"model": args.model, "k": args.k, "max_tokens": args.max_tokens, "prompts": args.prompts,
               "date": time.strftime("%Y-%m-%d"), "dtypes": {}}
    for dtype in args.dtypes:
        model = load_causal_lm(args.model, "cpu", dtype)
        engine = TransformersEngine(model)
        diverged, first_positions, tokens_compared = 0, [], 0
        for text in tqdm(PROMPTS[: args.prompts], desc=dtype, unit="prompt"):
            ids = tokenizer.encode(chatml(text), add_special_tokens=False)
            with torch.inference_mode():
                plain = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                       max_new_tokens=args.max_tokens, do_sample=False, pad_token_id=eos)
            plain = plain[0, len(ids):].tolist()
            plain = plain[: plain.index(eos) + 1] if eos in plain else plain
            spec = speculative_greedy(engine, ids, args.max_tokens, args.k, eos)
            tokens_compared += min(len(plain), len(spec))
            mismatch = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
            if mismatch is None and len(plain) != len(spec):
                mismatch = min(len(plain), len(spec))
            if mismatch is not None:
                diverged += 1
                first_positions.append(mismatch)
        results["dtypes"][dtype] = {"prompts_diverged": diverged, "divergence_rate": diverged / args.prompts,
                                    "first_divergence_positions": first_positions,
                                    "tokens_compared": tokens_compared}
        print(f"{dtype}: {diverged}/{args.prompts} prompts diverged; first positions {first_positions}", flush=True)
    pathlib.Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
