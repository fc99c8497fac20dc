"""The operator's scaling arithmetic (pure functions: fast, no cluster)."""

from __future__ import annotations

from hookline_operator.scaling import ScalePolicy, Stabilizer, recommend

POLICY = ScalePolicy(min_replicas=0, max_replicas=10, target_backlog_per_replica=100,
                     scale_down_stabilization_seconds=300)


def test_recommendation_is_ceil_of_backlog_over_target_clamped() -> None:
    assert recommend(0, 0, POLICY) == 0
    assert recommend(1, 0, POLICY) == 1
    assert recommend(100, 0, POLICY) == 1
    assert recommend(101, 0, POLICY) == 2
    assert recommend(250, 0, POLICY) == 3
    assert recommend(10_000, 0, POLICY) == 10
    assert recommend(0, 3, POLICY) == 1  # in-flight work keeps a worker
    floor = ScalePolicy(min_replicas=2, max_replicas=4, target_backlog_per_replica=10)
    assert recommend(0, 0, floor) == 2
    assert recommend(1000, 0, floor) == 4


def test_scale_up_is_immediate_and_scale_down_waits_for_the_window() -> None:
    s = Stabilizer()
    assert s.desired(0, recommend(500, 0, POLICY), current=1, policy=POLICY) == 5
    assert s.desired(10, recommend(100, 0, POLICY), current=5, policy=POLICY) == 5
    assert s.desired(200, recommend(0, 0, POLICY), current=5, policy=POLICY) == 5
    assert s.desired(301, recommend(0, 0, POLICY), current=5, policy=POLICY) == 1  # the 10 s reading of 1 remains
    assert s.desired(311, recommend(0, 0, POLICY), current=1, policy=POLICY) == 0
    assert s.desired(312, recommend(900, 0, POLICY), current=0, policy=POLICY) == 9


def test_zero_only_after_a_whole_idle_window_even_after_a_restart() -> None:
    s = Stabilizer()  # a fresh operator knows nothing of the past window
    assert s.desired(1000, 0, current=3, policy=POLICY) == 3
    assert s.desired(1299, 0, current=3, policy=POLICY) == 3
    assert s.desired(1301, 0, current=3, policy=POLICY) == 0
    busy = Stabilizer()
    assert busy.desired(0, recommend(0, 2, POLICY), current=1, policy=POLICY) == 1
    assert busy.desired(400, recommend(0, 2, POLICY), current=1, policy=POLICY) == 1
