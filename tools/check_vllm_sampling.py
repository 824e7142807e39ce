"""Is vLLM's speculative sampling exact on this build? vLLM's own n-gram speculation, T=1.0.

Runs in the vLLM environment: .venv-vllm/bin/python tools/check_vllm_sampling.py [--fixed]
A tiny seeded model and a prompt of distinct tokens, so that the n-gram proposer always drafts
t1 + 1 after the first sampled token t1. The second token's distribution must equal the target's
p(. | prompt, t1): a chi-square test over 3,000 samples. With --fixed, verifier_service.engines.vllm_sampling's
fix is installed first (the engine runs in this process so that the fix applies).
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import tempfile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fixed", action="store_true", help="install verifier_service.engines.vllm_sampling first")
    parser.add_argument("--samples", type=int, default=3000)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    from vllm import LLM, SamplingParams

    from devkit.testing import VLLM_TINY_SHAPE, build_tiny_pair, pooled_chi_square_p_value
    from verifier_service.engines import vllm_sampling

    if args.fixed:
        vllm_sampling.install()
    target, _draft = build_tiny_pair(pathlib.Path(tempfile.mkdtemp()), shape=VLLM_TINY_SHAPE)
    llm = LLM(model=str(target), dtype="float32", seed=0, enforce_eager=True, skip_tokenizer_init=True,
              max_num_seqs=64, speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                                   "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    prompt = list(range(3, 300))
    outputs = llm.generate([{"prompt_token_ids": prompt}] * args.samples,
                           SamplingParams(temperature=1.0, max_tokens=3, detokenize=False), use_tqdm=False)
    tokens = [list(output.outputs[0].token_ids) for output in outputs]
    t1 = collections.Counter(t[0] for t in tokens).most_common(1)[0][0]
    seconds = collections.Counter(t[1] for t in tokens if t[0] == t1)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    with torch.inference_mode():
        p = torch.softmax(model(torch.tensor([prompt + [t1]])).logits[0, -1].double(), dim=-1).numpy()
    total = sum(seconds.values())
    p_value = pooled_chi_square_p_value([seconds.get(i, 0) for i in range(len(p))], p)
    draft = t1 + 1
    print(f"{'with' if args.fixed else 'without'} the fix: t1={t1}, {total} samples; drafted token {draft} has "
          f"p={p[draft]:.4f} and was emitted {seconds.get(draft, 0)} times; chi-square p-value {p_value:.3g}")
    return 0 if p_value > 1e-3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
