"""A ratio of two methods' speeds with its 95% interval, from paired runs (the same prompt, the same pass).

On the 2-core machines this project is measured on, two identical stacks run side by side differ on single prompts
by more than most of the differences a benchmark looks for (docs/results/pair-claims.md, run 26), so a ratio summed
over a few prompts reads as a result it is not. The ratio is quoted with the interval its pairs give: the geometric
mean of the per-pair ratios, and Student's t interval of their logs.
"""

from __future__ import annotations

import math
import statistics

# two-sided 95% quantiles of Student's t by degrees of freedom; past the table, the normal's
T_95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t_95(degrees: int) -> float:
    """The 95% two-sided quantile of Student's t at `degrees` (at least 1), from the table's nearest row at or
    below it: never narrower than the true one."""
    return T_95[max(d for d in T_95 if d <= degrees)] if degrees < 120 else 1.96


def ratio_interval(pairs: list[tuple[float, float]]) -> dict | None:
    """pairs: (a, b) speeds measured side by side. The geometric mean of a / b, and its 95% interval (None with fewer
    than two pairs), each rounded to 3 digits; None without a pair whose speeds are both positive."""
    logs = [math.log(a / b) for a, b in pairs if a > 0 and b > 0]
    if not logs:
        return None
    mean = statistics.fmean(logs)
    result = {"ratio": round(math.exp(mean), 3), "pairs": len(logs), "low": None, "high": None}
    if len(logs) >= 2:
        half = t_95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        result["low"], result["high"] = round(math.exp(mean - half), 3), round(math.exp(mean + half), 3)
    return result
