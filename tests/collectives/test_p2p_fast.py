"""The native core's fast path for point-to-point (smddp_core.cpp's fast_send and fast_recv, p2p.py's
fast_send and fast_recv): between real ranks of one host, a blocking send or receive over a ring runs in
the core where the Python path would do the same, and everything else stays the Python path's: receives
posted before keep their messages, tags are matched, any-source receives see fast-path messages, a
mismatch fails both ends with one error, concurrent senders share the ring, and the reader thread a fast
receive parks still serves senders and receives that do not poll."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from smddp_sdk.collectives import native  # noqa: E402
from tests.collectives.cluster import native_setting, run_scenario  # noqa: E402

pytestmark = [pytest.mark.jobs, pytest.mark.skipif(native.core() is None, reason="the native core does not build here")]


def run_ranks(scenario: str, native_path: str = "1", timeout: float = 120) -> list[dict]:
    """Two ranks of one host on the scenario (p2p_fast_worker.py); their reports."""
    return run_scenario("tests.collectives.p2p_fast_worker", scenario, ["algo-1"] * 2,
                        lambda r: {"SMDDP_NATIVE": native_setting(native_path, r)}, timeout)


@pytest.mark.parametrize("native_path", ["1", "mixed"], ids=["native", "native-sender-python-receiver"])
def test_fast_path_messages_and_a_posted_irecv_keep_order_per_source_and_tag(native_path):
    sender, receiver = run_ranks("order", native_path)
    assert sender.get("ok") and receiver.get("ok"), (sender, receiver)
    assert sender["moved"] - sender["warmed"] == 6, sender  # every send of the scenario went through the core
    if native_path == "1":
        assert receiver["warmed"] >= 1, receiver  # receives waiting on an empty ring took the fast path
    else:
        assert receiver["moved"] == 0, receiver  # a Python rank reads the core's messages as its own


def test_receives_from_any_source_see_fast_path_messages_in_order():
    sender, receiver = run_ranks("any_source")
    assert sender.get("ok") and receiver.get("ok"), (sender, receiver)
    assert sender["moved"] >= 29, sender  # every send after the first (it makes the link) went through the core


def test_a_mismatch_on_the_fast_path_fails_both_ends_with_one_error():
    sender, receiver = run_ranks("mismatch")
    assert sender["moved"] >= 1, sender  # the 10 elements went through the core
    for error in (sender["error"], receiver["error"]):
        assert "point-to-point mismatch" in error, (sender, receiver)
        assert "recv from rank 0 (tag 2, float32, 12 elements)" in error, (sender, receiver)
        assert "send #2 to rank 1 (tag 2, float32, 10 elements)" in error, (sender, receiver)


def test_two_threads_sending_to_one_rank_share_its_ring():
    sender, receiver = run_ranks("threads")
    assert sender.get("ok") and receiver.get("ok"), (sender, receiver)
    assert sender["moved"] > 0, sender


def test_a_parked_reader_still_serves_a_waiting_sender_and_a_polled_irecv():
    sender, receiver = run_ranks("parked")
    assert sender.get("ok") and receiver.get("ok"), (sender, receiver)
    assert receiver["warmed"] >= 1, receiver  # its reader was parked by a fast receive
    assert sender["waited"] < 10, sender  # served by rank 1's reader thread while rank 1 was busy
