"""Rooted collectives between hosts (broadcast, scatter, reduce, gather) are checked on both sides before data
moves: a root, size or dtype that differs between hosts fails every rank of every host, each naming both calls.
Before the check, two hosts that each held "the root" both only sent and returned their own data, and a root
host reported success while the receivers failed on the size."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
from tests.collectives.cluster import Cluster  # noqa: E402

pytestmark = pytest.mark.integration

TWO_BY_ONE, TWO_BY_TWO, THREE_BY_ONE = ["algo-1", "algo-2"], ["algo-1", "algo-1", "algo-2", "algo-2"], ["algo-1", "algo-2", "algo-3"]
EXTRAS = {"broadcast": "", "scatter": "", "reduce": "SUM, ", "gather": ""}


def _calls(mismatch: str, world: int) -> tuple[str, str]:
    """What the first host and the last host call as call #2 (rooted_mismatch_between_hosts)."""
    op, kind = mismatch.split("_")
    extra = EXTRAS[op]
    ours = f"{op} #2 ({extra}float32, 10 elements, root 0)"
    theirs = {"root": f"{op} #2 ({extra}float32, 10 elements, root {world - 1})",
              "size": f"{op} #2 ({extra}float32, 20 elements, root 0)",
              "dtype": f"{op} #2 ({extra}float64, 10 elements, root 0)"}[kind]
    return ours, theirs


CASES = [  # (mismatch, hosts, paths): every op with another root, sizes and dtypes on broadcast and gather
    *[("broadcast_root", hosts, path) for hosts in (TWO_BY_ONE, TWO_BY_TWO) for path in ("1", "0", "mixed")],
    ("broadcast_root", THREE_BY_ONE, "mixed"),  # the check reaches hosts that the tree's first round does not
    ("broadcast_size", TWO_BY_ONE, "1"), ("broadcast_size", TWO_BY_TWO, "mixed"),
    ("broadcast_dtype", TWO_BY_ONE, "0"), ("broadcast_dtype", TWO_BY_TWO, "1"),
    ("scatter_root", TWO_BY_TWO, "1"), ("scatter_root", TWO_BY_ONE, "mixed"),
    ("reduce_root", TWO_BY_TWO, "mixed"), ("reduce_root", THREE_BY_ONE, "1"),
    ("gather_root", TWO_BY_TWO, "0"), ("gather_size", THREE_BY_ONE, "mixed"),
]
SHAPES = {id(TWO_BY_ONE): "2x1", id(TWO_BY_TWO): "2x2", id(THREE_BY_ONE): "3x1"}
PATHS = {"1": "native", "0": "python", "mixed": "mixed"}


@pytest.mark.parametrize(("mismatch", "hosts", "path"), CASES,
                         ids=[f"{m}-{SHAPES[id(h)]}-{PATHS[p]}" for m, h, p in CASES])
def test_a_rooted_call_that_differs_between_hosts_fails_every_rank_naming_both_calls(mismatch, hosts, path):
    env = {"SMDDP_TEST_PG_TIMEOUT": "30", "SMDDP_TEST_MISMATCH": mismatch, "SMDDP_TEST_LAST_HOST": hosts[-1]}
    cluster = Cluster(hosts, scenario="rooted_mismatch_between_hosts", env=env, native=path)
    reports = {r: json.loads(cluster.store.get(f"report/rooted/{r}")) for r in range(len(hosts))}
    cluster.finish(timeout=30)
    ours, theirs = _calls(mismatch, len(hosts))
    for rank, report in reports.items():
        error = report["error"]
        assert error and "collective mismatch between hosts" in error, (rank, report)
        assert ours in error and theirs in error, (rank, report)
        assert report["elapsed"] < 10, (rank, report)
