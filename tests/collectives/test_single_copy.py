"""Large one-host all_gathers and broadcasts read the peers' memory directly (process_vm_readv), in the
core and in Python alike, and copy through shared memory where the kernel refuses that or
SMDDP_SINGLE_COPY=0 says so: the same bits either way."""

from __future__ import annotations

import json
import platform

import pytest

pytest.importorskip("torch")
from smddp_sdk.collectives.local import STREAMED_FROM  # noqa: E402
from tests.collectives.cluster import NATIVE_IDS, NATIVE_PATHS, Cluster, native_setting  # noqa: E402
from tests.collectives.scenarios import SINGLE_COPY_CALLS, STREAMED_CALLS  # noqa: E402

SLOT = 65536
CHUNKS = -(-300_001 * 4 // SLOT)  # barriers of one call through the slots (the scenario's 1.2 MB per rank)


def _run(ranks: int, native: str, **env: str) -> list[dict]:
    cluster = Cluster(["algo-1"] * ranks, scenario="single_copy", native=native, env={"SMDDP_SHM_SLOT_BYTES": str(SLOT), **env})
    reports = [json.loads(cluster.store.get(f"report/single_copy/{r}")) for r in range(ranks)]
    exits = cluster.finish(timeout=60)
    assert all(code == 0 for code, _ in exits), exits
    for report in reports:
        assert [r["call"] for r in report["results"]] == SINGLE_COPY_CALLS
        assert all(r["right"] for r in report["results"]), report
    return reports


def _barriers(report: dict) -> list[int]:
    return [r["barriers"] for r in report["results"]]


@pytest.mark.integration
@pytest.mark.parametrize("native_path", NATIVE_PATHS, ids=NATIVE_IDS)
def test_large_gathers_and_broadcasts_read_the_peers_memory_once(native_path):
    for rank, report in enumerate(_run(3, native_path)):
        assert report["single_copy"] and _barriers(report) == [2] * len(SINGLE_COPY_CALLS), report
        assert not any(r["warnings"] for r in report["results"]), report
        blocking = sum(not call.startswith("async_") for call in SINGLE_COPY_CALLS)
        assert report["core_calls"] == (blocking if native_setting(native_path, rank) == "1" else None), report


@pytest.mark.integration
@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="the test's seccomp filter knows these")
@pytest.mark.parametrize("native_path", NATIVE_PATHS, ids=NATIVE_IDS)
def test_a_refused_read_falls_back_for_the_whole_host_with_one_warning(native_path):
    """The last rank's kernel refuses process_vm_readv: the broadcast from it still reads once (its peers
    may read it), the first all_gather finds the refusal after its two barriers and copies through the
    slots, and so does every later call, on every rank; the host's first rank says why, once."""
    reports = _run(2, native_path, SMDDP_TEST_DENY_READS="1")
    for rank, report in enumerate(reports):
        assert not report["single_copy"]
        assert _barriers(report) == [2, 2 + CHUNKS] + [CHUNKS] * 4, report
        warned = [w for r in report["results"] for w in r["warnings"]]
        if rank == 0:
            assert len(warned) == 1 and "EPERM" in warned[0] and "SYS_PTRACE" in warned[0], warned
        else:
            assert warned == [], warned


@pytest.mark.integration
def test_smddp_single_copy_0_copies_through_the_slots():
    for report in _run(2, "mixed", SMDDP_SINGLE_COPY="0"):
        assert not report["single_copy"] and _barriers(report) == [CHUNKS] * len(SINGLE_COPY_CALLS), report
        assert not any(r["warnings"] for r in report["results"]), report


@pytest.mark.integration
@pytest.mark.parametrize("native_path", NATIVE_PATHS, ids=NATIVE_IDS)
def test_gathers_of_more_than_the_caches_copy_through_the_slots(native_path):
    """From STREAMED_FROM bytes of result an all_gather copies through the slots (the core with
    non-temporal stores), in the core and in Python alike: right into an unaligned output and in place."""
    cluster = Cluster(["algo-1"] * 2, scenario="streamed_gather", native=native_path, env={"SMDDP_SHM_SLOT_BYTES": str(SLOT)})
    reports = [json.loads(cluster.store.get(f"report/streamed_gather/{r}")) for r in range(2)]
    exits = cluster.finish(timeout=60)
    assert all(code == 0 for code, _ in exits), exits
    chunks = -(-(STREAMED_FROM // 2 + 12) // SLOT)
    for report in reports:
        assert [r["call"] for r in report["results"]] == STREAMED_CALLS
        assert all(r["right"] for r in report["results"]), report
        assert report["single_copy"] and _barriers(report) == [chunks] * len(STREAMED_CALLS), report
