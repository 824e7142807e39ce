"""Should I speculate? python -m bench.advise --target DIR [--draft DIR | --method ngram] --prompts FILE

Checks that the draft can pair with the target (one tokenizer), the size ratio,
the memory both models and their KV caches take, then measures on your prompts,
in-process:
  - alpha: how often the draft's tokens match the target's greedy output, by
    replaying the target's greedy continuation round by round at each k (greedy
    verification accepts exactly the longest common prefix, so this is what the
    service would accept);
  - c: the draft's step time over the target's (0 for n-gram lookup);
and prints the predicted speedup S = E / (k c + 1 + rho) for each k, the speedup
measured with Hugging Face assisted generation at the best k, and a plain
recommendation: use it / use it with k = N / don't.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

from bench import speedup_model
from bench.workloads import Prompt, load_workload

DEFAULT_RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "latest.json"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
K_VALUES = (1, 2, 3, 4, 6, 8)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.advise", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", required=True, help="target model directory")
    p.add_argument("--draft", default="", help="draft model directory (method=model)")
    p.add_argument("--method", default="", choices=["", "ngram", "model"],
                   help="ngram (prompt lookup, no model) or model (needs --draft); default: model if --draft given")
    p.add_argument("--prompts", required=True,
                   help="your prompts: a .jsonl in bench/workloads format, or a text file with one prompt a line")
    p.add_argument("--max-prompts", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=0, help="tokens per sequence for the KV estimate (0: the model's max)")
    p.add_argument("--sequences", type=int, default=1, help="concurrent sequences for the KV estimate")
    p.add_argument("--default-k", type=int, default=4, help="the verifier's default block length")
    p.add_argument("--rho", type=float, default=None,
                   help="per-round transport cost / target step (default: from bench/results/latest.json, else 0.05)")
    p.add_argument("--no-measure", action="store_true", help="skip the measured (HF assisted generation) speedup")
    return p


def load_prompts(path: str, limit: int, max_tokens: int) -> list[Prompt]:
    file = pathlib.Path(path)
    if file.suffix == ".jsonl":
        prompts = load_workload(str(file), limit, max_tokens)
    else:
        from specdec.chat_format import chatml

        lines = [line.strip() for line in file.read_text().splitlines() if line.strip()]
        prompts = [Prompt("custom", f"line{i}", chatml(line), max_tokens) for i, line in enumerate(lines[:limit])]
    for prompt in prompts:  # the advisor measures greedy acceptance
        prompt.temperature, prompt.seed = 0.0, None
    return prompts


def model_memory(config: dict, dtype: str, context: int, sequences: int) -> dict:
    """Weights and KV cache bytes from a HF config.json (Llama-style fields)."""
    nbytes = DTYPE_BYTES[dtype]
    layers = int(config.get("num_hidden_layers", 0))
    heads = int(config.get("num_attention_heads", 1))
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or config.get("hidden_size", 0) // max(1, heads))
    kv_per_token = 2 * layers * kv_heads * head_dim * nbytes
    return {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "kv_bytes_per_token": kv_per_token,
            "kv_bytes": kv_per_token * context * sequences, "context": context, "sequences": sequences}


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def default_rho(path: pathlib.Path = DEFAULT_RESULTS) -> tuple[float, str]:
    """rho from the last benchmark: median n-gram overhead per round over the median off forward per round."""
    try:
        rows = json.loads(path.read_text())["rows"]
        overhead = statistics.median(r["transport_overhead_ms_median"] for r in rows
                                     if r["method"] == "ngram" and r["transport_overhead_ms_median"] is not None)
        step = statistics.median(r["forward_ms_per_round_median"] for r in rows
                                 if r["method"] == "off" and r.get("forward_ms_per_round_median"))
        return max(0.0, overhead / step), f"{path} (overhead {overhead:.1f} ms / target step {step:.1f} ms)"
    except (OSError, KeyError, ValueError, TypeError, statistics.StatisticsError):
        return 0.05, "an assumed default (no benchmark results found; run `make bench`)"


def greedy_continuations(model, tokenizer, prompts: list[Prompt], eos) -> tuple[list[tuple[list[int], list[int]]], float]:
    """Target greedy output of each prompt, and plain-decoding tokens/s."""
    import torch

    out, tokens, wall = [], 0, 0.0
    for prompt in prompts:
        ids = tokenizer(prompt.text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        started = time.perf_counter()
        with torch.inference_mode():
            gen = model.generate(ids, max_new_tokens=prompt.max_tokens, do_sample=False, eos_token_id=eos,
                                 pad_token_id=eos if isinstance(eos, int) else eos[0], temperature=None, top_p=None,
                                 top_k=None)
        wall += time.perf_counter() - started
        new = gen[0, ids.shape[1]:].tolist()
        tokens += len(new)
        out.append((ids[0].tolist(), new))
    return out, tokens / wall if wall else 0.0


def simulate(prompt_ids: list[int], continuation: list[int], k: int, propose) -> dict:
    """Replay greedy speculation over the target's own continuation. propose(context, k) -> draft tokens."""
    sequence = prompt_ids + continuation
    end, pos = len(sequence), len(prompt_ids)
    rounds = drafts = drafted = accepted = 0
    while pos < end:
        proposal = propose(sequence[:pos], min(k, end - pos))
        matched = 0
        for token in proposal:
            if pos + matched < end and sequence[pos + matched] == token:
                matched += 1
            else:
                break
        rounds += 1
        if proposal:
            drafts += 1
            drafted += len(proposal)
            accepted += matched
        pos = min(end, pos + matched + 1)
    return {"rounds": rounds, "drafts": drafts, "drafted": drafted, "accepted": accepted,
            "tokens": len(continuation)}


def ngram_proposer():
    from draft_service.ngram import NgramSequence

    def propose(context: list[int], k: int) -> list[int]:
        return NgramSequence(context, 1, 4).propose(k).token_ids

    return propose


def model_proposer(draft, k_max: int):
    import torch

    cache: dict[int, list[int]] = {}

    def propose(context: list[int], k: int) -> list[int]:
        if len(context) not in cache:
            with torch.inference_mode():
                out = draft.generate(torch.tensor([context]), max_new_tokens=k_max, do_sample=False,
                                     temperature=None, top_p=None, top_k=None, pad_token_id=0)
            cache[len(context)] = out[0, len(context):].tolist()
        return cache[len(context)][:k]

    return propose


def step_time(model, context: int, trials: int = 10) -> float:
    """Median single-token forward time with a KV cache at `context` tokens."""
    import torch

    ids = torch.randint(3, model.config.vocab_size, (1, max(2, context)))
    times = []
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        cache = out.past_key_values
        for _ in range(trials):
            started = time.perf_counter()
            out = model(ids[:, -1:], past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - started)
            cache = out.past_key_values
    return statistics.median(times[2:] or times)


def measured_speedup(target, draft, tokenizer, prompts: list[Prompt], ks: list[int], eos,
                     repeats: int = 2) -> dict[int, float]:
    """HF plain greedy vs HF assisted generation (prompt lookup or the draft model) at each k.

    Per repeat, every prompt runs plain and each k back to back (order rotated), and the speedup is the
    summed tokens over summed time against plain; the median over repeats is returned per k.
    """
    import torch

    pad = eos if isinstance(eos, int) else eos[0]
    common = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None, "eos_token_id": eos,
              "pad_token_id": pad}

    def assisted(k: int) -> dict:
        if draft is None:
            return {"prompt_lookup_num_tokens": k}
        return {"assistant_model": draft, "num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0}

    variants = [("plain", {})] + [(k, assisted(k)) for k in ks]
    ratios: dict[int, list[float]] = {k: [] for k in ks}
    for repeat in range(repeats):
        tokens = {name: 0 for name, _ in variants}
        wall = {name: 0.0 for name, _ in variants}
        for index, prompt in enumerate(prompts):
            ids = tokenizer(prompt.text, return_tensors="pt", add_special_tokens=False)["input_ids"]
            shift = (repeat + index) % len(variants)
            for name, extra in variants[shift:] + variants[:shift]:
                started = time.perf_counter()
                with torch.inference_mode():
                    out = target.generate(ids, max_new_tokens=prompt.max_tokens, **common, **extra)
                wall[name] += time.perf_counter() - started
                tokens[name] += out.shape[1] - ids.shape[1]
        plain = tokens["plain"] / wall["plain"]
        for k in ks:
            ratios[k].append(tokens[k] / wall[k] / plain)
    return {k: statistics.median(values) for k, values in ratios.items()}


def recommend(mismatch: str | None, table: list[dict], default_k: int, measured: dict[int, float] | None) -> str:
    """DON'T / USE IT / USE IT WITH k = N. Measured speedups, where there are any, overrule the prediction."""
    if mismatch:
        return "DON'T: the draft cannot pair with the target (different tokenizers)."
    best = max(table, key=lambda row: row["predicted"])
    if best["predicted"] < 1.05:
        return (f"DON'T: predicted speedup at best {best['predicted']:.2f}x (k = {best['k']}): acceptance "
                f"alpha = {best['alpha']:.2f} is too low for the draft's cost c = {best['c']:.3f} and rho.")
    if measured:
        k_best = max(measured, key=measured.get)
        if measured[k_best] < 1.0:
            shown = ", ".join(f"{v:.2f}x at k = {k}" for k, v in sorted(measured.items()))
            return (f"DON'T: predicted {best['predicted']:.2f}x at k = {best['k']}, but measured in-process {shown} "
                    "(verifying a block or running the draft costs more than the model assumes on this machine).")
        if default_k in measured and measured[default_k] >= 0.97 * measured[k_best]:
            return (f"USE IT (measured {measured[default_k]:.2f}x at the server's default k = {default_k}, "
                    f"within 3% of the best).")
        return f"USE IT WITH k = {k_best} (measured {measured[k_best]:.2f}x; default k = {default_k}: " \
               f"{measured[default_k]:.2f}x)." if default_k in measured else f"USE IT WITH k = {k_best}."
    default = next((row for row in table if row["k"] == default_k), None)
    if default is not None and default["predicted"] >= 0.97 * best["predicted"]:
        return f"USE IT (the server's default k = {default_k} is within 3% of the best predicted, k = {best['k']})."
    return f"USE IT WITH k = {best['k']} (predicted {best['predicted']:.2f}x)."


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    method = args.method or ("model" if args.draft else "ngram")
    if method == "model" and not args.draft:
        print("--method model needs --draft DIR", file=sys.stderr)
        return 2
    import torch

    from specdec.models import describe, load_causal_lm, load_tokenizer, tokenizer_mismatch

    if args.threads:
        torch.set_num_threads(args.threads)
    target_tok = load_tokenizer(args.target)
    target = load_causal_lm(args.target, dtype=args.dtype)
    target_info = describe(args.target, target_tok, target)
    print(f"target: {args.target}: {target_info.num_parameters / 1e6:.1f}M parameters, "
          f"{target_info.tokenizer_class} vocabulary {target_info.tokenizer_vocab_size}")
    draft = None
    mismatch = None
    configs = {"target": json.loads((pathlib.Path(args.target) / "config.json").read_text())}
    if method == "model":
        draft_tok = load_tokenizer(args.draft)
        draft = load_causal_lm(args.draft, dtype=args.dtype)
        draft_info = describe(args.draft, draft_tok, draft)
        configs["draft"] = json.loads((pathlib.Path(args.draft) / "config.json").read_text())
        mismatch = tokenizer_mismatch(target_info, draft_info)
        ratio = target_info.num_parameters / max(1, draft_info.num_parameters)
        print(f"draft:  {args.draft}: {draft_info.num_parameters / 1e6:.1f}M parameters; size ratio "
              f"target/draft = {ratio:.1f}x " + ("(in the 10-50x sweet spot)" if 10 <= ratio <= 50 else
                                                 "(too close in size: the draft's cost eats the gain)" if ratio < 10
                                                 else "(very small draft: cheap, but check its acceptance)"))
    else:
        print("draft:  n-gram prompt lookup (no model, same tokenizer as the target)")
    print("tokenizer: " + ("compatible (same fingerprint " + target_info.tokenizer_fingerprint + ")"
                           if not mismatch else "INCOMPATIBLE: " + mismatch))

    total = 0
    for name, config in configs.items():
        context = args.context or int(config.get("max_position_embeddings") or 2048)
        mem = model_memory(config, args.dtype, context, args.sequences)
        params = (target_info if name == "target" else draft_info).num_parameters
        weights = params * DTYPE_BYTES[args.dtype]
        total += weights + mem["kv_bytes"]
        print(f"memory {name}: weights {gib(weights)} ({args.dtype}) + KV cache {gib(mem['kv_bytes'])} "
              f"({mem['layers']} layers x {mem['kv_heads']} KV heads x head dim {mem['head_dim']} x 2 (K,V) = "
              f"{mem['kv_bytes_per_token'] / 1024:.1f} KiB/token, x {mem['context']} tokens x {mem['sequences']} seq)")
    print(f"memory total: {gib(total)}" + ("" if method == "model" else " (n-gram index: negligible)"))
    if mismatch:
        print("\nrecommendation: " + recommend(mismatch, [], args.default_k, None))
        return 0

    prompts = load_prompts(args.prompts, args.max_prompts, args.max_tokens)
    eos = target.generation_config.eos_token_id or target_tok.eos_token_id
    rho, rho_source = (args.rho, "--rho") if args.rho is not None else default_rho()
    print(f"\nmeasuring on {len(prompts)} prompts from {args.prompts}, {args.max_tokens} new tokens each, greedy ...")
    target.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False)  # warm-up
    runs, plain_tps = greedy_continuations(target, target_tok, prompts, eos)
    context = int(statistics.median(len(p) + len(c) for p, c in runs))
    target_step = step_time(target, context)
    if draft is None:
        propose = ngram_proposer()
        from draft_service.ngram import NgramSequence

        lookup_s, calls = 0.0, 0
        for prompt_ids, continuation in runs:  # the service's incremental cost: propose, roll back, append
            sequence = NgramSequence(prompt_ids, 1, 4)
            for token in continuation:
                keep = len(sequence.tokens)
                started = time.perf_counter()
                sequence.propose(args.default_k)
                sequence.update(keep, [token])
                lookup_s += time.perf_counter() - started
                calls += 1
        c = lookup_s / max(1, calls) / max(1, args.default_k) / target_step
    else:
        c = step_time(draft, context) / target_step
        propose = model_proposer(draft, max(K_VALUES))
    print(f"target: {plain_tps:.1f} tokens/s plain greedy; step {target_step * 1e3:.1f} ms at {context} tokens; "
          f"c = {c:.3f}; rho = {rho:.3f} from {rho_source}")

    table = []
    for k in sorted({*K_VALUES, args.default_k}):
        totals = {"rounds": 0, "drafts": 0, "drafted": 0, "accepted": 0, "tokens": 0}
        for prompt_ids, continuation in runs:
            for key, value in simulate(prompt_ids, continuation, k, propose).items():
                totals[key] += value
        rate = totals["accepted"] / totals["drafted"] if totals["drafted"] else 0.0
        k_eff = totals["drafted"] / totals["rounds"] if totals["rounds"] else 0.0  # over all rounds
        block = totals["drafted"] / totals["drafts"] if totals["drafts"] else 0.0  # over drafted rounds
        alpha = speedup_model.alpha_from_rate(rate, block)
        # E measured directly (tokens per round, rounds without a proposal included), the model's cost per round.
        e_measured = totals["tokens"] / totals["rounds"] if totals["rounds"] else 1.0
        predicted = e_measured / (k_eff * c + 1 + rho)
        table.append({"k": k, "acceptance_rate": rate, "alpha": alpha, "E": e_measured, "k_eff": k_eff, "c": c,
                      "predicted": predicted, "model": speedup_model.predicted_speedup(alpha, block, c, rho),
                      "block": block, "no_proposal_share": 1 - totals["drafts"] / max(1, totals["rounds"])})
    print("\n  k | acceptance | alpha | block | rounds w/o draft | tokens/round | predicted S | model S(alpha, block)")
    for row in table:
        print(f"  {row['k']:>2} | {row['acceptance_rate']:>10.2f} | {row['alpha']:>5.2f} | {row['block']:>5.2f} | "
              f"{row['no_proposal_share']:>16.0%} | {row['E']:>12.2f} | {row['predicted']:>10.2f}x | "
              f"{row['model']:>8.2f}x")
    print("  (predicted S = tokens/round / (k_eff c + 1 + rho), rounds without a draft counted; model S assumes "
          "every round drafts a full block)")
    best = max(table, key=lambda row: row["predicted"])
    print()
    measured = None
    if not args.no_measure:
        ks = sorted({best["k"], args.default_k})
        measured = measured_speedup(target, draft, target_tok, prompts, ks, eos)
        for k in ks:
            predicted = next(row["predicted"] for row in table if row["k"] == k)
            print(f"measured in-process (HF {'prompt lookup' if draft is None else 'assisted generation'} at "
                  f"k = {k} vs plain greedy, median of 2 interleaved passes): {measured[k]:.2f}x; "
                  f"predicted {predicted:.2f}x")
    print("\nrecommendation: " + recommend(None, table, args.default_k, measured))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
