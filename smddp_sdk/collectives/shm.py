"""Shared-memory transport between the ranks of one host.

One file per group and host under /dev/shm, created by the host's first rank exclusively (O_EXCL,
O_NOFOLLOW, mode 0600) under a name derived from the job's secret, sized with posix_fallocate (ENOSPC at
setup, never SIGBUS later), mapped with MAP_POPULATE and unlinked as soon as every local rank has mapped
it, so nothing is left behind even when a rank is killed. Other local users can list /dev/shm and write
names there, so a peer maps only what open_segment accepts (this user's regular 0600 file of the
expected size, reached without a link) and a name that is taken is never opened.

Layout: a control area with one 64-byte line per local rank (barrier generation, call records, the
rank's single-copy verdict and pid) and an abort record, then for each local rank two data halves of
``slot_bytes``. Consecutive phases alternate halves, so one barrier per phase is enough: a half is
rewritten only after every rank has passed the barrier of the phase in between, which it reaches after
its reads of that half are done.

Large all_gathers and broadcasts read the peers' tensors straight from their memory instead
(``single_copy_read``: process_vm_readv, one copy instead of two through a slot), unless the kernel
refuses it (ptrace_scope, a container's seccomp profile) or SMDDP_SINGLE_COPY=0.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import stat
import time
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from smddp_sdk.collectives import call_file, futex, native
from smddp_sdk.collectives.calls import Call, describe
from smddp_sdk.collectives.errors import CollectiveError, PeerRank
from smddp_sdk.collectives.hangs import HangWatch
from smddp_sdk.collectives.memory import allow_peer_reads, copy_bytes, read_process
from smddp_sdk.specs.call_record import RECORD_AT, RECORD_WORDS
from smddp_sdk.specs.processes import pid_alive, runnable_tasks

SHM_DIR_ENV = "SMDDP_SHM_DIR"
SLOT_BYTES_ENV = "SMDDP_SHM_SLOT_BYTES"
SPIN_US_ENV = "SMDDP_SPIN_US"  # fixed poll time before sleeping, overriding the load-based choice
SINGLE_COPY_ENV = "SMDDP_SINGLE_COPY"  # "0": large all_gathers and broadcasts copy through the slots too
DEFAULT_SHM_DIR = "/dev/shm"
DEFAULT_SLOT_BYTES = 16 << 20  # per rank and half in a group across hosts: fewer phases per inter-host step
# ... and in a group on one host, where a phase costs a few microseconds: consecutive phases pipeline (a
# rank fills chunk k+1 while its peers read chunk k) and stay in cache (16 MB all_reduce 12.3 -> 6.4 ms,
# broadcast 6.9 -> 2.6 ms with the native core, 2 ranks here)
ONE_HOST_SLOT_BYTES = 1 << 20
MIN_SLOT_BYTES = 64 << 10
LINE = 64
ABORT_MESSAGE_BYTES = 1024
PAGE = 4096
_SPIN_S_UNDERSUBSCRIBED = 30e-6  # poll this long before sleeping when every rank has a core of its own
SPIN_S_LOADED = 2e-6  # ... and this long when the machine is loaded (polling steals the peer's slice)
_SPIN_S_BLOCKING = 1e-3  # ... and this long in the core's blocking calls, whatever the load (spin_budgets)
_YIELD_S_CROWDED = 300e-6  # ranks outnumber cores: poll this long with sched_yield, loaded or not
CHECK_EVERY_S = 0.05  # how often a waiting rank checks the deadline, the abort record and peer liveness
# control line words (32-bit): generation, sleeping waiters, a call record per generation parity, then
# the errno of the rank's last single-copy read (0: it read everything) and its pid
_WAITERS_WORD = 1
_SEQ, _GENERATION, _PHASE, _SINGLE_COPY_OFF = 0, 1, 2, 3  # ShmArena.counters
_RECORD_WORD = 2
_VERDICT_WORD = 14
_PID_WORD = 15


_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC


class LoadSamples:
    """Whether the machine is loaded, from the last WINDOW samples of "more tasks runnable than cores":
    loaded while a majority of them say so. /proc/loadavg's runnable count is an instant: with every core
    taken by a rank, any passing task (a shell, a kernel thread, the benchmark's parent) tips one sample
    over, and a rule that trusted one sample a second left a quiet machine's ranks sleeping after 2 µs of
    polling for that whole second (4 KB calls of ~100 µs instead of ~10). A sustained load still turns
    the budget within WINDOW // 2 + 1 samples (about half a second). native/core/engine.cpp's spin() keeps the
    same rule."""

    WINDOW = 8
    SAMPLE_EVERY_S = 0.125

    def __init__(self) -> None:
        self._bits = 0  # the newest sample in bit 0

    def add(self, over: bool) -> None:
        self._bits = ((self._bits << 1) | int(over)) & ((1 << self.WINDOW) - 1)

    @property
    def loaded(self) -> bool:
        return self._bits.bit_count() > self.WINDOW // 2


def spin_budgets(n_local: int, cores: int) -> tuple[float, float, float]:
    """ShmArena.spin_budgets' rule for n_local ranks on this many cores (point-to-point's rings share it)."""
    forced = os.environ.get(SPIN_US_ENV)
    if forced:
        return (float(forced) * 1e-6,) * 3
    if n_local > cores:
        return (_YIELD_S_CROWDED,) * 3
    return _SPIN_S_UNDERSUBSCRIBED, SPIN_S_LOADED, _SPIN_S_BLOCKING


class ShmUnavailable(Exception):
    """Shared memory cannot hold this group's arena; the caller falls back to TCP."""


def shm_dir() -> str:
    return os.environ.get(SHM_DIR_ENV, DEFAULT_SHM_DIR)


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def control_bytes(n_local: int) -> int:
    """The ranks' control lines, the abort line and message, then a word per rank: the CPU it last
    waited on (the native wait's, smddp_native.c's cpu_word)."""
    return _align(LINE * n_local + LINE + ABORT_MESSAGE_BYTES + 4 * n_local, PAGE)


def arena_bytes(n_local: int, slot_bytes: int) -> int:
    return control_bytes(n_local) + 2 * n_local * slot_bytes


def choose_slot_bytes(n_local: int, directory: str, default: int = DEFAULT_SLOT_BYTES) -> int:
    """Slot size (SMDDP_SHM_SLOT_BYTES, else default) that fits in half of the free space of the shm file
    system, or ShmUnavailable."""
    wanted = int(os.environ.get(SLOT_BYTES_ENV, default))
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


def create_arena(directory: str, name: str, n_local: int, default_slot: int = DEFAULT_SLOT_BYTES) -> tuple[str, int, int]:
    """Create and allocate the host's arena exclusively under name; returns (path, fd, slot_bytes).
    Raises ShmUnavailable, saying why."""
    slot = choose_slot_bytes(n_local, directory, default_slot)
    path, fd = create_segment(directory, name, arena_bytes(n_local, slot))
    return path, fd, slot


def create_segment(directory: str, name: str, nbytes: int) -> tuple[str, int]:
    """A new file of nbytes that only this user can open (0600, created here or not at all: O_EXCL and
    O_NOFOLLOW never open what another user made), backed now (ENOSPC here, never SIGBUS later); returns
    (path, open fd). Raises ShmUnavailable."""
    check_directory(directory)
    path = os.path.join(directory, name)
    try:
        fd = os.open(path, _CREATE, 0o600)
    except FileExistsError as exc:
        raise ShmUnavailable(f"{path} exists already ({_owner(path)}) although its name is new to this job: "
                             "another local user (or a stale process) took it; it was not opened") from exc
    except OSError as exc:
        raise ShmUnavailable(f"cannot create a file in {directory}: {exc.strerror}") from exc
    try:
        os.fchmod(fd, 0o600)  # exactly, whatever the umask: peers refuse any other mode
        os.posix_fallocate(fd, 0, max(nbytes, 1))
    except OSError as exc:
        unlink_own(path, fd)
        os.close(fd)
        if exc.errno in (errno.ENOSPC, errno.ENOMEM):
            raise ShmUnavailable(f"{directory} ran out of space allocating {nbytes >> 20} MiB") from exc
        raise
    return path, fd


def check_directory(directory: str) -> None:
    """Refuse a directory where another user could swap our files: theirs, or writable by others
    without the sticky bit (/dev/shm is root's, 1777)."""
    try:
        info = os.stat(directory)
    except OSError as exc:
        raise ShmUnavailable(f"cannot use {directory}: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise ShmUnavailable(f"{directory} is not a directory")
    if info.st_uid not in (0, os.geteuid()):
        raise ShmUnavailable(f"{directory} belongs to uid {info.st_uid}, who could replace this job's files there")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise ShmUnavailable(f"{directory} is writable by other users without the sticky bit: they could replace this job's files there")


def open_segment(path: str, nbytes: int) -> int:
    """Open a segment a local peer created, checked before anything maps it: no link followed, a regular
    file of this user, mode 0600 exactly, one name, nbytes long. Returns the fd; CollectiveError if not."""
    try:
        fd = os.open(path, _OPEN)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CollectiveError(f"smddp: refusing shared-memory segment {path}: it is a symbolic link") from exc
        raise
    try:
        problem = segment_problem(os.fstat(fd), nbytes)
    except BaseException:
        os.close(fd)
        raise
    if problem:
        os.close(fd)
        raise CollectiveError(f"smddp: refusing shared-memory segment {path}: {problem}; this job did not make it")
    return fd


def segment_problem(info: os.stat_result, nbytes: int) -> str:
    """Why a file is not a segment this job made ('' when it may be): what open_segment checks."""
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid != os.geteuid():
        return f"owned by uid {info.st_uid}, not {os.geteuid()}"
    if stat.S_IMODE(info.st_mode) != 0o600:
        return f"mode {stat.S_IMODE(info.st_mode):o}, not 600"
    if info.st_nlink != 1:
        return f"{info.st_nlink} names link to it"
    if info.st_size != max(nbytes, 1):
        return f"{info.st_size} bytes, not {max(nbytes, 1)}"
    return ""


def unlink_own(path: str, fd: int) -> None:
    """Remove path if it still names the file open at fd; never another file put in its place."""
    mine = os.fstat(fd)
    try:
        there = os.lstat(path)
    except FileNotFoundError:
        return
    if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
        os.unlink(path)


def _owner(path: str) -> str:
    try:
        info = os.lstat(path)
    except OSError:
        return "gone again"
    kind = "a link" if stat.S_ISLNK(info.st_mode) else "a file"
    return f"{kind} of uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}"


def allocate_file(nbytes: int, directory: str) -> str:
    """A new 0600 file of nbytes under a random name (create_segment). Raises ShmUnavailable."""
    path, fd = create_segment(directory, f"smddp-{uuid.uuid4().hex}", nbytes)
    os.close(fd)
    return path


def map_file(path: str, nbytes: int) -> torch.Tensor:
    """A local peer's segment (checked by open_segment) as a uint8 tensor over a shared, pre-faulted
    mapping (kept alive by the tensor)."""
    fd = open_segment(path, nbytes)
    try:
        mapping = map_fd(fd, nbytes)
    finally:
        os.close(fd)
    return torch.frombuffer(mapping, dtype=torch.uint8)[:nbytes]


def map_fd(fd: int, nbytes: int) -> mmap.mmap:
    return mmap.mmap(fd, max(nbytes, 1), flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))


@functools.cache
def _warn_single_copy_refused(error: int) -> None:
    """Said once per process (and errno): every group of the host would say the same."""
    warnings.warn(
        f"smddp: reading a local peer's memory failed ({errno.errorcode.get(error, error)}: {os.strerror(error)}); "
        "large all_gathers and broadcasts copy through shared memory instead (allow process_vm_readv between the "
        f"ranks: kernel.yama.ptrace_scope=0, or docker run --cap-add SYS_PTRACE; {SINGLE_COPY_ENV}=0 skips the "
        "attempt)",
        RuntimeWarning,
        stacklevel=3,
    )


@dataclass(frozen=True)
class Peer:
    """A local rank as the shm transport sees it."""

    group_rank: int
    pid: int


class ShmArena:
    """A mapped arena plus the barrier and abort protocol over it."""

    def __init__(self, fd: int, n_local: int, slot_bytes: int, local_index: int, peers: Sequence[Peer]) -> None:
        """Map the arena open at fd (created by create_arena, or checked by open_segment)."""
        self.n = n_local
        self.index = local_index
        self.slot_bytes = slot_bytes
        self.peers = list(peers)
        self._map = map_fd(fd, arena_bytes(n_local, slot_bytes))
        self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self._words = memoryview(self._map).cast("I")  # 32-bit: futex words
        self.base_address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self._ctrl = control_bytes(n_local)
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.spin_s = 0.0
        self._spin_checked_at = -1.0
        self._load = LoadSamples()
        self._refresh_spin_budget(time.monotonic())
        # call sequence number, barrier generation, phase, single copy refused: 32-bit words the native
        # core advances too
        self.counters = (ctypes.c_uint32 * 4)()
        self.counters[_SINGLE_COPY_OFF] = os.environ.get(SINGLE_COPY_ENV, "1").strip() == "0"
        if not self.counters[_SINGLE_COPY_OFF]:
            allow_peer_reads()
        self._words[local_index * LINE // 4 + _PID_WORD] = os.getpid()  # for the core's reads; read after a barrier
        self._native = native.library()
        self._record = call_file.call_words(RECORD_AT, RECORD_WORDS)  # where `smddp-launch stacks` reads the current call
        self.record_address = ctypes.addressof(self._record)
        self.slot_addresses = [(ctypes.c_void_p * n_local)(*(self._slot_address(i, half) for i in range(n_local))) for half in (0, 1)]
        self.hangs = HangWatch()  # the group's, once the rendezvous knows every rank (topology.build)
        self._prefault_own_slots()

    def _prefault_own_slots(self) -> None:
        # first touch costs ~1 GB/s against ~8 GB/s pre-faulted; each rank writes its own slots once
        for half in (0, 1):
            self.slot(self.index, half).zero_()

    # layout -------------------------------------------------------------------------------------------
    def slot(self, local_index: int, half: int) -> torch.Tensor:
        start = self._ctrl + (2 * local_index + half) * self.slot_bytes
        return self._bytes[start : start + self.slot_bytes]

    def _slot_address(self, local_index: int, half: int) -> int:
        return self.base_address + self._ctrl + (2 * local_index + half) * self.slot_bytes

    def next_half(self) -> int:
        phase = self.counters[_PHASE]
        self.counters[_PHASE] = (phase + 1) & 0xFFFFFFFF
        return phase & 1

    def _counter(self, local_index: int) -> int:
        return self._words[local_index * LINE // 4]

    def _record_of(self, local_index: int, generation: int) -> list[int]:
        start = local_index * LINE // 4 + _RECORD_WORD + (generation & 1) * RECORD_WORDS
        return list(self._words[start : start + RECORD_WORDS])

    def begin(self, call: Call) -> None:
        """Number the collective that the following barriers belong to (peers check they run the same)."""
        seq = (self.counters[_SEQ] + 1) & 0xFFFFFFFF
        self.counters[_SEQ] = seq
        self._record[:] = call.words(seq)

    @property
    def native(self) -> bool:
        return self._native is not None

    def spin_budgets(self) -> tuple[float, float, float]:
        """Seconds to poll before sleeping: (on a calm machine, on a loaded one, in a blocking call of the
        core). Polling catches a peer that arrives within microseconds without a wake-up (51 µs against
        115 µs for a 4 KB allreduce here), but only while every runnable task has a core: when the load
        tasks runnable on the machine do (other jobs), polling burns the slice the peer needs (4 KB
        all_reduce 164 µs with 30 µs of polling, 63 µs with 5, at load 13 on 2 cores).
        A blocking call of the core (the caller's thread waits in it, nothing of the rank's own runs
        meanwhile) polls up to 1 ms when the ranks have a core each, loaded or not: a rank that sleeps
        gives its core away, and its wake-up waits behind whatever took it, often on its peer's core, so
        that the peer, arriving late next time, sleeps too; the pair stays in that state (4 KB all_reduce
        86 µs at 30 µs of polling, 28 µs at 2, 6.6 µs at 1 ms, with other sessions' tasks runnable).
        The native wait pauses for the first 30 µs of a budget and yields after that, so that a peer a
        wake-up put on this rank's core gets it (a pause of 1 ms there cost 1.7 ms a call).
        Where the ranks outnumber the cores, every wait polls with sched_yield (``crowded``), which hands
        the core to a runnable peer without a sleep and wake-up, as Open MPI's ranks do when
        oversubscribed (4 ranks on 2 cores, 64 KB all_reduce 120 µs against 190 µs-1.8 ms sleeping after
        2 µs). Figures: docs/performance.md, issue 37. SMDDP_SPIN_US overrides all three."""
        return spin_budgets(self.n, self.cores)

    @property
    def crowded(self) -> bool:
        """The host's ranks outnumber the cores: waits poll with sched_yield (smddp_native.c's the same)."""
        return self.n > self.cores

    def _refresh_spin_budget(self, now: float) -> None:
        """The budget for the machine's load now (native core: the same rule in core/engine.cpp's spin()).
        The tasks runnable now, not the 1-minute load average: that one lags, so a busy minute before (or
        another backend's polling ranks in the same benchmark) kept the ranks of a now quiet machine
        sleeping after 2 µs (4 KB calls of 90-200 µs instead of 10-15). Sampled every SAMPLE_EVERY_S and
        judged by LoadSamples' majority, so one passing task never costs a calm machine a second of
        sleeping ranks."""
        if now - self._spin_checked_at < LoadSamples.SAMPLE_EVERY_S:
            return
        self._spin_checked_at = now
        calm, loaded, _ = self.spin_budgets()
        self._load.add(runnable_tasks() > self.cores)
        self.spin_s = loaded if self._load.loaded else calm

    # single copy ------------------------------------------------------------------------------------
    @property
    def single_copy(self) -> bool:
        """Large all_gathers and broadcasts read from the peers' memory (until a kernel refuses)."""
        return not self.counters[_SINGLE_COPY_OFF]

    def single_copy_read(self, source: torch.Tensor, reads: Sequence[tuple[int, torch.Tensor]], what: str, deadline: float) -> bool:
        """Every rank's source address out through its slot, a barrier, then each rank fills its targets
        (local index, tensor) straight from the peers' sources, and a second barrier keeps every source
        untouched until it has been read. False when some rank's read was refused: nothing is lost, the
        caller copies through the slots, now and in every later call (every rank sees the same verdicts)."""
        half = self.next_half()
        self.slot(self.index, half)[:8].view(torch.int64)[0] = source.data_ptr()
        self.barrier(what, deadline)
        error = 0
        for peer, target in reads:
            address = int(self.slot(peer, half)[:8].view(torch.int64)[0])
            error = read_process(self._pid_of(peer), target, address)
            if error:
                break
        self._words[self.index * LINE // 4 + _VERDICT_WORD] = error
        self.barrier(what, deadline)
        return self._single_copy_agreed()

    def _pid_of(self, local_index: int) -> int:
        """The pid the peer wrote in its own line (as the native core reads it), not one from the store."""
        return self._words[local_index * LINE // 4 + _PID_WORD]

    def _single_copy_agreed(self) -> bool:
        """After a single-copy call's second barrier: did every local rank read everything? If not, the
        arena copies through its slots from now on."""
        errors = [self._words[i * LINE // 4 + _VERDICT_WORD] for i in range(self.n)]
        refused = next((error for error in errors if error), 0)
        if refused:
            self.refuse_single_copy(refused)
        return not refused

    def refuse_single_copy(self, error: int) -> None:
        """The kernel refused a single-copy read: copy through the slots from now on."""
        self.counters[_SINGLE_COPY_OFF] = 1
        if self.index == 0:
            _warn_single_copy_refused(error)

    # abort record -----------------------------------------------------------------------------------
    def post_abort(self, message: str) -> None:
        """Tell local peers this rank failed, so they fail now instead of at the timeout."""
        encoded = message.encode("utf-8", "replace")[: ABORT_MESSAGE_BYTES - 1]
        base = self.n * LINE + LINE
        self._map[base : base + len(encoded) + 1] = encoded + b"\0"
        self._words[self.n * LINE // 4] = self.index + 1
        for i in range(self.n):
            futex.wake_all(self.base_address + i * LINE)  # waiters re-check and see the abort

    def abort_message(self) -> str | None:
        who = self._words[self.n * LINE // 4]
        if not who:
            return None
        base = self.n * LINE + LINE
        raw = bytes(self._map[base : base + ABORT_MESSAGE_BYTES]).split(b"\0", 1)[0]
        return f"rank {self.peers[who - 1].group_rank} failed: {raw.decode('utf-8', 'replace')}"

    # synchronisation --------------------------------------------------------------------------------
    def barrier(self, what: str, deadline: float) -> None:
        """All local ranks arrive with the same call record; raises CollectiveError naming the op and the
        missing or mismatched peers."""
        generation = self._next_generation()
        if self._native is not None:
            status = self._native.smddp_barrier(self.base_address, self.n, self.index, generation, self.record_address, int(self.spin_s * 1e9), int(CHECK_EVERY_S * 1e9))
            self.finish_barrier(status, generation, what, deadline)
        else:
            self._python_barrier(generation, what, deadline)

    def _next_generation(self) -> int:
        generation = (self.counters[_GENERATION] + 1) & 0xFFFFFFFF
        self.counters[_GENERATION] = generation
        self._refresh_spin_budget(time.monotonic())
        return generation

    def finish_barrier(self, status: int, generation: int, what: str, deadline: float) -> None:
        """Carry a native barrier to its end: status is smddp_wait's (-1 done, i >= 0 peer i still
        missing after a slice, -2 - i peer i's call record differs)."""
        started = time.monotonic()
        while status >= 0:
            now = time.monotonic()
            self._check_peers([status], what, now, deadline)
            self._still_waiting(generation, what, now - started)
            status = self._native.smddp_wait(self.base_address, self.n, self.index, generation, self.record_address, 0, int(CHECK_EVERY_S * 1e9))
        if status <= -2:
            self._raise_mismatch(-2 - status, generation, what)

    def allreduce_small(self, x: torch.Tensor, codes: tuple[int, int], half: int, what: str, deadline: float) -> bool:
        """Native one-shot all_reduce of a contiguous x that fits a slot: copy in, barrier, reduce every
        slot into x in one call. False when the reduction is left to the caller (the barrier is done)."""
        generation = self._next_generation()
        nbytes = x.numel() * x.element_size()
        status = self._native.smddp_allreduce_small(
            self.base_address,
            self.n,
            self.index,
            generation,
            self.record_address,
            int(self.spin_s * 1e9),
            int(CHECK_EVERY_S * 1e9),
            x.data_ptr(),
            nbytes,
            self.slot_addresses[half],
            codes[0],
            codes[1],
            x.numel(),
        )
        if status == -1:
            return True
        if status != -100:
            self.finish_barrier(status, generation, what, deadline)
        return False

    def _python_barrier(self, generation: int, what: str, deadline: float) -> None:
        line = self.index * LINE // 4
        record = line + _RECORD_WORD + (generation & 1) * RECORD_WORDS
        self._words[record : record + RECORD_WORDS] = memoryview(self._record).cast("B").cast("I")
        self._words[line] = generation
        if futex.available():
            futex.wake_all(self.base_address + self.index * LINE)
        pending = [i for i in range(self.n) if i != self.index]
        start = time.monotonic()
        spin_until = start + self.spin_s
        next_check = start + CHECK_EVERY_S
        while pending:
            peer = pending[-1]
            seen = self._counter(peer)
            if (seen - generation) & 0xFFFFFFFF < 1 << 31:  # arrived (or already past it), wrap-safe
                if self._record_of(peer, generation) != list(self._record):
                    self._raise_mismatch(peer, generation, what)
                pending.pop()
                continue
            now = time.monotonic()
            if now < spin_until:
                if self.crowded:
                    os.sched_yield()  # the peer is likely waiting for this core
                continue  # else busy poll: sched_yield would hand the core to other jobs for a whole slice
            if futex.available():
                futex.wait(self.base_address + peer * LINE, seen, CHECK_EVERY_S)
            else:
                time.sleep(50e-6)
            if now >= next_check:
                next_check = now + CHECK_EVERY_S
                self._check_peers(pending, what, now, deadline)
                self._still_waiting(generation, what, now - start)

    def _raise_mismatch(self, peer: int, generation: int, what: str) -> None:
        mine = describe(list(self._record))
        theirs = describe(self._record_of(peer, generation))
        me, other = self.peers[self.index].group_rank, self.peers[peer].group_rank
        raise CollectiveError(
            f"smddp {what}: collective mismatch between ranks: rank {me} called {mine} but rank {other} called "
            f"{theirs} (every rank must call the same collectives in the same order, with the same dtype, "
            "size, reduce op and root)"
        )

    def last_call(self, local_index: int) -> str:
        """What a local rank last entered (its record at its latest barrier generation)."""
        generation = self._counter(local_index)
        return describe(self._record_of(local_index, generation)) if generation else "no collective yet"

    def latest_calls(self) -> dict[int, list[int] | None]:
        """Every local rank's latest call record, by group rank (None: no collective yet): what the hang
        warning knows of this host's ranks without asking anyone."""
        calls: dict[int, list[int] | None] = {}
        for i, peer in enumerate(self.peers):
            generation = self._counter(i)
            calls[peer.group_rank] = self._record_of(i, generation) if generation else None
        return calls

    def _still_waiting(self, generation: int, what: str, waited_s: float) -> None:
        self.hangs.waiting(self._record, waited_s, what, lambda: self._transport_view(generation, what, waited_s))

    def _transport_view(self, generation: int, what: str, waited_s: float) -> str:
        """Whom this barrier waits for, as the arena alone sees it."""
        missing = [i for i in range(self.n) if i != self.index and (self._counter(i) - generation) & 0xFFFFFFFF >= 1 << 31]
        who = "; ".join(f"rank {self.peers[i].group_rank} (last call: {self.last_call(i)})" for i in missing) or "the other ranks of this host"
        host = os.environ.get("SM_CURRENT_HOST", "this host")
        return f"smddp: rank {self.peers[self.index].group_rank} has waited {waited_s:.0f} s in {what} ({describe(list(self._record))}) for {who} on {host}; they have not arrived"

    def _check_peers(self, pending: list[int], what: str, now: float, deadline: float) -> None:
        aborted = self.abort_message()
        if aborted:
            raise CollectiveError(f"smddp {what} aborted: {aborted}")
        for i in pending:
            peer = self.peers[i]
            if not pid_alive(peer.pid):
                raise CollectiveError(f"smddp {what} failed: peer rank {peer.group_rank} (pid {peer.pid}, same host) exited before completing it", lost=[PeerRank(peer.group_rank)])
        if now >= deadline:
            missing = ", ".join(str(self.peers[i].group_rank) for i in pending)
            raise CollectiveError(f"smddp {what} timed out: rank(s) {missing} on this host did not arrive within the process-group timeout (a peer is hung or took a different code path)",
                                  awaited=[PeerRank(self.peers[i].group_rank) for i in pending])

    def close(self) -> None:
        call_file.release(self._record)
        try:
            del self._bytes, self._words
            self._map.close()
        except (BufferError, AttributeError):
            pass  # tensors over the map are still alive; the mapping goes with the process


def copy_in(dst_slot: torch.Tensor, src: torch.Tensor) -> None:
    """Copy a contiguous tensor's bytes to the start of a uint8 slot view."""
    copy_bytes(dst_slot, src)
