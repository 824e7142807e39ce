"""bench.studies.load's bookkeeping without a stack: repeats folded into one row per point, the crossover, the policy rows.

The sweep itself runs end to end in tests/e2e/test_openai_load.py.
"""

from __future__ import annotations

from bench.studies import load


def point(rate, mode, repeat, tok_s, tpot):
    return {"rate": rate, "mode": mode, "repeat": repeat,
            "result": {"completed": 4, "failed": 0, "total_output_tokens": 32, "output_throughput": tok_s,
                       "median_tpot_ms": tpot, "median_ttft_ms": 50.0, "median_itl_ms": tpot}}


def test_repeats_fold_into_medians_and_sums_with_each_repeat_kept():
    points = [point(2.0, "off", 0, 10.0, 100.0), point(2.0, "off", 1, 14.0, 80.0), point(2.0, "off", 2, 11.0, 90.0),
              point(2.0, "fixed", 0, 20.0, 50.0)]
    off, fixed = load.summarize(points)
    assert (off["mode"], off["repeats"], off["completed"], off["total_output_tokens"]) == ("off", 3, 12, 96)
    assert (off["output_throughput"], off["median_tpot_ms"]) == (11.0, 90.0)  # medians, not means
    assert off["by_repeat"]["output_throughput"] == [10.0, 14.0, 11.0]
    assert (fixed["repeats"], fixed["output_throughput"]) == (1, 20.0)


def test_crossover_interpolates_where_speculation_stops_paying_and_the_policy_is_compared_above_it():
    points = []
    for rate, off_tpot, fixed_tpot, adaptive_tpot in [(2.0, 300.0, 200.0, 250.0), (8.0, 500.0, 1000.0, 480.0)]:
        points += [point(rate, "off", 0, 10.0, off_tpot), point(rate, "fixed", 0, 10.0, fixed_tpot),
                   point(rate, "adaptive", 0, 12.0, adaptive_tpot)]
    rows = load.summarize(points)
    cross = load.crossover(rows, "fixed")
    assert cross["off_over_on"] == {"2.0": 1.5, "8.0": 0.5} and cross["between"] == [2.0, 8.0]
    assert cross["rate"] == 4.0  # halfway in log rate: the ratio falls from 1.5 to 0.5
    above = load.policy_above(rows, cross["rate"])
    assert above == [{"rate": 8.0, "metric": "median_tpot_ms", "adaptive_over_off": 0.96},
                     {"rate": 8.0, "metric": "output_throughput", "adaptive_over_off": 1.2}]


def test_the_verifiers_counters_are_summed_over_the_repeats():
    points = [point(8.0, "adaptive", r, 10.0, 100.0) for r in range(2)]
    points[0]["verifier"] = {"drafts": 3.0, "draft_tokens": 12.0, "accepted_tokens": 5.0, "tokens": 100.0,
                             "fallback_rounds": {"load": 90.0}}
    points[1]["verifier"] = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0, "tokens": 100.0,
                             "fallback_rounds": {"load": 96.0, "not_paying": 2.0}}
    (row,) = load.summarize(points)
    assert row["verifier"] == {"drafts": 3.0, "draft_tokens": 12.0, "accepted_tokens": 5.0, "tokens": 200.0,
                               "fallback_rounds": {"load": 186.0, "not_paying": 2.0}}
    points[1]["verifier"] = None  # not scraped for one repeat: no totals rather than half of them
    assert load.summarize(points)[0]["verifier"] is None


def test_verifier_counters_are_the_change_in_the_scraped_metrics():
    from bench.studies.load_vllm import verifier_counters

    before = {("spec_decode_num_drafts_total", ()): 4.0, ("specdec_fallback_rounds_total", (("reason", "load"),)): 7.0}
    after = {("spec_decode_num_drafts_total", ()): 10.0, ("specdec_generated_tokens_total", ()): 64.0,
             ("specdec_fallback_rounds_total", (("reason", "load"),)): 7.0,
             ("specdec_fallback_rounds_total", (("reason", "not_paying"),)): 3.0,
             ("specdec_engine_step_token_seconds", ()): 0.004}
    assert verifier_counters(before, after) == {"drafts": 6.0, "draft_tokens": 0.0, "accepted_tokens": 0.0,
                                                "tokens": 64.0, "fallback_rounds": {"not_paying": 3.0},
                                                "step_token_s": 0.004}
