"""smddp's native kernels (smddp_native.c), compiled on first use and loaded through ctypes.

SMDDP_NATIVE chooses: "auto" (default) uses the kernels when they load and falls back to the pure-Python
path with one note when they cannot be built (no C compiler); "1" requires them (an error says why they
are missing); "0" never loads them. The shared library is cached per user under
$XDG_CACHE_HOME/smddp-sdk/native (or ~/.cache/...), keyed by a hash of the source and the compiler flags,
so a changed source rebuilds and concurrent ranks never load a half-written file (write, then rename).
A library prebuilt next to this file (the Docker image does it) is used before the cache.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

NATIVE_ENV = "SMDDP_NATIVE"
CACHE_ENV = "SMDDP_NATIVE_CACHE"
SOURCE = Path(__file__).with_name("smddp_native.c")
_FLAGS = ["-O3", "-shared", "-fPIC", "-std=gnu11", "-fno-strict-aliasing"]

_lib: ctypes.CDLL | None = None
_loaded = False
_why_not = ""


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


def build(directory: Path | None = None) -> Path:
    """Compile the kernels into directory (default: the cache) unless already there; returns the path."""
    target_dir = directory or cache_dir()
    target = target_dir / library_name()
    if target.exists():
        return target
    named = os.environ.get("CC")
    compiler = shutil.which(named) if named else shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not compiler:
        raise NativeUnavailable(f"no C compiler found ({f'CC={named} is not on PATH' if named else 'no cc, gcc or clang on PATH'}; "
                                "install gcc, or set CC)")
    target_dir.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target_dir, suffix=".so.part")
    os.close(fd)
    try:
        result = subprocess.run([compiler, *_flags(), "-o", partial, str(SOURCE)], capture_output=True, text=True)
        if result.returncode:
            raise NativeUnavailable(f"{compiler} failed to build {SOURCE.name}: {result.stderr.strip()[-2000:]}")
        os.replace(partial, target)  # atomic: a concurrent rank sees no file or a whole one
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def _declare(lib: ctypes.CDLL) -> None:
    c = ctypes
    barrier_args = [c.c_void_p, c.c_int, c.c_int, c.c_uint32, c.c_void_p, c.c_long, c.c_long]
    lib.smddp_wait.argtypes = barrier_args
    lib.smddp_barrier.argtypes = barrier_args
    lib.smddp_reduce.argtypes = [c.c_int, c.c_int, c.c_void_p, c.c_void_p, c.c_int, c.c_long]
    lib.smddp_allreduce_small.argtypes = barrier_args + [c.c_void_p, c.c_long, c.c_void_p, c.c_int, c.c_int, c.c_long]
    for fn in (lib.smddp_wait, lib.smddp_barrier, lib.smddp_reduce, lib.smddp_allreduce_small):
        fn.restype = c.c_int


def _load() -> ctypes.CDLL:
    prebuilt = SOURCE.with_name(library_name())
    path = prebuilt if prebuilt.exists() else build()
    lib = ctypes.CDLL(str(path))
    _declare(lib)
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
            warnings.warn(f"smddp: native kernels unavailable ({exc}); using the pure-Python path "
                          f"(set {NATIVE_ENV}=0 to silence this note)", RuntimeWarning, stacklevel=2)
    _loaded = True
    return _lib


def main(argv: list[str]) -> int:
    """`python -m smddp_sdk.collectives.native [--into DIR]`: build now (the Docker image prebuilds)."""
    directory = Path(argv[argv.index("--into") + 1]) if "--into" in argv else None
    print(build(directory))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
