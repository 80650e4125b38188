"""The rank's current call where ``smddp-launch stacks`` reads it (specs/call_record.py has the layout).

The call records of the rank's first process group, its arena's record and its mesh's call header, live
in a shared mapping of the rank's call file instead of private memory: every call, Python's or the native
core's, writes its record there as it begins, at no cost beyond the store it makes anyway. The file is
never one call old, as one written when a call turned slow was. Later groups (``new_group``) keep private
records while the first is alive; a group that closes clears its words and frees them for the next.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import stat
from contextlib import suppress
from pathlib import Path

from smddp_sdk.specs.call_record import CALL_FILE_WORDS
from smddp_sdk.specs.contract import STACKS_FILE_ENV, rank_call_file_of

Words = ctypes.Array[ctypes.c_uint32]

_mapping: mmap.mmap | None = None
_claimed: dict[int, Words] = {}  # word offset in the file -> the array a transport holds there


def call_words(offset: int, count: int) -> Words:
    """``count`` zeroed 32-bit words for a transport's call record: at ``offset`` in the rank's call file
    when the rank has one and no live group holds that part, else private memory."""
    mapping = _mapped()
    if mapping is None or offset in _claimed:
        return (ctypes.c_uint32 * count)()
    words = (ctypes.c_uint32 * count).from_buffer(mapping, offset * 4)
    ctypes.memset(words, 0, ctypes.sizeof(words))
    _claimed[offset] = words
    return words


def release(words: Words) -> None:
    """A closing group's words: cleared (the rank is in none of its calls any more) and free again."""
    for offset, held in list(_claimed.items()):
        if held is words:
            ctypes.memset(words, 0, ctypes.sizeof(words))
            del _claimed[offset]


def _mapped() -> mmap.mmap | None:
    """The call file beside the rank's stacks file, mapped once per process; None without one."""
    global _mapping
    stacks_file = os.environ.get(STACKS_FILE_ENV)
    if _mapping is None and stacks_file:
        with suppress(OSError):
            _mapping = _map(rank_call_file_of(Path(stacks_file)))
    return _mapping


def _map(path: Path) -> mmap.mmap | None:
    # Not through a link and not a FIFO, as the stacks file. Sized, never emptied: a rank of an earlier attempt
    # that still has it mapped must not fault; the words a group claims are zeroed.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        os.ftruncate(fd, CALL_FILE_WORDS * 4)
        return mmap.mmap(fd, CALL_FILE_WORDS * 4, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
