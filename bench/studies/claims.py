"""The talk's claims about a model draft, measured on a real draft and target of one family.

    python -m bench claims --model .cache/models/qwen2.5-coder-1.5b --draft-model .cache/models/qwen2.5-coder-0.5b \
        --parts temperature,length,memory --out bench/results/pair/claims.json

One stack (the target verifies, the draft model drafts), three parts:
- temperature: acceptance, tokens a round and speedup at T = 0, 0.7 and 1.0, speculation off against a fixed k,
  on the first prompts of each --workloads (sampled runs seeded);
- length: speedup against the prompt's length (about 200, 1,000 and 4,000 tokens of code to read, then a short
  question about it);
- memory: the resident memory of the verifier and of the draft service, with the draft model and with an
  n-gram draft (no second model), and the KV cache a token costs each model (from its config).
Requests of one part take turns (off, then speculation, the order flipped every repeat), so a slow spell of
the machine falls on both. Writes OUT (JSON) and a plot beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib
import statistics
import sys

from bench.core.machine import machine_info, process_memory_mib
from bench.core.methods import Sample, StackMethod, add_stack_options, stack_kwargs
from bench.core.workloads import Prompt, chatml_conversation, load_workload, parse_workloads

PARTS = ("temperature", "length", "memory")
# The code a long prompt asks about: this repository's own source, so the text is fixed and needs no download.
CODE_SOURCES = ["verifier_service/speculation/policy.py", "draft_service/suffix_cache.py", "gateway/openai_protocol.py",
                "specdec/modeling/fetch_model.py", "verifier_service/draft/client.py"]
LENGTH_QUESTION = "Write a one-paragraph summary of what the code above does."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench claims", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_stack_options(parser, repeats=1)  # --model, --draft-model (required here), --engine, --dtype, --threads, ...
    parser.set_defaults(out="bench/results/pair/claims.json")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--k", type=int, default=4, help="the fixed block size speculation runs at")
    parser.add_argument("--workloads", default="sql,structured,chat", help="temperature: the prompts' workloads")
    parser.add_argument("--prompts-per-workload", type=int, default=2)
    parser.add_argument("--temperatures", default="0,0.7,1.0")
    parser.add_argument("--lengths", default="200,1000,4000", help="length: prompt sizes in tokens")
    return parser


def summarize(samples: list[Sample]) -> dict:
    """Tokens/s, acceptance and tokens a drafted round over a set of requests."""
    tokens = sum(s.completion_tokens for s in samples)
    drafted = sum(s.num_draft_tokens for s in samples)
    drafts = sum(s.num_drafts for s in samples)
    accepted = sum(s.num_accepted_tokens for s in samples)
    decode_s = sum(s.wall_s - s.ttft_s for s in samples if s.ttft_s)
    return {"requests": len(samples), "tokens": tokens, "tok_s": round(tokens / sum(s.wall_s for s in samples), 3),
            # after the first token: the decode rate, without the prefill both methods pay
            "decode_tok_s": round(sum(s.completion_tokens - 1 for s in samples if s.ttft_s) / decode_s, 3)
            if decode_s > 0 else None,
            "acceptance": round(accepted / drafted, 3) if drafted else None,
            "mean_accepted_length": round(1 + accepted / drafts, 3) if drafts else None,
            "ttft_ms_median": round(statistics.median(s.ttft_s for s in samples if s.ttft_s) * 1e3, 1)}


def paired(off: StackMethod, spec: StackMethod, prompts: list[Prompt], repeats: int, max_tokens: int,
           label: str) -> dict:
    """Each prompt through both methods, the order flipped every repeat; both summaries and their ratio."""
    from tqdm import tqdm

    runs: dict[str, list[Sample]] = {"off": [], "spec": []}
    with tqdm(total=2 * repeats * len(prompts), desc=label, unit="req", file=sys.stderr) as bar:
        for repeat in range(repeats):
            for index, prompt in enumerate(prompts):
                order = [off, spec] if (repeat + index) % 2 == 0 else [spec, off]
                for method in order:
                    runs["off" if method is off else "spec"].append(method.run(prompt, repeat, max_tokens))
                    bar.update(1)
    result = {name: summarize(samples) for name, samples in runs.items()}
    result["speedup"] = round(result["spec"]["tok_s"] / result["off"]["tok_s"], 3)
    if result["spec"]["decode_tok_s"] and result["off"]["decode_tok_s"]:
        result["decode_speedup"] = round(result["spec"]["decode_tok_s"] / result["off"]["decode_tok_s"], 3)
    return result


def temperature_part(args, off, spec) -> list[dict]:
    prompts = [p for name in parse_workloads(args.workloads)
               for p in load_workload(name, args.prompts_per_workload, args.max_tokens)]
    rows = []
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        for workload in dict.fromkeys(p.workload for p in prompts):
            chosen = [dataclasses.replace(p, temperature=temperature, seed=1000 + i if temperature else None)
                      for i, p in enumerate(prompts) if p.workload == workload]
            rows.append({"temperature": temperature, "workload": workload,
                         **paired(off, spec, chosen, args.repeats, args.max_tokens, f"T={temperature} {workload}")})
    return rows


def code_context(tokenizer, length: int) -> str:
    """About `length` tokens of this repository's source, cut at a line end."""
    root = pathlib.Path(__file__).resolve().parents[2]
    text = "\n".join((root / path).read_text() for path in CODE_SOURCES)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:length]
    return tokenizer.decode(ids).rsplit("\n", 1)[0]


def length_part(args, tokenizer, off, spec) -> list[dict]:
    rows = []
    for length in [int(n) for n in args.lengths.split(",")]:
        code = code_context(tokenizer, length)
        text = chatml_conversation([{"role": "user", "content": f"```python\n{code}\n```\n\n{LENGTH_QUESTION}"}])
        prompt = Prompt("length", str(length), text, max_tokens=args.max_tokens)
        measured = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        rows.append({"target_length": length, "prompt_tokens": measured,
                     **paired(off, spec, [prompt], max(args.repeats, 2), args.max_tokens, f"{measured} tokens")})
    return rows


def kv_bytes_per_token(model: str, dtype: str) -> int:
    """K and V of every layer for one token, at the dtype's width."""
    config = json.loads((pathlib.Path(model) / "config.json").read_text())
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * (2 if dtype == "bfloat16" else 4)


def memory_of(services) -> dict:
    return {name: {"rss_mib": round(process_memory_mib(services[name].process.pid, "VmRSS"), 1),
                   "peak_rss_mib": round(process_memory_mib(services[name].process.pid, "VmHWM"), 1)}
            for name in ("verifier", "draft")}


def stack(args, method: str):
    """The stack the bench's load tools start (bench.core.methods.stack_kwargs), with this draft method."""
    from devkit.stack import running_stack

    return running_stack(args.model, **stack_kwargs(argparse.Namespace(**{**vars(args), "method": method})))


def main(argv=None) -> int:
    from specdec.modeling.models import load_tokenizer

    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.draft_model:
        parser.error("--draft-model is required: the claims are about a model draft")
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    tokenizer = load_tokenizer(args.model)
    result = {"what": "the talk's claims on a draft and target of one family", "model": pathlib.Path(args.model).name,
              "draft_model": pathlib.Path(args.draft_model).name, "dtype": args.dtype, "k": args.k,
              "max_tokens": args.max_tokens, "repeats": args.repeats,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine_info(args.threads, "PASSIVE"), "parts": {}}
    with stack(args, "model") as services:
        off = StackMethod("off", services["gateway"].address, services["verifier"].metrics_port, k=0)
        spec = StackMethod(f"model k={args.k}", services["gateway"].address, services["verifier"].metrics_port,
                           k=args.k)
        warm = Prompt("warmup", "warmup", chatml_conversation([{"role": "user", "content": "Say hello."}]), 8)
        off.run(warm, -1, 8)
        spec.run(warm, -1, 8)
        if "memory" in parts:
            result["parts"]["memory"] = {"model draft, after warm-up": memory_of(services)}
        if "temperature" in parts:
            result["parts"]["temperature"] = temperature_part(args, off, spec)
        if "length" in parts:
            result["parts"]["length"] = length_part(args, tokenizer, off, spec)
        if "memory" in parts:
            result["parts"]["memory"]["model draft, after the runs"] = memory_of(services)
        off.close()
        spec.close()
    if "memory" in parts:
        with stack(args, "ngram") as services:
            StackMethod("off", services["gateway"].address, services["verifier"].metrics_port, k=0).run(warm, -1, 8)
            result["parts"]["memory"]["n-gram draft (no draft model), after warm-up"] = memory_of(services)
        result["parts"]["memory"]["kv_bytes_per_token"] = {
            "target": kv_bytes_per_token(args.model, args.dtype), "draft": kv_bytes_per_token(args.draft_model, args.dtype)}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out.with_suffix(".png"))
    print(json.dumps(result["parts"], indent=1))
    print(f"wrote {out}")
    return 0


def plot(result: dict, path: pathlib.Path) -> None:
    """Acceptance against temperature by workload, and speedup against prompt length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = result["parts"]
    panels = [p for p in ("temperature", "length") if p in parts]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, part in zip(axes[0], panels):
        if part == "temperature":
            for workload in dict.fromkeys(r["workload"] for r in parts[part]):
                rows = [r for r in parts[part] if r["workload"] == workload]
                ax.plot([r["temperature"] for r in rows], [r["spec"]["acceptance"] for r in rows], "o-", label=workload)
            ax.set(xlabel="temperature", ylabel="acceptance (accepted / drafted)", ylim=(0, 1.05),
                   title=f"acceptance by temperature, k = {result['k']}")
            ax.legend()
        else:
            rows = parts[part]
            lengths = [r["prompt_tokens"] for r in rows]
            ax.plot(lengths, [r["speedup"] for r in rows], "o-", label="end to end (prefill included)")
            if all(r.get("decode_speedup") for r in rows):
                ax.plot(lengths, [r["decode_speedup"] for r in rows], "s--", label="decode (after the first token)")
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.set(xscale="log", xlabel="prompt tokens", ylabel="speedup (tok/s, spec / off)",
                   title=f"speedup by prompt length, k = {result['k']}")
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.minorticks_off()
            ax.legend()
    fig.suptitle(f"{result['model']} with {result['draft_model']} ({result['dtype']}), "
                 f"{result['machine'].get('cpu', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
