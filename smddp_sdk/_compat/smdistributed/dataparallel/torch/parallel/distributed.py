"""The old API's DistributedDataParallel: torch's DDP with the old constructor's defaults."""

from __future__ import annotations

import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as _TorchDDP

import smddp_sdk.collectives  # noqa: F401 - registers "smddp"

DEFAULT_BUCKET_CAP_MB = 25


class DistributedDataParallel(_TorchDDP):
    """Same arguments as AWS's old class; `no_sync()` and everything else come from torch's DDP."""

    def __init__(
        self,
        module: nn.Module,
        device_ids: list[int] | None = None,
        output_device: int | None = None,
        broadcast_buffers: bool | None = None,
        process_group: object = None,
        bucket_cap_mb: float | None = None,
        **kwargs: object,
    ) -> None:
        if broadcast_buffers is not None:  # only when asked: newer torch warns on every rank when it is passed
            kwargs["broadcast_buffers"] = broadcast_buffers
        super().__init__(
            module, device_ids=device_ids, output_device=output_device, process_group=process_group, bucket_cap_mb=DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb, **kwargs
        )
