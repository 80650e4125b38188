"""SageMaker SDK v3's distributed runners (``sagemaker.train.distributed``): ``Torchrun``, ``MPI`` and ``SMP``.

    from smddp_sdk.train.distributed import Torchrun     # was: from sagemaker.train.distributed import Torchrun

SMDDP runs through ``Torchrun`` as AWS documents it for v3: the script calls
``dist.init_process_group("smddp")`` (after ``import smdistributed.dataparallel.torch.torch_smddp`` on AWS's
images); smddp-sdk's bundled backend answers that name on every scheduler. ``process_count_per_node``
becomes the ranks per host (default: the instance type's GPUs, else 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from smddp_sdk.train.configs import _Config


@dataclass(kw_only=True)
class SMP(_Config):
    """SageMaker model parallelism v2 parameters (sent as ``mp_parameters``; only AWS's SMP images run it)."""

    hybrid_shard_degree: int | None = None
    sm_activation_offloading: bool | None = None
    activation_loading_horizon: int | None = None
    fsdp_cache_flush_warnings: bool | None = None
    allow_empty_shards: bool | None = None
    tensor_parallel_degree: int | None = None
    context_parallel_degree: int | None = None
    expert_parallel_degree: int | None = None
    random_seed: int | None = None


class DistributedConfig(_Config):
    """What a ``distributed=`` runner gives the job: v2's ``distribution`` and the ranks per host."""

    process_count_per_node: int | None

    def distribution(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(kw_only=True)
class Torchrun(DistributedConfig):
    """torchrun-style launch: one process per rank with RANK, WORLD_SIZE, MASTER_ADDR and friends."""

    process_count_per_node: int | None = None
    smp: SMP | None = None

    def distribution(self) -> dict[str, Any]:
        given: dict[str, Any] = {"torch_distributed": {"enabled": True}}
        if self.smp is not None:
            given["smdistributed"] = {"modelparallel": {"enabled": True, "parameters": self.smp.as_dict()}}
        return given


@dataclass(kw_only=True)
class MPI(DistributedConfig):
    """mpirun-style launch; ``mpi_additional_options`` are passed on as v2's ``custom_mpi_options``."""

    process_count_per_node: int | None = None
    mpi_additional_options: list[str] | None = None

    def distribution(self) -> dict[str, Any]:
        options: dict[str, Any] = {"enabled": True}
        if self.process_count_per_node is not None:
            options["processes_per_host"] = self.process_count_per_node
        if self.mpi_additional_options:
            options["custom_mpi_options"] = " ".join(self.mpi_additional_options)
        return {"mpi": options}


__all__ = ["SMP", "DistributedConfig", "Torchrun", "MPI"]
