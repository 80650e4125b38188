"""DDP communication hooks for the smddp backend: gradient buckets reduced on the communication thread.

DDP fuses gradients into buckets of ``bucket_cap_mb`` and calls the hook as soon as a bucket is ready,
while backward goes on computing the next ones. Every smddp collective issued with ``async_op=True`` runs
on the group's communication thread, so the hook returns at once and the reduction overlaps backward;
the reducer waits on the returned future only at the end of backward.

    model = DistributedDataParallel(net, bucket_cap_mb=25)
    smddp_sdk.collectives.ddp.register(model)                      # fp32 buckets, averaged in one pass
    smddp_sdk.collectives.ddp.register(model, compress="bf16")     # bf16 on the wire, fp32 accumulation

Low-precision buckets (fp16/bf16 models, or ``compress``) are summed in fp32 and rounded once, so the
result equals reducing the fp32 values and rounding at the end.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as live objects.
import torch
import torch.distributed as dist

COMPRESS_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def allreduce_hook(group: dist.ProcessGroup | None, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket in place over the group (AVG: one division after the fp32-accumulated sum)."""
    buffer = bucket.buffer()
    work = dist.all_reduce(buffer, op=dist.ReduceOp.AVG, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def _compressed_hook(dtype: torch.dtype):
    def hook(group: dist.ProcessGroup | None, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        wire = buffer.to(dtype)
        work = dist.all_reduce(wire, op=dist.ReduceOp.AVG, group=group, async_op=True)

        def decompress(fut: torch.futures.Future) -> torch.Tensor:
            buffer.copy_(fut.value()[0])
            return buffer

        return work.get_future().then(decompress)

    hook.__name__ = f"{dtype}_compress_hook".replace("torch.", "")
    return hook


def register(model: torch.nn.parallel.DistributedDataParallel, group: dist.ProcessGroup | None = None,
             compress: str | None = None) -> None:
    """Install the smddp hook on a DDP model; ``compress`` is None, "fp16" or "bf16"."""
    if compress is None:
        model.register_comm_hook(group, allreduce_hook)
        return
    if compress not in COMPRESS_DTYPES:
        raise ValueError(f"compress={compress!r} is not supported: use None, " + ", ".join(repr(k) for k in COMPRESS_DTYPES))
    model.register_comm_hook(group, _compressed_hook(COMPRESS_DTYPES[compress]))
