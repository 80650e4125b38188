"""Time from a fault to training again, for a local job retried from its checkpoints: cold and warm.

    python benchmarks/resume_bench.py --repeats 3
    python benchmarks/resume_bench.py --repeats 3 --docker smddp-sdk:<version>   # containers (a running engine)

Each repeat runs ``tests/faults/scripts/resume_train.py`` (2 hosts x 2 ranks, torch on CPU, a checkpoint
per epoch) as a managed spot job with ``max_retry_attempts=1`` twice: with today's restart (every host's
runtime and ranks start cold) and with ``warm_restart`` (a standby runtime per host, its ranks and the
store helper started ahead with torch imported). Each run injects two faults: algo-2's runtime
is SIGKILLed once epoch 2 is checkpointed (a lost host: the job is retried), then algo-2's instance is
reclaimed (``interrupt``) once the second attempt has checkpointed an epoch of its own (and, warm, once
the supervisor says its new standbys are ready: ``standbys_ready`` in state.json; a fault in their first
seconds finds them still importing torch). Both runs end bitwise equal to a straight run. Measured per fault:
seconds from the fault until the script prints that it resumed ("starting at epoch N from epoch-M.pt"),
which spans stopping the hosts, the last checkpoint sync, archiving the attempt, restoring the checkpoints,
starting the runtimes, importing torch and joining the process group. Reported: median and max over
repeats (the machine is shared, so single runs are noisy; give ``uptime`` with the figures). With
``--docker IMAGE`` the hosts are containers of that image (``gpus: none``): the first fault kills algo-2's
container, and warm restarts wake standby containers.

``run_interrupted`` and ``run_straight`` are also the proof in ``tests/faults/test_resume.py``.

    python benchmarks/resume_bench.py --survivors --repeats 3

Recovery without a checkpoint instead: ``examples/checkpointless`` (2 hosts x 2 ranks, smddp's DDP, 60 steps
of 0.1 s pause), algo-2's runtime SIGKILLed once rank 0 has done step 20, in three ways per repeat: the
survivors stay up (``survive_host_loss`` and ``warm_restart``: algo-2 replaced alone, the group re-formed),
a warm restart of every host and a cold one (the survivors' snapshots restored from a peer). Measured: from
the fault until a step completes again (the earliest ``first_step`` after it in the hosts' ``events.jsonl``);
every run ends bitwise equal to a straight run.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from smddp_sdk.schedulers.docker import DockerScheduler  # noqa: E402
from smddp_sdk.schedulers.hosttree.attempts import Interruption  # noqa: E402
from smddp_sdk.schedulers.hosttree.jobs import HostTreeScheduler  # noqa: E402
from smddp_sdk.schedulers.local import LocalScheduler  # noqa: E402
from smddp_sdk.specs import events  # noqa: E402
from smddp_sdk.specs.job import JobSpec  # noqa: E402
from smddp_sdk.specs.status import JobHandle, JobState, JobStatus  # noqa: E402

SCRIPTS = ROOT / "tests" / "faults" / "scripts"
CHECKPOINTLESS = ROOT / "examples" / "checkpointless"
SURVIVOR_KINDS = ("survivors", "warm", "cold")
TIMEOUT = 900.0  # a loaded machine: standbys may take minutes to import torch beside the training
RESUMED = re.compile(r"rank 0: starting at epoch (\d+) from epoch-\d+\.pt")


@dataclass(frozen=True)
class Run:
    status: JobStatus
    params: bytes  # model/params.pt as the job saved it
    resumed_at: tuple[int, ...]  # the epoch each retry resumed at
    seconds_to_training: tuple[float, ...]  # per fault: until the script resumed
    phases: tuple[tuple[float, float, float], ...] = ()  # per fault: hosts stopped and synced, relaunched, script resumed (events.jsonl)


def run_straight(workdir: Path, epochs: int = 10, scheduler: HostTreeScheduler | None = None) -> Run:
    scheduler, handle = _submit(scheduler or local_scheduler(workdir), workdir, "straight", epochs)
    return _finish(scheduler, handle, ())


def run_interrupted(workdir: Path, epochs: int = 10, scheduler: HostTreeScheduler | None = None, *, warm: bool = False) -> Run:
    """Kill algo-2's runtime after epoch 2, then interrupt algo-2 once the retry has checkpointed."""
    scheduler, handle = _submit(scheduler or local_scheduler(workdir), workdir, "interrupted", epochs)
    job_dir = scheduler.job_root / handle.job_id
    checkpoints = job_dir / "algo-1" / "checkpoints"
    _wait(lambda: (checkpoints / "epoch-2.pt").exists(), "epoch 2 checkpointed")
    killed = time.time()
    _kill_runtime(_state(job_dir)["hosts"]["algo-2"])
    first = _wait_resumed(job_dir, 1)
    _wait(lambda: any(path.stat().st_mtime > first for path in checkpoints.glob("epoch-*.pt")), "an epoch checkpointed by the retry")
    if warm:
        _wait(lambda: _state(job_dir).get("standbys_ready") is not None, "the next attempt's standbys")
    interrupted = time.time()
    scheduler.interrupt(handle, Interruption("algo-2"))
    second = _wait_resumed(job_dir, 2)
    run = _finish(scheduler, handle, (first - killed, second - interrupted))
    return replace(run, phases=_phases(job_dir, ((killed, first), (interrupted, second))))


def _phases(job_dir: Path, faults: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float, float], ...]:
    """Split each fault-to-training span at the supervisor's recovery events: ``restart`` (every host
    stopped, the last checkpoint pass done), then ``hosts_started`` (archived, restored, relaunched)."""
    recorded = events.read(job_dir / events.FILE_NAME)
    restarts = [e["time"] for e in recorded if e["event"] == events.RESTART]
    relaunches = [e["time"] for e in recorded if e["event"] == events.HOSTS_STARTED][1:]
    return tuple((stop - fault, relaunch - stop, resumed - relaunch) for (fault, resumed), stop, relaunch in zip(faults, restarts, relaunches))


def local_scheduler(workdir: Path, ranks: int = 1, warm: bool = False) -> LocalScheduler:
    return LocalScheduler(job_root=workdir / "jobs", processes_per_host=ranks, stop_grace_period=3, warm_restart=warm)


def docker_scheduler(workdir: Path, image: str, ranks: int = 1, warm: bool = False) -> DockerScheduler:
    return DockerScheduler(job_root=workdir / "jobs", image=image, processes_per_host=ranks, stop_grace_period=3, gpus="none", warm_restart=warm)


def _kill_runtime(host: dict[str, Any]) -> None:
    """SIGKILL a host's runtime: its process here, its container (whose first process it is) in docker mode."""
    if "container" in host:
        subprocess.run(["docker", "kill", "--signal", "KILL", host["container"]], check=True, capture_output=True, timeout=60)
    else:
        os.kill(int(host["pid"]), signal.SIGKILL)


def _submit(scheduler: HostTreeScheduler, workdir: Path, name: str, epochs: int) -> tuple[HostTreeScheduler, JobHandle]:
    spec = JobSpec.from_mapping(
        {
            "entry_point": "resume_train.py",
            "source_dir": str(SCRIPTS),
            "instance_type": "local",
            "instance_count": 2,
            "distribution": {"smdistributed": {"dataparallel": {"enabled": True}}},
            "job_name": f"resume-{name}",
            "checkpoint_s3_uri": f"file://{workdir / 'checkpoints' / name}",
            "max_retry_attempts": 1,
            "use_spot_instances": True,
            "max_run": 1800,  # a loaded machine
            "max_wait": 2400,
            "hyperparameters": {"epochs": epochs},
        }
    )
    return scheduler, scheduler.submit(spec)


def _finish(scheduler: HostTreeScheduler, handle: JobHandle, seconds: tuple[float, ...]) -> Run:
    _wait(lambda: scheduler.status(handle).state.is_terminal, "the job's end")
    status = scheduler.status(handle)
    log = "\n".join(line.text for line in scheduler.logs(handle))
    resumed = tuple(int(match) for match in RESUMED.findall(log))
    params = b""
    if status.state is JobState.SUCCEEDED and status.model_data:
        with tarfile.open(status.model_data) as archive:
            member = archive.extractfile("params.pt")
            params = member.read() if member is not None else b""
    return Run(status, params, resumed, seconds)


def _wait_resumed(job_dir: Path, count: int) -> float:
    """When the script had resumed ``count`` times (polled from the job's log)."""
    log = job_dir / "console.log"
    _wait(lambda: len(RESUMED.findall(log.read_text(errors="replace"))) >= count, f"resume {count}", poll=0.05)
    return time.time()


def _wait(condition: Any, what: str, poll: float = 0.1) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(poll)


def _state(job_dir: Path) -> dict[str, Any]:
    return json.loads((job_dir / "state.json").read_text())


def load_params(raw: bytes) -> dict[str, Any]:
    import torch

    return torch.load(io.BytesIO(raw))


def same_params(one: Run, other: Run) -> bool:
    """Bitwise: every tensor's bytes equal (the archive's own bytes may differ)."""
    if not one.params or not other.params:
        return False
    mine, theirs = load_params(one.params), load_params(other.params)
    return mine.keys() == theirs.keys() and all(mine[name].numpy().tobytes() == theirs[name].numpy().tobytes() for name in mine)


def checkpointless_spec(name: str, hyperparameters: dict[str, Any]) -> JobSpec:
    """``examples/checkpointless`` as a job of 2 hosts with one retry (this bench's and tests/faults' own)."""
    return JobSpec.from_mapping(
        {
            "entry_point": "train.py",
            "source_dir": str(CHECKPOINTLESS),
            "instance_type": "local",
            "instance_count": 2,
            "distribution": {"smdistributed": {"dataparallel": {"enabled": True}}},
            "job_name": name,
            "max_retry_attempts": 1,
            "max_run": 600,
            "hyperparameters": hyperparameters,
        }
    )


def run_checkpointless(workdir: Path, kind: str | None, steps: int = 60) -> Run:
    """The checkpointless example; with ``kind`` (one of SURVIVOR_KINDS), algo-2's runtime SIGKILLed after step 20."""
    scheduler = LocalScheduler(job_root=workdir / "jobs", processes_per_host=2, stop_grace_period=3,
                               warm_restart=kind in ("survivors", "warm"), survive_host_loss=kind == "survivors")
    spec = checkpointless_spec(f"checkpointless-{kind or 'straight'}", {"steps": steps, "pause": 0.1, "ddp": "smddp"})
    handle = scheduler.submit(spec)
    job_dir = scheduler.job_root / handle.job_id
    if kind is None:
        return _finish(scheduler, handle, ())
    done = re.compile(r"rank 0: step (\d+) done")
    _wait(lambda: any(int(step) >= 20 for step in done.findall(_log_text(job_dir))), "step 20", poll=0.05)
    killed = time.time()
    _kill_runtime(_state(job_dir)["hosts"]["algo-2"])
    _wait(lambda: _stepped_since(job_dir, killed) is not None, "a step done after the fault", poll=0.05)
    return _finish(scheduler, handle, (_stepped_since(job_dir, killed) - killed,))


def _log_text(job_dir: Path) -> str:
    try:
        return (job_dir / "console.log").read_text(errors="replace")
    except FileNotFoundError:  # not written yet
        return ""


def _stepped_since(job_dir: Path, since: float) -> float | None:
    """The earliest ``first_step`` any rank recorded after ``since`` (this attempt's hosts' events)."""
    times = [e["time"] for path in job_dir.glob("*/output/" + events.FILE_NAME) for e in events.read(path) if e["event"] == events.FIRST_STEP and e["time"] > since]
    return min(times, default=None)


def survivors_main(repeats: int) -> int:
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        straight = run_checkpointless(Path(tmp), None)
    if straight.status.state is not JobState.SUCCEEDED:
        print(f"the straight run ended {straight.status.state.value}: {straight.status.message}", file=sys.stderr)
        return 1
    results: dict[str, list[float]] = {kind: [] for kind in SURVIVOR_KINDS}
    for repeat in range(repeats):
        for kind in SURVIVOR_KINDS:
            with tempfile.TemporaryDirectory() as tmp:
                run = run_checkpointless(Path(tmp), kind)
            loads.append(os.getloadavg()[0])
            if run.status.state is not JobState.SUCCEEDED or not same_params(run, straight):
                problem = run.status.message if run.status.state is not JobState.SUCCEEDED else "its parameters differ from the straight run's"
                print(f"repeat {repeat} ({kind}): the job ended {run.status.state.value}: {problem}", file=sys.stderr)
                return 1
            results[kind].append(run.seconds_to_training[0])
            print(f"repeat {repeat} ({kind}): runtime SIGKILL -> a step done again {run.seconds_to_training[0]:.2f} s (equal to the straight run)", flush=True)
    for kind, values in results.items():
        print(f"{kind}: runtime SIGKILL -> a step done again: median {statistics.median(values):.2f} s, max {max(values):.2f} s ({len(values)} runs)")
    print(f"load: median {statistics.median(loads):.1f}, max {max(loads):.1f} (1-minute average at the end of each run)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2, help="ranks per host (2 hosts)")
    parser.add_argument("--survivors", action="store_true", help="recovery without a checkpoint: survivors staying up vs warm vs cold restart")
    parser.add_argument("--docker", metavar="IMAGE", help="run the hosts as containers of IMAGE (docker mode) instead of local processes")
    args = parser.parse_args()
    if args.survivors and args.docker:
        parser.error("--survivors measures local jobs only (survive_host_loss is a local option): leave out --docker")
    if args.survivors:
        return survivors_main(args.repeats)

    def scheduler(workdir: Path, warm: bool = False) -> HostTreeScheduler:
        if args.docker:
            return docker_scheduler(workdir, args.docker, args.ranks, warm)
        return local_scheduler(workdir, args.ranks, warm)

    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        straight = run_straight(Path(tmp), scheduler=scheduler(Path(tmp)))
    if straight.status.state is not JobState.SUCCEEDED:
        print(f"the straight run ended {straight.status.state.value}: {straight.status.message}", file=sys.stderr)
        return 1
    results: dict[str, list[Run]] = {"cold": [], "warm": []}
    for repeat in range(args.repeats):
        for kind, runs in results.items():
            with tempfile.TemporaryDirectory() as tmp:
                run = run_interrupted(Path(tmp), scheduler=scheduler(Path(tmp), warm=kind == "warm"), warm=kind == "warm")
            loads.append(os.getloadavg()[0])
            if run.status.state is not JobState.SUCCEEDED or not same_params(run, straight):
                problem = run.status.message if run.status.state is not JobState.SUCCEEDED else "its parameters differ from the straight run's"
                print(f"repeat {repeat} ({kind}): the job ended {run.status.state.value}: {problem}", file=sys.stderr)
                return 1
            runs.append(run)
            kill, interrupt = run.seconds_to_training
            print(f"repeat {repeat} ({kind}): {'container' if args.docker else 'runtime'} SIGKILL -> training {kill:.1f} s; interruption -> training {interrupt:.1f} s (equal to the straight run)", flush=True)
    for kind, runs in results.items():
        for index, name in enumerate((f"{'container' if args.docker else 'runtime'} SIGKILL", "spot interruption")):
            values = [run.seconds_to_training[index] for run in runs]
            print(f"{kind}: {name} -> training again: median {statistics.median(values):.1f} s, max {max(values):.1f} s ({len(values)} runs)")
        phases = [phase for run in runs for phase in run.phases]
        for index, name in enumerate(("hosts stopped and checkpoints synced", "archived, restored, hosts relaunched", "script resumed (import, process group, load)")):
            print(f"  {name}: median {statistics.median(p[index] for p in phases):.1f} s")
    print(f"load: median {statistics.median(loads):.1f}, max {max(loads):.1f} (1-minute average at the end of each run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
