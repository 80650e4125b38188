"""The call record every collective carries, so that ranks can check they are doing the same thing.

A record is six 32-bit words (sequence number, op, dtype, element count low/high, root) written next to
a rank's barrier word in shared memory; a peer compares it when it sees the rank arrive. A mismatch
(another collective, dtype, size, reduce op or root) raises on every rank of the host instead of
returning garbage. Sizes that may legitimately differ between ranks (all_to_all splits) carry count 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NO_ROOT = 0xFFFFFFFF
OPS = (
    "barrier", "all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "scatter", "all_gather",
    "all_gather_coalesced", "all_gather_into_tensor", "all_gather_into_tensor_coalesced", "gather",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "all_to_all",
    "all_to_all_single", "shared_buffers", "destroy_process_group",
)
REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM", "UNUSED")
DTYPES = (
    None, torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.bool,
)
_DTYPE_CODE = {d: i for i, d in enumerate(DTYPES)}
_OP_CODE = {name: i for i, name in enumerate(OPS)}


@dataclass(frozen=True)
class Call:
    """One collective as the ranks must agree on it; seq is filled in when it executes."""

    op: str
    dtype: torch.dtype | None = None
    count: int = 0
    root: int = -1
    reduce_op: str = ""
    seq: int = 0

    def words(self, seq: int) -> tuple[int, int, int, int, int, int]:
        op_code = _OP_CODE.get(self.op, 31) << 4 | (REDUCE_OPS.index(self.reduce_op) + 1 if self.reduce_op else 0)
        return (seq & 0xFFFFFFFF, op_code, _DTYPE_CODE.get(self.dtype, 0xFF), self.count & 0xFFFFFFFF,
                self.count >> 32 & 0xFFFFFFFF, NO_ROOT if self.root < 0 else self.root)


def describe(words: tuple[int, ...] | list[int]) -> str:
    """A record as a person reads it: 'all_reduce #12 (SUM, float32, 1024 elements)'."""
    seq, op_code, dtype_code, low, high, root = (int(w) for w in words)
    name_index, reduce_index = op_code >> 4, op_code & 15
    name = OPS[name_index] if name_index < len(OPS) else "another collective"
    details = []
    if reduce_index:
        details.append(REDUCE_OPS[reduce_index - 1])
    if 0 < dtype_code < len(DTYPES):
        details.append(str(DTYPES[dtype_code]).removeprefix("torch."))
    count = high << 32 | low
    if count:
        details.append(f"{count} elements")
    if root != NO_ROOT:
        details.append(f"root {root}")
    return f"{name} #{seq}" + (f" ({', '.join(details)})" if details else "")
