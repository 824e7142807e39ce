"""Should I speculate, and with which draft? python -m bench advise --target DIR [--draft DIR] --prompts FILE

Checks that a draft model can pair with the target (one tokenizer), the size ratio and the memory
both models and their KV caches take; then, in-process, on your prompts in their order:
  - the target's greedy continuation of each prompt, and the verify-cost curve t(n)/t(1) of this
    machine (measured here, or --verify-cost FILE);
  - for each proposer (n-gram lookup, suffix decoding, and the draft model and the hybrid if given), the rounds
    it would run: its proposals replayed over the target's continuation at each k (greedy
    verification accepts exactly the longest matching prefix). n-gram and suffix are the draft
    service's own classes; suffix learns from the earlier prompts' outputs, as the service does;
  - the predicted speedup of those rounds with the shared speedup model (specdec/decoding/speedup.py):
    the measured curve, the draft's cost c, the transport rho of the last benchmark, and the
    prefill share of plain decoding;
  - the measured in-process speedup at each proposer's best k: n-gram, suffix and the hybrid through a
    real speculative loop on the target (the verifier engine's rounds, without transport), a draft
    model through Hugging Face assisted generation;
  - with --forced-share (structured outputs: the share of the output a schema forces), the grammar drafter alone
    and on top of suffix (`grammar`, `suffix+grammar`): predicted from that share, the forced run length and
    its acceptance (bench/replay/grammar_rounds.py), not replayed or measured here;
and recommends a proposer and k, or not to speculate.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import time
from typing import TYPE_CHECKING

from bench.core import speedup_model
from bench.core.paths import RESULTS_DIR
from bench.core.workloads import Prompt, load_workload
from bench.replay.grammar_rounds import GRAMMAR_PROPOSERS, ForcedTokens, with_grammar
from specdec.runtime.config import model_dir, optional_model_dir

if TYPE_CHECKING:
    from bench.replay import loop as replay

DEFAULT_RESULTS = RESULTS_DIR / "latest.json"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
K_VALUES = (1, 2, 3, 4, 6, 8)
PROPOSERS = ("ngram", "suffix", "model", "hybrid", *GRAMMAR_PROPOSERS)
MODEL_PROPOSERS = ("model", "hybrid")  # run the draft model (--draft)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench advise", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", required=True, type=model_dir, help="target model directory")
    p.add_argument("--draft", default="", type=optional_model_dir,
                   help="draft model directory (the 'model' and 'hybrid' proposers)")
    p.add_argument("--method", default="", choices=["", *PROPOSERS],
                   help="try only this proposer; default: ngram and suffix, model and hybrid when --draft is given, "
                        "grammar and suffix+grammar when --forced-share is given")
    p.add_argument("--prompts", required=True,
                   help="your prompts, in the order traffic brings them: a .jsonl in bench/workloads format, or a "
                        "text file with one prompt a line")
    p.add_argument("--max-prompts", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=0, help="tokens per sequence for the KV estimate (0: the model's max)")
    p.add_argument("--sequences", type=int, default=1, help="concurrent sequences for the KV estimate")
    p.add_argument("--default-k", type=int, default=4, help="the verifier's default block length")
    p.add_argument("--rho", type=float, default=None,
                   help="per-round transport cost / target step (default: from bench/results/latest.json, else 0.05)")
    p.add_argument("--verify-cost", default="",
                   help="a `python -m bench verify-cost` JSON; default: measure t(n)/t(1) here, on the target")
    p.add_argument("--verify-cost-repeats", type=int, default=6, help="sweeps of the in-process measurement")
    p.add_argument("--no-measure", action="store_true", help="skip the measured in-process speedups")
    p.add_argument("--forced-share", type=float, default=0.0,
                   help="structured outputs: the share of output tokens the schema forces (grammar alone's accepted / "
                        "output in `python -m tools.grammar_draft_check`); 0: the grammar drafter is not considered")
    p.add_argument("--forced-run", type=float, default=ForcedTokens.run,
                   help="forced tokens per grammar draft (its draft tokens / drafts)")
    p.add_argument("--forced-acceptance", type=float, default=ForcedTokens.acceptance,
                   help="the share of forced draft tokens the target accepts")
    p.add_argument("--no-prepack-weights", action="store_true",
                   help="run the target on torch's own linear kernels (the verifier's --prepack-weights false); by "
                        "default its linears are prepacked for oneDNN, as the verifier runs them on CPU in float32")
    return p


def prepack_target(target, disabled: bool) -> str:
    """Run the target as the verifier does: linears prepacked where it would prepack them (CPU, float32).

    Every measurement below (plain decoding, the verify-cost curve, the speculative loop) then runs the same
    kernels. Measuring the curve prepacked and the loop on torch's own kernels predicted 2.1-2.2x on
    extraction where the loop measured 1.6x (AMD EPYC Zen 4, fp32).
    """
    from specdec.modeling.prepacked_linear import prepack_linears, why_not

    reason = "--no-prepack-weights" if disabled else why_not(target)
    if reason:
        return f"linears not prepacked ({reason})"
    return f"{prepack_linears(target)} linears prepacked for oneDNN, as the verifier runs them"


def load_prompts(path: str, limit: int, max_tokens: int) -> list[Prompt]:
    file = pathlib.Path(path)
    if file.suffix == ".jsonl":
        prompts = load_workload(str(file), limit, max_tokens)
    else:
        from specdec.decoding.chat_format import chatml

        lines = [line.strip() for line in file.read_text().splitlines() if line.strip()]
        prompts = [Prompt("custom", f"line{i}", chatml(line), max_tokens, position=i)
                   for i, line in enumerate(lines[:limit])]
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


def default_rho(path: pathlib.Path = DEFAULT_RESULTS) -> tuple[float, float, str]:
    """(rho, rho_off) from the last benchmark: median per-round overheads of n-gram and off over the off step."""
    try:
        rows = json.loads(path.read_text())["rows"]
        step = statistics.median(r["forward_ms_per_round_median"] for r in rows
                                 if r["method"] == "off" and r.get("forward_ms_per_round_median"))

        def overhead(method: str) -> float:
            return statistics.median(r["transport_overhead_ms_median"] for r in rows
                                     if r["method"] == method and r["transport_overhead_ms_median"] is not None)

        spec, off = overhead("ngram"), overhead("off")
        return (max(0.0, spec / step), max(0.0, off / step),
                f"{path} (overhead {spec:.1f} ms, off {off:.1f} ms / target step {step:.1f} ms)")
    except (OSError, KeyError, ValueError, TypeError, statistics.StatisticsError):
        return 0.05, 0.0, "an assumed default (no benchmark results found; run `make bench`)"


def greedy_continuations(model, tokenizer, prompts: list[Prompt], eos) -> tuple[list[tuple[list[int], list[int]]],
                                                                              float, float]:
    """Target greedy output of each prompt, plain-decoding tokens/s, and the share of its time spent in prefill."""
    import torch

    out, tokens, wall, prefill = [], 0, 0.0, 0.0
    for prompt in prompts:
        ids = tokenizer(prompt.text, return_tensors="pt", add_special_tokens=False)["input_ids"]  # [1, prompt]
        prefill += prompt_read_time(model, ids)
        started = time.perf_counter()
        with torch.inference_mode():
            gen = model.generate(ids, max_new_tokens=prompt.max_tokens, do_sample=False, eos_token_id=eos,
                                 pad_token_id=eos if isinstance(eos, int) else eos[0], temperature=None, top_p=None,
                                 top_k=None)
        wall += time.perf_counter() - started
        new = gen[0, ids.shape[1]:].tolist()
        tokens += len(new)
        out.append((ids[0].tolist(), new))
    return out, tokens / wall if wall else 0.0, min(1.0, prefill / wall) if wall else 0.0


def prompt_read_time(model, ids) -> float:
    """Seconds `model` takes to read a prompt ids [1, n] into a fresh cache, the head on the last position alone
    (as generate, the verifier's prefill and the model draft run it)."""
    import torch

    started = time.perf_counter()
    with torch.inference_mode():
        model(ids, use_cache=True, logits_to_keep=1)
    return time.perf_counter() - started


def step_time(model, context: int, trials: int = 10) -> float:
    """Median single-token forward time in seconds with a KV cache at `context` tokens (`verify_cost.measure`)."""
    from bench.studies import verify_cost

    curve = verify_cost.measure(model, str(model.device), context, [1], repeats=trials, warmup=2)
    return curve["t_ms"]["1"] / 1e3


def step_ratio(draft, target, context: int, trials: int = 12) -> float:
    """c: a draft step over a target step at `context` tokens, the median of the ratios of steps taken side by
    side (`verify_cost.sample_each`): a shared machine's load moves a pair alike, where the ratio of two medians
    took in a load phase that fell on one model's samples more than on the other's."""
    from bench.studies import verify_cost

    draft_samples, target_samples = verify_cost.sample_each([draft, target], str(target.device), context, [1],
                                                            repeats=trials, warmup=2)
    return statistics.median(d / t for d, t in zip(draft_samples[1], target_samples[1]))


def hf_assisted_speedup(target, draft, tokenizer, prompts: list[Prompt], k: int, eos, repeats: int = 2) -> float:
    """HF plain greedy vs HF assisted generation with the draft model at a constant k: median over interleaved passes.

    The block length goes on the draft's own generation config: transformers 5 sizes the assistant's blocks from
    `assistant_model.generation_config` (AssistedCandidateGenerator) and ignores num_assistant_tokens given to the
    target's generate, which left every block at its default of 20 tokens whatever k was asked.
    """
    import torch

    pad = eos if isinstance(eos, int) else eos[0]
    common = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None, "eos_token_id": eos,
              "pad_token_id": pad}
    saved = draft.generation_config
    draft.generation_config = copy.deepcopy(saved)
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0  # no early stop: the block is k tokens
    ratios = []
    try:
        for repeat in range(repeats):
            tokens, wall = [0, 0], [0.0, 0.0]
            for index, prompt in enumerate(prompts):
                ids = tokenizer(prompt.text, return_tensors="pt", add_special_tokens=False)["input_ids"]  # [1, prompt]
                order = [0, 1] if (repeat + index) % 2 == 0 else [1, 0]
                for variant in order:
                    started = time.perf_counter()
                    with torch.inference_mode():
                        out = target.generate(ids, max_new_tokens=prompt.max_tokens, **common,
                                              **({"assistant_model": draft} if variant else {}))
                    wall[variant] += time.perf_counter() - started
                    tokens[variant] += out.shape[1] - ids.shape[1]
            ratios.append((tokens[1] / wall[1]) / (tokens[0] / wall[0]))
    finally:
        draft.generation_config = saved
    return statistics.median(ratios)


def loop_speedups(target, runs, prompts: list[Prompt], plan: dict[str, tuple[replay.Drafts, int]], eos: set[int],
                  repeats: int = 2) -> dict[str, float]:
    """tokens/s of each proposer at its k over plain decoding, both through `replay.speculative_greedy`.

    Per pass, prompts in order (each proposer's learnt state fresh at the start of the pass), every
    variant of a prompt back to back in rotating order; median of the passes' ratios.
    """
    from bench.replay import loop as replay

    names = ["plain", *plan]
    ratios: dict[str, list[float]] = {name: [] for name in plan}
    for repeat in range(repeats):
        openers = {name: drafts.new_pass() for name, (drafts, _) in plan.items()}
        tokens = dict.fromkeys(names, 0)
        wall = dict.fromkeys(names, 0.0)
        for index, ((prompt_ids, _), prompt) in enumerate(zip(runs, prompts)):
            shift = (repeat + index) % len(names)
            for name in names[shift:] + names[:shift]:
                k = 0 if name == "plain" else plan[name][1]
                sequence = None if name == "plain" else openers[name](list(prompt_ids))
                started = time.perf_counter()
                out = replay.speculative_greedy(target, prompt_ids, prompt.max_tokens, k, sequence, eos)
                wall[name] += time.perf_counter() - started
                tokens[name] += len(out)
        for name in plan:
            ratios[name].append((tokens[name] / wall[name]) / (tokens["plain"] / wall["plain"]))
    return {name: statistics.median(values) for name, values in ratios.items()}


def hybrid_cost_per_token(c_model: float, model_tokens: int, drafted: int) -> float:
    """The hybrid's draft cost per drafted token: c for each token its model side drafted, spread over the tokens
    its blocks put before the target (`drafted`: the suffix side's chained tokens are cut from a block at a fixed k,
    so they are not among them, though its proposals held them)."""
    return c_model * min(1.0, model_tokens / drafted) if drafted else 0.0


def predict_table(runs, drafts: replay.Drafts, c_model: float | None, target_step: float, curve, rho: float,
                  rho_off: float, prefill_share: float, draft_reads: list[float] | None = None) -> list[dict]:
    """Per k: the replayed rounds and the model's speedup for the service (with transport) and in-process (without).

    A draft model costs c per drafted token (the hybrid's, c times the share of tokens its model side drafted), and
    its prompt read once a request (draft_reads: each run's, as a share of plain decoding's time over all runs). The
    hybrid's model reads it only in the requests where it drafts (the service's reads it when it first drafts). The
    no-model drafts' lookup time is per round, not per token: it goes in as d = draft time per round / target step,
    beside rho.
    """
    from bench.replay import loop as replay

    table = []
    for k in K_VALUES:
        stats = replay.replay(runs, k, drafts.new_pass())
        read = 0.0
        if c_model is not None and draft_reads:
            drafted = drafts.model_drafted if drafts.model_drafted is not None else [True] * len(draft_reads)
            read = min(1.0, sum(share for share, reads in zip(draft_reads, drafted) if reads))
        c, d = (c_model, 0.0) if c_model is not None else (0.0, stats.draft_s / max(1, stats.rounds) / target_step)
        if drafts.drafted_by is not None and c_model is not None:  # hybrid: only the model's tokens cost c
            c = hybrid_cost_per_token(c_model, drafts.drafted_by["model"], stats.drafted)
        service = speedup_model.predicted_speedup_of_rounds(stats.tokens, stats.rounds_by_block, curve, c, rho + d,
                                                            rho_off)
        local = speedup_model.predicted_speedup_of_rounds(stats.tokens, stats.rounds_by_block, curve, c, d)
        table.append({"k": k, "acceptance_rate": stats.accepted / stats.drafted if stats.drafted else 0.0,
                      "block": stats.drafted / stats.drafts if stats.drafts else 0.0,
                      "no_draft_share": 1 - stats.drafts / max(1, stats.rounds),
                      "tokens_per_round": stats.tokens / max(1, stats.rounds), "c": c, "d": d,
                      "tokens": stats.tokens, "rounds_by_block": dict(stats.rounds_by_block),
                      "predicted": speedup_model.with_prefill(service, prefill_share, read),
                      "predicted_in_process": speedup_model.with_prefill(local, prefill_share, read)})
    return table


def grammar_table(name: str, suffix_table: list[dict] | None, tokens: int, forced: ForcedTokens, curve, rho: float,
                  rho_off: float, prefill_share: float) -> list[dict]:
    """Per k: the grammar drafter's predicted rounds and speedup, alone (name 'grammar') or in the suffix table's
    no-draft rounds ('suffix+grammar'); the grammar's matcher cost is taken as nil beside a target step."""
    table = []
    for k in K_VALUES:
        row = next((r for r in suffix_table if r["k"] == k), None) if suffix_table else None
        base = dict(row["rounds_by_block"]) if row else {0: float(tokens)}
        out = row["tokens"] if row else tokens
        d = row["d"] if row else 0.0
        rounds = with_grammar(out, base, forced, k)
        count = sum(rounds.values())
        drafted = sum(b * n for b, n in rounds.items())
        drafts = sum(n for b, n in rounds.items() if b)
        service = speedup_model.predicted_speedup_of_rounds(out, rounds, curve, 0.0, rho + d, rho_off)
        local = speedup_model.predicted_speedup_of_rounds(out, rounds, curve, 0.0, d)
        accepted = out - count  # every round emits its accepted tokens and one more
        table.append({"k": k, "acceptance_rate": accepted / drafted if drafted else 0.0,
                      "block": drafted / drafts if drafts else 0.0, "no_draft_share": rounds.get(0, 0.0) / count,
                      "tokens_per_round": out / count, "c": 0.0, "d": d, "tokens": out, "rounds_by_block": rounds,
                      "predicted": speedup_model.with_prefill(service, prefill_share),
                      "predicted_in_process": speedup_model.with_prefill(local, prefill_share)})
    return table


def recommend(mismatch: str | None, tables: dict[str, list[dict]], default_k: int,
              measured: dict[str, float] | None) -> str:
    """Which proposer and k, or DON'T. A measured speedup, where there is one, overrules the prediction."""
    if not tables:
        return ("DON'T: the draft cannot pair with the target (different tokenizers)." if mismatch
                else "DON'T: no proposer to try.")
    best = {name: max(table, key=lambda row: row["predicted"]) for name, table in tables.items()}
    measured = measured or {}

    def score(name: str) -> float:
        return measured.get(name, best[name]["predicted"])

    name = max(best, key=score)
    row = best[name]
    others = ", ".join(f"{n} {score(n):.2f}x" for n in best if n != name)
    basis = f"measured in-process {measured[name]:.2f}x" if name in measured else f"predicted {row['predicted']:.2f}x"
    if row["predicted"] < 1.05 or measured.get(name, 1.0) < 1.0:
        return (f"DON'T: the best proposer, {name}, reaches {basis} at k = {row['k']} (acceptance "
                f"{row['acceptance_rate']:.2f}, block {row['block']:.1f}); verifying a block costs too much here for "
                f"what is accepted" + (f"; others: {others}." if others else "."))
    default = next((r for r in tables[name] if r["k"] == default_k), None)
    if default is not None and default["predicted"] >= 0.97 * row["predicted"]:
        advice = f"USE {name} (the server's default k = {default_k} is within 3% of the best predicted, k = {row['k']})"
    else:
        advice = f"USE {name} WITH k = {row['k']}"
    return f"{advice}: {basis}" + (f"; others: {others}." if others else ".")


@dataclasses.dataclass
class Models:
    """The target, and the draft model when one is asked for and its tokenizer matches."""

    target: object
    target_tok: object
    draft: object | None
    mismatch: str | None
    configs: dict  # name -> (config.json, parameters)


def main(argv: list[str] | None = None) -> int:
    """Four phases: the machine and the models, their memory, one plain greedy run, then the predictions
    (and, unless --no-measure, the in-process speedups that check them)."""
    args = build_parser().parse_args(argv)
    if args.method in MODEL_PROPOSERS and not args.draft:
        print(f"--method {args.method} needs --draft DIR", file=sys.stderr)
        return 2
    forced = None
    if args.forced_share or args.method in GRAMMAR_PROPOSERS:
        forced = ForcedTokens(args.forced_share, args.forced_run, args.forced_acceptance)
        if forced.problems():
            print("; ".join(forced.problems()) + " (the grammar drafter's figures: python -m tools.grammar_draft_check)",
                  file=sys.stderr)
            return 2
    names = [args.method] if args.method else ["ngram", "suffix"] + (list(MODEL_PROPOSERS) if args.draft else []) \
        + (list(GRAMMAR_PROPOSERS) if forced else [])
    # OpenMP reads this when torch loads: spinning threads make a busy, shared machine collapse (docs/benchmark.md).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    from bench.core.machine import machine_info

    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_info(torch.get_num_threads(), os.environ["OMP_WAIT_POLICY"])
    print(f"machine: {machine['cpu']}, {machine['cores']} cores, torch threads {machine['threads']}; CPU flags "
          f"{', '.join(machine['cpu_flags']) or '-'} (torch CPU capability {machine['torch_cpu_capability']}, "
          f"amx_bf16 {machine['amx_bf16']})")
    models = load_models(args, names)
    print_memory(args, models.configs)
    if not names:
        print("\nrecommendation: " + recommend(models.mismatch, {}, args.default_k, None))
        return 0
    tables, drafts, runs, prompts, eos = predict(args, models, names, forced)
    measured = None if args.no_measure else measure(models, names, tables, drafts, runs, prompts, eos)
    print("\nrecommendation: " + recommend(models.mismatch, tables, args.default_k, measured))
    return 0


def load_models(args: argparse.Namespace, names: list[str]) -> Models:
    """Load the target (prepacked as the verifier runs it) and the draft model; drop the draft from `names` when
    its tokenizer differs from the target's."""
    from specdec.modeling.models import describe, load_causal_lm, load_tokenizer, tokenizer_mismatch

    target_tok = load_tokenizer(args.target)
    target = load_causal_lm(args.target, dtype=args.dtype)
    target_info = describe(args.target, target_tok, target)
    print(f"target: {args.target}: {target_info.num_parameters / 1e6:.1f}M parameters, "
          f"{target_info.tokenizer_class} vocabulary {target_info.tokenizer_vocab_size}; "
          + prepack_target(target, args.no_prepack_weights))
    models = Models(target, target_tok, None, None,
                    {"target": (json.loads((pathlib.Path(args.target) / "config.json").read_text()),
                                target_info.num_parameters)})
    if set(names) & set(MODEL_PROPOSERS):
        draft_tok = load_tokenizer(args.draft)
        models.draft = load_causal_lm(args.draft, dtype=args.dtype)
        draft_info = describe(args.draft, draft_tok, models.draft)
        models.configs["draft"] = (json.loads((pathlib.Path(args.draft) / "config.json").read_text()),
                                   draft_info.num_parameters)
        models.mismatch = tokenizer_mismatch(target_info, draft_info)
        ratio = target_info.num_parameters / max(1, draft_info.num_parameters)
        print(f"draft:  {args.draft}: {draft_info.num_parameters / 1e6:.1f}M parameters; size ratio "
              f"target/draft = {ratio:.1f}x " + ("(in the 10-50x sweet spot)" if 10 <= ratio <= 50 else
                                                 "(too close in size: the draft's cost eats the gain)" if ratio < 10
                                                 else "(very small draft: cheap, but check its acceptance)"))
        print("tokenizer: " + ("compatible (same fingerprint " + target_info.tokenizer_fingerprint + ")"
                               if not models.mismatch else
                               "INCOMPATIBLE: " + models.mismatch + " (the draft model is left out)"))
        if models.mismatch:
            names[:] = [n for n in names if n not in MODEL_PROPOSERS]
    if set(names) & {"ngram", "suffix"}:
        print("no-model drafts: " + ", ".join(n for n in names if n != "model")
              + " (no weights; the target's tokenizer; the suffix cache is bounded by --suffix-max-cached-tokens)")
    return models


def print_memory(args: argparse.Namespace, configs: dict) -> None:
    """Weights and KV cache of each model at the context and sequence count asked for."""
    total = 0
    for name, (config, params) in configs.items():
        context = args.context or int(config.get("max_position_embeddings") or 2048)
        mem = model_memory(config, args.dtype, context, args.sequences)
        weights = params * DTYPE_BYTES[args.dtype]
        total += weights + mem["kv_bytes"]
        print(f"memory {name}: weights {gib(weights)} ({args.dtype}) + KV cache {gib(mem['kv_bytes'])} "
              f"({mem['layers']} layers x {mem['kv_heads']} KV heads x head dim {mem['head_dim']} x 2 (K,V) = "
              f"{mem['kv_bytes_per_token'] / 1024:.1f} KiB/token, x {mem['context']} tokens x {mem['sequences']} seq)")
    print(f"memory total: {gib(total)}")


def predict(args: argparse.Namespace, models: Models, names: list[str], forced: ForcedTokens | None = None):
    """One plain greedy run of the prompts, the verify-cost curve, and each draft's predicted table over k."""
    import torch

    from bench.replay import loop as replay
    from bench.studies import verify_cost
    from specdec.modeling.prepacked_linear import is_prepacked

    target, target_tok = models.target, models.target_tok
    prompts = load_prompts(args.prompts, args.max_prompts, args.max_tokens)
    eos = target.generation_config.eos_token_id or target_tok.eos_token_id
    rho, rho_off, rho_source = ((args.rho, 0.0, "--rho") if args.rho is not None else default_rho())
    print(f"\nmeasuring on {len(prompts)} prompts from {args.prompts} (in order), {args.max_tokens} new tokens each, "
          "greedy ...")
    target.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False)  # warm-up
    runs, plain_tps, prefill_share = greedy_continuations(target, target_tok, prompts, eos)
    context = int(statistics.median(len(p) + len(c) for p, c in runs))
    target_step = step_time(target, context)
    if args.verify_cost:
        record = verify_cost.read_for_run(args.verify_cost, context, prepacked=is_prepacked(target))
    else:
        record = verify_cost.measure_for_run(target, context, repeats=args.verify_cost_repeats)
    curve = verify_cost.ratio_curve(record)
    shown = ", ".join(f"t({n})/t(1) = {curve[n]:.2f}" for n in (2, 4, 5, 8) if n in curve)
    print(f"target: {plain_tps:.1f} tokens/s plain greedy; step {target_step * 1e3:.1f} ms at {context} tokens; "
          f"prefill {prefill_share:.0%} of the time; rho = {rho:.3f}, rho_off = {rho_off:.3f} from {rho_source}")
    print(f"verify cost ({record['source']}, context {record['context']}): {shown}")

    drafts = {"ngram": replay.ngram_drafts(), "suffix": replay.suffix_drafts()}
    if "model" in names:
        drafts["model"] = replay.model_drafts(models.draft, max(K_VALUES))
    if "hybrid" in names:
        drafts["hybrid"] = replay.hybrid_drafts(models.draft, max(K_VALUES))
    uses_model = set(names) & set(MODEL_PROPOSERS)
    c_model = step_ratio(models.draft, target, context) if uses_model else None
    draft_reads: list[float] = []
    if uses_model:
        plain_wall = sum(len(c) for _, c in runs) / plain_tps if plain_tps else 0.0
        reads = [prompt_read_time(models.draft, torch.tensor([p])) for p, _ in runs]  # ids [1, prompt]
        draft_reads = [read / plain_wall if plain_wall else 0.0 for read in reads]
        print(f"draft: reads the prompts in {sum(reads):.2f} s, {min(1.0, sum(draft_reads)):.1%} of plain decoding's "
              "time (once a request, before its first block; the hybrid's, where its model drafts)")
    tables = {}
    suffix_table = None
    for name in names:
        if name in GRAMMAR_PROPOSERS:
            if name == "suffix+grammar" and suffix_table is None:
                suffix_table = predict_table(runs, drafts["suffix"], None, target_step, curve, rho, rho_off,
                                             prefill_share)
            table = grammar_table(name, suffix_table if name == "suffix+grammar" else None,
                                  sum(len(c) for _, c in runs), forced, curve, rho, rho_off, prefill_share)
            print(f"\n{name}: forced share {forced.share:.2f}, {forced.run:.1f} forced tokens a draft, accepted "
                  f"{forced.acceptance:.2f} (given; predicted only: not replayed or measured here)")
        else:
            table = predict_table(runs, drafts[name], c_model if name in MODEL_PROPOSERS else None, target_step,
                                  curve, rho, rho_off, prefill_share, draft_reads)
            if name == "suffix":
                suffix_table = table
        tables[name] = table
        print(f"\n{name}: c = {table[0]['c']:.4f} per drafted token, d = {statistics.median(r['d'] for r in table):.4f} "
              "per round (draft time over the target step)")
        print("  k | acceptance | block | rounds w/o draft | tokens/round | predicted S (service) | in-process")
        for row in table:
            print(f"  {row['k']:>2} | {row['acceptance_rate']:>10.2f} | {row['block']:>5.2f} | "
                  f"{row['no_draft_share']:>16.0%} | {row['tokens_per_round']:>12.2f} | {row['predicted']:>20.2f}x | "
                  f"{row['predicted_in_process']:>9.2f}x")
    print("\n(predicted S: the rounds above with the measured verify cost t(k+1)/t(1), c, rho, the prefill share and "
          "a draft model's prompt read; "
          "in-process: without transport, what the loop below measures)")
    return tables, drafts, runs, prompts, eos


def measure(models: Models, names: list[str], tables: dict, drafts: dict, runs, prompts, eos) -> dict:
    """Each draft's in-process speedup at its best predicted k, against its prediction."""
    from bench.replay import loop as replay

    eos_set = set(eos) if isinstance(eos, (list, tuple)) else {eos}
    best = {name: max(table, key=lambda row: row["predicted"]) for name, table in tables.items()}
    plan = {name: (drafts[name], best[name]["k"]) for name in names if name not in ("model", *GRAMMAR_PROPOSERS)}
    if "hybrid" in plan:  # timed with the service's own model draft: the replay's memoised proposals cost nothing
        plan["hybrid"] = (replay.hybrid_drafts(models.draft, max(K_VALUES), live=True), best["hybrid"]["k"])
    measured = loop_speedups(models.target, runs, prompts, plan, eos_set) if plan else {}
    if "model" in names:
        measured["model"] = hf_assisted_speedup(models.target, models.draft, models.target_tok, prompts,
                                                best["model"]["k"], eos)
    print()
    for name, value in measured.items():
        predicted = best[name]["predicted_in_process"]
        how = "HF assisted generation" if name == "model" else "speculative loop"
        print(f"measured in-process ({how}, {name} at k = {best[name]['k']} vs plain, median of 2 interleaved "
              f"passes): {value:.2f}x; predicted in-process {predicted:.2f}x (measured / predicted "
              f"{value / predicted:.2f})")
    return measured


if __name__ == "__main__":
    raise SystemExit(main())
