"""The shared speedup model with a measured verify-cost curve: known values by hand."""

import pytest

from bench.core import speedup_model
from specdec.decoding import speedup

# The bf16 curve measured on an AVX2-only EPYC (docs, FACTS.md): verifying is far from free there.
AVX2_BF16 = {1: 1.0, 2: 1.371, 3: 1.777, 4: 2.121, 5: 2.5, 8: 3.52}


def test_verify_cost_interpolates_and_extrapolates():
    assert speedup.verify_cost(None, 9) == 1.0  # the classic model
    assert speedup.verify_cost(AVX2_BF16, 1) == 1.0
    assert speedup.verify_cost(AVX2_BF16, 4) == 2.121
    assert speedup.verify_cost(AVX2_BF16, 6) == pytest.approx(2.5 + (3.52 - 2.5) / 3)  # between 5 and 8
    assert speedup.verify_cost(AVX2_BF16, 3.5) == pytest.approx((1.777 + 2.121) / 2)
    assert speedup.verify_cost(AVX2_BF16, 10) == pytest.approx(3.52 + 2 * (3.52 - 2.5) / 3)  # the last slope
    assert speedup.verify_cost({1: 1.0, 4: 1.1, 8: 1.05}, 12) == pytest.approx(1.05)  # never below the last point
    with pytest.raises(ValueError, match="n = 1"):
        speedup.verify_cost({2: 1.2, 4: 1.5}, 3)


def test_predicted_speedup_known_values():
    # alpha 0.5, k 2: E = 1 + 0.5 + 0.25 = 1.75; round = 2 c + t(3)/t(1) + rho.
    assert speedup.predicted_speedup(0.5, 2) == pytest.approx(1.75)
    assert speedup.predicted_speedup(0.5, 2, AVX2_BF16) == pytest.approx(1.75 / 1.777)
    assert speedup.predicted_speedup(0.5, 2, AVX2_BF16, c=0.05, rho=0.1, rho_off=0.02) == pytest.approx(
        1.75 * 1.02 / (0.1 + 1.777 + 0.1))
    # The measured mean accepted length stands in for E.
    assert speedup.predicted_speedup(None, 4, AVX2_BF16, mean_accepted_length=3.0) == pytest.approx(3.0 / 2.5)
    with pytest.raises(ValueError, match="alpha or mean_accepted_length"):
        speedup.predicted_speedup(None, 4)


def test_the_issue_example_an_advisor_that_assumes_free_verification_overshoots():
    # Copy prompts with alpha 0.3 at k 4: the classic model says 1.43x; with the AVX2 bf16 curve, 0.57x.
    classic = speedup.predicted_speedup(0.3, 4)
    measured_curve = speedup.predicted_speedup(0.3, 4, AVX2_BF16)
    assert classic == pytest.approx(1.4251, abs=1e-4)
    assert measured_curve == pytest.approx(1.4251 / 2.5, abs=1e-4)


def test_rounds_mix_counts_rounds_that_drafted_nothing():
    # 10 rounds drafted 4 and emitted 3 tokens each; 10 rounds drafted nothing and emitted 1: 40 tokens.
    mix = {4: 10, 0: 10}
    assert speedup.predicted_speedup_of_rounds(40, mix) == pytest.approx(40 / 20)
    assert speedup.predicted_speedup_of_rounds(40, mix, AVX2_BF16) == pytest.approx(40 / (10 * 2.5 + 10 * 1.0))
    assert speedup.predicted_speedup_of_rounds(40, mix, AVX2_BF16, rho=0.1, rho_off=0.1) == pytest.approx(
        40 * 1.1 / (10 * 2.6 + 10 * 1.1))
    # A fractional mean block length interpolates the curve.
    assert speedup.predicted_speedup_of_rounds(10, {2.5: 4}, AVX2_BF16) == pytest.approx(10 / (4 * (1.777 + 2.121) / 2))
    with pytest.raises(ValueError):
        speedup.predicted_speedup_of_rounds(0, {})


def test_with_prefill_is_amdahl():
    assert speedup.with_prefill(2.0, 0.0) == 2.0
    assert speedup.with_prefill(2.0, 1.0) == 1.0
    assert speedup.with_prefill(2.0, 0.2) == pytest.approx(1 / (0.2 + 0.4))


def test_a_draft_models_prompt_read_adds_to_the_speculative_time():
    # plain: 0.2 prefill + 0.8 decode; speculative: 0.2 + the draft's read 0.1 + 0.8 / 2
    assert speedup.with_prefill(2.0, 0.2, 0.1) == pytest.approx(1 / (0.2 + 0.1 + 0.4))
    assert speedup.with_prefill(1.0, 0.0, 0.25) == pytest.approx(0.8)  # no decode gain: the read is a loss


def test_best_k_and_ceiling_follow_the_curve():
    # Free verification and near-certain acceptance: the longest block wins.
    assert speedup.best_k(0.95, None, k_max=8)[0] == 8
    # On the AVX2 curve alpha 0.3 never pays: k = 0, speedup 1.0.
    assert speedup.best_k(0.3, AVX2_BF16, k_max=7) == (0, 1.0)
    # Every token accepted, t(n)/t(1) as measured: (k + 1) / t(k + 1), best at k = 7 (8 / 3.52).
    k, best = speedup_model.ceiling(AVX2_BF16, k_max=7)
    assert (k, best) == (7, pytest.approx(8 / 3.52))
    # A figure of 2.0x over off is out of reach on a curve whose ceiling is below it.
    assert speedup_model.ceiling({1: 1.0, 2: 1.9, 9: 9.0}, k_max=8)[1] < 2.0


def test_break_even_alpha_uses_the_curve():
    a = speedup_model.break_even_alpha(4, AVX2_BF16)
    assert speedup.predicted_speedup(a, 4, AVX2_BF16) == pytest.approx(1.0, abs=1e-6)
    assert a > speedup_model.break_even_alpha(4, None)
