"""The one wrapper of the docker CLI (through subprocess: no compose, no Docker SDK) and the labels
docker jobs carry, so status, cancel and cleanup find their containers and networks from any process."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Collection, Mapping
from pathlib import Path

from smddp_sdk.errors import UnavailableError

LABEL_JOB = "ai.smddp.job"
LABEL_HOST = "ai.smddp.host"
LABEL_JOB_DIR = "ai.smddp.job-dir"
ENGINE_HINT = 'start Docker (sudo systemctl start docker), or as root in a smddp-sdk checkout: eval "$(scripts/docker-engine.sh start)"; point DOCKER_HOST at a running engine otherwise'


def run(docker: str, *args: str, check: bool = True, timeout: float = 120, env: Mapping[str, str] | None = None) -> str:
    """One docker CLI command's output. With ``check``, trouble becomes an UnavailableError that says
    what failed and how to fix the engine; without, a failed or silent command gives what it printed.
    ``env`` is added to the client's environment: secrets go there (``-e NAME`` takes its value from
    it), never into ``args``, which every local user can read in /proc/*/cmdline."""
    client_env = {**os.environ, **env} if env is not None else None
    try:
        proc = subprocess.run([docker, *args], capture_output=True, text=True, errors="replace", timeout=timeout, check=False, env=client_env)
    except FileNotFoundError:
        raise UnavailableError(f"the docker CLI ({docker!r}) is not installed; install Docker, then {ENGINE_HINT}") from None
    except subprocess.TimeoutExpired:
        if check:
            raise UnavailableError(f"docker {args[0]} did not answer within {timeout:.0f} s; is the engine healthy? ({ENGINE_HINT})") from None
        return ""
    if check and proc.returncode != 0:
        error = (proc.stderr or proc.stdout or "").strip()
        if "Cannot connect to the Docker daemon" in error or "error during connect" in error:
            raise UnavailableError(f"no Docker engine answers ({error.splitlines()[-1]}); {ENGINE_HINT}")
        raise UnavailableError(f"docker {' '.join(args[:2])} failed: {error}")
    return proc.stdout or ""


def remove_job(docker: str, job: str, sparing: Collection[str] = ()) -> None:
    """Remove every container and network of ``job`` (by label) but those named in ``sparing``; nothing to do is fine."""
    label = f"label={LABEL_JOB}={job}"
    names = [name for name in run(docker, "ps", "-a", "--filter", label, "--format", "{{.Names}}", check=False).split() if name not in sparing]
    if names:
        run(docker, "rm", "-f", *names, check=False)
    networks = [name for name in run(docker, "network", "ls", "--filter", label, "--format", "{{.Name}}", check=False).split() if name not in sparing]
    if networks:
        run(docker, "network", "rm", *networks, check=False)


def leftovers(docker: str, job_root: Path, removed: set[str]) -> dict[str, list[str]]:
    """Stopped containers, and networks without running containers, of jobs from ``job_root`` whose
    directory is gone or in ``removed``. Other job roots' containers (another user's, a test's) are left alone."""
    if shutil.which(docker) is None:
        return {}
    template = f'{{{{.ID}}}} {{{{.State}}}} {{{{.Label "{LABEL_JOB}"}}}} {{{{.Label "{LABEL_JOB_DIR}"}}}}'
    rows = [line.split(" ", 3) for line in run(docker, "ps", "-a", "--filter", f"label={LABEL_JOB}", "--format", template, check=False).splitlines()]
    mine = [row for row in rows if len(row) == 4 and Path(row[3]).parent == job_root]
    gone = {row[2] for row in mine if row[2] in removed or not Path(row[3]).is_dir()}
    containers = [row[0] for row in mine if row[2] in gone and row[1] in ("exited", "created", "dead")]
    live_jobs = {row[2] for row in rows if len(row) == 4 and row[1] == "running"}
    listed = run(docker, "network", "ls", "--filter", f"label={LABEL_JOB}", "--format", f'{{{{.ID}}}} {{{{.Label "{LABEL_JOB}"}}}}', check=False)
    networks = [item[0] for item in (line.split(" ", 1) for line in listed.splitlines()) if len(item) == 2 and item[1] in gone and item[1] not in live_jobs]
    return {"container": containers, "network": networks}


def remove_leftovers(docker: str, found: dict[str, list[str]]) -> None:
    if found.get("container"):
        run(docker, "rm", "-f", *found["container"], check=False)
    if found.get("network"):
        run(docker, "network", "rm", *found["network"], check=False)
