"""The pre-1.4 `smdistributed.dataparallel.torch.distributed` API on top of torch.distributed + smddp.

Old scripts call ``init_process_group()`` with no arguments and use ``get_local_rank()``; everything is
forwarded to torch.distributed with the smddp backend. The module warns once that this API is old.
"""

from __future__ import annotations

import os
import warnings

import torch.distributed as _dist

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


group = _dist.group


def is_available() -> bool:
    return _dist.is_available()


def init_process_group(*args: object, **kwargs: object) -> None:
    """Join the job's process group from the launcher's environment; a second call is a no-op."""
    if _dist.is_initialized():
        return
    kwargs.setdefault("backend", "smddp")
    _dist.init_process_group(*args, **kwargs)


def is_initialized() -> bool:
    return _dist.is_initialized()


def get_world_size(group: object = None) -> int:
    return _dist.get_world_size(group)


def get_rank(group: object = None) -> int:
    return _dist.get_rank(group)


def get_local_rank() -> int:
    return _first_set(("SMDATAPARALLEL_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"), 0)


def get_local_size() -> int:
    return _first_set(("SMDATAPARALLEL_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"), 1)


def _first_set(names: tuple[str, ...], default: int) -> int:
    return next((int(os.environ[name]) for name in names if name in os.environ), default)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    return _dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def broadcast(tensor, src=0, group=None, async_op=False):
    return _dist.broadcast(tensor, src=src, group=group, async_op=async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    return _dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):  # noqa: A002
    return _dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)


def barrier(group=None, async_op=False):
    return _dist.barrier(group=group, async_op=async_op)
