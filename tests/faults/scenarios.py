"""Faults injected into running local jobs (2 hosts x 2 ranks, smddp collectives), and what they leave.

Each scenario starts a real job, injects one fault, then measures the seconds from the fault until every
process of the job is gone, and reads the root cause the job reported. Run as a module for figures:

    python -m tests.faults.scenarios --repeat 5            # every scenario, 5 times: median seconds
    python -m tests.faults.scenarios --only hang_outside   # one scenario

``tests/faults/test_faults.py`` runs each once under pytest (marker ``faults``) and asserts the culprit
and that nothing is left: no process, no listening port, no scratch directory, no shared-memory file.

How a hang is detected: by the process-group timeout (``init_process_group(timeout=...)``, 4 s here).
The peers' collectives time out naming the rank they waited for, the runtime stops the job, and the
root-cause rule (``specs.failure.decide``) names that rank although it wrote no error file.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from smddp_sdk.schedulers.local import LocalScheduler
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobHandle, JobState, JobStatus

SCRIPTS = Path(__file__).resolve().parent / "scripts"
PG_TIMEOUT = 4.0  # seconds: the hang detector
START_TIMEOUT = 180.0  # four torch ranks on a loaded machine
GONE_TIMEOUT = 60.0
LINGER_MAX_RUN = 40  # seconds: long enough for four torch ranks to start on a loaded machine


@dataclass(frozen=True)
class Scenario:
    name: str
    expect_state: JobState
    expect_root: tuple[str, int | None] | None  # (host, rank); rank None: the host's runtime
    fault: str = "none"  # done by a rank itself (see scripts/train.py)
    victim: int = -1
    external: Callable[[Path, dict], None] | None = None  # done from outside once every rank trains
    cancel: bool = False
    expect_message: tuple[str, ...] = ()  # each in the job's status message
    steps: int = 1_000_000  # all-reduces each rank makes before it leaves the group
    max_run: int = 600  # below 600: the fault is max_run passing (time counted from then)


@dataclass
class Outcome:
    scenario: str
    state: str
    root: tuple[str, int | None] | None
    message: str
    seconds_to_gone: float
    leftovers: list[str] = field(default_factory=list)
    missing_archives: list[str] = field(default_factory=list)  # every ended job gets both, however it ended


def _kill_supervisor(job_dir: Path, state: dict) -> None:
    os.kill(int(state["supervisor_pid"]), signal.SIGKILL)


def _freeze_supervisor(job_dir: Path, state: dict) -> None:
    os.kill(int(state["supervisor_pid"]), signal.SIGSTOP)


def _kill_runtime(host: str) -> Callable[[Path, dict], None]:
    def kill(job_dir: Path, state: dict) -> None:
        os.kill(int(state["hosts"][host]["pid"]), signal.SIGKILL)

    return kill


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("sigkill_supervisor", JobState.FAILED, None, external=_kill_supervisor),
        Scenario("sigkill_rank", JobState.FAILED, ("algo-2", 3), fault="sigkill_rank", victim=3),
        Scenario("kill_runtime_algo2", JobState.FAILED, ("algo-2", None), external=_kill_runtime("algo-2")),
        Scenario("kill_master_runtime", JobState.FAILED, ("algo-1", None), external=_kill_runtime("algo-1")),
        Scenario("kill_master_runtime_quiet", JobState.FAILED, ("algo-1", None), fault="quiet", external=_kill_runtime("algo-1")),
        Scenario("hang_in_collective", JobState.FAILED, ("algo-2", 2), fault="hang_in_collective", victim=2),
        Scenario("hang_outside", JobState.FAILED, ("algo-1", 1), fault="hang_outside", victim=1),
        Scenario("exit0_early", JobState.FAILED, ("algo-1", 1), fault="exit0_early", victim=1),
        # The others finished; rank 1 sleeps outside any collective until max_run ends the job, which names it.
        Scenario("linger_until_max_run", JobState.FAILED, ("algo-1", 1), fault="linger", victim=1, steps=20, max_run=LINGER_MAX_RUN,
                 expect_message=(f"max_run={LINGER_MAX_RUN} seconds; still running: algo-1/rank1 in linger_after_training (train.py:",)),
        Scenario("frozen_supervisor_cancel", JobState.CANCELLED, None, external=_freeze_supervisor, cancel=True),
        # algo-2's ranks call another collective than algo-1's at step 5: call #6, after one all_reduce per step
        *(Scenario(f"mismatch_between_hosts_{how}", JobState.FAILED, None, fault=f"mismatch_{how}", victim=2,
                   expect_message=("collective mismatch between hosts", f"(host algo-2) called {theirs}"))
          for how, theirs in (
              ("reduce_op", "all_reduce #6 (MAX, float32, 1000 elements)"),
              ("dtype", "all_reduce #6 (SUM, int32, 1000 elements)"),
              ("size", "all_reduce #6 (SUM, float32, 2000 elements)"),
              ("op", "all_gather #6 (float32, 1000 elements)"),
              ("count", "destroy_process_group #6"),
          )),
    )
}


def run(scenario: Scenario, workdir: Path) -> Outcome:
    """Start the job, inject the fault, wait until every process is gone; report what was left."""
    ready = workdir / "ready"
    ready.mkdir(parents=True, exist_ok=True)
    source = workdir / "src"
    shutil.copytree(SCRIPTS, source, dirs_exist_ok=True)
    scheduler = LocalScheduler(job_root=workdir / "jobs", processes_per_host=2, stop_grace_period=3)
    spec = JobSpec.from_mapping({
        "entry_point": "train.py", "source_dir": str(source), "instance_type": "local", "instance_count": 2,
        "distribution": {"smdistributed": {"dataparallel": {"enabled": True}}}, "job_name": "fault-" + scenario.name.replace("_", "-"),
        "max_run": scenario.max_run,
        # A 4 s process-group timeout would count rank 0's start on a loaded machine: rank 0 serves the store.
        "environment": {"SMDDP_RUNTIME_STORE": "0"},
        "hyperparameters": {"fault": scenario.fault, "victim": scenario.victim, "ready": str(ready), "pg-timeout": PG_TIMEOUT, "steps": scenario.steps},
    })
    handle = scheduler.submit(spec)
    job_dir = workdir / "jobs" / handle.job_id
    try:
        _wait_for_ranks(scheduler, handle, ready)
        state = _read_state(job_dir)
        started = time.time()
        if scenario.external is not None:
            scenario.external(job_dir, state)
        if scenario.cancel:
            scheduler.cancel(handle)
        gone_at = _wait_until_gone(scheduler, handle, job_dir)
        injected = _injection_time(job_dir) if scenario.external is None else started
        if scenario.max_run < 600:  # the fault is max_run passing
            injected = state["started"] + scenario.max_run
        status = scheduler.status(handle)
        return Outcome(scenario.name, status.state.value, _root(status), status.message, gone_at - injected, leftovers(job_dir, state),
                       missing_archives(status))
    finally:
        _sweep(job_dir)


def _wait_for_ranks(scheduler: LocalScheduler, handle: JobHandle, ready: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while len(list(ready.glob("rank-*"))) < 4 or time.time() - max(float(p.read_text() or 0) for p in ready.glob("rank-*")) < 0.5:
        status = scheduler.status(handle)
        if status.state.is_terminal:
            if len(list(ready.glob("rank-*"))) == 4:
                return  # every rank trained, and the script's own fault (two steps later) ended the job already
            raise RuntimeError(f"the job ended before every rank trained: {status.state.value} {status.message}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the ranks did not start within {START_TIMEOUT:.0f} s")
        time.sleep(0.1)


def _wait_until_gone(scheduler: LocalScheduler, handle: JobHandle, job_dir: Path) -> float:
    """When the last process of the job went away (the state is settled by then, or shortly after)."""
    deadline = time.monotonic() + GONE_TIMEOUT
    while job_processes(job_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = time.time()
    while not scheduler.status(handle).state.is_terminal and time.monotonic() < deadline:
        time.sleep(0.1)
    return gone


def _injection_time(job_dir: Path) -> float:
    text = (job_dir / "console.log").read_text(errors="replace")
    found = re.search(r"injecting \w+ at (\d+\.\d+)", text)
    return float(found.group(1)) if found else time.time()


def _root(status: JobStatus) -> tuple[str, int | None] | None:
    return (status.failure.host, status.failure.rank) if status.failure is not None else None


def _read_state(job_dir: Path) -> dict:
    import json

    return json.loads((job_dir / "state.json").read_text())


# --- what a job leaves behind ---------------------------------------------------------------------------


def job_processes(job_dir: Path) -> list[int]:
    """Live processes whose command line or environment names the job directory (supervisor, runtimes,
    ranks and their children all do)."""
    marker = str(job_dir).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z":
                continue
            if marker in (entry / "cmdline").read_bytes() or marker in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def missing_archives(status: JobStatus) -> list[str]:
    """The archives a job that ended lacks: SageMaker uploads what a failed or stopped job wrote."""
    archives = {"model.tar.gz": status.model_data, "output.tar.gz": status.output_data}
    return [name for name, path in archives.items() if not path or not Path(path).is_file()]


def leftovers(job_dir: Path, state: dict) -> list[str]:
    left = [f"process {pid}" for pid in job_processes(job_dir)]
    listening = _listening_ports()
    left += [f"port {port} still listening" for port in (state.get("ports") or {}).values() if int(port) in listening]
    if (job_dir / "scratch").exists():
        left.append(f"scratch directory {job_dir / 'scratch'}")
    for host in (state.get("hosts") or {}).values():
        left += [f"temp directory {path}" for path in Path(tempfile.gettempdir()).glob(f"smddp-runtime-{host.get('pid')}-*")]
    return left


def _listening_ports() -> set[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _sweep(job_dir: Path) -> None:
    """Whatever a failing scenario left running is killed (and SIGCONT'ed first if it was frozen)."""
    for pid in job_processes(job_dir):
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS))
    args = parser.parse_args(argv)
    names = args.only or list(SCENARIOS)
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} on {os.cpu_count()} CPUs", flush=True)
    print(f"{'scenario':<26} {'median s':>9} {'max s':>7}  root cause / state (every run)", flush=True)
    failed = False
    for name in names:
        outcomes = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="smddp-faults-") as workdir:
                outcomes.append(run(SCENARIOS[name], Path(workdir)))
        times = [o.seconds_to_gone for o in outcomes]
        roots = sorted({f"{o.state} {o.root}" for o in outcomes})
        ok = all(_as_expected(SCENARIOS[name], o) for o in outcomes)
        failed |= not ok
        left = sorted({item for o in outcomes for item in o.leftovers})
        print(f"{name:<26} {statistics.median(times):>9.2f} {max(times):>7.2f}  {'; '.join(roots)}{'' if ok else '  << UNEXPECTED'}"
              + (f"  LEFT: {left}" if left else ""), flush=True)
    return 1 if failed else 0


def _as_expected(scenario: Scenario, outcome: Outcome) -> bool:
    return outcome.state == scenario.expect_state.value and (scenario.expect_root is None or outcome.root == scenario.expect_root) and not outcome.leftovers and not outcome.missing_archives


if __name__ == "__main__":
    sys.exit(main())
