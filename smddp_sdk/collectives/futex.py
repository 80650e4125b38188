"""Futex wait/wake on 32-bit words in a shared mapping, through libc's syscall() (ctypes drops the GIL).

Waiting ranks sleep in the kernel instead of spinning, which matters when ranks outnumber cores: a
spinning rank burns the time slice its peer needs to reach the barrier. Linux only; `available()` says
whether it works here, and callers fall back to sleeping polls where it does not.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1  # shared (non-private) futexes: the word lives in a MAP_SHARED file


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load():
    if _SYS_FUTEX is None or not os.path.exists("/proc/self"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    return syscall


_syscall = _load()


def available() -> bool:
    return _syscall is not None


def wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep while the word at address equals expected, at most timeout_s (spurious wake-ups allowed)."""
    seconds = int(timeout_s)
    spec = _Timespec(seconds, int((timeout_s - seconds) * 1e9))
    _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAIT, ctypes.c_uint32(expected & 0xFFFFFFFF),
             ctypes.byref(spec), None, 0)


def wake_all(address: int) -> None:
    _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)
