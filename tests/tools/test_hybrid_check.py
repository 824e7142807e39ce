"""tools.hybrid_check's summaries (the tool itself runs the real pair by hand)."""

import pytest

from tools.hybrid_check import warm_summary


def row(workload: str, prompt: str, method: str, tokens: int, seconds: float) -> dict:
    return {"workload": workload, "prompt": prompt, "method": method, "tokens": [0] * tokens, "seconds": seconds,
            "identical": True}


def test_the_warm_summary_leaves_out_the_first_request_the_stacks_served():
    """The stacks' first request (prompt a) ran the hybrid at half the model's speed; the later ones at the same
    speed. The warm summary has the later ones only, per workload; a workload without the first prompt is whole."""
    runs = []
    for prompt, hybrid_s in (("a", 4.0), ("b", 2.0)):
        runs += [row("code", prompt, "off", 10, 4.0), row("code", prompt, "model", 10, 2.0),
                 row("code", prompt, "suffix", 10, 3.0), row("code", prompt, "hybrid", 10, hybrid_s)]
    runs += [row("sql", "c", "off", 10, 4.0), row("sql", "c", "model", 10, 2.0), row("sql", "c", "suffix", 10, 4.0),
             row("sql", "c", "hybrid", 10, 2.5)]
    warm = warm_summary(runs, ("model", "suffix", "hybrid"), "a")
    assert warm["code"]["hybrid"]["vs_better"] == 1.0 and warm["code"]["hybrid"]["vs_off"] == 2.0
    assert warm["sql"]["hybrid"]["vs_better"] == 0.8


def test_a_twin_of_the_model_stack_gives_the_runs_own_spread():
    """model-twin is a second stack just like model's: its ratio to model is what two identical stacks give apart
    in this run, against which the hybrid's ratios are read."""
    from tools.hybrid_check import summarize

    runs = [row("chat", "a", "off", 10, 4.0), row("chat", "a", "model", 10, 2.0),
            row("chat", "a", "model-twin", 10, 2.5), row("chat", "a", "hybrid", 10, 2.2)]
    summary = summarize(runs, ("model", "hybrid", "model-twin"))
    assert summary["model-twin"]["vs_model"] == 0.8 and summary["hybrid"]["vs_model"] == round(2.0 / 2.2, 3)


def test_each_ratio_comes_with_the_interval_its_prompts_give():
    """Per prompt the hybrid ran at 1.0, 1.25 and 0.8 of the model (the better side), in each of two passes: the
    summed ratio alone reads as a result; the interval of these 6 pairs (each pass pairs apart) holds both 0.9 and
    1.1."""
    from tools.hybrid_check import summarize

    runs = []
    for prompt, hybrid_s in (("a", 2.0), ("b", 1.6), ("c", 2.5)):
        for run_pass in (0, 1):
            runs += [dict(row("code", prompt, "off", 10, 4.0), **{"pass": run_pass}),
                     dict(row("code", prompt, "model", 10, 2.0), **{"pass": run_pass}),
                     dict(row("code", prompt, "suffix", 10, 3.0), **{"pass": run_pass}),
                     dict(row("code", prompt, "hybrid", 10, hybrid_s), **{"pass": run_pass})]
    interval = summarize(runs, ("model", "suffix", "hybrid"))["hybrid"]["vs_better_interval"]
    assert interval["pairs"] == 6 and interval["ratio"] == pytest.approx(1.0, abs=1e-3)
    assert interval["low"] < 0.9 and interval["high"] > 1.1


def test_off_takes_every_slot_in_turn_with_the_methods():
    """Off rotates with the methods, so that whatever the request before leaves behind falls on each in turn."""
    from tools.hybrid_check import run_order

    methods = ("model", "suffix", "hybrid")
    orders = [run_order(methods, i) for i in range(4)]
    assert orders[0] == ("off", "model", "suffix", "hybrid")
    assert orders[1] == ("model", "suffix", "hybrid", "off")
    assert all(sorted(order) == sorted(("off", *methods)) for order in orders)
    assert [order.index("off") for order in orders] == [0, 3, 2, 1]
    assert run_order(methods, 4) == orders[0]
