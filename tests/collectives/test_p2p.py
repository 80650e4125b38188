"""Point-to-point over smddp (collectives/p2p.py) between real rank processes: one host over shared
memory, one host over TCP only, and 2 simulated hosts x 2 ranks; correctness for dtypes and sizes (0
elements, and once over 64 MiB), any source, tags, ordering, batch_isend_irecv, mismatch errors on both
ends and a peer killed while a receive waits for it."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from datetime import timedelta

import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from tests.collectives.cluster import native_setting, run_scenario  # noqa: E402

pytestmark = pytest.mark.integration
jobs = pytest.mark.jobs  # every test but the smoke test starts several ranks many times over
ONE_HOST, TWO_HOSTS = ["algo-1"] * 3, ["algo-1", "algo-1", "algo-2", "algo-2"]
LAYOUTS = {"one-host": (ONE_HOST, {}), "one-host-tcp": (ONE_HOST, {"SMDDP_TRANSPORT": "tcp"}), "two-hosts": (TWO_HOSTS, {})}


def run_ranks(hosts: list[str], scenario: str, env: dict[str, str] | None = None, timeout: float = 240,
              per_rank: bool = False, meanwhile: Callable[[dist.TCPStore], None] = lambda store: None) -> list[dict]:
    """Start one rank per host entry on the scenario; every rank's report (a missing one: its output).
    per_rank: even ranks native, odd ranks pure Python (cluster.py's "mixed"); meanwhile runs while they do."""
    return run_scenario("tests.collectives.p2p_worker", scenario, hosts,
                        lambda r: {**(env or {}), **({"SMDDP_NATIVE": native_setting("mixed", r)} if per_rank else {})}, timeout, meanwhile)


def test_smoke_send_recv_between_two_local_ranks():
    reports = run_ranks(ONE_HOST[:2], "smoke", timeout=120)
    assert all(report.get("ok") for report in reports), reports


@jobs
@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
def test_point_to_point_moves_every_dtype_and_size_in_order(layout):
    hosts, env = LAYOUTS[layout]
    reports = run_ranks(hosts, "correctness", env)
    assert all(report.get("ok") for report in reports), reports


@jobs
@pytest.mark.parametrize("native", ["0", "mixed"])
def test_the_python_path_and_a_mix_of_paths_speak_the_same_protocol(native):
    """SMDDP_NATIVE=0 moves the bytes between hosts with the cryptography package, and a native rank
    understands it (the records and framing are the same)."""
    reports = run_ranks(TWO_HOSTS, "correctness", {"SMDDP_NATIVE": native} if native == "0" else {}, per_rank=native == "mixed")
    assert all(report.get("ok") for report in reports), reports


@jobs
@pytest.mark.parametrize("layout", ["one-host", "two-hosts"])
def test_a_message_over_64_mib_arrives_whole(layout):
    hosts, env = LAYOUTS[layout]
    reports = run_ranks(hosts[:2] if layout == "one-host" else hosts, "large", env)
    assert all(report.get("ok") for report in reports), reports


@jobs
@pytest.mark.parametrize(("layout", "recv_after_s", "sent"),
                         [(layout, "0", 10) for layout in LAYOUTS] + [("two-hosts", "1", 10), ("two-hosts", "0", 8 << 20)],
                         ids=[*LAYOUTS, "two-hosts-message-first", "two-hosts-refused-mid-message"])
def test_size_mismatch_fails_both_ends_naming_both_calls(layout, recv_after_s, sent):
    hosts, env = LAYOUTS[layout]
    reports = run_ranks(hosts, "mismatch", {**env, "SMDDP_TEST_RECV_AFTER_S": recv_after_s, "SMDDP_TEST_SENT": str(sent)}, timeout=120)
    sender, receiver = reports[0]["error"], reports[-1]["error"]
    for error in (sender, receiver):
        assert "point-to-point mismatch" in error, reports
        assert f"recv from rank 0 (tag 2, float32, {sent + 2} elements)" in error, reports
        assert "send #1 to rank" in error and f"(tag 2, float32, {sent} elements)" in error, reports


@jobs
@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
def test_a_peer_killed_mid_receive_is_named_as_lost(layout):
    hosts, env = LAYOUTS[layout]
    victim = len(hosts) - 1
    reports = run_ranks(hosts, "killed", {**env, "SMDDP_TEST_VICTIM": str(victim), "SMDDP_TEST_PG_TIMEOUT": "30"}, timeout=120)
    report = reports[0]
    assert f"rank {victim}" in report["error"], reports
    assert report["lost"] == [[victim, hosts[victim]]], reports
    assert report["elapsed"] < 10, reports  # told by the broken link, not by the 30 s timeout


@jobs
@pytest.mark.parametrize("encrypt", ["0", "1"], ids=["integrity", "encrypt"])
def test_links_between_hosts_are_protected_and_strangers_keep_no_sender_out(encrypt):
    """The point-to-point links between hosts take the hosts' protection (integrity records by default,
    encrypted with SMDDP_LINK_ENCRYPT=1) and a sender dials through 80 silent connections on the listener."""
    strangers: list[socket.socket] = []

    def flood(store: dist.TCPStore) -> None:
        store.wait(["p2p-listener"], timedelta(seconds=120))
        address = tuple(json.loads(store.get("p2p-listener")))
        strangers.extend(socket.create_connection(address, timeout=5) for _ in range(80))
        store.set("flooded", "1")

    try:
        reports = run_ranks(TWO_HOSTS, "protected", {"SMDDP_LINK_ENCRYPT": encrypt}, timeout=120, meanwhile=flood)
    finally:
        for sock in strangers:
            sock.close()
    assert all(report.get("ok") for report in reports), reports
    ends = [reports[1], reports[3]]
    assert all(end["protection"] == end["expected"] == ("encrypt" if encrypt == "1" else "integrity") for end in ends), reports
