"""The call record every collective carries, so that ranks can check they are doing the same thing.

A record is six 32-bit words (sequence number, op, dtype, element count low/high, root) written next to
a rank's barrier word in shared memory; a peer compares it when it sees the rank arrive. A mismatch
(another collective, dtype, size, reduce op or root) raises on every rank of the host instead of
returning garbage. Sizes that may legitimately differ between ranks (all_to_all splits) carry count 0.
The tables and ``describe`` are specs/call_record.py's, so that readers without torch (``stacks``) decode it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from smddp_sdk.specs.call_record import DTYPE_NAMES, NO_ROOT, OPS, REDUCE_OPS, describe

__all__ = ["Call", "DTYPES", "describe"]

DTYPES = tuple(getattr(torch, name) if name else None for name in DTYPE_NAMES)  # a record's dtype code: the index
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
