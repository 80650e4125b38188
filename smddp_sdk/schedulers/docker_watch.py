"""Ends a docker job whose owner went away: ``python -m smddp_sdk.schedulers.docker_watch <job_root> <job> <owner_pid> [docker]``.

An attached job (``fit(wait=True)``, ``smddp-launch`` without ``--detach``) belongs to the process that
started it. Containers outlive a process killed without warning (SIGKILL, a closed notebook), so the
docker scheduler starts this small watcher in a session of its own: it cancels the job once the owner is
gone, and exits as soon as the owner's ``wait`` has saved the job's result (or its containers are gone).
"""

from __future__ import annotations

import sys
import time

from smddp_sdk.schedulers.docker import RESULT_FILE, DockerScheduler
from smddp_sdk.schedulers.local_job import pid_alive
from smddp_sdk.specs.status import JobHandle

POLL_SECONDS = 2.0


def watch(scheduler: DockerScheduler, handle: JobHandle, owner_pid: int, poll: float = POLL_SECONDS) -> str:
    """Block until the job's containers are gone; cancel it first if the owner dies. Says what happened."""
    result = scheduler.job_root / handle.job_id / RESULT_FILE  # saved by the owner's wait, or a cancel
    while scheduler._inspect(handle.job_id) and not result.exists():
        if not pid_alive(owner_pid):
            scheduler.cancel(handle)  # stops a running job; saves and removes a finished one
            return f"owner {owner_pid} is gone: {handle} cancelled and removed"
        time.sleep(poll)
    return f"{handle} finished and was saved by its owner"


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    job_root, job_name, owner = argv[:3]
    scheduler = DockerScheduler(job_root=job_root, docker=argv[3] if len(argv) == 4 else "docker")
    print(watch(scheduler, JobHandle(scheduler.name, job_name), int(owner)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
