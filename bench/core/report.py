"""Aggregate samples into rows (one per workload x method) and write JSON, Markdown and a PNG plot."""

from __future__ import annotations

import collections
import json
import pathlib
import statistics

from bench.core import speedup_model
from bench.core.methods import Sample

OFF = "off"
HF_GREEDY, HF_LOOKUP = "hf_greedy", "hf_prompt_lookup"
ROW_KEYS = ["workload", "method", "tokens_per_s", "speedup_vs_off", "acceptance_rate", "mean_accepted_length",
            "transport_overhead_ms_median", "ttft_ms_median", "anchor_speedup", "predicted_speedup",
            "implementation_efficiency"]


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _round(value, digits=3):
    return None if value is None else round(value, digits)


def per_repeat_tps(samples: list[Sample]) -> dict[int, float]:
    """tokens/s of each repeat: all its prompts' completion tokens over their summed wall time."""
    tokens, wall = collections.Counter(), collections.Counter()
    for s in samples:
        tokens[s.repeat] += s.completion_tokens
        wall[s.repeat] += s.wall_s
    return {r: tokens[r] / wall[r] for r in wall if wall[r] > 0}


def paired_ratio(num: list[Sample], den: list[Sample]) -> float | None:
    """Median over repeats of tokens/s(num) / tokens/s(den), each repeat over the prompts both ran."""
    common = {(s.prompt_id, s.repeat) for s in num} & {(s.prompt_id, s.repeat) for s in den}
    a = per_repeat_tps([s for s in num if (s.prompt_id, s.repeat) in common])
    b = per_repeat_tps([s for s in den if (s.prompt_id, s.repeat) in common])
    return _median([a[r] / b[r] for r in a if r in b and b[r] > 0])


def prefill_share(off: list[Sample]) -> float:
    """Share of plain decoding's wall time spent before the first round: sum(TTFT - one step) / sum(wall)."""
    wall = sum(s.wall_s for s in off)
    prefill = sum(max(0.0, s.ttft_s - (s.forward_s / s.forward_count if s.forward_count else 0.0))
                  for s in off if s.ttft_s is not None and s.forward_s is not None)
    return prefill / wall if wall > 0 else 0.0


def build_rows(samples: list[Sample], draft_cost: dict[str, float] | None = None,
               method_order: list[str] | None = None, verify_curve: dict[int, float] | None = None) -> list[dict]:
    """One row per workload x method: workloads in the order first seen, methods in method_order (else first seen).

    draft_cost: method -> c (draft step time / target step time); 0 when absent (n-gram, suffix).
    verify_curve: the machine's t(n)/t(1) ({n: ratio}); None: the classic model's 1.0.
    """
    draft_cost = draft_cost or {}
    workloads = list(dict.fromkeys(s.workload for s in samples))
    methods = list(dict.fromkeys([*(method_order or []), *(s.method for s in samples)]))
    groups: dict[tuple[str, str], list[Sample]] = {}
    for s in sorted(samples, key=lambda s: (workloads.index(s.workload), methods.index(s.method))):
        groups.setdefault((s.workload, s.method), []).append(s)
    rows = []
    for (workload, method), group in groups.items():
        off = groups.get((workload, OFF), [])
        hf_greedy, hf_lookup = groups.get((workload, HF_GREEDY), []), groups.get((workload, HF_LOOKUP), [])
        drafted = sum(s.num_draft_tokens for s in group)
        accepted = sum(s.num_accepted_tokens for s in group)
        drafts = sum(s.num_drafts for s in group)
        rounds = sum(s.num_rounds for s in group)
        rate = accepted / drafted if drafted else None
        k_mean = drafted / drafts if drafts else None
        overhead = _median([s.overhead_per_round_s() for s in group])
        step = _median([s.forward_s / s.forward_count for s in off if s.forward_count])
        off_overhead = _median([s.overhead_per_round_s() for s in off])
        forward_round = _median([s.forward_s / s.forward_count for s in group if s.forward_count])
        wait_round = _median([s.draft_wait_s / s.forward_count for s in group if s.forward_count
                              and s.draft_wait_s is not None])
        alpha = speedup_model.alpha_from_rate(rate, k_mean) if rate is not None else None
        speedup = paired_ratio(group, off) if off else None
        share = prefill_share(off) if off else None
        predicted = predicted_overhead = efficiency = None
        if drafts and off and step:
            # The model over the measured mix of rounds (drafted at the mean block length, or nothing drafted),
            # the measured verify-cost curve, and plain decoding's measured prefill share (docs/benchmark.md).
            tokens = sum(s.completion_tokens for s in group)
            mix = {k_mean: drafts, 0: rounds - drafts}
            c = draft_cost.get(method, 0.0)
            predicted = speedup_model.with_prefill(
                speedup_model.predicted_speedup_of_rounds(tokens, mix, verify_curve, c), share)
            if overhead is not None and off_overhead is not None:
                predicted_overhead = speedup_model.with_prefill(speedup_model.predicted_speedup_of_rounds(
                    tokens, mix, verify_curve, c, max(0.0, overhead) / step, max(0.0, off_overhead) / step), share)
            efficiency = speedup / predicted if speedup is not None else None
        greedy_pairs = [(s, o) for s in group for o in off if o.prompt_id == s.prompt_id and o.repeat == s.repeat]
        row = {
            "workload": workload,
            "method": method,
            "tokens_per_s": _round(_median(list(per_repeat_tps(group).values())), 2),
            "speedup_vs_off": _round(speedup, 3),
            "acceptance_rate": _round(rate),
            "mean_accepted_length": _round(1 + accepted / drafts if drafts else None),
            "transport_overhead_ms_median": _round(overhead * 1000 if overhead is not None else None, 2),
            "ttft_ms_median": _round(_median([s.ttft_s * 1000 if s.ttft_s is not None else None for s in group]), 1),
            "anchor_speedup": _round(paired_ratio(hf_lookup, hf_greedy), 3) if hf_lookup and hf_greedy else None,
            "predicted_speedup": _round(predicted, 3),
            "implementation_efficiency": _round(efficiency, 3),
            # Extras (not needed by other tools): what the numbers above are made of.
            "requests": len(group),
            "completion_tokens": sum(s.completion_tokens for s in group),
            "num_rounds": rounds,
            "drafted_round_share": _round(drafts / rounds if rounds else None),
            "fallback_round_share": _round(sum(s.num_fallback_rounds for s in group) / rounds if rounds else None),
            "mean_block_len": _round(k_mean, 2),
            "alpha_est": _round(alpha),
            "forward_ms_per_round_median": _round(forward_round * 1000 if forward_round is not None else None, 2),
            "draft_wait_ms_per_round_median": _round(wait_round * 1000 if wait_round is not None else None, 2),
            "prefill_share_of_off": _round(share),
            "predicted_speedup_with_overhead": _round(predicted_overhead, 3),
            # A verify pass of k + 1 tokens over a 1-token step, measured inside the stack.
            "verify_cost_ratio": _round(forward_round / step if forward_round is not None and step else None, 2),
            "tokens_identical_to_off": (_round(sum(s.token_ids == o.token_ids for s, o in greedy_pairs)
                                               / len(greedy_pairs)) if greedy_pairs and method != OFF else None),
        }
        rows.append(row)
    return rows


def write_json(path: pathlib.Path, result: dict) -> None:
    path.write_text(json.dumps(result, indent=2) + "\n")


def _fmt(value, spec="", suffix=""):
    if value is None:
        return "-"
    return f"{value:{spec}}{suffix}"


def machine_lines(result: dict) -> list[str]:
    """The machine, its CPU flags and the verify-cost curve the predictions use."""
    machine = result["machine"]
    flags = machine.get("cpu_flags")
    lines = [
        f"Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, torch threads "
        f"{machine.get('threads', '?')}, load average at start {machine.get('load_avg_start', '?')}, "
        f"at end {machine.get('load_avg_end', '?')}. Repeats: {result['config']['repeats']} (medians). "
        f"Wall time of the run: {result['config'].get('run_seconds', '?')} s.",
        "",
        f"CPU flags that matter: {', '.join(flags) if flags else '-'} (torch CPU capability "
        f"{machine.get('torch_cpu_capability', '?')}; avx512_bf16 {machine.get('avx512_bf16', '?')}, "
        f"amx_bf16 {machine.get('amx_bf16', '?')}).",
    ]
    steadiness = machine.get("steadiness")
    if steadiness:
        lines += ["", "Steadiness (bench/steadiness.py, the same matmul loop timed 8 times; max/min): "
                      + ", ".join(f"{when} {probe['spread']:.2f}x ({min(probe['seconds']):.2f}-"
                                  f"{max(probe['seconds']):.2f} s)" for when, probe in steadiness.items())
                      + ". Differences between methods smaller than this drift are not resolved."]
    verify = result.get("verify_cost")
    if verify:
        ratio = verify["ratio"]
        shown = ", ".join(f"t({n})/t(1) = {ratio[n]:.2f}" for n in ("2", "4", "5", "8", "17") if n in ratio)
        lines += ["", f"Verify cost (one target forward over n tokens against one, context {verify['context']}, "
                      f"{verify['source']}): **t(4)/t(1) = {verify_t4(result):.2f}**; {shown}. A round that drafts "
                      "k tokens verifies k + 1."]
        if verify.get("measurements"):
            start, end = (m["t_ms"]["1"] for m in verify["measurements"])
            step = verify.get("stack_step_ms")
            lines.append(f"Measured before and after the run (t(1) {start:.0f} / {end:.0f} ms; `off`'s step in the stack "
                         + (f"{step:.0f} ms): the {verify['when']}'s curve is used, its t(1) the nearer to the stack's."
                            if step else "not measured): the start's curve is used."))
        curve = {int(n): float(v) for n, v in ratio.items()}
        k, best = speedup_model.ceiling(curve)
        lines.append(f"Ceiling of the speedup model on this curve (every draft token accepted, no overhead, no "
                     f"prefill): {best:.2f}x at k = {k}.")
    else:
        lines += ["", "Verify cost: not recorded in this run; the predictions assume t(n)/t(1) = 1.0 (the classic "
                      "model; `--rebuild FILE --verify-cost CURVE.json` adds a measured curve)."]
    return lines


def verify_t4(result: dict) -> float | None:
    verify = result.get("verify_cost")
    if not verify:
        return None
    return speedup_model.verify_cost({int(n): float(v) for n, v in verify["ratio"].items()}, 4)


def markdown(result: dict) -> str:
    lines = [f"# Benchmark: {pathlib.Path(result['model']).name}, {result['dtype']}, {result['date']}", ""]
    lines += machine_lines(result)
    lines += [
        "",
        "tokens/s is end to end (completion tokens / request wall time, prefill included). Speedups are against "
        "`off` (same stack, k = 0). anchor = HF transformers prompt lookup over HF plain greedy, in-process. "
        "Overhead = per-round time outside the target forward pass and the draft model; verify cost = forward "
        "time per round over `off`'s 1-token step, inside the stack; predicted = the speedup model "
        "(specdec/decoding/speedup.py) with the measured acceptance, block length, verify-cost curve and prefill share, "
        "no transport; efficiency = measured / predicted; w/ overhead = the same model with the measured "
        "overheads (docs/benchmark.md).",
        "",
        "| workload | method | tok/s | speedup vs off | acceptance | mean acc. len | block len | "
        "overhead ms/round | verify cost | TTFT ms | predicted | efficiency | w/ overhead | anchor speedup |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['workload']} | {r['method']} | {_fmt(r['tokens_per_s'], '.1f')} | "
            f"{_fmt(r['speedup_vs_off'], '.2f', 'x')} | {_fmt(r['acceptance_rate'], '.2f')} | "
            f"{_fmt(r['mean_accepted_length'], '.2f')} | {_fmt(r.get('mean_block_len'), '.1f')} | "
            f"{_fmt(r['transport_overhead_ms_median'], '.1f')} | {_fmt(r.get('verify_cost_ratio'), '.2f', 'x')} | "
            f"{_fmt(r['ttft_ms_median'], '.0f')} | {_fmt(r.get('predicted_speedup'), '.2f', 'x')} | "
            f"{_fmt(r.get('implementation_efficiency'), '.2f')} | "
            f"{_fmt(r.get('predicted_speedup_with_overhead'), '.2f', 'x')} | {_fmt(r['anchor_speedup'], '.2f', 'x')} |")
    lines.append("")
    if result.get("comparison"):
        lines += comparison_lines(result)
    if result.get("adaptive_vs_fixed"):
        lines += adaptive_lines(result["adaptive_vs_fixed"])
    return "\n".join(lines)


ADAPTIVE_MIN = 0.97  # the adaptive policy's tokens/s over the best fixed k's, on every workload


def adaptive_vs_fixed(samples: list[Sample], families: tuple[str, ...] = ("ngram", "suffix")) -> list[dict]:
    """Per workload and proposer: the adaptive method ("ngram") against each fixed k ("ngram_k4", ...) it ran beside.

    Each ratio is paired by repeat over the prompts both ran (as the rows' speedups); the best fixed k is the one
    with the highest tokens/s against the adaptive method, so the figure is adaptive / best = min over the ratios.
    """
    by = collections.defaultdict(list)
    for s in samples:
        by[(s.workload, s.method)].append(s)
    workloads = list(dict.fromkeys(s.workload for s in samples))
    out = []
    for workload in workloads:
        for family in families:
            adaptive = by.get((workload, family))
            fixed = {int(m.rsplit("_k", 1)[1]): group for (w, m), group in by.items()
                     if w == workload and m.startswith(family + "_k") and m.rsplit("_k", 1)[1].isdigit()}
            if not adaptive or not fixed:
                continue
            ratios = {k: paired_ratio(adaptive, group) for k, group in sorted(fixed.items())}
            known = {k: v for k, v in ratios.items() if v is not None}
            if not known:
                continue
            best_k = min(known, key=known.get)
            value = known[best_k]
            out.append({"workload": workload, "proposer": family, "adaptive_over_fixed": {k: _round(v) for k, v
                                                                                           in ratios.items()},
                        "best_fixed_k": best_k, "adaptive_over_best": _round(value), "met": value >= ADAPTIVE_MIN})
    return out


def adaptive_lines(rows: list[dict]) -> list[str]:
    lines = [f"## the adaptive policy against fixed k (tokens/s ratio, paired by repeat; figure: >= {ADAPTIVE_MIN} "
             "of the best fixed k)", "",
             "| workload | proposer | adaptive / fixed k | best fixed k | adaptive / best | met |",
             "|---|---|---|---:|---:|---|"]
    for r in rows:
        shown = ", ".join(f"k={k}: {_fmt(v, '.2f', 'x')}" for k, v in r["adaptive_over_fixed"].items())
        lines.append(f"| {r['workload']} | {r['proposer']} | {shown} | {r['best_fixed_k']} | "
                     f"{_fmt(r['adaptive_over_best'], '.2f', 'x')} | {'yes' if r['met'] else 'NO'} |")
    lines.append("")
    return lines


def comparison_lines(result: dict) -> list[str]:
    """suffix against ngram and off, over all requests and after the first requests, with the issue's figures."""
    skip = result.get("warmup", {}).get("skip", 4)
    lines = [
        f"## suffix vs ngram (same run; 'after {skip}' = requests at position >= {skip} in their workload)",
        "",
        f"| workload | repetitive | suffix/ngram | suffix/ngram after {skip} | suffix/off | suffix/off after {skip} | "
        f"ngram/off | figure | met |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for c in result["comparison"]:
        lines.append(
            f"| {c['workload']} | {'yes' if c['repetitive'] else 'no'} | {_fmt(c['suffix_vs_ngram'], '.2f', 'x')} | "
            f"{_fmt(c.get('suffix_vs_ngram_after'), '.2f', 'x')} | {_fmt(c['suffix_vs_off'], '.2f', 'x')} | "
            f"{_fmt(c.get('suffix_vs_off_after'), '.2f', 'x')} | {_fmt(c['ngram_vs_off'], '.2f', 'x')} | "
            f"{'; '.join(f['text'] for f in c['figures']) or '-'} | "
            f"{'; '.join({True: 'yes', False: 'NO', None: 'n/a'}[f['met']] for f in c['figures']) or '-'} |")
    lines.append("")
    warm = result.get("warmup", {}).get("curves", {})
    if warm:
        lines += ["Warm-up: suffix speedup vs off by position in the workload (median over repeats); "
                  "plot: latest_warmup.png.", ""]
        for workload, points in warm.items():
            shown = " ".join(f"{p['speedup']:.2f}" for p in points.get("suffix", []))
            lines.append(f"- {workload}: {shown}")
        lines.append("")
    return lines


def plot(path: pathlib.Path, result: dict) -> None:
    """Measured speedup vs acceptance rate beside the model's prediction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["acceptance_rate"] is not None and r["speedup_vs_off"] is not None]
    offs = {r["workload"]: r for r in result["rows"] if r["method"] == OFF}
    steps = [r["forward_ms_per_round_median"] for r in offs.values() if r.get("forward_ms_per_round_median")]
    step = statistics.median(steps) if steps else None
    spec = [r for r in rows if r["method"].startswith(("ngram", "suffix"))]
    spec_overheads = [r["transport_overhead_ms_median"] for r in spec if r["transport_overhead_ms_median"] is not None]
    off_overheads = [r["transport_overhead_ms_median"] for r in offs.values()
                     if r["transport_overhead_ms_median"] is not None]
    rho = max(0.0, statistics.median(spec_overheads) / step) if step and spec_overheads else 0.0
    rho_off = max(0.0, statistics.median(off_overheads) / step) if step and off_overheads else 0.0
    blocks = [r["mean_block_len"] for r in spec if r.get("mean_block_len")]
    k_main = max(1, round(statistics.median(blocks))) if blocks else 4

    verify = result.get("verify_cost")
    curve = {int(n): float(v) for n, v in verify["ratio"].items()} if verify else None
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(14, 6), gridspec_kw={"width_ratios": [1.1, 1]})
    xs = [i / 100 for i in range(101)]
    source = "measured verify cost" if curve else "verify cost 1.0"
    for k in sorted({2, k_main, 8}):
        style = {"color": "black", "lw": 2} if k == k_main else {"color": "grey", "lw": 1}
        ax.plot(xs, [speedup_model.predicted_speedup(speedup_model.alpha_from_rate(x, k), k, curve, 0.0, rho, rho_off)
                     for x in xs], label=f"model k={k}, c=0, rho={rho:.2f} (off: {rho_off:.2f}), {source}", **style)
    ax.plot(xs, [1 + k_main * x for x in xs], "k--", lw=1,
            label=f"model k={k_main}, c=0, rho=0, verify cost 1.0 (the classic model)")
    ax.axhline(1.0, color="red", lw=0.8, ls=":")
    markers = {"copy_heavy": "o", "structured": "s", "chat": "^", "creative": "v", "long_prompt": "D",
               "extraction": "P", "agent_loop": "X", "sql": "*", "faq": "h", "code": "p"}
    colors = {}
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown"]
    for i, r in enumerate(sorted(rows, key=lambda r: r["acceptance_rate"])):
        color = colors.setdefault(r["method"], palette[len(colors) % len(palette)])
        ax.scatter(r["acceptance_rate"], r["speedup_vs_off"], marker=markers.get(r["workload"], "o"), s=70,
                   color=color, edgecolor="black", zorder=3)
        ax.annotate(f"{r['workload']}\n{r['method']} (k~{r.get('mean_block_len') or 0:.1f})",
                    (r["acceptance_rate"], r["speedup_vs_off"]), fontsize=7, xytext=(-8, -4) if i % 2 else (8, -4),
                    ha="right" if i % 2 else "left",
                    textcoords="offset points")
    for method, color in colors.items():
        ax.scatter([], [], color=color, edgecolor="black", label=f"measured: {method}")
    ax.set_xlabel("acceptance rate (accepted / drafted tokens)")
    ax.set_ylabel("speedup vs off (end-to-end tokens/s)")
    ax.set_xlim(0, 1)
    top = max([r["speedup_vs_off"] for r in rows] + [2.0]) * 1.15
    ax.set_ylim(0, max(top, 1.5))
    ax.set_title("Measured speedup vs acceptance, beside S = E (1 + rho_off) / (k c + t(k+1)/t(1) + rho)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")

    workloads = list(dict.fromkeys(r["workload"] for r in result["rows"]))
    methods = [m for m in dict.fromkeys(r["method"] for r in result["rows"]) if m != OFF]
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        values = []
        for w in workloads:
            match = [r for r in result["rows"] if r["workload"] == w and r["method"] == method]
            values.append(match[0]["speedup_vs_off"] or 0 if match else 0)
        bars.bar([j + i * width for j in range(len(workloads))], values, width, label=method)
    anchors = []
    for w in workloads:
        match = [r["anchor_speedup"] for r in result["rows"] if r["workload"] == w and r["anchor_speedup"]]
        anchors.append(match[0] if match else None)
    for j, value in enumerate(anchors):
        if value:
            bars.hlines(value, j - 0.1, j + 0.8, colors="black", linestyles="--", lw=1)
    bars.plot([], [], "k--", lw=1, label="anchor: HF prompt lookup / HF greedy")
    bars.axhline(1.0, color="red", lw=0.8, ls=":")
    bars.set_xticks([j + 0.4 - width / 2 for j in range(len(workloads))], workloads, rotation=15)
    bars.set_ylabel("speedup vs off")
    bars.set_title("Speedup by workload (1.0 = the stack with k = 0)")
    bars.legend(fontsize=7)
    bars.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{pathlib.Path(result['model']).name}, {result['dtype']}, {result['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
