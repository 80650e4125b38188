"""Fault injection into running local jobs: the right culprit, and nothing left running (``-m faults``).

Each case is one scenario of ``tests.faults.scenarios``; run them all with timings via
``python -m tests.faults.scenarios --repeat N``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.scenarios import SCENARIOS, run

pytest.importorskip("torch")
pytestmark = [pytest.mark.faults, pytest.mark.timeout(400)]

# Every process gone within this many seconds of the fault (the target is 10 s; the hang
# scenarios add the 4 s process-group timeout, and a loaded machine adds its share).
BUDGET_SECONDS = 20.0


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fault_names_the_culprit_and_leaves_nothing(name: str, tmp_path: Path) -> None:
    scenario = SCENARIOS[name]
    outcome = run(scenario, tmp_path)
    assert outcome.state == scenario.expect_state.value, outcome
    if scenario.expect_root is not None:
        assert outcome.root == scenario.expect_root, outcome
    assert all(part in outcome.message for part in scenario.expect_message), outcome
    assert outcome.leftovers == [], outcome
    assert outcome.missing_archives == [], outcome  # a killed or frozen supervisor's job too
    assert outcome.seconds_to_gone < BUDGET_SECONDS, outcome
