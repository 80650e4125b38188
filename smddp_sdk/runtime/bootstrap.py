"""Run a user script as ``__main__`` and record why it failed, without the user decorating anything.

    python -m smddp_sdk.runtime.bootstrap train.py --epochs 3
    python -m smddp_sdk.runtime.bootstrap --module pkg.train --epochs 3

The script sees the same ``sys.argv``, ``sys.path[0]`` and ``__main__`` as under ``python train.py``.
When it raises (or exits with a non-zero code) the bootstrap writes a JSON error file to the path in
``SMDDP_ERROR_FILE`` (keys: host, rank, local_rank, pid, exit_code, error_type, message, traceback,
timestamp, and the peers a failed collective named: lost, awaited) and exits with the same code Python would have used, without the interpreter's slow module
teardown (``exit_without_teardown``).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from smddp_sdk.runtime.procs import die_with_parent
from smddp_sdk.runtime.stacks import register_stack_dump
from smddp_sdk.specs.contract import ERROR_FILE_ENV, PARENT_PID_ENV, number_or_none
from smddp_sdk.specs.failure import blame_of

# Frames of ours to hide from user tracebacks (runpy is "<frozen runpy>" on Python 3.11+).
_OWN_FILES = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 2
    die_with_parent(signal.SIGKILL, os.environ.get(PARENT_PID_ENV))  # a rank must not outlive its runtime, however it dies
    register_stack_dump()  # `smddp-launch stacks` (the runtime forwards the signal)
    try:
        _run(argv)
    except SystemExit as stop:
        code = _exit_code(stop.code)
        if code != 0:
            _record(code, "SystemExit", f"sys.exit({stop.code})" if isinstance(stop.code, int) else str(stop.code), "")
        return code
    except BaseException as exc:  # noqa: BLE001 - every failure of user code must be recorded
        trace = "".join(traceback.format_exception(type(exc), exc, _user_frames(exc.__traceback__)))
        sys.stderr.write(trace)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        _record(code, type(exc).__name__, str(exc), trace, blame_of(exc))
        return code
    return 0


def _run(argv: list[str]) -> None:
    if argv[0] == "--module":
        if len(argv) < 2:
            raise SystemExit("bootstrap: --module needs a module name")
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = Path(argv[0]).resolve()
    sys.argv = list(argv)
    sys.path[0] = str(script.parent)  # what `python script.py` puts first
    runpy.run_path(str(script), run_name="__main__")


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """Drop the bootstrap's and runpy's frames so the traceback starts in user code."""
    while tb is not None and _frame_file(tb) in _OWN_FILES:
        tb = tb.tb_next
    return tb


def _frame_file(tb: TracebackType) -> str:
    name = tb.tb_frame.f_code.co_filename
    return name if name.startswith("<") else os.path.abspath(name)


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)  # SystemExit("message") prints it and exits 1, as Python does
    return 1


def _record(exit_code: int, error_type: str, message: str, trace: str, blame: Mapping[str, Any] | None = None) -> None:
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    record = {
        "host": os.environ.get("SM_CURRENT_HOST", ""),
        "rank": number_or_none(int, os.environ.get("RANK")),
        "local_rank": number_or_none(int, os.environ.get("LOCAL_RANK")),
        "pid": os.getpid(),
        "exit_code": exit_code,
        "error_type": error_type,
        "message": message,
        "traceback": trace,
        "timestamp": time.time(),
        **(blame or {}),  # the peers a failed collective named: lost, awaited
    }
    try:
        Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        # 0600 whatever the rank's umask (0022): the runtime's own record, as its logs
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        os.replace(tmp, path)  # the runtime never reads half a file
    except OSError as exc:
        print(f"bootstrap: could not write the error file {path}: {exc}", file=sys.stderr)


_WRITABLE_FILES = frozenset({io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom})  # what open() returns


def exit_without_teardown(code: int) -> None:
    """End the rank as Python would, minus the interpreter's module teardown (about 2 s with torch loaded
    on a busy machine, per rank, at the end of every job): wait for non-daemon threads, run the atexit
    handlers (logging, multiprocessing, the user's own), flush every open file, then ``os._exit``."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for obj in gc.get_objects():  # files the script left open keep what it wrote, as at a normal exit
        if type(obj) in _WRITABLE_FILES:  # exact types: fast over ~10^5 objects, and no attribute reads
            with contextlib.suppress(Exception):
                if not obj.closed:
                    obj.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main(sys.argv[1:]))
