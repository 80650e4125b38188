"""The collective cost model: closed forms per algorithm, the algorithm choice, what runs on each target,
monotonicity and bad input."""

import math

import pytest

from smddp_sdk.planning.costmodel import collective_cost, collective_seconds, implementation, per_link_bytes
from smddp_sdk.planning.hardware import CATALOG, DELAY_LINK_MTU, TCP_PAYLOAD_SHARE, simulated, tcp_payload_share, topology
from smddp_sdk.planning.selection import allgather_algorithm, allreduce_algorithm, broadcast_algorithm

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


@pytest.mark.parametrize("hosts", [4, 8, 16])
def test_log_depth_closed_forms_on_powers_of_two(hosts):
    topo = simulated(1000, delay_ms=0.5)
    alpha, bw, size, log = topo.alpha_s, topo.network_bytes_s, 4 * MB, math.log2(hosts)
    cost = collective_cost("all_reduce", size, hosts, topo, forced="halving_doubling")
    assert cost.latency_s == pytest.approx(2 * log * alpha)
    assert cost.transfer_s == pytest.approx(2 * (hosts - 1) / hosts * size / bw)
    assert collective_seconds("all_reduce", size, hosts, topo, forced="recursive_doubling") == pytest.approx(log * (alpha + size / bw))
    assert collective_seconds("all_gather", size, hosts, topo, forced="bruck") == pytest.approx(log * alpha + (hosts - 1) / hosts * size / bw)


def test_other_host_counts_pay_two_rounds_to_fold_the_extra_hosts_in_and_out():
    topo = simulated(1000, delay_ms=0.5)
    size = 4 * MB
    eight = collective_cost("all_reduce", size, 8, topo, forced="halving_doubling")
    twelve = collective_cost("all_reduce", size, 12, topo, forced="halving_doubling")
    assert twelve.latency_s == pytest.approx(eight.latency_s + 2 * topo.alpha_s)
    assert twelve.transfer_s == pytest.approx(eight.transfer_s + 2 * size / topo.network_bytes_s)
    # which is why the runtime takes sharded for 4 MiB on 12 hosts, and halves and doubles on 16
    assert allreduce_algorithm(size, 12) == "sharded" and allreduce_algorithm(size, 16) == "halving_doubling"


@pytest.mark.parametrize("hosts", [2, 3, 4, 5, 8, 12, 16, 64])
def test_the_planner_prices_the_algorithm_the_runtime_chooses(hosts):
    topo = simulated(400)
    for size in (4 << 10, 16 << 10, 64 << 10, 256 << 10, MB, 4 * MB, 64 * MB):
        chosen = allreduce_algorithm(size, hosts)
        assert collective_cost("all_reduce", size, hosts, topo).algorithm == chosen, (size, hosts)
        assert collective_seconds("all_reduce", size, hosts, topo) == collective_seconds("all_reduce", size, hosts, topo, forced=chosen)
        assert collective_cost("all_gather", size, hosts, topo).algorithm == allgather_algorithm(-(-size // hosts), hosts)
        assert collective_cost("broadcast", size, hosts, topo).algorithm == broadcast_algorithm(size, hosts)


@pytest.mark.parametrize("hosts", [2, 3, 5, 8, 16])
def test_broadcast_is_a_tree_of_log_depth_and_scatters_large_messages(hosts):
    topo = simulated(1000, delay_ms=0.5)
    alpha, bw, depth = topo.alpha_s, topo.network_bytes_s, math.ceil(math.log2(hosts))
    small = collective_cost("broadcast", 4 << 10, hosts, topo)
    assert small.algorithm == "binomial"
    assert small.seconds == pytest.approx(depth * (alpha + (4 << 10) / bw))
    large = collective_cost("broadcast", 16 * MB, hosts, topo)
    assert large.algorithm == ("binomial" if hosts == 2 else "scatter_allgather")
    if hosts > 2:  # the root's link carries (H-1)/H of the message twice, never the whole of it log2 H times
        assert large.transfer_s == pytest.approx(2 * (hosts - 1) / hosts * 16 * MB / bw)


def test_log_depth_algorithms_beat_the_ring_where_latency_counts():
    topo = simulated(1000, delay_ms=0.5)
    for size in (64 << 10, MB):
        ring = collective_seconds("all_reduce", size, 16, topo, forced="ring")
        assert collective_seconds("all_reduce", size, 16, topo) < ring / 1.5
    assert collective_cost("all_reduce", 4 << 10, 64, topo).algorithm == "recursive_doubling"
    assert collective_cost("all_gather", 64 << 10, 64, topo).algorithm == "bruck"


def test_delay_is_part_of_alpha_and_delayed_links_carry_large_frames():
    plain, delayed = topology("sim:1000mbit"), topology("sim:1000mbit+0.5ms")
    assert delayed.alpha_s == pytest.approx(plain.alpha_s + 0.5e-3)
    assert delayed.network_gbit_s == pytest.approx(tcp_payload_share(DELAY_LINK_MTU))
    assert topology("sim:100mbitx2+2ms").gpus == 2 and not delayed.gpu


def test_each_target_models_what_runs_there():
    p4d, g5, sim = CATALOG["ml.p4d.24xlarge"], CATALOG["ml.g5.48xlarge"], simulated(400)
    assert (implementation(p4d, "smddp"), implementation(p4d, "stock")) == ("AWS SMDDP", "NCCL")
    assert (implementation(sim, "smddp"), implementation(sim, "stock")) == ("smddp (this project)", "gloo")
    # SMDDP does not run on g5: SageMaker jobs with backend smddp get NCCL there, like the stock library
    assert implementation(g5, "smddp") == "NCCL"
    assert collective_seconds("all_reduce", 25 * MB, 8, g5, "smddp") == collective_seconds("all_reduce", 25 * MB, 8, g5, "stock")
    # reduce-scatter is not one of SMDDP's own collectives
    assert collective_cost("reduce_scatter", 25 * MB, 8, p4d).note == "SMDDP hands reduce_scatter to NCCL"


def test_aws_smddp_pays_two_network_steps_at_any_scale_and_moves_fewer_bytes_than_nccl():
    topo = CATALOG["ml.p4d.24xlarge"]
    latencies = {collective_cost("all_reduce", 25 * MB, h, topo).latency_s for h in (2, 8, 64, 512)}
    assert len({round(x, 12) for x in latencies}) == 1
    for hosts in (2, 4, 8, 16, 32, 64):
        assert collective_seconds("all_reduce", 1000 * MB, hosts, topo, "smddp") < collective_seconds("all_reduce", 1000 * MB, hosts, topo, "stock")
    # NCCL's tree takes over from its ring where latency matters
    assert collective_cost("all_reduce", 1 * MB, 64, topo, "stock").algorithm == "tree"


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
    with pytest.raises(ValueError, match="unknown all_reduce algorithm 'tree'"):
        collective_seconds("all_reduce", MB, 4, simulated(100), forced="tree")


def test_topology_names_and_errors():
    assert topology("sim:250mbit").network_gbit_s == pytest.approx(0.25 * TCP_PAYLOAD_SHARE)
    assert topology("sim:100mbitx2").gpus == 2
    assert topology("ml.p4d.24xlarge", price_per_hour=10.0).price_per_hour == 10.0
    assert CATALOG["ml.p4d.24xlarge"].price_per_hour is None  # no unchecked prices built in
    with pytest.raises(Exception, match="no network figures"):
        topology("ml.p9.huge")
    with pytest.raises(Exception, match="no network figures"):
        topology("sim:100mbit+fast")
    with pytest.raises(Exception, match="positive"):
        topology("ml.p4d.24xlarge", price_per_hour=-1)


def test_cpu_instance_types_run_the_bundled_backend_one_rank_per_host():
    topo = CATALOG["ml.c6i.32xlarge"]
    assert topo.gpus == 1 and not topo.gpu
    cost = collective_cost("all_reduce", 4 * MB, 8, topo)
    assert (cost.implementation, cost.algorithm) == ("smddp (this project)", "ring")
    assert collective_cost("all_reduce", 4 * MB, 8, topo, "stock").implementation == "gloo"
