"""The collective cost model: closed forms, the algorithm choice, monotonicity and bad input."""

import pytest

from smddp_sdk.planning.costmodel import collective_seconds, per_link_bytes, smddp_inter_host_allreduce
from smddp_sdk.planning.hardware import CATALOG, TCP_PAYLOAD_SHARE, simulated, topology

MB = 1 << 20


def test_ring_allreduce_on_single_rank_hosts_is_the_textbook_closed_form():
    topo = simulated(400)  # one rank per host: no within-host phase
    bw = 400e6 / 8 * TCP_PAYLOAD_SHARE
    for hosts in (3, 4, 8):
        size = 16 * MB
        expected = 2 * (hosts - 1) * topo.alpha_s + 2 * (hosts - 1) / hosts * size / bw
        assert collective_seconds("all_reduce", size, hosts, topo) == pytest.approx(expected)
        # gloo's ring moves the same bytes with one rank per host
        assert collective_seconds("all_reduce", size, hosts, topo, "stock") == pytest.approx(expected)


def test_two_hosts_use_oneshot_which_moves_the_optimal_bytes():
    topo = simulated(800)
    size = 4 * MB
    assert collective_seconds("all_reduce", size, 2, topo) == pytest.approx(topo.alpha_s + size / topo.network_bytes_s)
    assert smddp_inter_host_allreduce(size, 2, topo, "ring") > smddp_inter_host_allreduce(size, 2, topo, "oneshot")


def test_auto_picks_as_the_backend_does():
    topo = simulated(400)
    for size, algo in ((16 << 10, "oneshot"), (256 << 10, "sharded"), (4 * MB, "ring")):
        assert smddp_inter_host_allreduce(size, 4, topo) == smddp_inter_host_allreduce(size, 4, topo, algo)


def test_hierarchical_smddp_moves_fewer_network_bytes_than_a_flat_ring_on_gpu_hosts():
    topo = CATALOG["ml.p4d.24xlarge"]
    size = 1000 * MB
    # per host: 2(H-1)/H S for smddp against 2(N-1)/N S for the flat ring (N = 8H)
    assert collective_seconds("all_reduce", size, 2, topo, "smddp") < 0.6 * collective_seconds("all_reduce", size, 2, topo, "stock")
    for hosts in (2, 4, 8):
        assert collective_seconds("all_reduce", size, hosts, topo, "smddp") < collective_seconds("all_reduce", size, hosts, topo, "stock")


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
@pytest.mark.parametrize("library", ["smddp", "stock"])
def test_time_grows_with_size_and_hosts_and_falls_with_bandwidth(op, library):
    slow, fast = simulated(100), simulated(800)
    sizes = [64 << 10, MB, 16 * MB, 256 * MB]
    times = [collective_seconds(op, s, 4, slow, library) for s in sizes]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert all(collective_seconds(op, s, 4, fast, library) < collective_seconds(op, s, 4, slow, library) for s in sizes)
    by_hosts = [collective_seconds(op, 16 * MB, h, slow, library) for h in (2, 3, 4, 8)]
    assert by_hosts == sorted(by_hosts)


def test_nothing_to_do_costs_nothing():
    assert collective_seconds("all_reduce", 4 * MB, 1, simulated(100)) == 0.0
    assert collective_seconds("all_reduce", 0, 4, simulated(100)) == 0.0
    # one host of 8 GPUs still reduces within the host
    assert collective_seconds("all_reduce", 4 * MB, 1, CATALOG["ml.p4d.24xlarge"]) > 0


def test_per_link_bytes_is_nccl_tests_bus_convention():
    assert per_link_bytes("all_reduce", 100, 4) == 150
    assert per_link_bytes("all_gather", 100, 4) == 75


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown collective"):
        collective_seconds("all_to_everyone", 1, 2, simulated(100))
    with pytest.raises(ValueError, match="unknown library"):
        collective_seconds("all_reduce", 1, 2, simulated(100), "mpi")
    with pytest.raises(ValueError, match="hosts"):
        collective_seconds("all_reduce", 1, 0, simulated(100))


def test_topology_names_and_errors():
    assert topology("sim:250mbit").network_gbit_s == pytest.approx(0.25 * TCP_PAYLOAD_SHARE)
    assert topology("sim:100mbitx2").gpus == 2
    assert topology("ml.p4d.24xlarge", price_per_hour=10.0).price_per_hour == 10.0
    assert CATALOG["ml.p4d.24xlarge"].price_per_hour is None  # no unchecked prices built in
    with pytest.raises(Exception, match="no network figures"):
        topology("ml.p9.huge")
    with pytest.raises(Exception, match="positive"):
        topology("ml.p4d.24xlarge", price_per_hour=-1)
