"""The Slurm commands the scheduler uses (sbatch, scontrol, sacct, scancel), run through subprocess.

One small class, injected into the scheduler so unit tests can hand it a fake; everything it returns
is plain data. Clusters without accounting have no ``sacct``: ``job_info`` asks ``scontrol`` first (it
knows a job until ``MinJobAge`` after its end) and ``sacct`` only when ``scontrol`` has forgotten it.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from smddp_sdk.errors import SpecError, SpecIssue, UnavailableError
from smddp_sdk.specs.slurm_job import scontrol_records

CLUSTER_HINT = 'run this on a machine where sbatch works (the cluster\'s login or head node); for a local test cluster, as root in a smddp-sdk checkout: eval "$(scripts/slurm-cluster.sh start)"'
# Pending reasons that never clear by themselves: the request exceeds what the partition has or allows.
NEVER_STARTS = ("PartitionNodeLimit", "PartitionConfig", "BadConstraints", "PartitionTimeLimit", "AccountNotAllowed", "InvalidAccount", "InvalidQOS")


@dataclass(frozen=True)
class JobInfo:
    """What Slurm says about one job (states as Slurm spells them: PENDING, RUNNING, NODE_FAIL, ...)."""

    state: str
    reason: str = ""
    nodes: str = ""
    exit_code: int | None = None
    signal: int | None = None
    restarts: int = 0


class SlurmClient:
    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout, check=False)
        except FileNotFoundError:
            raise UnavailableError(f"{argv[0]} is not installed here; {CLUSTER_HINT}") from None
        except subprocess.TimeoutExpired:
            raise UnavailableError(f"{argv[0]} did not answer within {self.timeout:.0f} s; is slurmctld up? (scontrol ping)") from None

    def check(self, script: Path) -> None:
        """Whether the cluster could ever run ``script`` (sbatch --test-only): a clear error, not a job pending forever."""
        proc = self._run("sbatch", "--test-only", str(script))
        if proc.returncode != 0:
            raise SpecError(refusal_issue(_error_text(proc)))

    def submit(self, script: Path) -> str:
        proc = self._run("sbatch", "--parsable", str(script))
        if proc.returncode != 0:
            raise UnavailableError(f"sbatch failed: {_error_text(proc)}")
        return proc.stdout.strip().split(";")[0]

    def job_info(self, job_id: str) -> JobInfo | None:
        """The job's state from scontrol, else sacct; None when neither knows it any more."""
        proc = self._run("scontrol", "show", "job", "-o", job_id)
        if proc.returncode == 0 and proc.stdout.strip():
            return _from_scontrol(proc.stdout)
        if "Invalid job id" not in proc.stderr and proc.returncode != 0:
            raise UnavailableError(f"scontrol show job {job_id} failed: {_error_text(proc)}")
        return self._from_sacct(job_id)

    def _from_sacct(self, job_id: str) -> JobInfo | None:
        try:
            proc = self._run("sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,Reason,NodeList,ExitCode")
        except UnavailableError:
            return None
        line = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else ""
        if not line:
            return None  # no accounting (sacct exits 1), or a job it never saw
        state, reason, nodes, exit_code = (line.split("|") + ["", "", "", ""])[:4]
        code, signal = _exit_code(exit_code)
        return JobInfo(state.split()[0], reason, nodes, code, signal)

    def cancel(self, job_id: str) -> None:
        proc = self._run("scancel", job_id)
        if proc.returncode != 0 and "Invalid job id" not in proc.stderr and "already completing" not in proc.stderr:
            raise UnavailableError(f"scancel {job_id} failed: {_error_text(proc)}")


# What sbatch's refusal is about (its words) -> the setting to change and how.
_REFUSALS = (
    ("partition", "scheduler_options.partition", "name a partition the cluster has (sinfo -s lists them), or leave it unset for the default one"),
    ("account", "scheduler_options.account", "name an account you may use (sacctmgr show assoc user=$USER), or leave it unset"),
    ("qos", "scheduler_options.extra_sbatch", "ask for a QOS you may use (sacctmgr show assoc user=$USER)"),
    ("time limit", "max_run", "ask for at most the partition's time limit (sinfo -o '%P %l')"),
)


def refusal_issue(error: str) -> SpecIssue:
    """sbatch --test-only's refusal, on the setting it is about (node counts when it names none)."""
    lowered = error.lower()
    path, hint = next(((path, hint) for word, path, hint in _REFUSALS if word in lowered),
                      ("instance_count", "ask for fewer nodes (sinfo lists what each partition has)"))
    return SpecIssue(path, f"Slurm cannot run this job: {error}", hint)


def _from_scontrol(text: str) -> JobInfo:
    fields = scontrol_records(text)[0]
    code, signal = _exit_code(fields.get("ExitCode", ""))
    nodes = fields.get("NodeList", "")
    return JobInfo(fields.get("JobState", "UNKNOWN"), fields.get("Reason", "None"), "" if nodes == "(null)" else nodes, code, signal, int(fields.get("Restarts", "0") or 0))


def _exit_code(text: str) -> tuple[int | None, int | None]:
    """Slurm's ``code:signal``."""
    code, _, signal = text.partition(":")
    try:
        return int(code), int(signal or 0) or None
    except ValueError:
        return None, None


def _error_text(proc: subprocess.CompletedProcess[str]) -> str:
    text = (proc.stderr or proc.stdout or "").strip()
    return " ".join(line.removeprefix("sbatch: error: ").strip() for line in text.splitlines()) or f"exit code {proc.returncode}"
