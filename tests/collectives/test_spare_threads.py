"""A spare imported torch under its runtime's environment; the rank it becomes takes the rank's OMP_NUM_THREADS,
as a cold rank would (a different thread count splits reductions differently: other last bits)."""

from __future__ import annotations

import pytest

from smddp_sdk.collectives.spare import take_thread_count

torch = pytest.importorskip("torch")


def test_a_spare_takes_the_ranks_thread_count() -> None:
    before = torch.get_num_threads()
    try:
        take_thread_count(torch, {"OMP_NUM_THREADS": str(before + 1)})
        assert torch.get_num_threads() == before + 1
        take_thread_count(torch, {"OMP_NUM_THREADS": "not a number"})
        take_thread_count(torch, {})
        assert torch.get_num_threads() == before + 1  # nothing usable: left as it is
    finally:
        torch.set_num_threads(before)
