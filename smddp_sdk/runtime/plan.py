"""The rank plan: one rule for every launch shape, as a pure function.

Hosts are taken in the job's distribution order (the toolkit's instance-group order, which is not
sorted). Every host runs ``processes_per_host`` ranks and

    global rank = host index x processes per host + local rank

which is what Open MPI's slot mapping gives the mpirun-style launchers and what torchrun gives with
``--node_rank = host index``. Launch shape ``none`` is the same rule with one process per host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from smddp_sdk.errors import ContractError


class LaunchShape(str, Enum):
    """How the user asked for the job to be launched (the ``distribution=`` of the estimator)."""

    SMDISTRIBUTED = "smdistributed"  # sagemaker_distributed_dataparallel_enabled: mpirun + smddprun in the toolkit
    PYTORCHDDP = "pytorchddp"  # sagemaker_pytorch_ddp_enabled: mpirun-style
    TORCH_DISTRIBUTED = "torch_distributed"  # torchrun-style
    MPI = "mpi"  # sagemaker_mpi_enabled
    NONE = "none"  # one process per host


# The PyTorch toolkit's precedence when several flags are on.
_SHAPE_FLAGS = (
    ("sagemaker_mpi_enabled", LaunchShape.MPI),
    ("sagemaker_pytorch_ddp_enabled", LaunchShape.PYTORCHDDP),
    ("sagemaker_torch_distributed_enabled", LaunchShape.TORCH_DISTRIBUTED),
    ("sagemaker_distributed_dataparallel_enabled", LaunchShape.SMDISTRIBUTED),
)
_UNSUPPORTED_FLAGS = ("sagemaker_pytorch_xla_multi_worker_enabled", "sagemaker_parameter_server_enabled")


@dataclass(frozen=True)
class RankSlot:
    """One process to start: its global rank, its rank on its host, and its host."""

    rank: int
    local_rank: int
    host: str
    node_rank: int


@dataclass(frozen=True)
class RankPlan:
    shape: LaunchShape
    hosts: tuple[str, ...]  # job order; index = node rank
    current_host: str
    processes_per_host: int
    world_size: int
    standalone: bool = False  # a host outside the distribution groups: one process, no rank variables

    @property
    def node_rank(self) -> int:
        return self.hosts.index(self.current_host)

    @property
    def master_host(self) -> str:
        return self.hosts[0]

    def slots_on(self, host: str) -> tuple[RankSlot, ...]:
        node = self.hosts.index(host)
        first = node * self.processes_per_host
        last = min(first + self.processes_per_host, self.world_size)
        return tuple(RankSlot(rank, rank - first, host, node) for rank in range(first, last))

    @property
    def local_slots(self) -> tuple[RankSlot, ...]:
        return self.slots_on(self.current_host)

    @property
    def local_world_size(self) -> int:
        return len(self.local_slots)


def launch_shape(framework_params: Mapping[str, Any], in_distribution_group: bool) -> LaunchShape:
    """The launch shape the flags ask for; ``none`` on hosts outside the distribution groups."""
    for flag in _UNSUPPORTED_FLAGS:
        if truthy(framework_params.get(flag)):
            raise ContractError(f"hyperparameters.json: field {flag!r} asks for a launcher this runtime does not provide; use smdistributed, pytorchddp, torch_distributed or mpi")
    if not in_distribution_group:
        return LaunchShape.NONE
    return next((shape for flag, shape in _SHAPE_FLAGS if truthy(framework_params.get(flag))), LaunchShape.NONE)


def processes_per_host(shape: LaunchShape, framework_params: Mapping[str, Any], num_gpus: int, num_neurons: int = 0) -> int:
    """``sagemaker_mpi_num_of_processes_per_host``, else the GPU (or Neuron) count, else 1; always 1 for ``none``."""
    if shape is LaunchShape.NONE:
        return 1
    explicit = framework_params.get("sagemaker_mpi_num_of_processes_per_host")
    if explicit is not None:
        return _positive_int("sagemaker_mpi_num_of_processes_per_host", explicit)
    return num_gpus or num_neurons or 1


def plan_ranks(hosts: Sequence[str], current_host: str, shape: LaunchShape, per_host: int, total_processes: int | None = None) -> RankPlan:
    """Plan the ranks of the whole job. A host outside ``hosts`` runs one process in a world of its own."""
    if per_host < 1:
        raise ContractError(f"processes per host must be at least 1, got {per_host}")
    if current_host not in hosts:
        return RankPlan(LaunchShape.NONE, (current_host,), current_host, 1, 1, standalone=True)
    capacity = per_host * len(hosts)
    world = capacity if total_processes is None else total_processes
    if not 0 < world <= capacity:
        raise ContractError(f"hyperparameters.json: field 'sagemaker_mpi_num_processes' is {world}, but {len(hosts)} hosts x {per_host} processes per host give {capacity} slots; choose 1..{capacity}")
    return RankPlan(shape, tuple(hosts), current_host, per_host, world)


def total_processes(shape: LaunchShape, framework_params: Mapping[str, Any]) -> int | None:
    """``sagemaker_mpi_num_processes`` (the mpirun ``-np``) for the mpi shape, else None (fill every slot)."""
    value = framework_params.get("sagemaker_mpi_num_processes")
    if shape is not LaunchShape.MPI or value is None:
        return None
    return _positive_int("sagemaker_mpi_num_processes", value)


def _positive_int(field: str, value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ContractError(f"hyperparameters.json: field {field!r} must be a positive integer, got {value!r}")
    return value


def truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)
