"""The planner predicts what the runtime runs: the runtime's algorithm choice lives in
smddp_sdk/planning/selection.py, and the collectives take it from there (the native core's mirror of it
is checked in tests/collectives/test_native.py)."""

import pytest

from smddp_sdk.planning.selection import allreduce_algorithm, inter_host_algorithm

pytest.importorskip("torch")
from smddp_sdk.collectives import algorithms  # noqa: E402


def test_the_runtime_takes_its_choice_and_its_names_from_the_planners_module():
    assert algorithms.allreduce_algorithm is allreduce_algorithm
    assert algorithms.ALGORITHMS == ("auto", "oneshot", "recursive_doubling", "sharded", "halving_doubling", "ring")


def test_a_forced_algorithm_wins_and_unknown_ops_are_refused():
    assert inter_host_algorithm("all_reduce", 4, 16, forced="ring") == "ring"
    with pytest.raises(ValueError, match="no inter-host algorithm rules for 'all_to_all'"):
        inter_host_algorithm("all_to_all", 4, 16)
