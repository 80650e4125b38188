"""A live job to attack: 2 simulated hosts x 2 ranks started by the node runtime as the local scheduler
starts them (a random SMDDP_JOB_TOKEN per job, from which each runtime derives the mesh secret it hands
its ranks; nothing of it in the store), running scripts/trusted_mesh.py, with an attacker running as
``nobody`` beside it (unprivileged.py)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from smddp_sdk.specs import contract
from tests.hostile.unprivileged import start_as_nobody
from tests.integration.runtime_job import make_job, wait_all

SCRIPTS = Path(__file__).parent / "scripts"
SHM = Path("/dev/shm")
KEY_PREFIX = "default_pg/0//cpu//smddp/"  # the default group's smddp keys, as a store client names them
JOB_TIMEOUT_S = 180  # well inside torch's 30-minute process-group timeout: a hang shows as a failure here
RANKS = 4


@dataclass
class Outcome:
    """What the job and the attacker did."""

    results: dict[str, tuple[int, str]]
    reports: list[dict]
    attacker: str
    store: str  # the rendezvous store's address, as the job's errors name it
    seconds: float

    @property
    def output(self) -> str:
        return "\n".join(out for _, out in self.results.values())

    def succeeded_correctly(self) -> bool:
        codes = [code for code, _ in self.results.values()]
        return codes == [0, 0] and len(self.reports) == RANKS and all(all(r["ok"].values()) for r in self.reports)

    def failed(self) -> bool:
        return all(code != 0 for code, _ in self.results.values())


def shm_entries() -> set[str]:
    return set(os.listdir(SHM))


def left_in_shm(before: set[str]) -> set[str]:
    """Entries of /dev/shm that were not there before and still are a moment later (other jobs' arenas
    on this machine live for milliseconds; a leak stays)."""
    new = shm_entries() - before
    if new:
        time.sleep(2)
    return new & shm_entries()


def run_attacked_job(tmp_path: Path, attack: str, *attack_args: str) -> Outcome:
    """Start the attacker (it gets the store's port, then attack_args; it prints 'ready' once set up),
    then the job; wait for the job, then stop the attacker and collect what it printed."""
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(SCRIPTS / "trusted_mesh.py", code / "train.py")
    job = make_job(tmp_path / "job", code, ["algo-1", "algo-2"], {"sagemaker_distributed_dataparallel_enabled": True}, num_gpus=2)
    port = job.env[contract.MASTER_PORT_ENV]
    attacker = start_as_nobody(attack, port, *attack_args)
    assert attacker.stdout is not None
    preamble = []  # what it says while it sets up
    while (line := attacker.stdout.readline()) != "ready\n":
        assert line, "the attacker stopped before it was ready: " + "".join(preamble) + attacker.communicate(timeout=10)[1]
        preamble.append(line)
    started = time.monotonic()
    try:
        results = wait_all(job.start({contract.JOB_TOKEN_ENV: secrets.token_hex(16)}), timeout=JOB_TIMEOUT_S)
    finally:
        attacker.terminate()
    try:
        seen, errors = attacker.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        attacker.kill()
        seen, errors = attacker.communicate()
    reports = [json.loads(p.read_text()) for p in sorted((tmp_path / "job").rglob("trusted-mesh-*.json"))]
    assert "Traceback" not in errors, errors  # the attack itself ran as written
    return Outcome(results, reports, "".join(preamble) + seen, f"127.0.0.1:{port}", time.monotonic() - started)
