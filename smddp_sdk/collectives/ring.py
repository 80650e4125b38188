"""A polled shared-memory ring: one byte stream from one rank to another of the same host (point-to-point).

The sender creates the ring as the arena is created (shm.create_segment: O_EXCL, O_NOFOLLOW, 0600,
backed at once) under a name only the job's ranks can derive, the receiver opens it only through
shm.open_segment (this user's regular 0600 file of the expected size, one name, no link followed), and
the sender, its creator, removes the name once the receiver has answered: nothing is left in /dev/shm.

Layout (smddp_native.c's "point-to-point rings"): RING_HEADER bytes of counters (head: bytes written,
tail: bytes consumed, 32-bit words mod 2^32, each with a count of the ends asleep on it), then
``capacity`` bytes of data, a power of two. One writer and one reader: each advances only its own
counter, so neither takes a lock; a waiting end polls for the spin budget, then sleeps on the other's
counter (a futex), which the other wakes only when someone sleeps there; a reader thread that should
not be woken by each message sleeps there uncounted (``sleep``), and the writer ``nudge``s it when it
waits for the reader. The native kernels do this without the GIL; without them (SMDDP_NATIVE=0) the
same layout is driven from Python, so a native rank and a Python rank share rings (and smddp_core.cpp's
fast path writes and reads it too).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

import torch

from smddp_sdk.collectives import futex, native
from smddp_sdk.collectives.errors import CollectiveError
from smddp_sdk.collectives.memory import memview
from smddp_sdk.collectives.shm import SPIN_S_LOADED, LoadSamples, create_segment, map_fd, open_segment, spin_budgets
from smddp_sdk.specs.processes import runnable_tasks

RING_BYTES_ENV = "SMDDP_P2P_RING_BYTES"  # data bytes per ring (a power of two); 0: local messages use the socket
DEFAULT_RING_BYTES = 1 << 20
MIN_RING_BYTES, MAX_RING_BYTES = 4096, 64 << 20
RING_HEADER = 256
_HEAD, _READERS, _TAIL, _WRITERS = 16, 17, 32, 33  # 32-bit word indexes (smddp_native.c's RING_*)
_MASK = 0xFFFFFFFF


def ring_bytes() -> int:
    """The capacity SMDDP_P2P_RING_BYTES asks for (0: no rings), checked."""
    text = os.environ.get(RING_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_RING_BYTES
    value = int(text) if text.isdigit() else -1
    if value != 0 and not valid_capacity(value):
        raise ValueError(f"{RING_BYTES_ENV}={text!r}: give 0 (no rings) or a power of two from {MIN_RING_BYTES} to {MAX_RING_BYTES}")
    return value


def valid_capacity(capacity: int) -> bool:
    return MIN_RING_BYTES <= capacity <= MAX_RING_BYTES and capacity & (capacity - 1) == 0


class RingCorrupt(CollectiveError):
    """The ring's counters are further apart than its capacity: something wrote into it."""


class Ring:
    """One end of a mapped ring (the writer's or the reader's: each uses its own half of the calls)."""

    def __init__(self, fd: int, capacity: int) -> None:
        self.capacity = capacity
        self._map = map_fd(fd, RING_HEADER + capacity)
        self._words = memoryview(self._map).cast("I")
        self._data = memoryview(self._map)[RING_HEADER:]
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self._native = native.library()
        self._sleepers = threading.Lock()

    @classmethod
    def create(cls, directory: str, name: str, capacity: int) -> tuple[Ring, str, int]:
        """A new ring under name (shm.create_segment's rules; ShmUnavailable if it cannot be made):
        (ring, path, fd); the caller unlinks path (shm.unlink_own) once the reader has it open."""
        path, fd = create_segment(directory, name, RING_HEADER + capacity)
        return cls(fd, capacity), path, fd

    @classmethod
    def open(cls, path: str, capacity: int) -> Ring:
        """The ring a local peer created, checked by shm.open_segment (CollectiveError if refused)."""
        fd = open_segment(path, RING_HEADER + capacity)
        try:
            return cls(fd, capacity)
        finally:
            os.close(fd)

    # the native kernels, or the same steps in Python ----------------------------------------------------
    def put(self, data: torch.Tensor, start: int) -> int:
        """Write what fits of a contiguous uint8 tensor's bytes from start on; returns how many."""
        count = data.numel() - start
        if self._native is not None:
            return self._checked(self._native.smddp_ring_put(self.address, self.capacity, data.data_ptr() + start, count))
        head, tail = self._words[_HEAD], self._words[_TAIL]
        count = min(count, self.capacity - self._used(head, tail))
        if count > 0:
            source = memview(data)[start : start + count]
            at = head & (self.capacity - 1)
            first = min(count, self.capacity - at)
            self._data[at : at + first] = source[:first]
            self._data[: count - first] = source[first:]
            self._publish(_HEAD, _READERS, head + count)
        return max(count, 0)

    def take(self, data: torch.Tensor, start: int) -> int:
        """Read what is there, up to the rest of a contiguous uint8 tensor from start on; returns how many."""
        count = data.numel() - start
        if self._native is not None:
            return self._checked(self._native.smddp_ring_take(self.address, self.capacity, data.data_ptr() + start, count))
        head, tail = self._words[_HEAD], self._words[_TAIL]
        count = min(count, self._used(head, tail))
        if count > 0:
            target = memview(data)[start : start + count]
            at = tail & (self.capacity - 1)
            first = min(count, self.capacity - at)
            target[:first] = self._data[at : at + first]
            target[first:] = self._data[: count - first]
            self._publish(_TAIL, _WRITERS, tail + count)
        return max(count, 0)

    def wait(self, space: bool, want: int, spin_s: float, slice_s: float) -> int:
        """Until want bytes are there to read (space: free to write), polling spin_s, then asleep; how
        many there are, 0 when slice_s passed first."""
        if self._native is not None:
            return self._checked(self._native.smddp_ring_wait(self.address, self.capacity, int(space), want, int(spin_s * 1e9), int(slice_s * 1e9)))
        counter, sleepers = (_TAIL, _WRITERS) if space else (_HEAD, _READERS)
        want = min(want, self.capacity)
        start = time.monotonic()
        while True:
            seen = self._words[counter]
            have = self._have(space)
            if have >= max(want, 1):
                return have
            elapsed = time.monotonic() - start
            if elapsed >= slice_s:
                return 0
            if elapsed < spin_s:
                continue
            if not futex.available():
                time.sleep(50e-6)
                continue
            self._count_sleeper(sleepers, 1)
            if self._have(space) < max(want, 1) and self._words[counter] == seen:
                futex.wait(self.address + counter * 4, seen, slice_s - elapsed)
            self._count_sleeper(sleepers, -1)

    def sleep(self, timeout_s: float) -> None:
        """Asleep on the head without counting as a sleeper, so the writer's messages do not wake this
        thread (a receive that polls the ring takes them): only a nudge, or the timeout, does."""
        if futex.available():
            futex.wait(self.address + _HEAD * 4, self._words[_HEAD], timeout_s)
        else:
            time.sleep(timeout_s)

    def nudge(self) -> None:
        """Wake every thread asleep on the head, counted or not (the writer waits for the reader)."""
        if futex.available():
            futex.wake_all(self.address + _HEAD * 4)

    def _count_sleeper(self, word: int, step: int) -> None:
        """Only this process sleeps on a ring end's word (the reader's threads, or the writer's), so a
        lock here keeps its count exact, as the kernels' atomic add does."""
        with self._sleepers:
            self._words[word] = (self._words[word] + step) & _MASK

    def available(self) -> int:
        """Bytes there to read now."""
        return self._have(False)

    def free(self) -> int:
        """Bytes free to write now."""
        return self._have(True)

    def _have(self, space: bool) -> int:
        used = self._used(self._words[_HEAD], self._words[_TAIL])
        return self.capacity - used if space else used

    def _used(self, head: int, tail: int) -> int:
        used = (head - tail) & _MASK
        if used > self.capacity:
            raise RingCorrupt(f"smddp point-to-point ring: its counters are {used} bytes apart in a ring of {self.capacity}: "
                              "something other than the two ranks wrote into it")
        return used

    def _publish(self, counter: int, sleepers: int, value: int) -> None:
        self._words[counter] = value & _MASK
        if self._words[sleepers] and futex.available():
            futex.wake_all(self.address + counter * 4)

    def _checked(self, result: int) -> int:
        if result < 0:
            self._used(self._words[_HEAD], self._words[_TAIL])  # raises RingCorrupt with the figures
            raise RingCorrupt("smddp point-to-point ring: its counters make no sense (something wrote into it)")
        return result


class SpinBudget:
    """How long a rank polls a ring before sleeping: shm.py's rule (spin_budgets, judged by LoadSamples
    every SAMPLE_EVERY_S), so that polling never steals the slice a peer needs on a loaded machine. A
    blocking receive (the caller's thread waits in it) polls the blocking budget, as the core's blocking
    calls do: a thread that sleeps waits for its wake-up (hundreds of us here, an 8-byte ping-pong 484 us),
    and the reply to a message often comes within a millisecond."""

    def __init__(self, n_local: int) -> None:
        self._n = n_local
        self._cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self._load = LoadSamples()
        self._checked_at = -1.0
        self._spin_s = self._blocking_s = 0.0

    def seconds(self, blocking: bool = False) -> float:
        now = time.monotonic()
        if now - self._checked_at >= LoadSamples.SAMPLE_EVERY_S:
            self._checked_at = now
            self._load.add(runnable_tasks() > self._cores)
            calm, loaded, blocking_s = spin_budgets(self._n, self._cores)
            crowded = self._n > self._cores  # ranks outnumber cores: the peer needs this core, poll briefly
            self._spin_s = SPIN_S_LOADED if crowded else loaded if self._load.loaded else calm
            self._blocking_s = SPIN_S_LOADED if crowded else blocking_s
        return self._blocking_s if blocking else self._spin_s
