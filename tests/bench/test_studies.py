"""The benchmark harness: the speedup model, the row layout, the shipped workloads, and a tiny end-to-end run."""

import json
import math

import pytest

from bench.core import prom
from bench.core import report
from bench.core import speedup_model
from bench.core.methods import Sample
from bench.core.workloads import CLASSIC_WORKLOADS, WORKLOAD_DIR, load_workload

ROW_KEYS = {"workload", "method", "tokens_per_s", "speedup_vs_off", "acceptance_rate", "mean_accepted_length",
            "transport_overhead_ms_median", "ttft_ms_median", "anchor_speedup", "predicted_speedup",
            "implementation_efficiency"}


# --- the speedup model -------------------------------------------------------------------------------------------

def test_expected_tokens_limits_and_a_known_value():
    assert speedup_model.expected_tokens(0.0, 4) == 1.0
    assert speedup_model.expected_tokens(1.0, 4) == 5.0
    assert speedup_model.expected_tokens(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    assert speedup_model.expected_tokens(0.7, 0) == 1.0


def test_predicted_speedup_formula():
    alpha, k, c, rho = 0.6, 4, 0.05, 0.1
    e = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert speedup_model.predicted_speedup(alpha, k, None, c, rho) == pytest.approx(e / (k * c + 1 + rho))
    # Only pays where alpha beats c (here at k = 1, rho = 0: S = (1 + alpha) / (1 + c)).
    assert speedup_model.predicted_speedup(0.2, 1, None, 0.3) < 1 < speedup_model.predicted_speedup(0.4, 1, None, 0.3)


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_rate_and_alpha_invert_and_tokens_per_round_is_one_plus_k_rate(alpha, k):
    rate = speedup_model.rate_from_alpha(alpha, k)
    assert rate <= alpha + 1e-12  # later positions are accepted less often
    assert speedup_model.alpha_from_rate(rate, k) == pytest.approx(alpha, abs=1e-6)
    assert 1 + k * rate == pytest.approx(speedup_model.expected_tokens(alpha, k))
    mal = speedup_model.expected_tokens(alpha, k)
    assert speedup_model.alpha_from_mean_accepted_length(mal, k) == pytest.approx(alpha, abs=1e-6)


def test_best_k_and_break_even():
    k, s = speedup_model.best_k(0.9, None, 0.0, 0.0, k_max=8)
    assert k == 8 and s == pytest.approx(speedup_model.predicted_speedup(0.9, 8))
    k, _ = speedup_model.best_k(0.3, None, 0.2, 0.0)
    assert k <= 2
    a = speedup_model.break_even_alpha(4, None, 0.1, 0.0)
    assert speedup_model.predicted_speedup(a, 4, None, 0.1) == pytest.approx(1.0, abs=1e-6)
    assert math.isinf(speedup_model.break_even_alpha(4, None, 1.5, 0.0))


# --- metrics and per-round overhead ------------------------------------------------------------------------------

def test_prometheus_histogram_delta():
    before = prom.parse("# HELP x\nspecdec_verify_forward_seconds_bucket{le=\"0.1\"} 3.0\n"
                        "specdec_verify_forward_seconds_sum 0.5\nspecdec_verify_forward_seconds_count 10.0\n")
    after = prom.parse("specdec_verify_forward_seconds_sum 1.25\nspecdec_verify_forward_seconds_count 25.0\n"
                       "spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 4.0\n")
    assert prom.histogram_delta(before, after, "specdec_verify_forward_seconds") == (pytest.approx(0.75), 15.0)
    assert "specdec_verify_forward_seconds_bucket" not in before


def test_overhead_per_round():
    # 11 rounds: prefill + round 1 = TTFT 0.3 s; rounds 2..11 take 1.0 s; forward 40 ms/round, draft 0.
    s = Sample("w", "p", "ngram", 0, completion_tokens=30, wall_s=1.3, ttft_s=0.3, num_rounds=11,
               forward_s=0.44, forward_count=11)
    assert s.overhead_per_round_s() == pytest.approx(0.1 - 0.04)
    s.draft_compute_s = 0.11
    assert s.overhead_per_round_s() == pytest.approx(0.1 - 0.05)
    assert Sample("w", "p", "hf_greedy", 0, 10, 1.0).overhead_per_round_s() is None


# --- rows --------------------------------------------------------------------------------------------------------

def _samples():
    out = []
    for repeat in range(3):
        for pid in ("a", "b"):
            out.append(Sample("copy", pid, "off", repeat, 40, 2.0, ttft_s=0.1, num_rounds=40, forward_s=1.6,
                              forward_count=40, draft_wait_s=0.0, token_ids=[1, 2, 3]))
            out.append(Sample("copy", pid, "ngram", repeat, 40, 1.0, ttft_s=0.1, num_rounds=20, num_drafts=20,
                              num_draft_tokens=80, num_accepted_tokens=20, forward_s=0.9, forward_count=20,
                              draft_wait_s=0.02, token_ids=[1, 2, 3]))
            out.append(Sample("copy", pid, "hf_greedy", repeat, 40, 1.6))
            out.append(Sample("copy", pid, "hf_prompt_lookup", repeat, 40, 0.8))
    return out


def test_rows_layout_and_values():
    rows = report.build_rows(_samples(), method_order=["off", "ngram", "hf_greedy", "hf_prompt_lookup"])
    assert [r["method"] for r in rows] == ["off", "ngram", "hf_greedy", "hf_prompt_lookup"]
    for row in rows:
        assert ROW_KEYS <= set(row)
    off, ngram, hf_greedy, _ = rows
    assert off["tokens_per_s"] == 20.0 and off["speedup_vs_off"] == 1.0
    assert ngram["tokens_per_s"] == 40.0 and ngram["speedup_vs_off"] == 2.0
    assert ngram["acceptance_rate"] == 0.25 and ngram["mean_accepted_length"] == 2.0
    assert ngram["mean_block_len"] == 4.0 and ngram["tokens_identical_to_off"] == 1.0
    assert off["acceptance_rate"] is None and off["mean_accepted_length"] is None
    assert hf_greedy["speedup_vs_off"] == 1.25
    assert all(r["anchor_speedup"] == 2.0 for r in rows)
    # ngram: (1.0 - 0.1) / 19 - 0.9 / 20 per round
    assert ngram["transport_overhead_ms_median"] == pytest.approx((0.9 / 19 - 0.045) * 1000, abs=0.01)
    assert ngram["ttft_ms_median"] == 100.0
    # The model over the measured rounds: 240 tokens in 120 rounds of k = 4 at verify cost 1.0 is 2.0x in
    # decoding; off spends (0.1 - 0.04) / 2.0 = 3% of its wall time in prefill, which speculation keeps.
    assert ngram["predicted_speedup"] == pytest.approx(1 / (0.03 + 0.97 / 2.0), abs=1e-3)
    assert ngram["implementation_efficiency"] == pytest.approx(2.0 / ngram["predicted_speedup"], abs=2e-3)
    assert off["predicted_speedup"] is None and hf_greedy["implementation_efficiency"] is None


def test_rows_predict_with_the_measured_verify_cost():
    # Verifying 5 tokens costs 1.5 steps: the same rounds predict 240 / (120 x 1.5) = 1.33x in decoding.
    rows = report.build_rows(_samples(), verify_curve={1: 1.0, 5: 1.5})
    ngram = next(r for r in rows if r["method"] == "ngram")
    assert ngram["predicted_speedup"] == pytest.approx(1 / (0.03 + 0.97 / (240 / 180)), abs=1e-3)
    assert ngram["implementation_efficiency"] > 1.4  # measured 2.0x: more than this model allows


def test_the_curve_kept_is_the_one_whose_t1_is_nearest_the_stacks_step():
    from bench.studies.speedup import pick_curve

    def curve(t1, t4):
        return {"context": 200, "source": "measured", "t_ms": {"1": t1, "4": t4}, "ratio": {"1": 1.0, "4": t4 / t1}}

    slow_start, end = curve(210.0, 223.0), curve(115.0, 150.0)  # a slow spell during the first measurement
    kept = pick_curve(slow_start, end, step_ms=118.0)
    assert kept["when"] == "end" and kept["ratio"]["4"] == end["ratio"]["4"] and kept["stack_step_ms"] == 118.0
    assert [m["t_ms"]["1"] for m in kept["measurements"]] == [210.0, 115.0]
    assert pick_curve(end, slow_start, step_ms=118.0)["when"] == "start"
    assert pick_curve(slow_start, end, step_ms=None)["when"] == "start"  # nothing to judge by: the first


def test_markdown_and_plot(tmp_path):
    result = {"machine": {"cpu": "x", "cores": 2}, "model": "/m/smol", "dtype": "bfloat16", "date": "2025-01-01",
              "config": {"repeats": 3}, "rows": report.build_rows(_samples())}
    md = report.markdown(result)
    assert "| copy | ngram | 40.0 | 2.00x |" in md
    report.plot(tmp_path / "p.png", result)
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the shipped workloads ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", CLASSIC_WORKLOADS)
def test_classic_workloads_ship_3_to_6_chat_prompts(name):
    prompts = load_workload(name)
    assert 3 <= len(prompts) <= 6
    assert len({p.id for p in prompts}) == len(prompts)
    for p in prompts:
        assert p.text.startswith("<|im_start|>user\n") and p.text.endswith("<|im_start|>assistant\n")
        assert 16 <= p.max_tokens <= 128
    if name == "creative":
        assert all(p.temperature == 1.0 and p.seed is not None for p in prompts)
    if name == "long_prompt":
        assert all(len(p.text) > 2000 and p.max_tokens <= 64 for p in prompts)  # about 1,500 tokens, short answers


def test_long_prompt_file_is_what_its_generator_writes(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_long", WORKLOAD_DIR / "make_long_prompt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shipped = (WORKLOAD_DIR / "long_prompt.jsonl").read_text()
    monkeypatch.setattr(module, "__file__", str(tmp_path / "make_long_prompt.py"))
    module.main()
    assert (tmp_path / "long_prompt.jsonl").read_text() == shipped


def test_quick_caps():
    assert all(p.max_tokens <= 48 for p in load_workload("copy_heavy", 2, 48))
    assert len(load_workload("copy_heavy", 2, 48)) == 2


# --- end to end on the tiny models ------------------------------------------------------------------------------

# Short, repeated extraction requests: the shipped workloads' prompts do not fit the tiny model's 512 tokens.
TINY_EXTRACTION = ["Invoice 7 from Ada, Paris, 12 EUR.", "Order 9 by Bo, Oslo, 30 NOK.", "Invoice 7 from Ada, Paris, 12 EUR.",
                   "Invoice 8 from Cy, Rome, 15 EUR.", "Invoice 7 from Ada, Paris, 12 EUR."]


@pytest.mark.slow
@pytest.mark.timeout(300)  # three stacks start and stop; the tiny model runs fastest on one thread
def test_tiny_run_with_suffix_writes_latest_json_md_png(tiny_pair, tmp_path):
    from bench.studies.speedup import main

    target, _ = tiny_pair
    workload = tmp_path / "extraction.jsonl"  # named like the shipped one: it counts as repetitive
    workload.write_text("".join(json.dumps({"id": f"r{i}", "max_tokens": 12, "prompt": f"Extract as JSON: {text}"})
                                + "\n" for i, text in enumerate(TINY_EXTRACTION)))
    out = tmp_path / "results"
    assert main(["--model", str(target), "--out", str(out), "--repeats", "1", "--dtype", "float32",
                 "--workloads", f"{workload},chat", "--prompts-per-workload", "5", "--max-tokens", "8", "--fixed-k", "4",
                 "--verify-cost-repeats", "2", "--steadiness-repeats", "2", "--no-progress", "--threads", "1",
                 "--log-dir", str(tmp_path / "logs")]) == 0
    latest = json.loads((out / "latest.json").read_text())
    assert {"machine", "model", "dtype", "date", "rows", "verify_cost", "warmup", "comparison"} <= set(latest)
    assert latest["dtype"] == "float32" and latest["model"] == str(target)
    assert isinstance(latest["machine"]["cpu_flags"], list)
    verify = latest["verify_cost"]
    assert verify["ratio"]["1"] == 1.0 and {"4", "17"} <= set(verify["ratio"]) and "in-process" in verify["source"]
    assert [m["when"] for m in verify["measurements"]] == ["start", "end"] and verify["stack_step_ms"] > 0
    methods = ("off", "ngram", "ngram_k4", "suffix", "suffix_k4", "hf_greedy", "hf_prompt_lookup")
    assert {(r["workload"], r["method"]) for r in latest["rows"]} == {
        (w, m) for w in ("extraction", "chat") for m in methods}
    for row in latest["rows"]:
        assert ROW_KEYS <= set(row)
        assert row["tokens_per_s"] > 0
        assert row["anchor_speedup"] is not None and row["anchor_speedup"] > 0
        if row["method"] == "off":
            assert row["speedup_vs_off"] == 1.0 and row["ttft_ms_median"] > 0
        if row["mean_accepted_length"] is not None:
            assert row["predicted_speedup"] > 0 and row["implementation_efficiency"] > 0
    # The third and fifth requests repeat the first: the suffix draft has its output cached by then. (At a
    # fixed k: on the tiny model the adaptive policy may turn speculation off.)
    suffix = next(r for r in latest["rows"] if r["workload"] == "extraction" and r["method"] == "suffix_k4")
    assert suffix["acceptance_rate"] > 0.3 and suffix["tokens_identical_to_off"] == 1.0
    # More of its drafts are accepted than of the chat prompts'. (Not the predicted speedups: they also price the
    # block lengths on this run's verify-cost curve, which on the tiny model is noise-sized and not monotone; one
    # CI run measured t(4)/t(1) = 1.21 and t(5)/t(1) = 1.14 and predicted 0.93x for extraction, 0.99x for chat.)
    chat = next(r for r in latest["rows"] if r["workload"] == "chat" and r["method"] == "suffix_k4")
    assert suffix["acceptance_rate"] > chat["acceptance_rate"]
    assert suffix["mean_accepted_length"] > chat["mean_accepted_length"]
    assert [p["position"] for p in latest["warmup"]["curves"]["extraction"]["suffix"]] == [0, 1, 2, 3, 4]
    comparison = {c["workload"]: c for c in latest["comparison"]}
    assert comparison["extraction"]["repetitive"] and comparison["extraction"]["suffix_vs_ngram_after"] > 0
    assert not comparison["chat"]["repetitive"] and comparison["chat"]["suffix_vs_ngram"] > 0
    md = (out / "latest.md").read_text()
    assert md.startswith("# Benchmark") and "t(4)/t(1) = " in md and "## suffix vs ngram" in md
    assert len(latest["machine"]["steadiness"]["after"]["seconds"]) == 2 and "Steadiness" in md
    assert {(r["workload"], r["proposer"]) for r in latest["adaptive_vs_fixed"]} == {
        (w, p) for w in ("extraction", "chat") for p in ("ngram", "suffix")}
    assert "## the adaptive policy against fixed k" in md
    assert (out / "latest.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "latest_warmup.png").read_bytes()[:4] == b"\x89PNG"
    runs = [p for p in out.glob("*.json") if p.name != "latest.json"]
    assert len(runs) == 1 and "samples" in json.loads(runs[0].read_text())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_advisor_on_tiny_pair_compares_proposers(tiny_pair, tmp_path, capsys):
    from bench.replay.advise import main

    target, draft = tiny_pair
    prompts = tmp_path / "mine.jsonl"  # a repeated request: suffix has the first one's output cached
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": text}) + "\n" for i, text in enumerate(
        ["Invoice 7 from Ada, Paris.", "Order 9 by Bo.", "Invoice 7 from Ada, Paris."])))
    assert main(["--target", str(target), "--draft", str(draft), "--prompts", str(prompts), "--max-prompts", "3",
                 "--max-tokens", "8", "--context", "256", "--rho", "0.1", "--verify-cost-repeats", "2",
                 "--dtype", "float32", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "tokenizer: compatible" in out and "memory total" in out
    assert "machine: " in out and "CPU flags " in out  # every result names its machine
    # every measurement runs the target as the verifier does: prepacked in float32 (curve and loop alike)
    assert "linears prepacked for oneDNN, as the verifier runs them" in out
    assert "verify cost (measured in-process" in out and "t(4)/t(1) = " in out
    assert "draft: reads the prompts in " in out  # its share enters the model and hybrid predictions
    for name in ("ngram", "suffix", "model", "hybrid"):
        assert f"\n{name}: c = " in out
        assert f"measured in-process ({'HF assisted generation' if name == 'model' else 'speculative loop'}, {name} " \
            in out
    recommendation = out.split("recommendation: ", 1)[1]
    assert recommendation.startswith(("USE ngram", "USE suffix", "USE model", "USE hybrid", "DON'T"))
    assert main(["--target", str(target), "--method", "suffix", "--prompts", str(prompts), "--max-prompts", "3",
                 "--max-tokens", "8", "--context", "256", "--rho", "0.1", "--verify-cost-repeats", "2",
                 "--no-measure", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "no-model drafts: suffix" in out and "\nsuffix: c = " in out and "ngram: c" not in out
    assert "linears not prepacked (the model is in bfloat16" in out  # the default dtype
    assert "measured in-process (" not in out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_advisor_predicts_the_grammar_drafter_from_its_forced_share(tiny_pair, tmp_path, capsys):
    from bench.replay.advise import main

    common = ["--target", str(tiny_pair[0]), "--prompts", str(WORKLOAD_DIR / "extraction.jsonl"), "--max-prompts",
              "2", "--max-tokens", "8", "--context", "256", "--rho", "0.1", "--verify-cost-repeats", "2",
              "--dtype", "float32", "--no-measure"]
    assert main([*common, "--forced-share", "0.4", "--forced-run", "5", "--forced-acceptance", "0.8"]) == 0
    out = capsys.readouterr().out
    for name in ("ngram", "suffix", "grammar", "suffix+grammar"):
        assert f"\n{name}: c = " in out
    assert "suffix+grammar: forced share 0.40, 5.0 forced tokens a draft, accepted 0.80 (given; predicted only" in out
    assert out.split("recommendation: ", 1)[1].startswith(("USE", "DON'T"))
    assert main([*common, "--method", "grammar"]) == 2  # the grammar needs its forced share
    assert "--forced-share must be in (0, 1]" in capsys.readouterr().err


@pytest.mark.slow
def test_advisor_refuses_a_draft_with_another_tokenizer(tiny_pair, tmp_path, capsys):
    from bench.replay.advise import main
    from devkit.testing import build_other_tokenizer_model

    other = build_other_tokenizer_model(tmp_path)
    assert main(["--target", str(tiny_pair[0]), "--draft", str(other), "--method", "model", "--prompts",
                 str(WORKLOAD_DIR / "chat.jsonl"), "--context", "256"]) == 0
    out = capsys.readouterr().out
    assert "INCOMPATIBLE" in out and "recommendation: DON'T" in out
