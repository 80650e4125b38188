"""smddp's native code, compiled on first use: the kernels (smddp_native.c, loaded through ctypes) and the
core (core/: smddp_core.cpp, a torch extension holding the C++ ProcessGroup base that runs collectives
without Python, and engine.cpp, its protocol and algorithms on bytes, free of torch headers).

SMDDP_NATIVE chooses: "auto" (default) uses both when they build and falls back with one note each when
they cannot (no C or C++ compiler, no Python or torch headers): without the core, every call goes through
the Python group; without the kernels, through the pure-Python path. "1" requires both (an error says
why one is missing); "0" loads neither. Builds are cached per user under $XDG_CACHE_HOME/smddp-sdk/native
(or ~/.cache/...), keyed by a hash of the source, the compiler flags and (for the core) the torch and
Python versions, so a change rebuilds and concurrent ranks never load a half-written file (write, then
rename; the core is built by one process while the others wait). The core's units compile at once (and
beside the kernels in `build_all`), so its build takes about as long as its torch unit alone. Files
prebuilt next to this one (the Docker image does it) are used before the cache.

The kernels protect the links between hosts with OpenSSL's libcrypto, opened when they load: the one
Python's own hashlib uses, else the system's libcrypto.so.3 or .1.1. Building needs no OpenSSL headers.
Without libcrypto the kernels still load and move plain frames only; a protected link (the default) then
fails with the reason (``crypto_unavailable``), and SMDDP_NATIVE=0 moves the bytes in Python instead,
with the ``cryptography`` package.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

NATIVE_ENV = "SMDDP_NATIVE"
CACHE_ENV = "SMDDP_NATIVE_CACHE"
SOURCE = Path(__file__).with_name("smddp_native.c")
_FLAGS = ["-O3", "-fPIC", "-std=gnu11", "-fno-strict-aliasing"]

CORE_DIR = Path(__file__).with_name("core")
_CORE_FLAGS = ["-O2", "-fPIC", "-fvisibility=hidden", "-std=c++20", "-DTORCH_EXTENSION_NAME=smddp_core", "-DTORCH_API_INCLUDE_EXTENSION_H"]

_lib: ctypes.CDLL | None = None
_loaded = False
_why_not = ""
_crypto_why_not = "the native kernels are not loaded"
_core: type | None = None
_core_loaded = False


class NativeUnavailable(RuntimeError):
    """SMDDP_NATIVE=1 but the kernels could not be built or loaded."""


def mode() -> str:
    value = os.environ.get(NATIVE_ENV, "auto").strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value in ("1", "true", "yes", "on"):
        return "on"
    if value in ("0", "false", "no", "off"):
        return "off"
    raise ValueError(f"{NATIVE_ENV}={value!r} is not understood: use auto, 1 or 0")


def _flags() -> list[str]:
    flags = list(_FLAGS)
    if platform.machine() in ("x86_64", "AMD64") and _cpu_has("f16c"):
        flags.append("-mf16c")  # fp16 conversions in hardware instead of libgcc calls
    return flags


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return flag in line.split()
    except OSError:
        pass
    return False


def library_name() -> str:
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(_flags()).encode() + platform.machine().encode())
    return f"libsmddp_native-{digest.hexdigest()[:16]}.so"


def cache_dir() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "smddp-sdk" / "native"


def _compiler(variable: str, candidates: tuple[str, ...], package: str) -> str:
    named = os.environ.get(variable)
    compiler = shutil.which(named) if named else next(filter(None, map(shutil.which, candidates)), None)
    if not compiler:
        where = f"{variable}={named} is not on PATH" if named else f"no {', '.join(candidates)} on PATH"
        raise NativeUnavailable(f"no {'C' if variable == 'CC' else 'C++'} compiler found ({where}; install {package}, or set {variable})")
    return compiler


@contextmanager
def _partial(target: Path) -> Iterator[Path]:
    """A temporary path next to target, renamed onto it if the block succeeds (atomic: a concurrent rank
    sees no file or a whole one), removed otherwise."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}-", suffix=".part")
    os.close(fd)
    try:
        yield Path(partial)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def _run_at_once(steps: list[tuple[Path, list[str]]]) -> None:
    """Run every compiler command (source, argv) at once and wait for all of them; every failure is
    reported together, each naming its source with the compiler's own message."""
    failures = []
    with ExitStack() as stack:
        running = []
        for source, argv in steps:
            errors = stack.enter_context(tempfile.TemporaryFile(mode="w+"))  # a file, not a pipe: never blocks
            running.append((source, argv, errors, subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=errors)))
        for source, argv, errors, process in running:
            if process.wait():
                errors.seek(0)
                failures.append(f"{os.path.basename(argv[0])} failed to build {source.name}: {errors.read().strip()[-2000:]}")
    if failures:
        raise NativeUnavailable("\n".join(failures))


def _kernels_argv(compiler: str, output: Path) -> list[str]:
    return [compiler, *_flags(), "-shared", "-o", str(output), str(SOURCE), "-ldl"]  # dlopen: libcrypto


def build(directory: Path | None = None) -> Path:
    """Compile the kernels into directory (default: the cache) unless already there; returns the path."""
    target = (directory or cache_dir()) / library_name()
    if not target.exists():
        compiler = _compiler("CC", ("cc", "gcc", "clang"), "gcc")
        with _partial(target) as partial:
            _run_at_once([(SOURCE, _kernels_argv(compiler, partial))])
    return target


# the core ----------------------------------------------------------------------------------------------
def _torch_build_flags() -> tuple[list[str], list[str]]:
    """Include and link flags for an extension of the installed torch (what torch.utils.cpp_extension
    passes, without needing ninja)."""
    import torch
    from torch.utils import cpp_extension

    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    if not os.path.exists(os.path.join(includes[-1], "Python.h")):
        raise NativeUnavailable(f"no Python headers in {includes[-1]} (install python3-dev)")
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    libs = [f"-L{p}" for p in cpp_extension.library_paths()] + ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    return [abi, *(f"-I{p}" for p in includes)], libs


def core_sources() -> list[Path]:
    """Every file of the core (the cache key covers them all); its .cpp files are the units."""
    return sorted(p for p in CORE_DIR.iterdir() if p.suffix in (".cpp", ".hpp"))


def core_name() -> str:
    import torch

    sources = [p.name.encode() + b"\0" + p.read_bytes() for p in core_sources()]
    key = [*sources, " ".join(_CORE_FLAGS).encode(), torch.__version__.encode(), sys.version.encode(), platform.machine().encode()]
    return f"smddp_core-{hashlib.sha256(b'|'.join(key)).hexdigest()[:16]}.so"


def build_core(directory: Path | None = None, with_kernels: bool = False) -> Path:
    """Compile the core into directory (default: the cache) unless already there; one process builds,
    concurrent ones wait for it. Its units compile at once, then link; with_kernels: the kernels too,
    beside them, if they are not built yet. Returns the core's path."""
    import torch

    target = (directory or cache_dir()) / core_name()
    if target.exists():
        return target
    compiler = _compiler("CXX", ("c++", "g++", "clang++"), "g++")
    flags, libs = _torch_build_flags()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if not target.exists():
            print(f"smddp: building the native core for torch {torch.__version__} (once; about 30 s on 2 cores)", file=sys.stderr, flush=True)
            kernels = (directory or cache_dir()) / library_name() if with_kernels else None
            _build_core(target, compiler, flags, libs, kernels if kernels and not kernels.exists() else None)
    return target


def _build_core(target: Path, compiler: str, flags: list[str], libs: list[str], kernels: Path | None) -> None:
    """The core's units (and the kernels, where given) compiled at once, then the core linked."""
    units = [p for p in core_sources() if p.suffix == ".cpp"]
    units.sort(key=lambda p: p.name != "smddp_core.cpp")  # the torch unit, the longest, first
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.stem}-") as scratch, _partial(target) as partial:
        objects = [Path(scratch) / f"{unit.stem}.o" for unit in units]
        steps = [(unit, [compiler, *_CORE_FLAGS, *flags, "-c", "-o", str(obj), str(unit)]) for unit, obj in zip(units, objects)]
        kernels_partial = Path(scratch) / "kernels.so"
        if kernels:
            steps.append((SOURCE, _kernels_argv(_compiler("CC", ("cc", "gcc", "clang"), "gcc"), kernels_partial)))
        try:
            _run_at_once(steps)
        finally:
            if kernels and kernels_partial.exists():
                os.replace(kernels_partial, kernels)  # built whole even where a unit of the core failed
        _run_at_once([(target, [compiler, "-shared", "-o", str(partial), *map(str, objects), *libs])])


def _load_core() -> type:
    import torch.distributed  # noqa: F401 - registers the ProcessGroup base class the core derives from

    prebuilt = SOURCE.with_name(core_name())
    path = prebuilt if prebuilt.exists() else build_core()
    spec = importlib.util.spec_from_file_location("smddp_core", path)
    if spec is None or spec.loader is None:
        raise NativeUnavailable(f"{path} is not a loadable extension")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SmddpCore


def core() -> type | None:
    """The C++ ProcessGroup base class, or None (SMDDP_NATIVE=0, no kernels, or auto without a C++
    toolchain: the group is then all Python)."""
    global _core, _core_loaded
    if _core_loaded:
        return _core
    chosen = mode()
    if chosen != "off" and library() is not None:
        try:
            _core = _load_core()
        except (NativeUnavailable, OSError, ImportError) as exc:
            if chosen == "on":
                raise NativeUnavailable(f"{NATIVE_ENV}=1 but smddp's native core is unavailable: {exc}") from exc
            warnings.warn(f"smddp: native core unavailable ({exc}); every collective goes through the Python group (set {NATIVE_ENV}=0 to silence this note)", RuntimeWarning, stacklevel=2)
    _core_loaded = True
    return _core


class Transfer(ctypes.Structure):
    """smddp_native.c's struct smddp_transfer: one buffer of a TCP exchange (tcp.py)."""

    _fields_ = [("fd", ctypes.c_int), ("receive", ctypes.c_int), ("data", ctypes.c_void_p), ("length", ctypes.c_long), ("done", ctypes.c_long), ("error", ctypes.c_int)]


def _declare(lib: ctypes.CDLL) -> None:
    c = ctypes
    barrier_args = [c.c_void_p, c.c_int, c.c_int, c.c_uint32, c.c_void_p, c.c_long, c.c_long]
    lib.smddp_wait.argtypes = barrier_args
    lib.smddp_barrier.argtypes = barrier_args
    lib.smddp_reduce.argtypes = [c.c_int, c.c_int, c.c_void_p, c.c_void_p, c.c_int, c.c_long]
    lib.smddp_allreduce_small.argtypes = barrier_args + [c.c_void_p, c.c_long, c.c_void_p, c.c_int, c.c_int, c.c_long]
    lib.smddp_reduce_shard.argtypes = [c.c_int, c.c_int, c.c_void_p, c.c_int, c.c_int, c.c_void_p, c.c_long, c.c_long, c.c_long]
    lib.smddp_exchange.argtypes = [c.POINTER(Transfer), c.c_int, c.c_long]
    lib.smddp_crypto_load.argtypes = [c.c_char_p]
    lib.smddp_link_open.argtypes = [c.c_int, c.c_int, c.c_long, c.c_char_p]
    lib.smddp_link_close.argtypes = [c.c_int]
    lib.smddp_link_close.restype = None
    lib.smddp_ring_put.argtypes = [c.c_void_p, c.c_long, c.c_void_p, c.c_long]
    lib.smddp_ring_take.argtypes = [c.c_void_p, c.c_long, c.c_void_p, c.c_long]
    lib.smddp_ring_wait.argtypes = [c.c_void_p, c.c_long, c.c_int, c.c_long, c.c_long, c.c_long]
    for fn in (lib.smddp_ring_put, lib.smddp_ring_take, lib.smddp_ring_wait):
        fn.restype = c.c_long
    for fn in (lib.smddp_wait, lib.smddp_barrier, lib.smddp_reduce, lib.smddp_reduce_shard, lib.smddp_allreduce_small, lib.smddp_exchange,
               lib.smddp_crypto_load, lib.smddp_link_open):
        fn.restype = c.c_int


def _libcrypto_candidates() -> list[str]:
    """The libcrypto this process's hashlib maps (the same library twice would be two copies), then the system's."""
    try:
        import _hashlib  # noqa: F401 - maps OpenSSL's libcrypto into the process, where it can be found
    except ImportError:
        pass
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            mapped = [line.split()[-1] for line in maps if "/libcrypto.so" in line]
    except OSError:
        mapped = []
    return list(dict.fromkeys([*mapped, *filter(None, [ctypes.util.find_library("crypto")]), "libcrypto.so.3", "libcrypto.so.1.1"]))


def _load_crypto(lib: ctypes.CDLL) -> None:
    global _crypto_why_not
    candidates = _libcrypto_candidates()
    for path in candidates:
        if lib.smddp_crypto_load(path.encode()) == 0:
            _crypto_why_not = ""
            return
    _crypto_why_not = f"no OpenSSL libcrypto with AES-GCM could be opened (tried {', '.join(candidates)}; install libssl3 or OpenSSL 1.1)"


def crypto_unavailable() -> str:
    """Why the kernels cannot protect links between hosts ("" when they can)."""
    return _crypto_why_not


def _load() -> ctypes.CDLL:
    prebuilt = SOURCE.with_name(library_name())
    path = prebuilt if prebuilt.exists() else build()
    lib = ctypes.CDLL(str(path))
    _declare(lib)
    _load_crypto(lib)
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None for the Python path (SMDDP_NATIVE=0, or auto without a compiler)."""
    global _lib, _loaded, _why_not
    if _loaded:
        return _lib
    chosen = mode()
    if chosen != "off":
        try:
            _lib = _load()
        except (NativeUnavailable, OSError) as exc:
            if chosen == "on":
                raise NativeUnavailable(f"{NATIVE_ENV}=1 but smddp's native kernels are unavailable: {exc}") from exc
            _why_not = str(exc)
            warnings.warn(f"smddp: native kernels unavailable ({exc}); using the pure-Python path (set {NATIVE_ENV}=0 to silence this note)", RuntimeWarning, stacklevel=2)
    _loaded = True
    return _lib


def main(argv: list[str]) -> int:
    """`python -m smddp_sdk.collectives.native [--into DIR] [--kernels-only]`: build now, the kernels beside
    the core's units (the Docker image prebuilds into the package); prints the paths, and how long it took."""
    directory = Path(argv[argv.index("--into") + 1]) if "--into" in argv else None
    started = time.monotonic()
    try:
        core_path = None if "--kernels-only" in argv else build_core(directory, with_kernels=True)
        print(build(directory))
        if core_path:
            print(core_path)
    except NativeUnavailable as exc:
        print(f"smddp: {exc}", file=sys.stderr)
        return 1
    print(f"smddp: native code ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
