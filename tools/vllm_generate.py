"""Plain vLLM greedy generation, no speculation: the reference the vLLM engine's output must equal.

Runs in the vLLM environment (.venv-vllm/bin/python tools/vllm_generate.py ...). Reads a JSON list
of prompt token-id lists; writes a JSON list of generated token-id lists.
"""

from __future__ import annotations

import argparse
import json
import os


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True, help="JSON file: [[token ids], ...]")
    parser.add_argument("--out", required=True, help="JSON file to write: [[generated ids], ...]")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--eos", type=int, nargs="*", default=[], help="token ids that end a sequence")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # The engine core and its one worker in this process, as the verifier's engine runs (vllm_engine.py): the
    # same engine, without two more processes that each import vLLM again (about 90 s -> 25 s on 2 cores).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams

    llm = LLM(model=args.model, dtype=args.dtype, seed=0, enforce_eager=True, skip_tokenizer_init=True,
              max_num_seqs=64)
    with open(args.prompts) as f:
        prompts = json.load(f)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, stop_token_ids=args.eos, detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    with open(args.out, "w") as f:
        json.dump([list(output.outputs[0].token_ids) for output in outputs], f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
