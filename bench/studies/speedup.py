"""python -m bench --model DIR [--quick] [--workloads SET] [--draft-model DIR] [--out bench/results]

Loads the target in-process, measures its verify-cost curve t(n)/t(1) (or reads one, --verify-cost)
and keeps it for the Hugging Face anchor; starts the n-gram stack (gateway -> verifier -> draft:
methods off and ngram) and a suffix stack (method suffix, restarted with an empty cache at each
repeat), optionally a draft-model stack; then, for every prompt in workload order, runs every
method back to back (the order rotates per prompt and repeat) and repeats the whole pass R times.
Writes <out>/<timestamp>.json, <out>/latest.json, <out>/latest.md, <out>/latest.png and
<out>/latest_warmup.png.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import json
import logging
import math
import os
import pathlib
import shlex
import signal
import statistics
import sys
import tempfile
import time

from bench.core import report, warmup
from bench.core.machine import machine_info
from bench.core.methods import FreshStackMethod, HFMethod, HFModel, StackMethod, draft_step_seconds
from bench.core.paths import RESULTS_DIR
from bench.core.workloads import REPETITIVE_WORKLOADS, Prompt, load_workload, parse_workloads
from specdec.decoding.chat_format import chatml
from specdec.runtime.config import model_dir, optional_model_dir

log = logging.getLogger("bench")
DEFAULT_OUT = RESULTS_DIR
# Every stack's first request, before any timing; unlike any workload's prompts, so the suffix cache
# learns nothing from it that a timed request could use.
WARMUP_PROMPT = Prompt("warmup", "warmup", chatml("Count from one to five."), 16)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench speedup", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", required=True, type=model_dir, help="target model directory")
    p.add_argument("--draft-model", default="", type=optional_model_dir, help="also benchmark a draft model (a second stack, method=model)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results directory")
    p.add_argument("--quick", action="store_true",
                   help="1 repeat, 2 prompts per workload, at most 48 new tokens: a few minutes")
    p.add_argument("--repeats", type=int, default=None, help="passes over all prompts (default 3; --quick 1)")
    p.add_argument("--workloads", default="default",
                   help="comma-separated names in bench/workloads/ or .jsonl paths, played in this order; the sets "
                        "'default' (repetitive + classic), 'repetitive' (extraction, agent_loop, sql, faq) and "
                        "'classic' (copy_heavy, structured, chat, creative, long_prompt) and 'all' (default + code) "
                        "expand")
    p.add_argument("--prompts-per-workload", type=int, default=None, help="first N prompts of each (default all)")
    p.add_argument("--max-tokens", type=int, default=None, help="cap every prompt's max_tokens")
    p.add_argument("--fixed-k", default="",
                   help="also run n-gram and suffix at these fixed k, e.g. '4' or '2,8' (each suffix k: a stack of its own)")
    p.add_argument("--anchor-lookup", type=int, default=4, help="HF prompt_lookup_num_tokens of the anchor")
    p.add_argument("--no-anchor", action="store_true", help="skip the in-process Hugging Face anchor")
    p.add_argument("--no-suffix", action="store_true", help="skip the suffix stack (method suffix)")
    p.add_argument("--suffix-reset", default="repeat", choices=["repeat", "workload"],
                   help="restart the suffix stack (an empty cache) at each repeat, or at each workload of each repeat")
    p.add_argument("--suffix-draft-args", default="",
                   help="extra draft-service flags for the suffix stack, e.g. '--suffix-max-cached-requests 1000'")
    p.add_argument("--verify-cost", default="",
                   help="a `python -m bench verify-cost` JSON for the model's t(n)/t(1) curve (the context nearest "
                        "the run's median prompt is used); default: measure it in-process at the start")
    p.add_argument("--verify-cost-repeats", type=int, default=8, help="sweeps of the in-process measurement")
    p.add_argument("--no-prepack-weights", action="store_true",
                   help="run the verifiers on torch's own linear kernels (their --prepack-weights false), and measure "
                        "or read the verify cost so: the before of prepacking")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="target (and draft) dtype")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the verifier and of the anchor")
    p.add_argument("--omp-wait-policy", default="PASSIVE", choices=["PASSIVE", "ACTIVE", "inherit"],
                   help="OMP_WAIT_POLICY for the services and the anchor; PASSIVE keeps a busy, shared machine from "
                        "collapsing (spinning OpenMP threads cost seconds per forward when cores are oversubscribed)")
    p.add_argument("--vllm", action="store_true",
                   help="add a vLLM column: a third stack with --engine vllm (methods vllm_off and vllm_ngram)")
    p.add_argument("--vllm-python", default=".venv-vllm/bin/python", help="the interpreter with vLLM (make setup-vllm)")
    p.add_argument("--steadiness-repeats", type=int, default=8,
                   help="times the machine-drift probe (bench/steadiness.py) runs before and after the run; 0: none")
    p.add_argument("--no-plot", action="store_true", help="skip latest.png")
    p.add_argument("--log-dir", default="", help="service logs (default: a temporary directory)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--rebuild", default="",
                   help="no run: rebuild rows, latest.* from the samples of a <timestamp>.json (after a report change; "
                        "with --verify-cost, predictions with that curve)")
    return p


def context_ok(tokenizer, max_context: int, prompt) -> bool:
    return len(tokenizer(prompt.text, add_special_tokens=False)["input_ids"]) + prompt.max_tokens <= max_context


def load_prompts(args, tokenizer, max_context: int, per_workload, max_tokens) -> list[Prompt]:
    prompts = []
    for name in parse_workloads(args.workloads):
        for prompt in load_workload(name, per_workload, max_tokens):
            if context_ok(tokenizer, max_context, prompt):
                prompts.append(prompt)
            else:
                log.warning("skipping %s/%s: prompt + max_tokens exceed the context (%d)", prompt.workload,
                            prompt.id, max_context)
    if not prompts:
        raise SystemExit("no prompt fits the model's context")
    return prompts


def verify_curve(args, hf: HFModel | None, context: int) -> dict:
    """The run's verify-cost record: read from --verify-cost, or measured on the in-process target."""
    from bench.studies import verify_cost  # imports torch: after main() has set OMP_WAIT_POLICY

    if args.verify_cost:
        record = verify_cost.read_for_run(args.verify_cost, context, prepacked=not args.no_prepack_weights)
        if record.get("dtype") and record["dtype"] != args.dtype:
            log.warning("--verify-cost %s was measured in %s; this run is %s", args.verify_cost, record["dtype"],
                        args.dtype)
        return record
    log.info("measuring the verify cost t(n)/t(1) at a %d-token context (%d sweeps)", context,
             args.verify_cost_repeats)
    return verify_cost.measure_for_run(hf.model, context, repeats=args.verify_cost_repeats,
                                       prepack=not args.no_prepack_weights)


def stack_step_ms(samples) -> float | None:
    """`off`'s median target step inside the stack (a 1-token forward), in ms: what the curve's t(1) should be."""
    steps = [s.forward_s / s.forward_count for s in samples if s.method == "off" and s.forward_count and s.forward_s]
    return statistics.median(steps) * 1000 if steps else None


def pick_curve(start: dict, end: dict, step_ms: float | None) -> dict:
    """Of the curves measured before and after the run, the one whose t(1) is nearest `off`'s step in the stack.

    A curve is 20 s of forwards; a slow spell of the machine in those seconds inflates every t(n) and flattens
    t(n)/t(1) (one run here measured t(1) = 210 ms at its start, where `off`'s step in the stack took 109-126 ms,
    and read t(4)/t(1) = 1.06 where interleaved runs measure 1.24-1.32). Both are kept in the record.
    """
    measured = [dict(start, when="start"), dict(end, when="end")]
    if step_ms:
        chosen = min(measured, key=lambda c: abs(math.log(c["t_ms"]["1"] / step_ms)))
    else:
        chosen = measured[0]
    return {**chosen, "stack_step_ms": step_ms and round(step_ms, 2),
            "measurements": [{"when": c["when"], "t_ms": c["t_ms"], "ratio": c["ratio"]} for c in measured]}


@dataclasses.dataclass(frozen=True)
class Plan:
    """How much of each workload a run plays: --quick's smaller defaults, or the flags'."""

    repeats: int
    per_workload: int | None
    max_tokens: int | None
    fixed_ks: list[int]

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Plan":
        return cls(repeats=args.repeats if args.repeats is not None else (1 if args.quick else 3),
                   per_workload=args.prompts_per_workload or (2 if args.quick else None),
                   max_tokens=args.max_tokens or (48 if args.quick else None),
                   fixed_ks=[int(k) for k in args.fixed_k.split(",") if k.strip()])


def run(args: argparse.Namespace) -> dict:
    """The study in four phases: the prompts, the in-process curve, the stacks' methods, then every request."""
    from specdec.modeling.models import load_tokenizer

    plan = Plan.from_args(args)
    started_run = time.monotonic()
    env = {} if args.omp_wait_policy == "inherit" else {"OMP_WAIT_POLICY": args.omp_wait_policy}
    machine = machine_info(args.threads, os.environ.get("OMP_WAIT_POLICY", "default"))
    from bench.core.steadiness import probe

    steadiness = {"before": probe(args.steadiness_repeats)} if args.steadiness_repeats else {}  # the drift

    tokenizer = load_tokenizer(args.model)
    config = json.loads((pathlib.Path(args.model) / "config.json").read_text())
    max_context = int(config.get("max_position_embeddings") or 2048)
    prompts = load_prompts(args, tokenizer, max_context, plan.per_workload, plan.max_tokens)
    context = int(statistics.median(len(tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in prompts))

    log_dir = pathlib.Path(args.log_dir) if args.log_dir else pathlib.Path(tempfile.mkdtemp(prefix="bench-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        # The in-process target first, on a machine with no stack running yet: its verify-cost curve.
        hf = None
        if not (args.no_anchor and args.verify_cost):
            log.info("loading the target in-process (%s)", ", ".join(
                ([] if args.verify_cost else ["verify cost"]) + ([] if args.no_anchor else ["HF anchor"])))
            hf = HFModel(args.model, dtype=args.dtype, threads=args.threads)
        verify = verify_curve(args, hf, context)
        log.info("verify cost t(n)/t(1): %s", ", ".join(f"{n}: {v:.2f}" for n, v in verify["ratio"].items()))
        curve_model = None if args.verify_cost else hf  # measures the curve again once the stacks are down
        methods, draft_cost = start_methods(args, stack, plan, env, log_dir, None if args.no_anchor else hf)
        samples = play(args, methods, prompts, plan.repeats)

    if curve_model is not None:
        end = verify_curve(args, curve_model, context)
        verify = pick_curve(verify, end, stack_step_ms(samples))
        curve_model = None
        log.info("verify cost measured again: t(1) %.1f ms at the start, %.1f at the end, off's step in the stack "
                 "%s ms; kept the %s's: %s", verify["measurements"][0]["t_ms"]["1"],
                 verify["measurements"][1]["t_ms"]["1"], verify["stack_step_ms"], verify["when"],
                 ", ".join(f"{n}: {v:.2f}" for n, v in verify["ratio"].items()))
    machine["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    if steadiness:
        steadiness["after"] = probe(args.steadiness_repeats)
        machine["steadiness"] = steadiness
    result = {
        "machine": machine,
        "model": str(args.model),
        "dtype": args.dtype,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "verify_cost": verify,
        "config": {"repeats": plan.repeats, "workloads": parse_workloads(args.workloads), "prompts": len(prompts),
                   "max_tokens_cap": plan.max_tokens, "fixed_k": plan.fixed_ks, "anchor_lookup": args.anchor_lookup,
                   "draft_model": args.draft_model or None, "vllm": args.vllm, "draft_cost_c": draft_cost or None,
                   "suffix": not args.no_suffix, "suffix_reset": args.suffix_reset,
                   "suffix_draft_args": args.suffix_draft_args, "threads": args.threads, "quick": args.quick,
                   "prepack_weights": not args.no_prepack_weights,
                   "run_seconds": round(time.monotonic() - started_run, 1)},
    }
    result.update(aggregate(samples, result, [m.name for m in methods]))
    result["samples"] = [{k: v for k, v in dataclasses.asdict(s).items() if k != "token_ids"} for s in samples]
    return result


def start_methods(args: argparse.Namespace, stack: contextlib.ExitStack, plan: Plan, env: dict, log_dir: pathlib.Path,
                  hf: HFModel | None) -> tuple[list, dict[str, float]]:
    """Start every stack the flags ask for (closed with `stack`); the methods to play, and each draft model's c."""
    from devkit.stack import running_stack

    verifier_args = ["--dtype", args.dtype, "--threads", str(args.threads),
                     "--prepack-weights", str(not args.no_prepack_weights).lower()]
    draft_cost: dict[str, float] = {}
    log.info("starting the n-gram stack (logs in %s)", log_dir)
    ngram_services = stack.enter_context(running_stack(args.model, method="ngram", verifier_args=verifier_args,
                                                       env=env, log_dir=log_dir))
    gateway, metrics_port = ngram_services["gateway"].address, ngram_services["verifier"].metrics_port
    methods = [StackMethod("off", gateway, metrics_port, k=0), StackMethod("ngram", gateway, metrics_port, k=None)]
    methods += [StackMethod(f"ngram_k{k}", gateway, metrics_port, k=k) for k in plan.fixed_ks]
    if not args.no_suffix:
        start_suffix = functools.partial(
            running_stack, args.model, method="suffix", verifier_args=verifier_args,
            draft_args=shlex.split(args.suffix_draft_args), env=env, log_dir=log_dir)
        for name, k in [("suffix", None), *((f"suffix_k{k}", k) for k in plan.fixed_ks)]:
            # One stack each: a cache shared by two methods would serve one the other's output of the same prompt.
            methods.append(stack.enter_context(contextlib.closing(
                FreshStackMethod(name, start_suffix, WARMUP_PROMPT, k=k))))
    if args.draft_model:
        log.info("measuring the draft model's step time in-process")
        draft_step = draft_step_seconds(args.draft_model, args.dtype, args.threads)
        target_step = draft_step_seconds(args.model, args.dtype, args.threads)
        draft_cost["model"] = draft_step / target_step
        log.info("draft step %.1f ms, target step %.1f ms: c = %.3f", draft_step * 1e3, target_step * 1e3,
                 draft_cost["model"])
        model_services = stack.enter_context(running_stack(
            args.model, args.draft_model, method="model", verifier_args=verifier_args,
            draft_args=["--dtype", args.dtype], env=env, log_dir=log_dir))
        methods.append(StackMethod("model", model_services["gateway"].address,
                                   model_services["verifier"].metrics_port, k=None, draft_step_s=draft_step))
    if args.vllm:
        log.info("starting the vLLM stack (%s)", args.vllm_python)
        vllm_services = stack.enter_context(running_stack(
            args.model, method="ngram", verifier_args=["--dtype", args.dtype, "--engine", "vllm"], env=env,
            log_dir=log_dir, timeout_s=300, verifier_python=args.vllm_python))
        vllm_gateway, vllm_metrics = vllm_services["gateway"].address, vllm_services["verifier"].metrics_port
        methods += [StackMethod("vllm_off", vllm_gateway, vllm_metrics, k=0),
                    StackMethod("vllm_ngram", vllm_gateway, vllm_metrics, k=None)]
    if hf is not None:
        methods += [HFMethod(report.HF_GREEDY, hf, 0), HFMethod(report.HF_LOOKUP, hf, args.anchor_lookup)]
    return methods, draft_cost


def play(args: argparse.Namespace, methods: list, prompts: list[Prompt], repeats: int) -> list:
    """Warm every method up, then run every prompt through every method, R times; the order rotates."""
    from tqdm import tqdm

    samples = []
    fresh = [m for m in methods if isinstance(m, FreshStackMethod)]
    for method in methods:  # warm-up: first-call costs stay out of the numbers (fresh stacks: at each start)
        if method not in fresh:
            method.run(WARMUP_PROMPT, repeat=-1, max_tokens=16)
    bar = tqdm(total=repeats * len(prompts) * len(methods), unit="req", desc="bench", disable=args.no_progress,
               file=sys.stderr)
    for repeat in range(repeats):
        for index, prompt in enumerate(prompts):
            for method in fresh:  # an empty cache at each repeat (or workload): see docs/benchmark.md
                key = (repeat,) if args.suffix_reset == "repeat" else (repeat, prompt.workload)
                if method.reset(key):
                    log.info("%s: fresh stack for %s", method.name, key)
            shift = (repeat + index) % len(methods)
            for method in methods[shift:] + methods[:shift]:
                bar.set_postfix_str(f"{prompt.workload}/{prompt.id} {method.name}", refresh=False)
                try:
                    samples.append(method.run(prompt, repeat))
                except Exception as exc:  # noqa: BLE001 (one failed request must not lose the run)
                    log.error("%s on %s/%s failed: %s", method.name, prompt.workload, prompt.id, exc)
                bar.update(1)
    bar.close()
    for method in methods:
        method.close()
    return samples


def aggregate(samples, result: dict, method_order: list[str]) -> dict:
    """rows, warmup and comparison from the samples: the same code for a run and for --rebuild."""
    from bench.studies import verify_cost

    curve = verify_cost.ratio_curve(result.get("verify_cost"))
    rows = report.build_rows(samples, result["config"].get("draft_cost_c") or {}, method_order, curve)
    return {
        "rows": rows,
        "warmup": {"skip": warmup.SKIP, "repetitive": REPETITIVE_WORKLOADS, "curves": warmup.curves(samples)},
        "comparison": warmup.comparison(samples, REPETITIVE_WORKLOADS, report.verify_t4(result)),
        "adaptive_vs_fixed": report.adaptive_vs_fixed(samples),
    }


def rebuild(path: pathlib.Path, verify_cost_path: str = "") -> dict:
    """Re-aggregate a saved run (its raw samples) with the current report code (and a verify-cost curve, if given)."""
    from bench.core.methods import Sample
    from bench.studies import verify_cost

    result = json.loads(path.read_text())
    if verify_cost_path:
        context = (result.get("verify_cost") or {}).get("context", 200)
        result["verify_cost"] = verify_cost.read_for_run(verify_cost_path, context)
    samples = [Sample(**s) for s in result["samples"]]
    old = {(r["workload"], r["method"]): r for r in result["rows"]}
    order = list(dict.fromkeys(r["method"] for r in result["rows"]))
    result.update(aggregate(samples, result, order))
    result["samples"] = result.pop("samples")  # last, as a run writes it
    for row in result["rows"]:  # token ids are not saved: keep what the run itself compared
        row["tokens_identical_to_off"] = old.get((row["workload"], row["method"]), {}).get("tokens_identical_to_off")
    if "torch_cpu_capability" not in result["machine"]:
        import torch

        current = machine_info(result["machine"].get("threads", 0), result["machine"].get("omp_wait_policy", ""))
        for key in ("torch_cpu_capability", "avx512_bf16", "amx_bf16"):
            result["machine"][key] = current[key]
        result["machine"]["cpu_flags_recorded_at_rebuild"] = True
        del torch
    return result


def write_results(result: dict, out: pathlib.Path, plot: bool = True) -> dict[str, pathlib.Path]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = result["date"].replace(":", "").replace("-", "")
    paths = {"run": out / f"{stamp}.json", "latest": out / "latest.json", "md": out / "latest.md"}
    report.write_json(paths["run"], result)
    report.write_json(paths["latest"], {k: v for k, v in result.items() if k != "samples"})
    paths["md"].write_text(report.markdown(result))
    if plot:
        paths["png"] = out / "latest.png"
        report.plot(paths["png"], result)
        if result.get("warmup", {}).get("curves"):
            paths["warmup_png"] = out / "latest_warmup.png"
            warmup.plot(paths["warmup_png"], result)
    return paths


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # SIGTERM unwinds like Ctrl-C, so the stack's processes are stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = build_parser().parse_args(argv)
    if args.omp_wait_policy != "inherit":
        # For the in-process anchor: OpenMP reads this when torch loads, so set it before anything imports torch.
        if "torch" in sys.modules and os.environ.get("OMP_WAIT_POLICY") != args.omp_wait_policy:
            log.warning("torch is already loaded: OMP_WAIT_POLICY=%s applies to the services only",
                        args.omp_wait_policy)
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy
    if args.rebuild:
        result = rebuild(pathlib.Path(args.rebuild), args.verify_cost)
    else:
        result = run(args)
    paths = write_results(result, pathlib.Path(args.out), plot=not args.no_plot)
    print(report.markdown(result))
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0
