"""The spin rule's load judgement (shm.LoadSamples): a passing task never flips a quiet machine to
"loaded", a sustained load does within half the window."""

from __future__ import annotations

from smddp_sdk.collectives.shm import LoadSamples


def judged(samples: list[bool]) -> list[bool]:
    load = LoadSamples()
    verdicts = []
    for over in samples:
        load.add(over)
        verdicts.append(load.loaded)
    return verdicts


def test_one_busy_sample_in_a_quiet_window_leaves_the_machine_calm() -> None:
    assert not any(judged([False] * 7 + [True] + [False] * 7))


def test_scattered_spikes_below_a_majority_leave_it_calm() -> None:
    assert not any(judged([True, False] * 20))


def test_a_sustained_load_turns_it_within_half_the_window_and_back() -> None:
    verdicts = judged([True] * 8 + [False] * 8)
    assert verdicts.index(True) == LoadSamples.WINDOW // 2  # the fifth busy sample
    assert verdicts[LoadSamples.WINDOW - 1]
    assert not verdicts[-1]
    assert verdicts[LoadSamples.WINDOW :].index(False) == LoadSamples.WINDOW // 2 - 1  # half the window calm again


def test_samples_older_than_the_window_are_forgotten() -> None:
    assert judged([True] * 100 + [False] * LoadSamples.WINDOW)[-1] is False
