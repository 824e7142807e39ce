"""The storms' health bars, on made-up figures (the storms themselves run in tests/reliability)."""
from tools.oversize_storm import health_within, health_within_under_load


def figures(p99: float, worst: float, failures: int = 0) -> dict:
    return {"health_max_ms": worst + 50, "health_p99_ms": p99 + 50, "health_failures": failures,
            "health_over_control_max_ms": worst, "health_over_control_p99_ms": p99}


def test_every_check_is_held_to_the_bound_on_a_quiet_machine():
    assert health_within(figures(p99=20, worst=90), 100)
    assert not health_within(figures(p99=20, worst=160), 100)


def test_under_shared_cores_one_slow_check_in_a_hundred_passes_but_a_stall_does_not():
    assert health_within_under_load(figures(p99=45, worst=160), 100)
    assert not health_within_under_load(figures(p99=120, worst=160), 100)
    assert not health_within_under_load(figures(p99=45, worst=1500), 100)


def test_a_failed_check_fails_either_bar():
    assert not health_within(figures(p99=5, worst=5, failures=1), 100)
    assert not health_within_under_load(figures(p99=5, worst=5, failures=1), 100)


def test_without_a_control_the_raw_times_are_held():
    raw = {"health_max_ms": 150, "health_p99_ms": 30, "health_failures": 0}
    assert not health_within(raw, 100)
    assert health_within_under_load(raw, 100)
