"""defaults < user config < job file < SMDDP_* environment < flags, and where each value came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from smddp_sdk.cli.output import render_resolved
from smddp_sdk.cli.params import flags_layer
from smddp_sdk.config.job_file import JobFileError, resolve_job
from smddp_sdk.errors import SpecError
from tests.cli.conftest import assert_golden, normalise


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def job(isolated: Path) -> Path:
    write(isolated / "train.py", "print('hi')\n")
    return write(isolated / "job.yaml", "entry_point: train.py\ninstance_type: local\ninstance_count: 2\nmax_run: 20\nhyperparameters:\n  epochs: 3\n  lr: 0.1\n")


@pytest.fixture
def user_config(isolated: Path) -> Path:
    return write(isolated.parent / "home" / ".config" / "smddp" / "config.yaml", "max_run: 10\nrole: arn:aws:iam::111122223333:role/Default\nhyperparameters:\n  seed: 7\n")


def flags(**params) -> object:
    return flags_layer(params, params.pop("script_args", ()), Path.cwd())


def test_each_layer_overrides_the_ones_below(job: Path, user_config: Path):
    environ = {"SMDDP_MAX_RUN": "30"}
    cases = [
        ({}, {}, 20, "job.yaml:4"),
        (environ, {}, 30, "env SMDDP_MAX_RUN"),
        (environ, {"max_run": 40}, 40, "flag --max-run"),
    ]
    for env, params, max_run, source in cases:
        resolved = resolve_job(Path("job.yaml"), environ=env, flags=flags(**params))
        assert resolved.spec.max_run == max_run
        assert resolved.source("max_run").describe("max_run") == source
    resolved = resolve_job(Path("job.yaml"), environ={})
    assert resolved.spec.role == "arn:aws:iam::111122223333:role/Default"
    assert resolved.source("role").describe("role") == "~/.config/smddp/config.yaml:2"
    assert resolved.source("volume_size").kind == "default"


def test_without_a_job_file_the_user_config_value_applies(job: Path, user_config: Path):
    job.write_text("entry_point: train.py\ninstance_type: local\n")
    assert resolve_job(Path("job.yaml"), environ={}).spec.max_run == 10


def test_mappings_merge_key_by_key_across_layers(job: Path, user_config: Path):
    resolved = resolve_job(Path("job.yaml"), environ={"SMDDP_HYPERPARAMETERS": "{lr: 0.5}"}, flags=flags(hyperparameter=[("epochs", "5")]))
    assert dict(resolved.spec.hyperparameters) == {"seed": 7, "epochs": 5, "lr": 0.5}
    describe = {key: resolved.source(f"hyperparameters.{key}").describe(f"hyperparameters.{key}") for key in ("seed", "epochs", "lr")}
    assert describe["seed"] == "~/.config/smddp/config.yaml:4"
    assert describe == {**describe, "epochs": "flag -H epochs", "lr": "env SMDDP_HYPERPARAMETERS"}


def test_arguments_after_a_job_files_double_dash_become_typed_hyperparameters(job: Path):
    resolved = resolve_job(Path("job.yaml"), environ={}, flags=flags(script_args=["--lr", "0.01", "--name=resnet 50"]))
    assert dict(resolved.spec.hyperparameters) == {"epochs": 3, "lr": 0.01, "name": "resnet 50"}  # typed as -H types
    assert resolved.source("hyperparameters.lr").describe("hyperparameters.lr") == "after --"


def test_set_changes_one_nested_key_and_keeps_the_rest(job: Path):
    job.write_text(job.read_text() + "distribution:\n  mpi:\n    enabled: true\n")
    resolved = resolve_job(Path("job.yaml"), environ={}, flags=flags(settings=[("distribution.mpi.processes_per_host", "2")]))
    assert resolved.spec.distribution.mpi is True
    assert resolved.spec.distribution.mpi_processes_per_host == 2


def test_environment_strings_stay_verbatim_and_numbers_are_parsed(job: Path):
    resolved = resolve_job(Path("job.yaml"), environ={"SMDDP_JOB_NAME": "0123", "SMDDP_INSTANCE_COUNT": "3", "SMDDP_USE_SPOT_INSTANCES": "", "SMDDP_ROLE": ""})
    assert resolved.spec.job_name == "0123"
    assert resolved.spec.instance_count == 3
    assert resolved.spec.role is None  # empty variables count as unset


def test_problems_are_reported_where_the_value_was_set(job: Path):
    with pytest.raises(JobFileError) as caught:
        resolve_job(Path("job.yaml"), environ={"SMDDP_INSTANCE_COUNT": "many", "SMDDP_SCHEDULER": "dokcer"}, flags=flags(settings=[("instance_cout", "2")], max_run=0))
    rendered = str(caught.value).splitlines()
    assert "SMDDP_INSTANCE_COUNT: instance_count: must be an integer, got 'many'" in rendered
    assert "SMDDP_SCHEDULER: scheduler: unknown scheduler 'dokcer' (did you mean 'docker'?)" in rendered
    assert "--set instance_cout: unknown field 'instance_cout' (did you mean 'instance_count'?)" in rendered
    assert "--max-run: max_run: must be at least 1, got 0" in rendered
    assert caught.value.exit_code == 2


def test_relative_paths_from_flags_are_relative_to_cwd(isolated: Path):
    write(isolated / "code" / "train.py", "print('hi')\n")
    write(isolated / "jobs" / "job.yaml", "entry_point: train.py\ninstance_type: local\n")
    resolved = resolve_job(Path("jobs/job.yaml"), environ={"SMDDP_OUTPUT_PATH": "out"}, flags=flags(source_dir="code"))
    assert resolved.spec.source_dir == str((isolated / "code").resolve())
    assert resolved.spec.output_path == str(isolated / "out")
    (isolated / "jobs" / "job.yaml").write_text("entry_point: train.py\ninstance_type: local\noutput_path: out\nsource_dir: ../code\n")
    assert resolve_job(Path("jobs/job.yaml"), environ={}).spec.output_path == str(isolated / "jobs" / "out")


def test_per_scheduler_options_in_the_user_config(job: Path, user_config: Path):
    user_config.write_text("scheduler_options:\n  local:\n    keep_job_dir: false\n    stop_grace_period: 5\n  sagemaker:\n    region: us-west-2\n")
    resolved = resolve_job(Path("job.yaml"), environ={}, flags=flags(scheduler_option=[("stop_grace_period", "2")]))
    assert resolved.scheduler == "local"
    assert resolved.scheduler_options == {"keep_job_dir": False, "stop_grace_period": 2}
    assert resolved.source("scheduler_options.keep_job_dir").describe("scheduler_options.keep_job_dir") == "~/.config/smddp/config.yaml:3"
    assert resolved.source("scheduler_options.stop_grace_period").describe("") == "flag -o stop_grace_period"
    user_config.write_text("scheduler_options:\n  locl:\n    keep_job_dir: false\n")
    with pytest.raises(JobFileError) as caught:
        resolve_job(Path("job.yaml"), environ={})
    assert "~/.config/smddp/config.yaml:2:3: scheduler_options: unknown scheduler section 'locl' (did you mean 'local'?)" in str(caught.value)


def test_smddp_config_names_the_user_config(job: Path, isolated: Path):
    config = write(isolated / "team.yaml", "max_run: 99\n")
    job.write_text("entry_point: train.py\ninstance_type: local\n")
    assert resolve_job(Path("job.yaml"), environ={"SMDDP_CONFIG": str(config)}).spec.max_run == 99
    with pytest.raises(SpecError, match="does not exist"):
        resolve_job(Path("job.yaml"), environ={"SMDDP_CONFIG": str(isolated / "missing.yaml")})
    assert resolve_job(Path("job.yaml"), environ={"SMDDP_CONFIG": ""}).spec.max_run == 86_400


def test_resolved_job_shows_the_source_of_every_value(job: Path, user_config: Path, isolated: Path):
    resolved = resolve_job(Path("job.yaml"), environ={"SMDDP_BASE_JOB_NAME": "mnist"}, flags=flags(instance_count=4, environment=[("NCCL_DEBUG", "WARN")], script_args=["--lr", "0.2"]))
    text = normalise(render_resolved(resolved, "mnist-generated-name"), (str(isolated.parent), "<tmp>"))
    assert_golden("resolved_job.txt", text)


SECTIONS = """entry_point: train.py
instance_type: ml.p4d.24xlarge
scheduler: local
scheduler_options:
  local:
    processes_per_host: 2
  docker:
    processes_per_host: 2
    shm_size: 1g
  sagemaker:
    region: us-west-2
  slurm:
"""


@pytest.mark.parametrize(
    ("scheduler", "expected", "line"),
    [
        ("local", {"processes_per_host": 2}, "job.yaml:6"),
        ("docker", {"processes_per_host": 2, "shm_size": "1g"}, "job.yaml:8"),
        ("sagemaker", {"region": "us-west-2"}, "job.yaml:11"),
        ("slurm", {}, None),
    ],
)
def test_one_job_file_serves_every_scheduler(job: Path, scheduler: str, expected: dict, line: str | None):
    job.write_text(SECTIONS)
    resolved = resolve_job(Path("job.yaml"), environ={}, flags=flags(scheduler=scheduler))
    assert (resolved.scheduler, resolved.scheduler_options) == (scheduler, expected)
    if line:
        first = next(iter(expected))
        assert resolved.source(f"scheduler_options.{first}").describe(f"scheduler_options.{first}") == line


def test_sections_stack_user_config_then_job_file_then_flags(job: Path, user_config: Path):
    user_config.write_text("scheduler_options:\n  local:\n    keep_job_dir: false\n    stop_grace_period: 5\n")
    job.write_text("entry_point: train.py\ninstance_type: local\nscheduler_options:\n  local:\n    stop_grace_period: 7\n    processes_per_host: 3\n")
    resolved = resolve_job(Path("job.yaml"), environ={}, flags=flags(scheduler_option=[("processes_per_host", "4")]))
    assert resolved.scheduler_options == {"keep_job_dir": False, "stop_grace_period": 7, "processes_per_host": 4}
    assert resolved.source("scheduler_options.stop_grace_period").describe("scheduler_options.stop_grace_period") == "job.yaml:5"


def test_the_other_sections_are_checked_for_names_only_every_problem_at_once(job: Path):
    job.write_text(SECTIONS.replace("shm_size", "shm_sise").replace("region", "regoin") + "  slurmm:\n    partition: gpu\n  keep_job_dir: false\n  sagemaker_extra:\n")
    with pytest.raises(JobFileError) as caught:
        resolve_job(Path("job.yaml"), environ={})
    assert str(caught.value).splitlines() == [
        "job.yaml:9:5: scheduler_options.docker: unknown option of the docker scheduler 'shm_sise' (did you mean 'shm_size'?)",
        "job.yaml:11:5: scheduler_options.sagemaker: unknown option of the sagemaker scheduler 'regoin' (did you mean 'region'?)",
        "job.yaml:13:3: scheduler_options: unknown scheduler section 'slurmm' (did you mean 'slurm'?)",
        "job.yaml:15:3: scheduler_options: unknown scheduler section 'keep_job_dir' (options go under the scheduler they are for, e.g. scheduler_options.local.keep_job_dir)",
        "job.yaml:16:3: scheduler_options: unknown scheduler section 'sagemaker_extra' (did you mean 'sagemaker'?)",
    ]
    # Values of a section are checked when its scheduler runs the job.
    job.write_text(SECTIONS.replace("region: us-west-2", "poll: fast"))
    assert resolve_job(Path("job.yaml"), environ={}).scheduler_options == {"processes_per_host": 2}
    with pytest.raises(JobFileError, match=r"job.yaml:11:11: scheduler_options.poll: must be a number of seconds"):
        resolve_job(Path("job.yaml"), environ={}, flags=flags(scheduler="sagemaker"))


def test_options_given_flat_apply_to_any_scheduler_and_point_at_sections(job: Path):
    job.write_text("entry_point: train.py\ninstance_type: ml.p4d.24xlarge\nscheduler: local\nscheduler_options:\n  processes_per_host: 2\n")
    assert resolve_job(Path("job.yaml"), environ={}).scheduler_options == {"processes_per_host": 2}
    with pytest.raises(JobFileError) as caught:
        resolve_job(Path("job.yaml"), environ={}, flags=flags(scheduler="sagemaker"))
    assert "job.yaml:5:3: scheduler_options: unknown option of the sagemaker scheduler 'processes_per_host'" in str(caught.value)
    assert "key them by scheduler (scheduler_options: {local: {processes_per_host: 2}})" in caught.value.summary()
