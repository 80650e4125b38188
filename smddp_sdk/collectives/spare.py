"""A rank started ahead: torch imported, waiting to become a rank (``python -m smddp_sdk.collectives.spare``).

A restart that starts its ranks cold pays the interpreter, ``import torch`` and the backend's import again:
seconds on a loaded machine, most of a recovery. A spare pays them before it is needed. The runtime starts
it with its stdin a pipe and later writes one request (JSON: ``argv``, ``env``, ``cwd``) and closes the
pipe; the spare then takes the rank's environment, working directory and ``sys.path`` and runs the rank's
bootstrap in this process, exactly as ``python -m smddp_sdk.runtime.bootstrap ...`` would. End of file
without a request (the runtime dropped it or died) ends it quietly.

Only what the import does before the request is shared with the rank: the environment variables torch
reads while importing (``OMP_NUM_THREADS``, ...) are the runtime's, not the rank's (CUDA is initialised
later, so ``CUDA_VISIBLE_DEVICES`` set per rank still applies).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

from smddp_sdk.runtime import bootstrap
from smddp_sdk.runtime.procs import die_with_parent
from smddp_sdk.runtime.usercode import BOOTSTRAP_MODULE
from smddp_sdk.specs.contract import PARENT_PID_ENV, RANK_UMASK

READY_FD_ENV = "SMDDP_SPARE_READY_FD"  # a pipe: one byte once torch is imported, then closed


def read_request(stream: Any) -> dict[str, Any] | None:
    raw = stream.read()
    if not raw:
        return None
    request = json.loads(raw)
    argv, env, cwd = request.get("argv"), request.get("env"), request.get("cwd")
    if not (isinstance(argv, list) and argv[1:3] == ["-m", BOOTSTRAP_MODULE] and isinstance(env, dict) and isinstance(cwd, str)):
        raise ValueError(f"a spare runs the rank bootstrap only, not {argv!r}")
    return request


def become(request: dict[str, Any]) -> list[str]:
    """Take the rank's environment, directory and import path; returns the bootstrap's arguments."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    wanted = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = ["", *wanted, *(entry for entry in sys.path[1:] if entry not in wanted)]  # as a fresh interpreter orders them
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # a rank's stdin is /dev/null, as a cold start's
    os.close(devnull)
    return list(request["argv"][3:])


def warm_up(torch: Any) -> None:
    """What a script's first optimizer pulls in lazily (torch._dynamo, sympy: seconds), without touching
    the random generator: a script that relies on torch's default seed draws the same numbers."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


def main() -> None:
    die_with_parent(signal.SIGKILL, os.environ.get(PARENT_PID_ENV))  # never outlive the runtime that keeps it
    import torch  # noqa: F401 - the point of a spare
    import torch.distributed  # noqa: F401

    import smddp_sdk.collectives  # noqa: F401 - registers smddp, as the scripts' imports would

    warm_up(torch)
    ready = int(os.environ.pop(READY_FD_ENV, "-1"))
    if ready >= 0:
        os.write(ready, b"1")
        os.close(ready)
    request = read_request(sys.stdin.buffer)
    if request is None:
        os._exit(0)
    argv = become(request)
    os.umask(RANK_UMASK)  # as a rank started cold (runtime/procs.py)
    take_thread_count(torch, os.environ)
    bootstrap.exit_without_teardown(bootstrap.main(argv))


def take_thread_count(torch: Any, environ: Mapping[str, str]) -> None:
    """The rank's OMP_NUM_THREADS, which torch read at import from the runtime's environment: a cold rank
    uses it, and a different thread count changes how reductions are split, so the results' last bits."""
    wanted = environ.get("OMP_NUM_THREADS", "")
    if wanted.isdigit() and int(wanted) > 0 and torch.get_num_threads() != int(wanted):
        torch.set_num_threads(int(wanted))


if __name__ == "__main__":
    main()
