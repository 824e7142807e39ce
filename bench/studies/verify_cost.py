"""The verify-cost curve: how much a target forward over k tokens costs against one token, t(k)/t(1).

Speculation pays when checking k drafted tokens costs little more than one decode step
(docs/design.md, the speedup model S = E / (k*c + t(k)/t(1))). This measures that ratio
for a target, on this machine, at a given context length, with the KV cache in place:
each timed pass runs k tokens after a cached prefix and is then rolled back.

    python -m bench verify-cost --model .cache/models/smollm2-135m-instruct --dtype bfloat16
    python -m bench verify-cost --config llama-8b --device cuda --dtype bfloat16   # random init
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import pathlib
import platform
import statistics
import time

import torch

from specdec.modeling.gqa_attention import use_sdpa_gqa
from specdec.modeling.kv_cache import new_cache, rollback_cache
from specdec.modeling.models import DTYPES, load_causal_lm
from specdec.modeling.prepacked_linear import is_prepacked, prepack_linears, why_not

# Random-initialised stand-ins for real targets: only the shapes matter for cost.
CONFIGS = {
    "llama-tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0),
    # Qwen2.5-Coder-1.5B's shape (biases on q, k, v; tied embeddings)
    "qwen2.5-coder-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                               num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                               rope_theta=1000000.0, tie_word_embeddings=True),
    "qwen2-tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=640, max_position_embeddings=4096, tie_word_embeddings=True),
}
# The architecture of each shape (Llama unless named here)
ARCHITECTURES = {"qwen2.5-coder-1.5b": "qwen2", "qwen2-tiny": "qwen2"}


def build_random_model(name: str, device: str, dtype: str):
    """A randomly initialised causal LM (Llama, or Qwen2 per ARCHITECTURES) with the named shape, built directly on
    the device."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_type, model_type = ((Qwen2Config, Qwen2ForCausalLM) if ARCHITECTURES.get(name) == "qwen2"
                               else (LlamaConfig, LlamaForCausalLM))
    config = config_type(**CONFIGS[name], bos_token_id=1, eos_token_id=2)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(DTYPES[dtype])
    try:
        with torch.device(device):
            model = model_type(config)
    finally:
        torch.set_default_dtype(previous)
    use_sdpa_gqa(model)  # as models.load_causal_lm does
    return model.eval()


def save_random_model(model, out_dir: str | pathlib.Path) -> pathlib.Path:
    """Save a random-initialised model as a model directory the services load (no hub needed): its weights, and a
    word-level tokenizer with one token per id ("<17>"), so every id the model can emit has a text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out_dir = pathlib.Path(out_dir)
    vocab = {f"<{i}>": i for i in range(model.config.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<0>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    eos, bos = f"<{model.config.eos_token_id}>", f"<{model.config.bos_token_id}>"
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos, bos_token=bos, unk_token="<0>",
                            pad_token="<0>").save_pretrained(out_dir)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = model.config.eos_token_id, 0
    model.save_pretrained(out_dir)
    return out_dir


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.inference_mode()
def time_forward(model, cache, context: int, k: int, device: str, repeats: int) -> list[float]:
    """Milliseconds for forward passes of k tokens after a cached prefix of `context` tokens."""
    vocab = model.config.vocab_size
    times = []
    for _ in range(repeats):
        block = torch.randint(0, vocab, (1, k), device=device)  # [1, k]
        sync(device)
        start = time.perf_counter()
        model(input_ids=block, past_key_values=cache, use_cache=True)
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
        rollback_cache(cache, context)
    return times


@torch.inference_mode()
def measure(model, device: str, context: int, ks: list[int], repeats: int, warmup: int, progress=None) -> dict:
    return measure_each([model], device, context, ks, repeats, warmup, progress)[0]


@torch.inference_mode()
def sample_each(models: list, device: str, context: int, ks: list[int], repeats: int, warmup: int,
                progress=None) -> list[dict[int, list[float]]]:
    """Per model, per k: `repeats` forward times in ms, every (model, k) interleaved in each sweep, so drift on a
    noisy machine spreads over all of them (on a shared 2-core VM, one model's t(1) moved by 40% between two runs
    minutes apart). Sweeps alternate their order, so no cell always runs in the same place. Sample i of every
    cell comes from sweep i."""
    caches = []
    for model in models:
        caches.append(new_cache(model))
        prefix = torch.randint(0, model.config.vocab_size, (1, context), device=device)  # [1, context]
        model(input_ids=prefix, past_key_values=caches[-1], use_cache=True)
        for k in ks:
            time_forward(model, caches[-1], context, k, device, warmup)
    samples = [{k: [] for k in ks} for _ in models]
    cells = [(k, index) for k in ks for index in range(len(models))]
    for sweep in range(repeats):
        # every other sweep runs backwards: a cell that always ran right after another (a thread pool just put
        # to sleep, a neighbour's time slice) would take that position's cost into its own median
        for k, index in cells if sweep % 2 == 0 else reversed(cells):
            samples[index][k] += time_forward(models[index], caches[index], context, k, device, 1)
        if progress:
            progress.update(1)
    return samples


def measure_each(models: list, device: str, context: int, ks: list[int], repeats: int, warmup: int,
                 progress=None) -> list[dict]:
    """One curve per model from `sample_each`: the median time at each k, and its ratio to the first k's."""
    curves = []
    for by_k in sample_each(models, device, context, ks, repeats, warmup, progress):
        medians = {k: statistics.median(by_k[k]) for k in ks}
        curves.append({"context": context, "t_ms": {str(k): round(medians[k], 3) for k in ks},
                       "ratio": {str(k): round(medians[k] / medians[ks[0]], 3) for k in ks}})
    return curves


# The n values a benchmark run measures: up to 17 tokens, a 16-token block and the verified token.
RUN_NS = (1, 2, 3, 4, 5, 6, 8, 10, 13, 17)


def measure_for_run(model, context: int, ns=RUN_NS, repeats: int = 8, warmup: int = 2, prepack: bool = True) -> dict:
    """The curve a benchmark run uses, measured in-process on the run's target (CPU, the run's threads), with
    the linears prepacked as the verifier prepacks them (`--prepack-weights`; on a copy: `model` stays as it is;
    a model already prepacked is measured as it is)."""
    already = is_prepacked(model)
    prepacked = already or (prepack and not why_not(model))
    if prepacked and not already:
        model = copy.deepcopy(model)
        prepack_linears(model)
    curve = measure(model, "cpu", context, list(ns), repeats, warmup)
    return {"source": "measured in-process at the start of this run", "repeats": repeats, "prepacked": prepacked,
            **curve}


def read_for_run(path: str | pathlib.Path, context: int, prepacked: bool = True) -> dict:
    """The curve of a saved `python -m bench verify-cost` result whose context is nearest to `context`, measured
    with the linears prepacked or not as asked where the result has both (results before prepacking: not), and
    with the verifier's attention (`sdpa_gqa`) where the result has both (results before it: transformers' sdpa)."""
    saved = json.loads(pathlib.Path(path).read_text())
    curves = saved.get("curves") or []
    if not curves or any("1" not in c.get("ratio", {}) for c in curves):
        raise ValueError(f"{path}: not a `python -m bench verify-cost` result (needs curves with the ratio at n = 1)")
    curves = [c for c in curves if c.get("prepacked", False) == prepacked] or curves
    curves = [c for c in curves if c.get("attention") == "sdpa_gqa"] or curves
    curve = min(curves, key=lambda c: abs(int(c["context"]) - context))
    return {"source": str(path), "dtype": saved.get("dtype"), "model": saved.get("model"), **curve}


def ratio_curve(record: dict | None) -> dict[int, float] | None:
    """{n: t(n)/t(1)} of a run's verify-cost record, for specdec.decoding.speedup."""
    return {int(n): float(v) for n, v in record["ratio"].items()} if record else None


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for curve in result["curves"]:
        ks = [int(k) for k in curve["ratio"]]
        packing = {True: ", prepacked linears", False: ", torch's linears"}.get(curve.get("prepacked"), "")
        attention = f", {curve['attention']}" if "attention" in curve else ""
        ax.plot(ks, list(curve["ratio"].values()), marker="o", label=f"context {curve['context']}{packing}{attention}")
    ks = [int(k) for k in result["curves"][0]["ratio"]]
    ax.plot(ks, ks, linestyle=":", color="grey", label="t(k) = k t(1) (no gain possible)")
    ax.set_xlabel("tokens in one forward pass (k)")
    ax.set_ylabel("t(k) / t(1)")
    ax.set_title(f"{result['model']} {result['dtype']} on {result['device_name']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="a local model directory")
    source.add_argument("--config", choices=sorted(CONFIGS), help="a random-initialised model of this shape")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--max-k", type=int, default=16)
    parser.add_argument("--contexts", default="200,1500", help="comma-separated cached context lengths")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 keeps torch's default)")
    parser.add_argument("--prepack", default="on", choices=["on", "off", "both"],
                        help="the linears prepacked for oneDNN, as the verifier runs them (--prepack-weights; CPU "
                             "float32 only), torch's own, or both curves in one run")
    parser.add_argument("--attention", default="sdpa_gqa", choices=["sdpa_gqa", "sdpa", "both"],
                        help="attention as the verifier runs it (sdpa_gqa: no copies of grouped keys and values on "
                             "CPU, specdec/modeling/gqa_attention.py), transformers' sdpa, or both curves in one run")
    parser.add_argument("--out", default="bench/results/verify_cost", help="writes OUT.json and OUT.png")
    return parser


def main(argv=None) -> int:
    from tqdm import tqdm

    from bench.core.machine import machine_info

    args = build_parser().parse_args(argv)
    if args.max_k < 1 or args.repeats < 1:
        raise SystemExit("--max-k and --repeats must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for, but torch sees no CUDA device")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = (load_causal_lm(args.model, args.device, args.dtype) if args.model
             else build_random_model(args.config, args.device, args.dtype))
    contexts = [int(c) for c in args.contexts.split(",")]
    ks = list(range(1, args.max_k + 1))
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    result = {
        "what": "t(k)/t(1): one target forward over k tokens after a cached context, against one token",
        "model": args.model and pathlib.Path(args.model).name or f"{args.config} (random init)",
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": args.dtype, "device": args.device, "device_name": device_name,
        "torch": torch.__version__, "threads": torch.get_num_threads() if args.device == "cpu" else None,
        "repeats": args.repeats, "statistic": "median, k values (and with --prepack or --attention both, the two models) interleaved",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(torch.get_num_threads(), os.environ.get("OMP_WAIT_POLICY", "default")),  # CPU flags
        "curves": [],
    }
    packings = {"on": [True], "off": [False], "both": [False, True]}[args.prepack]
    attentions = {"sdpa_gqa": ["sdpa_gqa"], "sdpa": ["sdpa"], "both": ["sdpa", "sdpa_gqa"]}[args.attention]
    if len(packings) == 2 and len(attentions) == 2:
        raise SystemExit("compare one thing at a time: --prepack both or --attention both")
    reason = why_not(model) if True in packings else ""
    if reason:
        print(f"not prepacking: {reason}")
        packings = [False]
    variants = [(packing, attention) for packing in packings for attention in attentions]  # (prepacked, attention)
    models = [copy.deepcopy(model) for _ in variants[1:]] + [model]  # copied before any change
    for (packing, attention), variant in zip(variants, models):
        if attention == "sdpa_gqa":
            use_sdpa_gqa(variant)
        elif variant.config._attn_implementation == "sdpa_gqa":
            variant.set_attn_implementation("sdpa")
        if packing:
            prepack_linears(variant)
    with tqdm(total=args.repeats * len(contexts), desc="verify cost", unit="sweep") as progress:
        for context in contexts:
            curves = measure_each(models, args.device, context, ks, args.repeats, args.warmup, progress)
            result["curves"] += [{"prepacked": packing, "attention": variant.config._attn_implementation, **curve}
                                 for (packing, _), variant, curve in zip(variants, models, curves)]
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out.with_suffix(".png"))
    for curve in result["curves"]:
        shown = ", ".join(f"{k}:{r}" for k, r in curve["ratio"].items())
        packing = "prepacked" if curve["prepacked"] else "torch's linears"
        print(f"context {curve['context']}, {packing}, {curve['attention']}: t(1) = {curve['t_ms']['1']} ms; t(k)/t(1) {shown}")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
