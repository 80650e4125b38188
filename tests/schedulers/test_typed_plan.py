"""One typed plan from the dry run to the supervisor (issue 36): what ``dryrun`` returns is what ``schedule``
runs, ``job.json`` stores and the supervisor reads, once; the config files are held once; Slurm's plan is its
``BatchPlan``; what host-tree and Slurm jobs share lives outside ``hosttree/``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from smddp_sdk.runtime import plan as rank_plan
from smddp_sdk.schedulers.base import DryRun
from smddp_sdk.schedulers.docker import DockerScheduler
from smddp_sdk.schedulers.hosttree.job_dir import JobDir
from smddp_sdk.schedulers.hosttree.plan import SHOWN_HOSTS, HostTreePlan
from smddp_sdk.schedulers.job_files import ranks_per_host
from smddp_sdk.schedulers.local import LocalScheduler
from smddp_sdk.schedulers.slurm.scheduler import SlurmScheduler
from smddp_sdk.schedulers.slurm.script import BatchPlan, render
from smddp_sdk.specs import contract
from smddp_sdk.specs.job import JobSpec, RetryPolicy


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return path


def spec_of(script: Path, **fields: object) -> JobSpec:
    return JobSpec.from_mapping({"entry_point": str(script), "instance_type": "local", "instance_count": 3, "job_name": "typed", **fields})


def test_the_local_plan_is_typed_and_job_json_keeps_it_whole(tmp_path: Path, script: Path) -> None:
    spec = spec_of(script, use_spot_instances=True, max_wait=7200, checkpoint_s3_uri=f"file://{tmp_path / 'ckpt'}", max_retry_attempts=2)
    dryrun = LocalScheduler(job_root=tmp_path / "jobs", interrupt_after=[5], retry_script_errors=True).dryrun(spec)
    plan = dryrun.request
    assert isinstance(dryrun, DryRun) and isinstance(plan, HostTreePlan)
    assert plan.retry == RetryPolicy(2, script_errors=True)
    assert plan.spot is not None and plan.spot.max_wait == 7200 and plan.spot.interrupt_after == (5.0,)
    assert plan.checkpoints is not None and plan.checkpoints.s3_uri == f"file://{tmp_path / 'ckpt'}"
    assert HostTreePlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan  # job.json holds the very plan


def test_the_docker_plan_round_trips_with_every_container(tmp_path: Path, script: Path) -> None:
    plan = DockerScheduler(job_root=tmp_path / "jobs").dryrun(spec_of(script)).request
    assert [host.container for host in plan.hosts] == ["typed-algo-1", "typed-algo-2", "typed-algo-3"]
    assert HostTreePlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_schedule_writes_the_plan_it_was_given_and_the_trees_its_config_files(tmp_path: Path, script: Path) -> None:
    scheduler = LocalScheduler(job_root=tmp_path / "jobs")
    dryrun = scheduler.dryrun(spec_of(script))
    _, job_dir = scheduler._claim_job_dir(dryrun)
    scheduler._write_job_dir(dryrun, job_dir)
    for host in dryrun.request.hosts:
        opt_ml = contract.OptMl(host.opt_ml)
        written = {name: json.loads(path.read_text()) for name, path in
                   (("resource", opt_ml.resource_config_file), ("hyperparameters", opt_ml.hyperparameters_file), ("input_data", opt_ml.input_data_config_file))}
        assert written == json.loads(json.dumps(dryrun.request.config_files.for_host(host.host)))


def test_a_job_dir_reads_its_record_once(tmp_path: Path, script: Path) -> None:
    plan = LocalScheduler(job_root=tmp_path / "jobs").dryrun(spec_of(script)).request
    job_dir = JobDir(tmp_path / "job")
    job_dir.path.mkdir()
    job_dir.write_record({"handle": plan.handle, "plan": plan.to_json()})
    first = job_dir.plan
    job_dir.write_record({"handle": plan.handle, "plan": {**plan.to_json(), "max_run": 5}})
    assert job_dir.plan is first and first.max_run == plan.max_run  # the same process does not read it again
    assert JobDir(job_dir.path).plan.max_run == 5  # a new reader (another process) sees the file


def test_the_plan_grows_with_the_hosts_not_with_their_square(tmp_path: Path, script: Path) -> None:
    scheduler = LocalScheduler(job_root=tmp_path / "jobs")
    sizes = [len(json.dumps(scheduler.dryrun(spec_of(script, instance_count=count)).request.to_json())) for count in (200, 400)]
    assert sizes[1] < 2.2 * sizes[0], sizes  # N x N would be 4x: every host holding every host's name


def test_a_small_plan_is_shown_whole_and_a_large_one_summarised(tmp_path: Path, script: Path) -> None:
    scheduler = LocalScheduler(job_root=tmp_path / "jobs")
    small = scheduler.dryrun(spec_of(script, instance_count=SHOWN_HOSTS))
    assert json.loads(small.render()) == json.loads(json.dumps(small.request.to_json()))
    large = scheduler.dryrun(spec_of(script, instance_count=50))
    shown = json.loads(large.render())
    assert [item if isinstance(item, str) else item["host"] for item in shown["hosts"]] == ["algo-1", "algo-2", "... 47 more hosts like these ...", "algo-50"]
    assert shown["config_files"]["hosts"][-1] == "algo-50" and len(shown["config_files"]["hosts"]) == 4
    assert any("50 hosts: the dry run shows the first and last ones" in note for note in large.notes)
    assert len(large.request.hosts) == 50  # what runs is whole


def test_an_older_record_is_refused_with_what_to_do() -> None:
    from smddp_sdk.errors import SpecError

    with pytest.raises(SpecError, match="written by an older smddp-sdk"):
        HostTreePlan.from_record({"handle": "local://old", "request": {"hosts": []}})


def test_slurm_plans_a_batch_plan_that_job_json_keeps(tmp_path: Path, script: Path) -> None:
    dryrun = SlurmScheduler(job_root=tmp_path / "jobs", client=object()).dryrun(spec_of(script, max_retry_attempts=3))
    plan = dryrun.request
    assert isinstance(plan, BatchPlan) and plan.retry == RetryPolicy(3) and plan.config_files.hosts == ("node-0", "node-1", "node-2")
    assert BatchPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert dryrun.render().endswith(render(plan))


def test_slurm_and_the_job_index_do_not_import_the_host_tree_package() -> None:
    code = "import sys, smddp_sdk.schedulers.slurm.scheduler, smddp_sdk.job_index\nprint(sorted(m for m in sys.modules if '.hosttree' in m))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


SMDDP = {"smdistributed": {"dataparallel": {"enabled": True}}}


@pytest.mark.parametrize(
    ("fields", "gpus", "expected"),
    [({}, 4, 1), ({"distribution": SMDDP}, 0, 1), ({"distribution": SMDDP}, 4, 4), ({"distribution": SMDDP}, None, None),
     ({"distribution": {"mpi": {"enabled": True, "processes_per_host": 3}}}, None, 3), ({"distribution": {"torch_distributed": {"enabled": True}}}, 2, 2)],
)
def test_ranks_per_host_is_what_the_node_runtime_decides(tmp_path: Path, script: Path, fields: dict, gpus: int | None, expected: int | None) -> None:
    spec = spec_of(script, **fields)
    assert ranks_per_host(spec, gpus) == expected
    if gpus is not None:  # the node's own decision from the hyperparameters it is given (runtime/plan.py)
        framework = contract.decode_hyperparameters(dict(LocalScheduler(job_root=tmp_path / "jobs").dryrun(spec).request.config_files.hyperparameters))
        assert rank_plan.processes_per_host(rank_plan.launch_shape(framework, in_distribution_group=True), framework, gpus) == expected


@pytest.mark.parametrize(("scheduler", "folder"), [("local", ""), ("docker", "docker"), ("slurm", "slurm")])
def test_a_job_is_found_by_name_in_its_scheduler_s_folder_of_the_one_job_root(tmp_path: Path, scheduler: str, folder: str) -> None:
    from smddp_sdk import job_index
    from smddp_sdk.specs.status import JobHandle

    job = tmp_path / folder / "named-job"
    job.mkdir(parents=True)
    (job / "job.json").write_text("{}")
    assert job_index.resolve("named-job", root=tmp_path) == (JobHandle(scheduler, "named-job"), None)
    assert "named-job" in job_index.known_names(tmp_path)
