"""JobSpec building and validation, distribution translation, handles and job names."""

import re

import pytest

from smddp_sdk.errors import SpecError
from smddp_sdk.specs.distribution import parse_distribution
from smddp_sdk.specs.job import JobSpec, make_job_name
from smddp_sdk.specs.status import JobHandle, JobState


@pytest.fixture()
def code(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    (tmp_path / "data").mkdir()
    return tmp_path


def spec(code, **overrides):
    data = {"entry_point": "train.py", "source_dir": "src", "instance_type": "ml.p4d.24xlarge", "instance_count": 2}
    data.update(overrides)
    return JobSpec.from_mapping(data, base_dir=code)


def problems(code, **overrides):
    with pytest.raises(SpecError) as info:
        spec(code, **overrides)
    return [str(issue) for issue in info.value.issues]


def test_minimal_spec_resolves_paths(code):
    job = spec(code)
    assert job.source_dir == str((code / "src").resolve())
    assert job.program == "train.py"
    assert job.instance.gpus == 8
    assert job.max_run == 86_400 and job.volume_size == 30 and job.container_log_level == 20


def test_entry_point_without_source_dir_is_a_file(code):
    job = JobSpec.from_mapping({"entry_point": "src/train.py", "instance_type": "local"}, base_dir=code)
    assert job.program == "train.py" and job.entry_point.endswith("src/train.py")


def test_every_problem_is_reported_at_once(code):
    found = problems(
        code,
        instance_cout=2,
        instance_count=0,
        instance_type="ml.p4d.24xlargee",
        max_run="1h",
        use_spot_instances="yes",
        environment={"A": 1},
        inputs={"train": {"s3_data": "s3://b/k", "distribution": "Sharded"}, "bad name!": "s3://b/k"},
        distribution={"smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_option": "-v"}}},
    )
    expected = [
        "instance_cout: unknown field (did you mean 'instance_count'?)",
        "instance_count: must be at least 1, got 0",
        "max_run: must be an integer, got '1h'",
        "use_spot_instances: must be true or false, got 'yes'",
        "environment.A: must be a string, got 1 (quote the value)",
        "distribution.smdistributed.dataparallel.custom_mpi_option: unknown option (did you mean 'custom_mpi_options'?)",
        "inputs.train.distribution: must be one of FullyReplicated, ShardedByS3Key, got 'Sharded' (did you mean 'ShardedByS3Key'?)",
        "inputs.bad name!: channel names use letters, digits, '.', '-' and '_' (at most 64)",
        "instance_type: unknown instance type 'ml.p4d.24xlargee' (did you mean 'ml.p4d.24xlarge'?)",
    ]
    assert sorted(found) == sorted(expected)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"entry_point": None}, "entry_point: is required"),
        ({"entry_point": "missing.py"}, "'missing.py' is not a file in source_dir"),
        ({"entry_point": "../train.py"}, "without '.' or '..' parts"),
        ({"entry_point": "s3://b/train.py"}, "must be a local file, not an S3 URI"),
        ({"source_dir": "nowhere"}, "source_dir: directory 'nowhere' does not exist"),
        ({"dependencies": ["nowhere"]}, "dependencies[0]: directory 'nowhere' does not exist"),
        ({"dependencies": "lib"}, "dependencies: must be a list of strings"),
        ({"instance_count": True}, "instance_count: must be an integer, got True"),
        ({"max_wait": 10}, "max_wait: only applies to spot training"),
        ({"use_spot_instances": True}, "use_spot_instances: needs max_wait"),
        ({"job_name": "bad_name"}, "job_name: must be 1-63 letters"),
        ({"input_mode": "Stream"}, "input_mode: must be one of File, Pipe, FastFile"),
        ({"inputs": {"train": "missing-dir"}}, "inputs.train.s3_data: local data 'missing-dir' does not exist"),
        ({"inputs": {"train": {"uri": "s3://b"}}}, "inputs.train.uri: unknown channel option"),
        ({"tags": [{"Key": "a"}]}, "tags[0]: must be"),
        ({"hyperparameters": ["lr", 1]}, "hyperparameters: must be a mapping"),
        ({"distribution": "smddp"}, "distribution: must be a mapping"),
        ({"distribution": {"pytorchxla": {"enabled": True}}}, "distribution.pytorchxla: PyTorch/XLA"),
        ({"distribution": {"smdistributed": {"dataparallel": {"enabled": "yes"}}}}, "enabled: must be true or false"),
        ({"distribution": {"mpi": {"enabled": True, "processes_per_host": 0}}}, "processes_per_host: must be a positive integer"),
        ({"distribution": {"pytorchddp": {"enabled": True}, "smdistributed": {"dataparallel": {"enabled": True}}}}, "pytorchddp and smdistributed cannot be used together"),
        ({"distribution": {"smdistributed": {"dataparallel": {"enabled": True}}, "mpi": {"enabled": True}}}, "enable only one of them"),
        ({"distribution": {"smdistributed": {}}}, "must hold exactly one strategy"),
        ({"distribution": {"smdistributed": {"dataparalel": {}}}}, "did you mean 'dataparallel'?"),
    ],
)
def test_bad_input_is_named(code, overrides, message):
    found = problems(code, **overrides)
    assert any(message in issue for issue in found), found


def test_tags_accept_a_plain_mapping(code):
    assert spec(code, tags={"team": "ml"}).tags == ({"Key": "team", "Value": "ml"},)


def test_local_channels_become_file_uris(code):
    job = spec(code, inputs={"train": "data", "val": "s3://bucket/val"})
    assert job.inputs["train"].s3_data == f"file://{(code / 'data').resolve()}"
    assert job.inputs["val"].is_s3
    assert spec(code, inputs="s3://bucket/all").inputs["training"].s3_data == "s3://bucket/all"


SMDDP_HPS = {
    "sagemaker_distributed_dataparallel_enabled": True,
    "sagemaker_instance_type": "ml.p4d.24xlarge",
    "sagemaker_distributed_dataparallel_custom_mpi_options": "",
}


@pytest.mark.parametrize(
    ("distribution", "expected", "launcher"),
    [
        ({"smdistributed": {"dataparallel": {"enabled": True}}}, SMDDP_HPS, "smddp"),
        ({"smdistributed_dataparallel": {"enabled": True}}, SMDDP_HPS, "smddp"),
        ({"pytorchddp": {"enabled": True}}, SMDDP_HPS, "smddp"),
        (
            {"smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_options": "-verbose"}}},
            {**SMDDP_HPS, "sagemaker_distributed_dataparallel_custom_mpi_options": "-verbose"},
            "smddp",
        ),
        (
            {"smdistributed": {"dataparallel": {"enabled": False}}},
            {"sagemaker_distributed_dataparallel_enabled": False, "sagemaker_instance_type": "ml.p4d.24xlarge"},
            "none",
        ),
        (
            {"torch_distributed": {"enabled": True}},
            {"sagemaker_torch_distributed_enabled": True, "sagemaker_instance_type": "ml.p4d.24xlarge"},
            "torch_distributed",
        ),
        (
            {"mpi": {"enabled": True, "processes_per_host": 8, "custom_mpi_options": "-x FOO=1"}},
            {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 8, "sagemaker_mpi_custom_mpi_options": "-x FOO=1"},
            "mpi",
        ),
        (
            {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {"enabled": True, "parameters": {"tensor_parallel_degree": 8}}}},
            {"mp_parameters": {"tensor_parallel_degree": 8}, "sagemaker_distributed_dataparallel_enabled": False,
             "sagemaker_instance_type": "ml.p4d.24xlarge", "sagemaker_torch_distributed_enabled": True},
            "torch_distributed",
        ),
        (None, {}, "none"),
    ],
)
def test_distribution_translates_like_sdk_v2(distribution, expected, launcher):
    parsed, issues = parse_distribution(distribution)
    assert issues == []
    assert parsed.hyperparameters("ml.p4d.24xlarge") == expected
    assert parsed.launcher == launcher


def test_training_hyperparameters_order_and_content(code):
    job = spec(code, hyperparameters={"epochs": 3}, distribution={"smdistributed": {"dataparallel": {"enabled": True}}})
    hps = job.training_hyperparameters(job_name="j-1", submit_directory="file:///code", region="us-west-2")
    assert list(hps)[:6] == ["epochs", "sagemaker_submit_directory", "sagemaker_program",
                             "sagemaker_container_log_level", "sagemaker_job_name", "sagemaker_region"]
    assert hps["sagemaker_program"] == "train.py" and hps["sagemaker_distributed_dataparallel_enabled"] is True


def test_job_names_follow_sdk_v2():
    assert re.fullmatch(r"pytorch-training-\d{4}(-\d{2}){5}-\d{3}", make_job_name(None))
    long = make_job_name("x" * 80)
    assert len(long) == 63 and long.startswith("x" * 39 + "-")


def test_handles_round_trip_and_reject_garbage():
    handle = JobHandle.parse("sagemaker://us-west-2/my-job")
    assert (handle.scheduler, handle.job_id, str(handle)) == ("sagemaker", "us-west-2/my-job", "sagemaker://us-west-2/my-job")
    with pytest.raises(SpecError, match="did you mean 'local'"):
        JobHandle.parse("locl://x")
    with pytest.raises(SpecError, match="not a job handle"):
        JobHandle.parse("just-a-name")
    assert JobState.CANCELLED.is_terminal and not JobState.RUNNING.is_terminal


@pytest.mark.parametrize("field", ["output_path", "checkpoint_s3_uri"])
def test_relative_local_locations_are_taken_from_the_base_dir(code, field):
    assert getattr(spec(code, **{field: "out"}), field) == str(code / "out")
    assert getattr(spec(code, **{field: "file://out"}), field) == str(code / "out")
    assert getattr(spec(code, **{field: "s3://bucket/out"}), field) == "s3://bucket/out"
    assert getattr(spec(code, **{field: "/abs/out"}), field) == "/abs/out"
