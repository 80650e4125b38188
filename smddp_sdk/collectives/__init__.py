"""The bundled `smddp` torch.distributed backend.

``import smddp_sdk.collectives`` registers the backend (idempotent; it leaves an already registered
`smddp`, such as AWS's own library, in place). Then ``dist.init_process_group("smddp")`` works as with any
backend: CPU tensors use shared memory within a host and authenticated TCP between hosts, CUDA tensors
are handed to NCCL. torch's DistributedDataParallel over an smddp group gets smddp's comm hook
(``ddp.install_default_hook``); ``dist.monitored_barrier`` works on smddp groups as on gloo ones
(``process_group.install_monitored_barrier``).
"""

from __future__ import annotations

import torch.distributed as dist

from smddp_sdk.collectives import ddp, sagemaker_compat
from smddp_sdk.collectives.errors import CollectiveError
from smddp_sdk.collectives.process_group import BACKEND_NAME, SmddpProcessGroup, group_class, install_monitored_barrier
from smddp_sdk.specs import events

__all__ = ["BACKEND_NAME", "CollectiveError", "SmddpProcessGroup", "is_registered", "register"]


def _create(store: dist.Store, rank: int, size: int, timeout) -> SmddpProcessGroup:
    default = not dist.is_initialized()
    if not default:  # the default group exists, so this is a subgroup (AWS's SMDDP has none)
        sagemaker_compat.check_subgroup(size)
    group = group_class()(store, rank, size, timeout)
    if default:  # the rendezvous and the mesh are up: a recovery phase (docs/resuming.md)
        events.record_from_rank(events.PROCESS_GROUP_FORMED, world_size=size)
    return group


def is_registered() -> bool:
    return BACKEND_NAME in dist.Backend.backend_list


def register() -> None:
    """Register `smddp` with torch.distributed unless a backend of that name already exists."""
    if not is_registered():
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
        ddp.install_default_hook()
        install_monitored_barrier()


register()
