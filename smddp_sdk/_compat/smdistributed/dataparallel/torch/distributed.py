"""The pre-1.4 `smdistributed.dataparallel.torch.distributed` API on top of torch.distributed + smddp.

Old scripts call ``init_process_group()`` with no arguments and use ``get_local_rank()``; the rest is
torch.distributed's, with the smddp backend. The module warns once that this API is old.
"""

from __future__ import annotations

import os
import warnings

import torch.distributed as _dist

# The rest of the old API has torch's own signatures, so it is torch.distributed's own functions.
from torch.distributed import all_gather, all_reduce, all_to_all_single, barrier, broadcast, get_rank, get_world_size, group, is_available, is_initialized  # noqa: F401

import smddp_sdk.collectives  # noqa: F401 - registers "smddp"

warnings.warn(
    "smdistributed.dataparallel.torch.distributed is the deprecated data-parallel API; new scripts should "
    "`import smdistributed.dataparallel.torch.torch_smddp` and call "
    "torch.distributed.init_process_group(backend='smddp')",
    DeprecationWarning,
    stacklevel=2,
)


class ReduceOp:
    """The reduce ops of the old API (AVERAGE is its name for AVG)."""

    SUM = _dist.ReduceOp.SUM
    AVERAGE = _dist.ReduceOp.AVG
    MIN = _dist.ReduceOp.MIN
    MAX = _dist.ReduceOp.MAX
    PRODUCT = _dist.ReduceOp.PRODUCT


def init_process_group(*args: object, **kwargs: object) -> None:
    """Join the job's process group from the launcher's environment; a second call is a no-op."""
    if _dist.is_initialized():
        return
    kwargs.setdefault("backend", "smddp")
    _dist.init_process_group(*args, **kwargs)


def get_local_rank() -> int:
    for name in ("SMDATAPARALLEL_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def get_local_size() -> int:
    for name in ("SMDATAPARALLEL_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        if name in os.environ:
            return int(os.environ[name])
    return 1
