"""A collective's call record as a person reads it, and the rank's call file that ``smddp-launch stacks``
reads it from (stdlib only: the schedulers read it where torch may be missing).

A record is six 32-bit words (sequence number, op, dtype, element count low/high, root): collectives/calls.py
writes them for every call, the native core too. The call file (``rank_call_file_of`` the rank's stacks file)
holds the records of the rank's first process group where its transports keep them, mapped shared
(collectives/call_file.py): the arena's record at ``RECORD_AT``, the mesh's call header (magic, record,
step) at ``HEADER_AT``. Every call writes its record there as it begins, so the file names the call the rank
is in now, not one it waited in before.
"""

from __future__ import annotations

import struct
from pathlib import Path

NO_ROOT = 0xFFFFFFFF
OPS = (
    "barrier", "all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "scatter", "all_gather",
    "all_gather_coalesced", "all_gather_into_tensor", "all_gather_into_tensor_coalesced", "gather",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "all_to_all",
    "all_to_all_single", "shared_buffers", "destroy_process_group",
)
REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM", "UNUSED")
DTYPE_NAMES = (None, "float32", "float64", "float16", "bfloat16", "uint8", "int8", "int16", "int32", "int64", "bool")

RECORD_WORDS = 6
RECORD_AT = 0  # the call file's words: the host arena's record (a rank with host peers)
HEADER_AT = 8  # the mesh's call header: magic, the record, the exchange's step (a host's leader)
CALL_FILE_WORDS = 16


def describe(words: tuple[int, ...] | list[int]) -> str:
    """A record as a person reads it: 'all_reduce #12 (SUM, float32, 1024 elements)'."""
    seq, op_code, dtype_code, low, high, root = (int(w) for w in words)
    name_index, reduce_index = op_code >> 4, op_code & 15
    name = OPS[name_index] if name_index < len(OPS) else "another collective"
    details = []
    if reduce_index:
        details.append(REDUCE_OPS[reduce_index - 1])
    if 0 < dtype_code < len(DTYPE_NAMES):
        details.append(str(DTYPE_NAMES[dtype_code]))
    count = high << 32 | low
    if count:
        details.append(f"{count} elements")
    if root != NO_ROOT:
        details.append(f"root {root}")
    return f"{name} #{seq}" + (f" ({', '.join(details)})" if details else "")


def read_call_file(path: Path) -> str:
    """The call the rank is in, or last began ('all_reduce #41 (SUM, ...)'); "" when it began none or the
    file cannot be read. The arena's record where the rank has host peers, else the mesh's header."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    if len(data) != CALL_FILE_WORDS * 4:
        return ""
    words = struct.unpack(f"={CALL_FILE_WORDS}I", data)
    for start in (RECORD_AT, HEADER_AT + 1):
        record = words[start : start + RECORD_WORDS]
        if record[0]:  # a sequence number: calls count from 1
            return describe(record)
    return ""
