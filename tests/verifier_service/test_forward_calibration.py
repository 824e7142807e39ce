"""verifier_service/forward_calibration.py: a fresh verifier's policy starts with the forward's measured times."""

import asyncio

from specdec.modeling.models import load_causal_lm
from verifier_service.engines.transformers_engine import TransformersEngine
from verifier_service.forward_calibration import calibrate_forward, calibration_sizes
from verifier_service.speculation.policy import RoundCost


def test_the_sizes_are_a_plain_step_and_powers_of_two_up_to_the_largest_block():
    assert calibration_sizes(16) == [0, 1, 2, 4, 8, 16]
    assert calibration_sizes(6) == [0, 1, 2, 4, 6]
    assert calibration_sizes(0) == [0]


def test_a_fresh_verifiers_round_cost_starts_with_each_sizes_forward_timed(tiny_pair):
    """Two timed samples of each size (after an untimed warm-up pass), recorded as forward times only: no round time,
    no acceptance. The dummy sequence is freed: the engine scores a real sequence as before."""
    engine = TransformersEngine(load_causal_lm(str(tiny_pair[0])))
    cost = RoundCost()
    samples = asyncio.run(calibrate_forward(engine, cost, 8))
    assert sorted({n for n, _ in samples}) == [0, 1, 2, 4, 8] and len(samples) == 10
    assert all(seconds > 0 for _, seconds in samples)
    assert {n: e.samples for n, e in cost.forward.items()} == {n: 2 for n in (0, 1, 2, 4, 8)}
    times = cost.forward_times(8)
    assert times is not None and all(a <= b for a, b in zip(times, times[1:]))
    assert cost.seconds == {} and cost.acceptance[True].judged == 0
    state = engine.start([5, 6, 7])
    assert engine.score(state, [8]).shape == (2, engine.vocab_size)


def test_an_engine_that_cannot_time_its_forward_alone_is_not_calibrated():
    cost = RoundCost()
    assert asyncio.run(calibrate_forward(object(), cost, 8)) == [] and cost.forward == {}
