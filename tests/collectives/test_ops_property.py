"""Every collective against a local reference, over ops, dtypes, shapes, subgroups and world sizes 1-4.

One process group per module: 4 ranks on 2 simulated hosts (2 x 2), with subgroups covering world size 1,
2 on one host, 2 across hosts, 3 (2 + 1 hosts) and the full 2 x 2 group; plus 3 ranks on one host. Slots
are shrunk to 512 KiB so the larger cases exercise chunking and the sharded allreduce path.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.collectives.cases import DTYPES, OPS, REDUCING  # noqa: E402
from tests.collectives.cluster import NATIVE_IDS, NATIVE_PATHS, Cluster  # noqa: E402

pytestmark = pytest.mark.integration

TWO_BY_TWO = ["algo-1", "algo-1", "algo-2", "algo-2"]
GROUPS_2X2 = [[0, 1, 2, 3], [0], [0, 1], [1, 2], [0, 1, 2], [3, 2]]
SLOT_ENV = {"SMDDP_SHM_SLOT_BYTES": str(512 << 10)}
FLOAT_OPS = ["sum", "avg", "product", "min", "max"]
INT_OPS = [*FLOAT_OPS, "band", "bor", "bxor"]
FUNCOL_OPS = ["sum", "avg", "min", "max"]


@st.composite
def cases(draw: st.DrawFn, n_groups: int) -> dict:
    op = draw(st.sampled_from(OPS))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    if op in REDUCING:
        choices = FUNCOL_OPS if op.startswith("funcol") else INT_OPS if not DTYPES[dtype].is_floating_point else FLOAT_OPS
        if dtype == "bool":
            choices = ["min", "max"] if op.startswith("funcol") else ["min", "max", "sum", "band", "bor", "bxor"]
        reduce_op = draw(st.sampled_from(choices))
    else:
        reduce_op = "sum"
    big = draw(st.integers(0, 9)) == 0  # one case in ten crosses the 512 KiB slot size
    dims = draw(st.integers(0, 3))
    if big:
        shape = [draw(st.integers(40_000, 200_000))]
    else:
        shape = draw(st.lists(st.integers(0, 9), min_size=dims, max_size=dims))
    if op.startswith("funcol") or op.startswith("all_to_all"):
        shape = shape or [3]
    return {
        "op": op, "dtype": dtype, "shape": shape, "reduce_op": reduce_op,
        "seed": draw(st.integers(0, 2**20)), "group": draw(st.integers(0, n_groups - 1)),
        "root": draw(st.integers(0, 3)), "async": draw(st.booleans()), "strided": draw(st.booleans()),
    }


def _start(hosts: list[str], groups: list[list[int]], native: str) -> Cluster:
    cluster = Cluster(hosts, env={**SLOT_ENV, "SMDDP_TEST_GROUPS": json.dumps(groups)}, native=native)
    cluster.wait_ready()
    return cluster


@pytest.fixture(scope="module", params=["1", "0"], ids=["native", "python"])
def two_hosts(request):
    cluster = _start(TWO_BY_TWO, GROUPS_2X2, request.param)
    yield cluster
    exits = cluster.close()
    assert all(code == 0 for code, _ in exits), exits


@pytest.fixture(scope="module", params=NATIVE_PATHS, ids=NATIVE_IDS)
def one_host_three(request):
    """Where the native core runs: every call it takes must agree with the Python path's (mixed)."""
    cluster = _start(["algo-1"] * 3, [[0, 1, 2], [2, 0]], request.param)
    yield cluster
    exits = cluster.close()
    assert all(code == 0 for code, _ in exits), exits


def _assert_ok(verdicts: list[str]) -> None:
    failures = [v for v in verdicts if v not in ("ok", "skip")]
    assert not failures, "\n".join(failures)
    assert "ok" in verdicts


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@SETTINGS
@given(case=cases(len(GROUPS_2X2)))
def test_two_simulated_hosts_match_reference(two_hosts, case):
    _assert_ok(two_hosts.run(case))


@settings(SETTINGS, max_examples=60)
@given(case=cases(2))
def test_three_ranks_one_host_match_reference(one_host_three, case):
    _assert_ok(one_host_three.run(case))


def test_every_op_and_dtype_once_across_hosts(two_hosts):
    """Deterministic coverage on the full 2 x 2 group, whatever hypothesis drew."""
    for op in OPS:
        for dtype in sorted(DTYPES):
            reduce_op = "max" if dtype == "bool" else "sum"
            case = {"op": op, "dtype": dtype, "shape": [5, 3], "reduce_op": reduce_op, "seed": 7, "group": 0,
                    "root": 3, "async": True, "strided": True}
            _assert_ok(two_hosts.run(case))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("reduce_op", ["sum", "avg"])
def test_half_precision_sums_are_rounded_once_across_hosts(two_hosts, dtype, reduce_op):
    for shape in ([1000], [300_000]):  # the one-shot and the sharded intra-host algorithms
        case = {"op": "all_reduce_rounding", "dtype": dtype, "shape": shape, "reduce_op": reduce_op, "seed": 11,
                "group": 0, "root": 0, "async": False, "strided": False}
        _assert_ok(two_hosts.run(case))
