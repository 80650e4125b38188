"""Point-to-point's shared-memory rings (collectives/ring.py, p2p.py): the ring itself in one process
(native kernels and the Python steps, each against the other, wrapping around a small ring with
messages larger than it, a sleeping reader woken, a corrupted ring refused), then between real ranks
with a small ring: order per tag, tags, any source with a flooding sender, many messages in flight, a
receiver asleep when the message comes."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from smddp_sdk.collectives import native  # noqa: E402
from smddp_sdk.collectives.ring import MIN_RING_BYTES, Ring, RingCorrupt  # noqa: E402
from tests.collectives.cluster import native_setting, run_scenario  # noqa: E402

KERNELS = ["native", "python"]


def _ring_pair(tmp_path, capacity: int, writer: str, reader: str) -> tuple[Ring, Ring]:
    """Two ends of one ring file, each driven by the native kernels or the Python steps."""
    made, path, fd = Ring.create(str(tmp_path), "ring", capacity)
    os.close(fd)
    other = Ring.open(path, capacity)
    ends = {"w": made, "r": other}
    for end, kind in (("w", writer), ("r", reader)):
        if kind == "python":
            ends[end]._native = None
        elif native.library() is None:
            pytest.skip("native kernels unavailable here")
    return ends["w"], ends["r"]


@pytest.mark.parametrize("writer", KERNELS)
@pytest.mark.parametrize("reader", KERNELS)
def test_a_stream_larger_than_the_ring_wraps_around_intact(tmp_path, writer, reader):
    w, r = _ring_pair(tmp_path, MIN_RING_BYTES, writer, reader)
    stream = torch.randint(0, 256, (300_000,), dtype=torch.uint8)  # 73 times the ring
    got = torch.zeros_like(stream)

    def write() -> None:
        done, step = 0, 1
        while done < stream.numel():  # odd piece sizes, so every wrap position is met
            piece = stream[done : done + step]
            at = 0
            while at < piece.numel():
                at += w.put(piece, at)
                if at < piece.numel():
                    assert w.wait(True, 1, 0.0, 5.0) > 0
            done += piece.numel()
            step = step * 3 % 5003 + 1

    thread = threading.Thread(target=write)
    thread.start()
    done = 0
    while done < got.numel():
        done += r.take(got, done)
        if done < got.numel():
            assert r.wait(False, 1, 0.0, 5.0) > 0, f"stalled at {done}"
    thread.join()
    assert torch.equal(got, stream)
    assert r.available() == 0


@pytest.mark.parametrize("writer", KERNELS)
@pytest.mark.parametrize("reader", KERNELS)
def test_a_reader_asleep_on_an_empty_ring_is_woken_by_a_write(tmp_path, writer, reader):
    w, r = _ring_pair(tmp_path, MIN_RING_BYTES, writer, reader)
    woke: list[float] = []
    thread = threading.Thread(target=lambda: woke.append((r.wait(False, 8, 0.0, 10.0), time.monotonic())))
    thread.start()
    time.sleep(0.3)  # the reader is asleep in the kernel by now (no polling: spin 0)
    written = time.monotonic()
    assert w.put(torch.arange(8, dtype=torch.uint8), 0) == 8
    thread.join(10)
    have, at = woke[0]
    assert have == 8
    assert at - written < 2.0, "woken by the write, not by the 10 s slice"
    assert r.wait(False, 9, 0.0, 0.05) == 0  # 8 bytes there, 9 wanted: the slice passes


@pytest.mark.parametrize("kind", KERNELS)
def test_a_ring_whose_counters_were_tampered_with_is_refused(tmp_path, kind):
    w, r = _ring_pair(tmp_path, MIN_RING_BYTES, kind, kind)
    w._words[16] = 1 << 20  # head a MiB past tail in a 4 KiB ring: something else wrote here
    buffer = torch.zeros(64, dtype=torch.uint8)
    for attempt in (lambda: r.take(buffer, 0), lambda: w.put(buffer, 0), lambda: r.wait(False, 1, 0.0, 0.01)):
        with pytest.raises(RingCorrupt, match="something other than the two ranks wrote into it|make no sense"):
            attempt()


# between real ranks -----------------------------------------------------------------------------------
def run_ranks(n: int, scenario: str, env: dict[str, str], native_path: str = "1", timeout: float = 180,
              meanwhile: Callable[[dist.TCPStore], None] = lambda store: None) -> list[dict]:
    """Start n ranks on one host on the scenario (p2p_ring_worker.py); meanwhile runs while they do."""
    return run_scenario("tests.collectives.p2p_ring_worker", scenario, ["algo-1"] * n,
                        lambda r: {**env, "SMDDP_NATIVE": native_setting(native_path, r)}, timeout, meanwhile)


@pytest.mark.jobs
@pytest.mark.parametrize("native_path", ["1", "0", "mixed"], ids=["native", "python", "mixed"])
def test_many_messages_in_flight_through_a_small_ring_keep_order_tags_and_any_source(native_path):
    reports = run_ranks(3, "traffic", {"SMDDP_P2P_RING_BYTES": str(MIN_RING_BYTES)}, native_path)
    assert all(report.get("ok") for report in reports), reports
    assert all(report["rings"] for report in reports), reports  # every local link was a ring


@pytest.mark.jobs
def test_a_receiver_asleep_on_its_ring_is_woken_by_the_message():
    reports = run_ranks(2, "sleeper", {})
    assert all(report.get("ok") for report in reports), reports
    assert reports[1]["late_s"] < 1.0, reports  # woken by the sender, not after a slice or the timeout


@pytest.mark.jobs
def test_rings_off_sends_over_the_socket():
    reports = run_ranks(2, "traffic_pair", {"SMDDP_P2P_RING_BYTES": "0"})
    assert all(report.get("ok") for report in reports), reports
    assert not any(report["rings"] for report in reports), reports
