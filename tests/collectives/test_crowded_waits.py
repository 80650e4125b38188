"""How a waiting rank polls (issue 37): where the host's ranks outnumber the cores it yields the core
for 300 µs instead of sleeping after 2 µs; with a core per rank a blocking call of the core polls 1 ms.

The native wait is exercised by two real processes pinned to one CPU (so crowded), each counting the
voluntary context switches (sleeps) of its barriers: yielding leaves almost none, pausing on the one CPU
(or not polling) sleeps in most."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from smddp_sdk.collectives import native, shm
from smddp_sdk.collectives.shm import SPIN_US_ENV, Peer, ShmArena, create_arena

PROJECT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(native.library() is None, reason="needs the native kernels (a C compiler)")


def arena_of(n_local: int, tmp_path: Path) -> ShmArena:
    path, fd, slot = create_arena(str(tmp_path), "arena", n_local, default_slot=shm.MIN_SLOT_BYTES)
    try:
        return ShmArena(fd, n_local, slot, 0, [Peer(i, os.getpid()) for i in range(n_local)])
    finally:
        os.close(fd)


def test_ranks_with_a_core_each_poll_30_us_calm_2_us_loaded_and_1_ms_in_a_blocking_call(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(SPIN_US_ENV, raising=False)
    arena = arena_of(1, tmp_path)
    assert not arena.crowded
    assert arena.spin_budgets() == (30e-6, 2e-6, 1e-3)


def test_ranks_that_outnumber_the_cores_yield_for_300_us_in_every_wait(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(SPIN_US_ENV, raising=False)
    arena = arena_of(len(os.sched_getaffinity(0)) + 1, tmp_path)
    assert arena.crowded
    assert arena.spin_budgets() == (300e-6,) * 3


def test_smddp_spin_us_sets_every_budget(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(SPIN_US_ENV, "7")
    assert arena_of(1, tmp_path).spin_budgets() == pytest.approx((7e-6,) * 3)


# Two processes on one CPU share a control area and run BARRIERS barriers through smddp_barrier with the
# given polling budget; each prints its voluntary context switches (sleeps) over them.
PAIR = textwrap.dedent("""
    import ctypes, json, mmap, os, resource, sys
    from smddp_sdk.collectives import native
    spin_ns, barriers = int(sys.argv[1]), int(sys.argv[2])
    area = mmap.mmap(-1, 4096)
    cpu = min(os.sched_getaffinity(0))
    index = 1 if os.fork() == 0 else 0
    os.sched_setaffinity(0, {cpu})  # before the first wait: the kernels count the cores once
    lib = native.library()
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    record = (ctypes.c_uint32 * 6)(1, 1, 1, 1, 0, 0)
    def barrier(generation):
        assert lib.smddp_barrier(base, 2, index, generation, record, spin_ns, 10**9) == -1
    barrier(1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    for generation in range(2, barriers + 2):
        barrier(generation)
    sleeps = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - before
    os.write(1, (json.dumps({"index": index, "sleeps": sleeps}) + "\\n").encode())  # one write: lines never mix
    if index == 0:
        os.wait()
    else:
        os._exit(0)
""")


def sleeps_over_barriers(spin_ns: int, barriers: int) -> list[int]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", PAIR, str(spin_ns), str(barriers)], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    return [json.loads(line)["sleeps"] for line in done.stdout.splitlines() if line.startswith("{")]


def test_crowded_ranks_yield_to_their_peer_instead_of_sleeping() -> None:
    barriers = 400
    yielding = sleeps_over_barriers(300_000, barriers)
    assert len(yielding) == 2
    assert max(yielding) < barriers // 10, f"{yielding} sleeps over {barriers} barriers while yielding"


def test_the_check_can_fail_a_wait_that_does_not_poll_sleeps_in_most_barriers() -> None:
    barriers = 400
    unpolled = sleeps_over_barriers(0, barriers)
    assert sum(unpolled) > barriers // 2, f"{unpolled} sleeps over {barriers} barriers without polling"
