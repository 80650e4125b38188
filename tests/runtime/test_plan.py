"""The rank plan: global rank = host index x processes per host + local rank, for every launch shape."""

from __future__ import annotations

import pytest

from smddp_sdk.errors import ContractError
from smddp_sdk.runtime.plan import LaunchShape, RankSlot, launch_shape, plan_ranks, processes_per_host, total_processes


def ranks(plan) -> list[tuple[int, int]]:
    return [(slot.rank, slot.local_rank) for slot in plan.local_slots]


def test_two_p4d_hosts_give_sixteen_ranks_in_host_order():
    plan = plan_ranks(["algo-1", "algo-2"], "algo-2", LaunchShape.SMDISTRIBUTED, 8)
    assert plan.world_size == 16 and plan.local_world_size == 8 and plan.node_rank == 1
    assert ranks(plan) == [(8 + i, i) for i in range(8)]
    assert plan.master_host == "algo-1"


def test_unsorted_instance_group_order_decides_ranks_and_master():
    hosts = ["algo-3", "algo-1", "algo-4", "algo-2"]
    plan = plan_ranks(hosts, "algo-1", LaunchShape.TORCH_DISTRIBUTED, 2)
    assert plan.master_host == "algo-3" and plan.node_rank == 1
    assert plan.local_slots == (RankSlot(2, 0, "algo-1", 1), RankSlot(3, 1, "algo-1", 1))
    everyone = [slot.rank for host in hosts for slot in plan.slots_on(host)]
    assert everyone == list(range(8))


def test_one_host():
    plan = plan_ranks(["algo-1"], "algo-1", LaunchShape.SMDISTRIBUTED, 4)
    assert ranks(plan) == [(0, 0), (1, 1), (2, 2), (3, 3)] and plan.world_size == 4


@pytest.mark.parametrize("shape", list(LaunchShape))
def test_gpu_less_hosts_run_one_process_each(shape):
    per_host = processes_per_host(shape, {}, num_gpus=0)
    plan = plan_ranks(["algo-1", "algo-2"], "algo-2", shape, per_host)
    assert per_host == 1 and ranks(plan) == [(1, 0)] and plan.world_size == 2


def test_processes_per_host_prefers_the_explicit_hyperparameter_then_gpus_then_neurons():
    shape = LaunchShape.MPI
    assert processes_per_host(shape, {"sagemaker_mpi_num_of_processes_per_host": 3}, num_gpus=8) == 3
    assert processes_per_host(shape, {}, num_gpus=8) == 8
    assert processes_per_host(shape, {}, num_gpus=0, num_neurons=2) == 2
    assert processes_per_host(LaunchShape.NONE, {"sagemaker_mpi_num_of_processes_per_host": 3}, num_gpus=8) == 1


def test_bad_processes_per_host_is_a_contract_error():
    with pytest.raises(ContractError, match="sagemaker_mpi_num_of_processes_per_host"):
        processes_per_host(LaunchShape.MPI, {"sagemaker_mpi_num_of_processes_per_host": 0}, num_gpus=0)


def test_mpi_num_processes_fills_slots_in_host_order():
    total = total_processes(LaunchShape.MPI, {"sagemaker_mpi_num_processes": 5})
    assert total == 5
    first = plan_ranks(["a", "b"], "a", LaunchShape.MPI, 4, total)
    second = plan_ranks(["a", "b"], "b", LaunchShape.MPI, 4, total)
    assert ranks(first) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert ranks(second) == [(4, 0)] and second.local_world_size == 1 and second.world_size == 5
    with pytest.raises(ContractError, match="8 slots"):
        plan_ranks(["a", "b"], "a", LaunchShape.MPI, 4, 9)


def test_heterogeneous_job_host_outside_the_distribution_group_runs_alone():
    # a data-loader group beside a training group: its host is not a rank of the training world
    assert launch_shape({"sagemaker_distributed_dataparallel_enabled": True}, in_distribution_group=False) is LaunchShape.NONE
    plan = plan_ranks(["train-1", "train-2"], "loader-1", LaunchShape.NONE, 1)
    assert plan.standalone and plan.world_size == 1 and ranks(plan) == [(0, 0)]


@pytest.mark.parametrize(
    ("flags", "shape"),
    [
        ({"sagemaker_distributed_dataparallel_enabled": True}, LaunchShape.SMDISTRIBUTED),
        ({"sagemaker_pytorch_ddp_enabled": "true"}, LaunchShape.PYTORCHDDP),
        ({"sagemaker_torch_distributed_enabled": True}, LaunchShape.TORCH_DISTRIBUTED),
        ({"sagemaker_mpi_enabled": True, "sagemaker_torch_distributed_enabled": True}, LaunchShape.MPI),
        ({"sagemaker_distributed_dataparallel_enabled": False}, LaunchShape.NONE),
        ({}, LaunchShape.NONE),
    ],
)
def test_launch_shape_follows_the_pytorch_toolkit_precedence(flags, shape):
    assert launch_shape(flags, in_distribution_group=True) is shape


def test_unsupported_launchers_are_refused_clearly():
    with pytest.raises(ContractError, match="sagemaker_pytorch_xla_multi_worker_enabled"):
        launch_shape({"sagemaker_pytorch_xla_multi_worker_enabled": True}, in_distribution_group=True)
