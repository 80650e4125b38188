"""The planner's algorithm rules mirror the runtime's: the same names, the same choice for every size and
host count (the runtime is to take its choice from smddp_sdk/planning/selection.py)."""

import pytest

from smddp_sdk.planning.selection import IMPLEMENTED, inter_host_algorithm

pytest.importorskip("torch")
from smddp_sdk.collectives import algorithms  # noqa: E402


def test_the_runtime_implements_exactly_the_algorithms_the_planner_models_as_implemented():
    assert frozenset(algorithms.ALGORITHMS) - {"auto"} == IMPLEMENTED


@pytest.mark.parametrize("hosts", [2, 3, 4, 5, 8, 12, 16, 64])
def test_the_runtime_and_the_planner_choose_the_same_all_reduce_algorithm(hosts):
    for nbytes in (4, 32 << 10, (32 << 10) + 4, 64 << 10, 256 << 10, (1 << 20) - 4, 1 << 20, 64 << 20):
        assert algorithms.inter_host_algorithm(nbytes, hosts, "auto") == inter_host_algorithm("all_reduce", nbytes, hosts), (nbytes, hosts)


def test_a_forced_algorithm_wins_and_unknown_ops_are_refused():
    assert inter_host_algorithm("all_reduce", 4, 16, forced="ring") == "ring"
    with pytest.raises(ValueError, match="no inter-host algorithm rules for 'all_to_all'"):
        inter_host_algorithm("all_to_all", 4, 16)
