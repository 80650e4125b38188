"""Shared-memory transport between the ranks of one host.

One file per group and host under /dev/shm, created 0600 by the host's first rank, sized with
posix_fallocate (ENOSPC at setup, never SIGBUS later), mapped with MAP_POPULATE and unlinked as soon as
every local rank has mapped it, so nothing is left behind even when a rank is killed.

Layout: a control area with one 64-byte line per local rank (barrier generation) and an abort record,
then for each local rank two data halves of ``slot_bytes``. Consecutive phases alternate halves, so one
barrier per phase is enough: a half is rewritten only after every rank has passed the barrier of the
phase in between, which it reaches after its reads of that half are done.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from smddp_sdk.collectives import futex
from smddp_sdk.collectives.errors import CollectiveError
from smddp_sdk.collectives.memory import copy_bytes

SHM_DIR_ENV = "SMDDP_SHM_DIR"
SLOT_BYTES_ENV = "SMDDP_SHM_SLOT_BYTES"
SPIN_US_ENV = "SMDDP_SPIN_US"  # fixed poll time before sleeping, overriding the load-based choice
DEFAULT_SHM_DIR = "/dev/shm"
DEFAULT_SLOT_BYTES = 16 << 20  # per rank and half; fewer phases for large messages, still L3-sized
MIN_SLOT_BYTES = 64 << 10
LINE = 64
ABORT_MESSAGE_BYTES = 1024
PAGE = 4096
_SPIN_S_UNDERSUBSCRIBED = 30e-6  # poll this long before sleeping when every rank has a core of its own
_SPIN_S_OVERSUBSCRIBED = 2e-6  # ... and this long when ranks outnumber cores (polling steals the peer's slice)
_CHECK_EVERY_S = 0.05  # how often a waiting rank checks the deadline, the abort record and peer liveness


class ShmUnavailable(Exception):
    """Shared memory cannot hold this group's arena; the caller falls back to TCP."""


def shm_dir() -> str:
    return os.environ.get(SHM_DIR_ENV, DEFAULT_SHM_DIR)


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def control_bytes(n_local: int) -> int:
    return _align(LINE * n_local + LINE + ABORT_MESSAGE_BYTES, PAGE)


def arena_bytes(n_local: int, slot_bytes: int) -> int:
    return control_bytes(n_local) + 2 * n_local * slot_bytes


def choose_slot_bytes(n_local: int, directory: str) -> int:
    """Slot size that fits in half of the free space of the shm file system, or ShmUnavailable."""
    wanted = int(os.environ.get(SLOT_BYTES_ENV, DEFAULT_SLOT_BYTES))
    try:
        stat = os.statvfs(directory)
    except OSError as exc:
        raise ShmUnavailable(f"cannot use {directory}: {exc.strerror}") from exc
    free = stat.f_bavail * stat.f_frsize
    fits = (free // 2 - control_bytes(n_local)) // (2 * n_local)
    slot = min(wanted, fits) // PAGE * PAGE
    if slot < MIN_SLOT_BYTES:
        need = arena_bytes(n_local, MIN_SLOT_BYTES) * 2
        raise ShmUnavailable(
            f"{directory} has {free >> 20} MiB free, {n_local} local ranks need at least {need >> 20} MiB "
            "(Docker: run with --shm-size=1g or --ipc=host; Kubernetes: mount an emptyDir with medium: Memory)"
        )
    return slot


def create_arena_file(n_local: int, directory: str) -> tuple[str, int]:
    """Create and allocate the arena file; returns (path, slot_bytes). Raises ShmUnavailable."""
    slot = choose_slot_bytes(n_local, directory)
    return allocate_file(arena_bytes(n_local, slot), directory), slot


def allocate_file(nbytes: int, directory: str) -> str:
    """A new 0600 file of nbytes, backed now (ENOSPC here, never SIGBUS later). Raises ShmUnavailable."""
    path = os.path.join(directory, f"smddp-{uuid.uuid4().hex}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise ShmUnavailable(f"cannot create a file in {directory}: {exc.strerror}") from exc
    try:
        os.posix_fallocate(fd, 0, max(nbytes, 1))
    except OSError as exc:
        os.unlink(path)
        if exc.errno in (errno.ENOSPC, errno.ENOMEM):
            raise ShmUnavailable(f"{directory} ran out of space allocating {nbytes >> 20} MiB") from exc
        raise
    finally:
        os.close(fd)
    return path


def map_file(path: str, nbytes: int) -> torch.Tensor:
    """The file's bytes as a uint8 tensor over a shared, pre-faulted mapping (kept alive by the tensor)."""
    fd = os.open(path, os.O_RDWR)
    try:
        mapping = mmap.mmap(fd, max(nbytes, 1), flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    finally:
        os.close(fd)
    return torch.frombuffer(mapping, dtype=torch.uint8)[:nbytes]


def _pid_alive(pid: int) -> bool:
    """False when the process is gone or a zombie (killed but not yet reaped by its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return fields[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        return True


@dataclass(frozen=True)
class Peer:
    """A local rank as the shm transport sees it."""

    group_rank: int
    pid: int


class ShmArena:
    """A mapped arena plus the barrier and abort protocol over it."""

    def __init__(self, path: str, n_local: int, slot_bytes: int, local_index: int, peers: Sequence[Peer]) -> None:
        self.n = n_local
        self.index = local_index
        self.slot_bytes = slot_bytes
        self.peers = list(peers)
        fd = os.open(path, os.O_RDWR)
        try:
            size = arena_bytes(n_local, slot_bytes)
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._map = mmap.mmap(fd, size, flags=flags)
        finally:
            os.close(fd)
        self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self._words = memoryview(self._map).cast("I")  # 32-bit: futex words
        self._base_address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self._ctrl = control_bytes(n_local)
        self._cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self._spin_s = 0.0
        self._spin_checked_at = -1.0
        self._refresh_spin_budget(time.monotonic())
        self._generation = 0
        self._phase = 0
        self._prefault_own_slots()

    def _prefault_own_slots(self) -> None:
        # first touch costs ~1 GB/s against ~8 GB/s pre-faulted; each rank writes its own slots once
        for half in (0, 1):
            self.slot(self.index, half).zero_()

    # layout -------------------------------------------------------------------------------------------
    def slot(self, local_index: int, half: int) -> torch.Tensor:
        start = self._ctrl + (2 * local_index + half) * self.slot_bytes
        return self._bytes[start:start + self.slot_bytes]

    def next_half(self) -> int:
        half = self._phase & 1
        self._phase += 1
        return half

    def _counter(self, local_index: int) -> int:
        return self._words[local_index * LINE // 4]

    def _refresh_spin_budget(self, now: float) -> None:
        """Poll a little before sleeping: a peer that arrives within microseconds is caught without a
        wake-up (51 µs against 115 µs for a 4 KB allreduce here), but only briefly when ranks outnumber
        cores, where polling burns the slice the peer needs. SMDDP_SPIN_US overrides."""
        if now - self._spin_checked_at < 1.0:
            return
        self._spin_checked_at = now
        forced = os.environ.get(SPIN_US_ENV)
        if forced:
            self._spin_s = float(forced) * 1e-6
        else:
            self._spin_s = _SPIN_S_UNDERSUBSCRIBED if self.n <= self._cores else _SPIN_S_OVERSUBSCRIBED

    # abort record -----------------------------------------------------------------------------------
    def post_abort(self, message: str) -> None:
        """Tell local peers this rank failed, so they fail now instead of at the timeout."""
        encoded = message.encode("utf-8", "replace")[: ABORT_MESSAGE_BYTES - 1]
        base = self.n * LINE + LINE
        self._map[base:base + len(encoded) + 1] = encoded + b"\0"
        self._words[self.n * LINE // 4] = self.index + 1
        for i in range(self.n):
            futex.wake_all(self._base_address + i * LINE)  # waiters re-check and see the abort

    def abort_message(self) -> str | None:
        who = self._words[self.n * LINE // 4]
        if not who:
            return None
        base = self.n * LINE + LINE
        raw = bytes(self._map[base:base + ABORT_MESSAGE_BYTES]).split(b"\0", 1)[0]
        return f"rank {self.peers[who - 1].group_rank} failed: {raw.decode('utf-8', 'replace')}"

    # synchronisation --------------------------------------------------------------------------------
    def barrier(self, what: str, deadline: float) -> None:
        """All local ranks arrive; raises CollectiveError naming the op and the missing peers."""
        self._generation = (self._generation + 1) & 0xFFFFFFFF
        generation = self._generation
        self._words[self.index * LINE // 4] = generation
        if futex.available():
            futex.wake_all(self._base_address + self.index * LINE)
        pending = [i for i in range(self.n) if i != self.index]
        start = time.monotonic()
        self._refresh_spin_budget(start)
        spin_until = start + self._spin_s
        next_check = time.monotonic() + _CHECK_EVERY_S
        while pending:
            peer = pending[-1]
            seen = self._counter(peer)
            if (seen - generation) & 0xFFFFFFFF < 1 << 31:  # arrived (or already past it), wrap-safe
                pending.pop()
                continue
            now = time.monotonic()
            if now < spin_until:
                continue  # busy poll: sched_yield would hand the core to other jobs for a whole slice
            if futex.available():
                futex.wait(self._base_address + peer * LINE, seen, _CHECK_EVERY_S)
            else:
                time.sleep(50e-6)
            if now >= next_check:
                next_check = now + _CHECK_EVERY_S
                self._check_peers(pending, what, now, deadline)

    def _check_peers(self, pending: list[int], what: str, now: float, deadline: float) -> None:
        aborted = self.abort_message()
        if aborted:
            raise CollectiveError(f"smddp {what} aborted: {aborted}")
        for i in pending:
            peer = self.peers[i]
            if not _pid_alive(peer.pid):
                raise CollectiveError(
                    f"smddp {what} failed: peer rank {peer.group_rank} (pid {peer.pid}, same host) exited "
                    "before completing it"
                )
        if now >= deadline:
            missing = ", ".join(str(self.peers[i].group_rank) for i in pending)
            raise CollectiveError(
                f"smddp {what} timed out: rank(s) {missing} on this host did not arrive within the process-group "
                "timeout (a peer is hung or took a different code path)"
            )

    def close(self) -> None:
        try:
            del self._bytes, self._words
            self._map.close()
        except (BufferError, AttributeError):
            pass  # tensors over the map are still alive; the mapping goes with the process


def copy_in(dst_slot: torch.Tensor, src: torch.Tensor) -> None:
    """Copy a contiguous tensor's bytes to the start of a uint8 slot view."""
    copy_bytes(dst_slot, src)
