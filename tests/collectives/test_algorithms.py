"""Every allreduce path forced (SMDDP_ALLREDUCE_ALGO), not only the one the size picks, against a reference.

Layouts: three single-rank hosts (every inter-host algorithm with H=3, where shards differ in owner and size
and recursive doubling and halving-doubling fold the third host into the first) and two hosts of two ranks
(the shared-memory symmetric and sharded paths under the inter-host step). Sizes cross the pipeline chunk
(1 MiB here) and the shm slot (512 KiB). Even ranks run the native core, odd ones Python.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from smddp_sdk.collectives.algorithms import (  # noqa: E402
    ALGORITHMS,
    folded_rank,
    host_of_folded,
    shard_bounds,
)
from smddp_sdk.planning.selection import allgather_algorithm, allreduce_algorithm  # noqa: E402
from tests.collectives.cluster import Cluster  # noqa: E402

pytestmark = pytest.mark.integration

LAYOUTS = {"3x1": ["algo-1", "algo-2", "algo-3"], "2x2": ["algo-1", "algo-1", "algo-2", "algo-2"]}
SHAPES = [[0], [2, 3], [1001], [300_000]]  # 300K float32 > 1 MiB: several pipeline steps
CASES = [
    {"dtype": "float32", "reduce_op": "sum"},
    {"dtype": "float32", "reduce_op": "avg"},
    {"dtype": "bfloat16", "reduce_op": "sum"},
    {"dtype": "float16", "reduce_op": "max"},
    {"dtype": "int64", "reduce_op": "product"},
]


def _cases() -> list[dict]:
    runs = []
    for seed, shape in enumerate(SHAPES):
        for extra in CASES:
            runs.append({"op": "all_reduce", "shape": shape, "seed": seed, "group": 0, "root": 0, "async": seed % 2 == 1,
                         "strided": False, **extra})
    for op, shape in (("all_gather_into_tensor", [300_000]), ("all_gather", [1000])):  # ring / all-to-all between hosts
        runs.append({"op": op, "shape": shape, "seed": 7, "group": 0, "root": 0, "async": False, "strided": False,
                     "dtype": "float32", "reduce_op": "sum"})
    runs.append({"op": "reduce_scatter_tensor", "shape": [70_001], "seed": 99, "group": 0, "root": 0, "async": False,
                 "strided": False, "dtype": "float32", "reduce_op": "sum"})
    return runs


@pytest.mark.parametrize("algo", ALGORITHMS[1:])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_forced_allreduce_path_matches_the_reference(layout: str, algo: str) -> None:
    cluster = Cluster(LAYOUTS[layout], env={"SMDDP_ALLREDUCE_ALGO": algo, "SMDDP_SHM_SLOT_BYTES": str(512 << 10),
                                                 "SMDDP_PIPELINE_CHUNK_BYTES": str(1 << 20)}, native="mixed")
    try:
        cluster.wait_ready()
        failures = []
        for case in _cases():
            verdicts = cluster.run(case)
            if any(v != "ok" for v in verdicts):
                failures.append((case["dtype"], case["reduce_op"], case["shape"], verdicts))
    finally:
        results = cluster.close()
    assert not failures, failures
    assert all(code == 0 for code, _ in results), results


def test_an_unknown_algorithm_is_a_clear_error() -> None:
    cluster = Cluster(["algo-1", "algo-2"], env={"SMDDP_ALLREDUCE_ALGO": "butterfly"})
    try:
        cluster.wait_ready()
        verdicts = cluster.run({"op": "all_reduce", "shape": [4], "seed": 1, "group": 0, "root": 0, "async": False,
                                "strided": False, "dtype": "float32", "reduce_op": "sum"})
    finally:
        cluster.close()
    assert all("SMDDP_ALLREDUCE_ALGO='butterfly'" in v and "oneshot" in v for v in verdicts), verdicts


def test_the_size_and_host_count_pick_the_algorithm() -> None:
    assert allreduce_algorithm(64 << 20, 2, "auto") == "oneshot"  # H=2: equal bytes, one round
    assert allreduce_algorithm(4 << 10, 4, "auto") == "oneshot"  # small: one round
    assert allreduce_algorithm(60 << 10, 4, "auto") == "recursive_doubling"
    assert allreduce_algorithm(32 << 10, 16, "auto") == "recursive_doubling"
    assert allreduce_algorithm(4 << 10, 64, "auto") == "recursive_doubling"  # 63 messages cost more than 6 rounds
    assert allreduce_algorithm(256 << 10, 8, "auto") == "sharded"
    assert allreduce_algorithm(1 << 20, 8, "auto") == "halving_doubling"  # sharded would take 14 rounds
    assert allreduce_algorithm(2 << 20, 3, "auto") == "ring"  # rounds of 512 KiB and more: continuous flows
    assert allreduce_algorithm(4 << 20, 8, "auto") == "ring"
    assert allreduce_algorithm(4 << 10, 4, "sharded") == "sharded"
    assert [allgather_algorithm(size, 8) for size in (1 << 10, 100 << 10, 1 << 20)] == ["oneshot", "bruck", "ring"]
    assert allgather_algorithm(4 << 10, 64) == "bruck"


def test_folding_pairs_the_extra_hosts_with_their_lower_neighbours() -> None:
    assert [folded_rank(h, 5) for h in range(5)] == [0, -1, 1, 2, 3]
    assert [folded_rank(h, 6) for h in range(6)] == [0, -1, 1, -1, 2, 3]
    for hosts in range(1, 20):
        kept = [h for h in range(hosts) if folded_rank(h, hosts) >= 0]
        assert [host_of_folded(folded_rank(h, hosts), hosts) for h in kept] == kept
        assert len(kept) == 1 << (hosts.bit_length() - 1)


def test_shards_cover_the_buffer_exactly_once() -> None:
    for numel in (0, 1, 5, 1000, 1001):
        for parts in (1, 2, 3, 4):
            bounds = [shard_bounds(numel, parts, i) for i in range(parts)]
            assert bounds[0][0] == 0 and bounds[-1][1] == numel
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1
