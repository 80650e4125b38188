"""Reduction kernels on torch tensors: one place that knows how each ReduceOp combines each dtype.

Sources are combined in the order given, so every rank that combines the same sources in the same order
gets bit-identical results (DDP relies on identical parameters everywhere).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from smddp_sdk.collectives import native
from smddp_sdk.collectives.memory import copy_bytes

RedOpType = dist.ReduceOp.RedOpType
HALF_TYPES = (torch.float16, torch.bfloat16)
FLOAT_TYPES = (torch.float32, torch.float64, *HALF_TYPES)
SUPPORTED_DTYPES = (
    *FLOAT_TYPES,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
)
BITWISE_OPS = (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR)

_InPlace = Callable[[torch.Tensor, torch.Tensor], object]

_IN_PLACE: dict[RedOpType, _InPlace] = {
    RedOpType.SUM: torch.Tensor.add_,
    RedOpType.AVG: torch.Tensor.add_,  # then divided once by the number of sources (combine)
    RedOpType.PRODUCT: torch.Tensor.mul_,
    RedOpType.MIN: lambda acc, x: torch.minimum(acc, x, out=acc),
    RedOpType.MAX: lambda acc, x: torch.maximum(acc, x, out=acc),
    RedOpType.BAND: torch.Tensor.bitwise_and_,
    RedOpType.BOR: torch.Tensor.bitwise_or_,
    RedOpType.BXOR: torch.Tensor.bitwise_xor_,
}
# bool has no add/mul: SUM behaves as logical or, PRODUCT as logical and (what gloo does too)
_BOOL_EQUIVALENT = {RedOpType.SUM: RedOpType.MAX, RedOpType.AVG: RedOpType.MAX, RedOpType.PRODUCT: RedOpType.MIN}


def red_op_type(op: object) -> RedOpType:
    """The hashable RedOpType of a ReduceOp (ReduceOp objects compare with == but hash differently)."""
    if isinstance(op, RedOpType):
        return op
    inner = getattr(op, "op", None)
    if isinstance(inner, RedOpType):
        return inner
    raise TypeError(f"unsupported reduce op {op!r}: use a torch.distributed.ReduceOp")


def check_supported(dtype: torch.dtype, op: RedOpType, what: str) -> None:
    """Raise a clear error for dtype/op pairs this backend cannot reduce."""
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"smddp {what}: dtype {dtype} is not supported; supported dtypes are " + ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES))
    if op not in _IN_PLACE:
        raise ValueError(f"smddp {what}: reduce op {op.name} is not supported (use SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR)")
    if op in BITWISE_OPS and (dtype.is_floating_point):
        raise TypeError(f"smddp {what}: bitwise reduce op {op.name} needs an integer or bool tensor, got {dtype}")


# codes of smddp_native.c's smddp_reduce
NATIVE_DTYPES = {
    torch.float32: 0,
    torch.float64: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.int32: 4,
    torch.int64: 5,
    torch.uint8: 6,
    torch.int8: 7,
    torch.int16: 8,
    torch.bool: 6,
}
NATIVE_OPS = {RedOpType.SUM: 0, RedOpType.PRODUCT: 1, RedOpType.MIN: 2, RedOpType.MAX: 3, RedOpType.AVG: 4}


def native_codes(dtype: torch.dtype, op: RedOpType) -> tuple[int, int] | None:
    """(dtype, op) codes for the native kernels, or None where torch does the reduction (AVG of integers:
    floor division)."""
    if dtype == torch.bool:
        op = _BOOL_EQUIVALENT.get(op, op)
    if op == RedOpType.AVG and not dtype.is_floating_point:
        return None
    dtype_code, op_code = NATIVE_DTYPES.get(dtype), NATIVE_OPS.get(op)
    return None if dtype_code is None or op_code is None else (dtype_code, op_code)


def _native_combine(dst: torch.Tensor, sources: Sequence[torch.Tensor], op: RedOpType) -> bool:
    lib = native.library()
    if lib is None or not dst.is_contiguous():
        return False
    codes = native_codes(dst.dtype, op)
    if codes is None or any(s.dtype != dst.dtype or not s.is_contiguous() or s.numel() != dst.numel() for s in sources):
        return False
    pointers = (ctypes.c_void_p * len(sources))(*(s.data_ptr() for s in sources))
    return lib.smddp_reduce(codes[0], codes[1], dst.data_ptr(), pointers, len(sources), dst.numel()) == 0


def combine(dst: torch.Tensor, sources: Sequence[torch.Tensor], op: RedOpType) -> None:
    """dst = sources[0] (op) sources[1] (op) ...; dst may alias sources[0] but no other source. AVG is the
    sum divided by len(sources).

    Native kernels where they cover the dtype and op (one pass over all sources, fp16/bf16 summed in fp32
    and rounded once, AVG divided in the same pass), torch otherwise; both combine in the order given."""
    if dst.numel() and _native_combine(dst, sources, op):
        return
    if dst.dtype == torch.bool:
        op = _BOOL_EQUIVALENT.get(op, op)
    apply = _IN_PLACE[op]
    if dst.dtype in HALF_TYPES and op in (RedOpType.SUM, RedOpType.AVG, RedOpType.PRODUCT):
        acc = sources[0].float()  # accumulate in fp32, round once
        for src in sources[1:]:
            apply(acc, src)
        finish_average(acc, op, len(sources))
        dst.copy_(acc)
        return
    first = sources[0]
    if dst.data_ptr() != first.data_ptr():
        if dst.is_contiguous() and first.is_contiguous() and dst.dtype == first.dtype:
            copy_bytes(dst, first)  # glibc memcpy: about twice torch copy_'s speed here
        else:
            dst.copy_(first)
    for src in sources[1:]:
        apply(dst, src)
    finish_average(dst, op, len(sources))


def reduce_into_copies(copies: Sequence[torch.Tensor], index: int, own: torch.Tensor, op: RedOpType, block: int) -> None:
    """copies[index] = own (op) the other copies (rank order), then written into every other copy; all
    flat and of one length. Block by block, so the combine and the copies out reread the block from cache."""
    lib = native.library()
    codes = native_codes(own.dtype, op)
    if lib is not None and codes is not None and own.is_contiguous() and all(c.is_contiguous() for c in copies):
        pointers = (ctypes.c_void_p * len(copies))(*(c.data_ptr() for c in copies))
        if lib.smddp_reduce_shard(codes[0], codes[1], pointers, len(copies), index, own.data_ptr(), own.numel(), own.element_size(), block) == 0:
            return
    for lo in range(0, own.numel(), block):
        hi = min(lo + block, own.numel())
        result = copies[index][lo:hi]
        combine(result, [own[lo:hi]] + [c[lo:hi] for i, c in enumerate(copies) if i != index], op)
        for i, copy in enumerate(copies):
            if i != index:
                copy_bytes(copy[lo:hi], result)


def finish_average(tensor: torch.Tensor, op: RedOpType, group_size: int) -> None:
    """AVG is a SUM divided once by the group size; integers use floor division."""
    if op != RedOpType.AVG or group_size == 1 or tensor.dtype == torch.bool:
        return
    if tensor.is_floating_point():
        tensor.div_(group_size)
    else:
        tensor.div_(group_size, rounding_mode="floor")
