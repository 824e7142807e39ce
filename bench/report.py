"""Aggregate samples into rows (one per workload x method) and write JSON, Markdown and a PNG plot."""

from __future__ import annotations

import collections
import json
import pathlib
import statistics

from bench import speedup_model
from bench.methods import Sample

OFF = "off"
HF_GREEDY, HF_LOOKUP = "hf_greedy", "hf_prompt_lookup"
ROW_KEYS = ["workload", "method", "tokens_per_s", "speedup_vs_off", "acceptance_rate", "mean_accepted_length",
            "transport_overhead_ms_median", "ttft_ms_median", "anchor_speedup"]


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


def build_rows(samples: list[Sample], draft_cost: dict[str, float] | None = None,
               method_order: list[str] | None = None) -> list[dict]:
    """One row per workload x method: workloads in the order first seen, methods in method_order (else first seen).

    draft_cost: method -> c (draft step time / target step time); 0 when absent (n-gram).
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
        predicted = None
        if alpha is not None and step and overhead is not None and off_overhead is not None:
            c = draft_cost.get(method, 0.0)
            # Against `off`, which pays its own per-token overhead: S = E (1 + rho_off) / (k c + 1 + rho).
            # Overheads are clamped at 0 (a noisy subtraction can go slightly negative).
            predicted = (speedup_model.predicted_speedup(alpha, k_mean, c, max(0.0, overhead) / step)
                         * (1 + max(0.0, off_overhead) / step))
        greedy_pairs = [(s, o) for s in group for o in off if o.prompt_id == s.prompt_id and o.repeat == s.repeat]
        row = {
            "workload": workload,
            "method": method,
            "tokens_per_s": _round(_median(list(per_repeat_tps(group).values())), 2),
            "speedup_vs_off": _round(paired_ratio(group, off), 3) if off else None,
            "acceptance_rate": _round(rate),
            "mean_accepted_length": _round(1 + accepted / drafts if drafts else None),
            "transport_overhead_ms_median": _round(overhead * 1000 if overhead is not None else None, 2),
            "ttft_ms_median": _round(_median([s.ttft_s * 1000 if s.ttft_s is not None else None for s in group]), 1),
            "anchor_speedup": _round(paired_ratio(hf_lookup, hf_greedy), 3) if hf_lookup and hf_greedy else None,
            # Extras (not needed by other tools): what the numbers above are made of.
            "requests": len(group),
            "completion_tokens": sum(s.completion_tokens for s in group),
            "num_rounds": rounds,
            "fallback_round_share": _round(sum(s.num_fallback_rounds for s in group) / rounds if rounds else None),
            "mean_block_len": _round(k_mean, 2),
            "alpha_est": _round(alpha),
            "forward_ms_per_round_median": _round(forward_round * 1000 if forward_round is not None else None, 2),
            "draft_wait_ms_per_round_median": _round(wait_round * 1000 if wait_round is not None else None, 2),
            "predicted_speedup": _round(predicted, 3),
            # A verify pass of k + 1 tokens over a 1-token step; the model assumes 1.0.
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


def markdown(result: dict) -> str:
    machine = result["machine"]
    lines = [
        f"# Benchmark: {pathlib.Path(result['model']).name}, {result['dtype']}, {result['date']}",
        "",
        f"Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, torch threads "
        f"{machine.get('threads', '?')}, load average at start {machine.get('load_avg_start', '?')}, "
        f"at end {machine.get('load_avg_end', '?')}. Repeats: {result['config']['repeats']} (medians). "
        f"Wall time of the run: {result['config'].get('run_seconds', '?')} s.",
        "",
        "tokens/s is end to end (completion tokens / request wall time, prefill included). Speedups are against "
        "`off` (same stack, k = 0). anchor = HF transformers prompt lookup over HF plain greedy, in-process. "
        "Overhead = per-round time outside the target forward pass and the draft model; verify cost = forward "
        "time per round over `off`'s 1-token step; predicted = the speedup model with the measured acceptance, "
        "block length and overheads, which assumes verify cost 1.0x (docs/benchmark.md).",
        "",
        "| workload | method | tok/s | speedup vs off | acceptance | mean acc. len | block len | "
        "overhead ms/round | forward ms/round | verify cost | TTFT ms | predicted | anchor speedup |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['workload']} | {r['method']} | {_fmt(r['tokens_per_s'], '.1f')} | "
            f"{_fmt(r['speedup_vs_off'], '.2f', 'x')} | {_fmt(r['acceptance_rate'], '.2f')} | "
            f"{_fmt(r['mean_accepted_length'], '.2f')} | {_fmt(r.get('mean_block_len'), '.1f')} | "
            f"{_fmt(r['transport_overhead_ms_median'], '.1f')} | {_fmt(r.get('forward_ms_per_round_median'), '.1f')} | "
            f"{_fmt(r.get('verify_cost_ratio'), '.2f', 'x')} | "
            f"{_fmt(r['ttft_ms_median'], '.0f')} | {_fmt(r.get('predicted_speedup'), '.2f', 'x')} | "
            f"{_fmt(r['anchor_speedup'], '.2f', 'x')} |")
    lines.append("")
    return "\n".join(lines)


def plot(path: pathlib.Path, result: dict) -> None:
    """Measured speedup vs acceptance rate beside the model's prediction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["acceptance_rate"] is not None and r["speedup_vs_off"] is not None]
    offs = {r["workload"]: r for r in result["rows"] if r["method"] == OFF}
    steps = [r["forward_ms_per_round_median"] for r in offs.values() if r.get("forward_ms_per_round_median")]
    step = statistics.median(steps) if steps else None
    ngram = [r for r in rows if r["method"].startswith("ngram")]
    spec_overheads = [r["transport_overhead_ms_median"] for r in ngram if r["transport_overhead_ms_median"] is not None]
    off_overheads = [r["transport_overhead_ms_median"] for r in offs.values()
                     if r["transport_overhead_ms_median"] is not None]
    rho = max(0.0, statistics.median(spec_overheads) / step) if step and spec_overheads else 0.0
    rho_off = max(0.0, statistics.median(off_overheads) / step) if step and off_overheads else 0.0
    blocks = [r["mean_block_len"] for r in ngram if r.get("mean_block_len")]
    k_main = max(1, round(statistics.median(blocks))) if blocks else 4

    fig, (ax, bars) = plt.subplots(1, 2, figsize=(14, 6), gridspec_kw={"width_ratios": [1.1, 1]})
    xs = [i / 100 for i in range(101)]
    for k in sorted({2, k_main, 8}):
        style = {"color": "black", "lw": 2} if k == k_main else {"color": "grey", "lw": 1}
        ax.plot(xs, [speedup_model.predicted_speedup(speedup_model.alpha_from_rate(x, k), k, 0.0, rho)
                     * (1 + rho_off) for x in xs], label=f"model k={k}, c=0, rho={rho:.2f} (off: {rho_off:.2f})",
                **style)
    ax.plot(xs, [1 + k_main * x for x in xs], "k--", lw=1, label=f"model k={k_main}, c=0, rho=0 (ideal)")
    verify = [r["verify_cost_ratio"] for r in ngram if r.get("verify_cost_ratio")]
    if verify:  # the model's "1" (one target step per round) replaced by the measured verify pass cost
        v = statistics.median(verify)
        ax.plot(xs, [(1 + k_main * x) * (1 + rho_off) / (v + rho) for x in xs], color="tab:red", ls="-.", lw=1.5,
                label=f"k={k_main}, c=0, rho={rho:.2f}, measured verify cost {v:.2f}x a step")
    ax.axhline(1.0, color="red", lw=0.8, ls=":")
    markers = {"copy_heavy": "o", "structured": "s", "chat": "^", "creative": "v", "long_prompt": "D"}
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
    ax.set_title("Measured speedup vs acceptance, beside S = E/(k c + 1 + rho)")
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
