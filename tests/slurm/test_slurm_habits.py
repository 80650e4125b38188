"""What a first Slurm user meets, on a real cluster (scripts/slurm-cluster.sh): `stacks` of a running job
grouped by where each rank is; a cancel that never reads as a failure; a failure summary printed once
(by `status`, not by every node's log); Slurm's job id and restarts in `status`; a bad partition reported on
the partition; and ranks per CPU node with processes_per_host auto planned from the CPUs Slurm allots, not from
the instance type's GPUs."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from smddp_sdk.cli.cmd_jobs import render_status
from smddp_sdk.errors import SpecError
from smddp_sdk.schedulers.stacks import grouped, ranks_text
from smddp_sdk.specs.failure import BORDER
from smddp_sdk.specs.status import JobState
from tests.slurm.test_slurm_cluster import FAILING, JOB_TIMEOUT, SLEEPING, slurm, spec_for, wait_until_running

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

HANGING = textwrap.dedent(
    """
    import time, torch, torch.distributed as dist
    import smddp_sdk.collectives  # noqa: F401
    dist.init_process_group("smddp")
    print("up", flush=True)
    t = torch.ones(2)
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.all_reduce(t)
    """
)
PLANNED = "import os\nprint('planned', os.environ['WORLD_SIZE'], os.environ.get('SLURM_CPUS_ON_NODE'), flush=True)\n"


def test_stacks_of_a_slurm_job_show_where_each_rank_is_and_a_cancel_is_no_failure(tmp_path: Path) -> None:
    scheduler = slurm(tmp_path, processes_per_host=1)
    handle = scheduler.submit(spec_for(tmp_path, HANGING, 2, "stuck"))
    wait_until_running(scheduler, handle, "up")
    time.sleep(2)  # rank 0 is in its all_reduce by now
    places, distinct = grouped(scheduler.stacks(handle, timeout=20))
    lines = {ranks_text(stacks): place for place, stacks in places}
    assert lines["rank 0"].startswith("all_reduce") and lines["rank 0"].endswith("at train.py:9"), lines
    assert lines["rank 1"] == "time.sleep(600) at train.py:8", lines
    assert len(distinct) == 2

    scheduler.cancel(handle)
    status = scheduler.wait(handle, poll=0.5, timeout=60)
    assert status.state is JobState.CANCELLED, status
    logged = "\n".join(line.text for line in scheduler.logs(handle))
    ours = "\n".join(line for line in logged.splitlines() if not line.startswith(("srun:", "slurmstepd")))  # not Slurm's words
    assert "exit code 143" not in ours and "failed" not in ours, ours
    with pytest.raises(SpecError, match="only a running job has stacks"):
        scheduler.stacks(handle, timeout=1)


def test_a_failed_job_prints_its_summary_once_and_status_shows_the_job_id_and_restarts(tmp_path: Path) -> None:
    scheduler = slurm(tmp_path, processes_per_host=2)
    handle = scheduler.submit(spec_for(tmp_path, FAILING, 2, "fails"))
    status = scheduler.wait(handle, poll=0.5, timeout=JOB_TIMEOUT)
    assert status.state is JobState.FAILED and status.failure is not None and status.failure.rank == 3, status
    logged = "\n".join(line.text for line in scheduler.logs(handle))
    assert BORDER not in logged, logged  # the nodes say one line each; `run` and `status` print the box
    assert logged.count("this host failed; root cause: rank 3 on host") == 2, logged
    shown = render_status(status, color=False)
    assert f"slurm job id: {scheduler.job_record(handle)['slurm_job_id']}, restarts 0" in shown, shown


def test_a_partition_the_cluster_lacks_is_reported_on_the_partition(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as refused:
        slurm(tmp_path, partition="no-such-partition").submit(spec_for(tmp_path, SLEEPING, 1, "nowhere"))
    (issue,) = refused.value.issues
    assert issue.path == "scheduler_options.partition" and "invalid partition" in issue.message.lower(), issue
    assert "sinfo" in issue.hint


def test_ranks_per_cpu_node_come_from_the_cpus_slurm_allots_not_the_instance_types_gpus(tmp_path: Path) -> None:
    scheduler = slurm(tmp_path, extra_sbatch=["--cpus-per-task=2"], processes_per_host="auto")  # torchrun's --nproc-per-node auto
    spec = spec_for(tmp_path, PLANNED, 1, "cpu-node", instance_type="ml.p4d.24xlarge")  # 8 GPUs on SageMaker
    assert any("else one per CPU: the CPUs Slurm allots" in note for note in scheduler.dryrun(spec).notes)
    status = scheduler.wait(scheduler.submit(spec), poll=0.5, timeout=JOB_TIMEOUT)
    assert status.state is JobState.SUCCEEDED, status
    planned = [line.text.split() for line in scheduler.logs(status.handle) if line.text.startswith("planned")]
    assert len(planned) == 2 and all(words[1] == "2" == words[2] for words in planned), planned  # 2 CPUs: 2 ranks, not 8
