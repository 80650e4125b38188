"""The step model: overlap of collectives with compute, in closed form."""

import pytest

from smddp_sdk.planning.hardware import simulated
from smddp_sdk.planning.step import CommEvent, StepProfile, from_figures, predict, simulate


def test_only_the_last_collective_is_exposed_when_the_rest_fit_under_backward():
    # 10 ms collectives ready at 20, 40, 60 ms (backward ends at 60 ms): the first two are hidden, the last one
    # delays the 40 ms that follow it (the optimizer waits for every bucket)
    assert simulate(0.1, [(0.02, 0.01), (0.04, 0.01), (0.06, 0.01)]) == pytest.approx(0.11)


def test_communication_bound_step_is_the_queue_plus_the_tail():
    # 50 ms each, queued back to back from 20 ms: ends at 170 ms, then the 40 ms after the last ready moment
    assert simulate(0.1, [(0.02, 0.05), (0.04, 0.05), (0.06, 0.05)]) == pytest.approx(0.17 + 0.04)


def test_no_collectives_is_compute_alone():
    assert simulate(0.25, []) == 0.25


def test_from_figures_spreads_buckets_through_backward():
    step = from_figures(0.3, 60 << 20, 25 << 20, backward_share=2 / 3)
    assert [e.nbytes for e in step.events] == [25 << 20, 25 << 20, 10 << 20]
    assert step.events[0].ready_s == pytest.approx(0.1 + 0.2 / 3)
    assert step.events[-1].ready_s == pytest.approx(0.3)


def test_with_compute_scales_ready_moments():
    step = StepProfile(0.2, (CommEvent("all_reduce", 100, 0.1),)).with_compute(0.05)
    assert step.compute_s == 0.05 and step.events[0].ready_s == pytest.approx(0.025)


def test_prediction_reports_exposed_and_overlapped_communication():
    topo = simulated(100)
    step = from_figures(0.05, 4 << 20, 1 << 20)
    p = predict(step, 2, topo)
    assert p.step_s > p.compute_s and p.exposed_s == pytest.approx(p.step_s - 0.05)
    assert 0 <= p.overlapped_share < 1
    assert predict(step, 1, topo).step_s == pytest.approx(0.05)  # one single-rank host: nothing to exchange
