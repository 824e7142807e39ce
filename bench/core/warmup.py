"""The warm-up curve and the suffix-vs-ngram figures: what a draft that learns from earlier outputs gains.

A workload's requests run in file order. A sample's `position` is how many of its workload's
requests ran before it in the same pass: for the suffix draft, how many of this workload's
outputs are in its cache (docs/benchmark.md says what else is). From the samples of one run:
- curves: per workload and method, the speedup against `off` on the same request (same prompt,
  same repeat), median over repeats, by position; and the acceptance rate, pooled over repeats;
- comparison: per workload, tokens/s ratios suffix/ngram, suffix/off and ngram/off over all
  requests, and over the requests after the first `skip`, each paired by repeat as in the rows;
  with the issue's figures checked against them.
"""

from __future__ import annotations

import pathlib
import statistics

from bench.core.methods import Sample
from bench.core.report import OFF, paired_ratio

SKIP = 4  # "after the first 4 requests"
AFTER_WARMUP_MIN = 1.5  # suffix / ngram tokens/s after the first requests, on the repetitive workloads
ELSEWHERE_MIN = 0.97  # suffix / ngram tokens/s on the other workloads
CHEAP_VERIFY_MAX = 1.2  # t(4)/t(1) at or below which ...
CHEAP_VERIFY_WORKLOADS = ("extraction", "agent_loop")  # ... suffix should reach ...
CHEAP_VERIFY_MIN = 2.0  # ... this speedup over off


def curves(samples: list[Sample], methods: tuple[str, ...] = ("suffix", "ngram"), base: str = OFF) -> dict:
    """{workload: {method: [{"position", "speedup", "acceptance", "repeats"}]}} for positions that were recorded."""
    base_by_request = {(s.workload, s.prompt_id, s.repeat): s for s in samples if s.method == base}
    points: dict[str, dict[str, dict[int, list[Sample]]]] = {}
    for s in samples:
        if s.method in methods and s.position >= 0 and s.repeat >= 0:
            points.setdefault(s.workload, {}).setdefault(s.method, {}).setdefault(s.position, []).append(s)
    out: dict[str, dict[str, list[dict]]] = {}
    for workload, by_method in points.items():
        for method, by_position in by_method.items():
            curve = []
            for position, group in sorted(by_position.items()):
                ratios = []
                for s in group:
                    b = base_by_request.get((s.workload, s.prompt_id, s.repeat))
                    if b is not None and min(s.wall_s, b.wall_s) > 0 and b.completion_tokens:
                        ratios.append((s.completion_tokens / s.wall_s) / (b.completion_tokens / b.wall_s))
                drafted = sum(s.num_draft_tokens for s in group)
                curve.append({"position": position,
                              "speedup": round(statistics.median(ratios), 3) if ratios else None,
                              "acceptance": round(sum(s.num_accepted_tokens for s in group) / drafted, 3)
                              if drafted else None,
                              "repeats": len(ratios)})
            out.setdefault(workload, {})[method] = curve
    return out


def _ratio(samples: list[Sample], num: str, den: str, skip: int = 0) -> float | None:
    a = [s for s in samples if s.method == num and s.position >= skip]
    b = [s for s in samples if s.method == den and s.position >= skip]
    value = paired_ratio(a, b) if a and b else None
    return round(value, 3) if value is not None else None


def figures(workload: str, repetitive: bool, row: dict, verify_t4: float | None) -> list[dict]:
    """The issue's figures for one workload: {"text", "value", "met" (True, False, or None: not applicable here)}."""
    out = []
    if repetitive:
        value = row.get("suffix_vs_ngram_after")
        out.append({"text": f"suffix/ngram after {SKIP} >= {AFTER_WARMUP_MIN}", "value": value,
                    "met": None if value is None else value >= AFTER_WARMUP_MIN})
    else:
        value = row.get("suffix_vs_ngram")
        out.append({"text": f"suffix/ngram >= {ELSEWHERE_MIN}", "value": value,
                    "met": None if value is None else value >= ELSEWHERE_MIN})
    if workload in CHEAP_VERIFY_WORKLOADS:
        value = row.get("suffix_vs_off")
        cheap = verify_t4 is not None and verify_t4 <= CHEAP_VERIFY_MAX
        text = f"suffix/off >= {CHEAP_VERIFY_MIN} where t(4)/t(1) <= {CHEAP_VERIFY_MAX}"
        if verify_t4 is not None and not cheap:
            text += f" (here t(4)/t(1) = {verify_t4:.2f}: not applicable)"
        out.append({"text": text, "value": value,
                    "met": (value >= CHEAP_VERIFY_MIN) if cheap and value is not None else None})
    return out


def comparison(samples: list[Sample], repetitive: list[str], verify_t4: float | None = None,
               skip: int = SKIP) -> list[dict]:
    """Per workload with suffix samples: the ratios, and the figures checked (empty without suffix samples)."""
    workloads = list(dict.fromkeys(s.workload for s in samples if s.method == "suffix"))
    rows = []
    for workload in workloads:
        mine = [s for s in samples if s.workload == workload and s.repeat >= 0]
        row = {"workload": workload, "repetitive": workload in repetitive,
               "suffix_vs_ngram": _ratio(mine, "suffix", "ngram"), "suffix_vs_off": _ratio(mine, "suffix", OFF),
               "ngram_vs_off": _ratio(mine, "ngram", OFF)}
        if row["repetitive"]:
            row.update(suffix_vs_ngram_after=_ratio(mine, "suffix", "ngram", skip),
                       suffix_vs_off_after=_ratio(mine, "suffix", OFF, skip),
                       ngram_vs_off_after=_ratio(mine, "ngram", OFF, skip))
        row["figures"] = figures(workload, row["repetitive"], row, verify_t4)
        rows.append(row)
    return rows


def plot(path: pathlib.Path, result: dict) -> None:
    """One panel per workload with suffix samples: speedup vs off against the requests the draft has seen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    warm = result["warmup"]["curves"]
    repetitive = [w for w in warm if w in result["warmup"]["repetitive"]] or list(warm)
    cols = min(2, len(repetitive))
    rows = (len(repetitive) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 3.8 * rows), squeeze=False)
    styles = {"suffix": {"color": "tab:red", "marker": "o", "lw": 2}, "ngram": {"color": "tab:blue", "marker": ".",
                                                                                "lw": 1, "ls": "--"}}
    for ax, workload in zip(axes.flat, repetitive):
        for method, points in warm[workload].items():
            xs = [p["position"] for p in points if p["speedup"] is not None]
            ys = [p["speedup"] for p in points if p["speedup"] is not None]
            ax.plot(xs, ys, label=method, **styles.get(method, {}))
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.axvline(result["warmup"]["skip"] - 0.5, color="grey", lw=0.8, ls="-.")
        ax.set_title(workload, fontsize=10)
        ax.set_xlabel("requests of this workload the draft has seen")
        ax.set_ylabel("speedup vs off (same request)")
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(repetitive):]:
        ax.axis("off")
    fig.suptitle(f"Warm-up: {pathlib.Path(result['model']).name}, {result['dtype']}, {result['date']}\n"
                 f"(median over repeats; left of dash-dot: the first {result['warmup']['skip']} requests)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
