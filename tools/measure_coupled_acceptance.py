"""How often a sampled model draft is accepted: the coupled rule (keyed Gumbel noise shared by draft and target)
against exact rejection sampling (an independent draft sample, accepted with min(1, p/q)).

In-process, no services. The target samples a continuation of each chat prompt with its seed; along it, the
target's p and the draft's q are computed at every position (one forward pass each). Per position:

- rejection sampling accepts with probability sum_v min(p, q) = 1 - TV(p, q) (exact, no sampling);
- the coupled rule accepts iff argmax(log q + g) == argmax(log p + g) for shared Gumbel noise g, estimated over
  --draws noise vectors;
- a greedy draft (argmax q, one-hot) is accepted with probability p(argmax q) under either rule.

The draft is the target with Gaussian noise added to every weight (--noise, relative to each tensor's std), or a
given --draft model.

With --stack DIR, it also saves the first perturbed draft to DIR and runs the three services with it (model draft,
fixed k): the acceptance rate of seeded requests (the coupled rule, the draft sampling with the keyed noise) against
unseeded ones (rejection sampling), as the responses' SpeculationStats count it.

    python tools/measure_coupled_acceptance.py --model .cache/models/smollm2-135m-instruct --noise 0.05 0.1 0.2
    python tools/measure_coupled_acceptance.py --model .cache/models/smollm2-135m-instruct --noise 0.05 \
        --stack /tmp/perturbed-draft
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import shutil
import sys
import tempfile

import torch

from specdec.decoding.chat_format import chatml
from specdec.modeling.models import load_causal_lm, load_tokenizer
from specdec.decoding.sampling import SamplingParams, keyed_sample, probs_from_logits

PROMPTS = [
    "Explain what a KV cache is in two sentences.",
    "Write a Python function that reverses a string.",
    "Write a haiku about autumn leaves.",
    "Translate to French: Good morning, how are you?",
    "Describe a cat in one sentence.",
    "Name two sorting algorithms and their time complexity.",
]


def perturbed(model, noise: float, seed: int = 0):
    """A copy of model with N(0, (noise * std)^2) added to each weight tensor."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            if param.numel() > 1:
                param.add_(torch.randn(param.shape, generator=generator) * float(param.std()) * noise)
    return draft


def continuation(model, prompt_ids: list[int], params: SamplingParams, max_tokens: int, eos: int) -> list[int]:
    """The target's seeded sample after prompt_ids (keyed draws, as the verifier makes them)."""
    tokens = list(prompt_ids)
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = model(input_ids=torch.tensor([tokens])).logits[0, -1:]  # [1, V]
            token = keyed_sample(probs_from_logits(logits, params)[0], params.seed, len(tokens))
            tokens.append(token)
            if token == eos:
                break
    return tokens


def shaped_rows(model, tokens: list[int], start: int, params: SamplingParams) -> torch.Tensor:
    """The shaped distribution of each token from position start on: [len(tokens) - start, V]."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([tokens])).logits[0, start - 1 : len(tokens) - 1]  # [n, V]
    return probs_from_logits(logits, params)


def acceptance(p: torch.Tensor, q: torch.Tensor, draws: int, generator: torch.Generator) -> dict[str, float]:
    """Mean per-position acceptance of each rule. p, q: [n, V]."""
    rejection = torch.minimum(p, q).sum(-1)  # [n]
    greedy = p.gather(-1, q.argmax(-1, keepdim=True))[:, 0]  # [n]
    agree = torch.zeros(p.shape[0])
    log_p, log_q = p.log(), q.log()  # [n, V]
    for _ in range(draws):
        gumbel = -torch.log(-torch.log(torch.rand(p.shape, generator=generator)))  # [n, V]
        agree += ((log_p + gumbel).argmax(-1) == (log_q + gumbel).argmax(-1)).float()
    tv = 1 - rejection
    return {"rejection": float(rejection.mean()), "coupled": float((agree / draws).mean()),
            "greedy_draft": float(greedy.mean()), "coupled_bound": float(((1 - tv) / (1 + tv)).mean()),
            "positions": int(p.shape[0])}


def through_stack(model: str, draft, draft_dir: pathlib.Path, params: SamplingParams, k: int, max_tokens: int,
                  seeds: int) -> None:
    """Acceptance of seeded (coupled) and unseeded (rejection) requests through the real services."""
    import grpc

    from devkit.stack import running_stack
    from specdec.v1 import gateway_pb2, gateway_pb2_grpc

    draft.save_pretrained(draft_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (pathlib.Path(model) / name).exists():
            shutil.copy(pathlib.Path(model) / name, draft_dir / name)
    with tempfile.TemporaryDirectory() as logs, running_stack(model, draft_dir, method="model",
                                                              log_dir=pathlib.Path(logs), timeout_s=300) as services:
        with grpc.insecure_channel(services["gateway"].address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            for rule, seeded in (("coupled (seeded)", True), ("rejection (unseeded)", False)):
                drafted = accepted = rounds = tokens = 0
                for seed in range(seeds):
                    for prompt in PROMPTS:
                        request = gateway_pb2.GenerateRequest(prompt=chatml(prompt), max_tokens=max_tokens,
                                                              temperature=params.temperature,
                                                              num_speculative_tokens=k)
                        if params.top_p < 1.0:
                            request.top_p = params.top_p
                        if seeded:
                            request.seed = params.seed + seed
                        stats = stub.Generate(request, timeout=600).speculation
                        drafted += stats.num_draft_tokens
                        accepted += stats.num_accepted_tokens
                        rounds += stats.num_drafts
                        tokens += stats.num_accepted_tokens + stats.num_drafts
                print(json.dumps({"stack": rule, "k": k, "requests": seeds * len(PROMPTS), "draft_tokens": drafted,
                                  "acceptance_rate": round(accepted / max(drafted, 1), 4),
                                  "tokens_per_drafted_round": round(tokens / max(rounds, 1), 3)}), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft", help="a draft model directory (default: the target plus --noise)")
    parser.add_argument("--noise", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    parser.add_argument("--temperature", type=float, default=0.9)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--draws", type=int, default=64, help="Gumbel noise vectors per position")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--stack", type=pathlib.Path, help="also measure through the services, the draft saved here")
    parser.add_argument("--k", type=int, default=4, help="--stack: the fixed k")
    parser.add_argument("--stack-seeds", type=int, default=2, help="--stack: requests per prompt and rule")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    target = load_causal_lm(args.model)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    sequences = []
    for prompt in PROMPTS:
        prompt_ids = tokenizer.encode(chatml(prompt), add_special_tokens=False)
        tokens = continuation(target, prompt_ids, params, args.max_tokens, tokenizer.eos_token_id)
        sequences.append((tokens, len(prompt_ids), shaped_rows(target, tokens, len(prompt_ids), params)))
    drafts = [("draft", load_causal_lm(args.draft))] if args.draft else [
        (f"noise {noise}", perturbed(target, noise)) for noise in args.noise]
    for name, draft in drafts:
        p = torch.cat([rows for _, _, rows in sequences])
        q = torch.cat([shaped_rows(draft, tokens, start, params) for tokens, start, _ in sequences])
        result = acceptance(p, q, args.draws, torch.Generator().manual_seed(0))
        print(json.dumps({"draft": name, "temperature": args.temperature, "top_p": args.top_p, **{
            key: round(value, 4) if isinstance(value, float) else value for key, value in result.items()}}))
        sys.stdout.flush()
    if args.stack:
        through_stack(args.model, drafts[0][1], args.stack, params, args.k, args.max_tokens, args.stack_seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
