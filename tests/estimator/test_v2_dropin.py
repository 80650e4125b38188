"""SageMaker SDK v2 habits work or say what to do: TrainingInput, fit's arguments, Session, v2 methods."""

from __future__ import annotations

from pathlib import Path

import pytest

from smddp_sdk import PyTorch
from smddp_sdk.errors import NotOfferedError, SpecError, UnavailableError
from smddp_sdk.inputs import TrainingInput, from_v2, normalise_inputs
from smddp_sdk.session import LocalSession, Session
from smddp_sdk.specs import v2_arguments

SMDDP = {"smdistributed": {"dataparallel": {"enabled": True}}}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part-0.csv").write_text("1,2\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "jobs"))
    return tmp_path


def estimator(**overrides) -> PyTorch:
    arguments = dict(entry_point="train.py", source_dir="src", instance_count=2, instance_type="local", distribution=SMDDP)
    arguments.update(overrides)
    return PyTorch(**arguments)


# --- TrainingInput ------------------------------------------------------------------------------


def test_training_input_takes_v2s_positional_order() -> None:
    channel = TrainingInput("s3://bucket/train", "ShardedByS3Key", "Gzip", "text/csv", "RecordIO", "ManifestFile")
    assert (channel.distribution, channel.compression, channel.content_type) == ("ShardedByS3Key", "Gzip", "text/csv")
    assert (channel.record_wrapping, channel.s3_data_type) == ("RecordIO", "ManifestFile")
    assert channel.config == {
        "DataSource": {"S3DataSource": {"S3DataType": "ManifestFile", "S3Uri": "s3://bucket/train", "S3DataDistributionType": "ShardedByS3Key"}},
        "CompressionType": "Gzip", "ContentType": "text/csv", "RecordWrapperType": "RecordIO",
    }
    assert TrainingInput("s3://b/x").distribution == "FullyReplicated"


@pytest.mark.parametrize("argument", ["instance_groups", "shuffle_config", "attribute_names", "hub_access_config"])
def test_training_input_arguments_not_offered_say_so(argument: str) -> None:
    with pytest.raises(NotOfferedError, match=f"TrainingInput\\({argument}=...\\) is a SageMaker SDK v2 feature smddp-sdk does not offer"):
        TrainingInput("s3://b/x", **{argument: ["x"]})


class V2Like:
    """The shape of v2's sagemaker.inputs.TrainingInput: everything lives in ``config``."""

    def __init__(self, config: dict) -> None:
        self.config = config


def test_v2s_own_input_objects_are_read_through_their_config() -> None:
    v2 = V2Like({"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/t", "S3DataDistributionType": "ShardedByS3Key"}},
                 "CompressionType": "Gzip", "InputMode": "FastFile"})
    channel = from_v2(v2)
    assert isinstance(channel, TrainingInput)
    assert (channel.s3_data, channel.distribution, channel.compression, channel.input_mode) == ("s3://b/t", "ShardedByS3Key", "Gzip", "FastFile")
    with pytest.raises(NotOfferedError, match="FileSystemInput"):
        from_v2(V2Like({"DataSource": {"FileSystemDataSource": {"FileSystemId": "fs-1"}}}))
    assert normalise_inputs(v2) == {"training": channel}
    assert normalise_inputs({"train": v2, "test": "s3://b/x"}) == {"train": channel, "test": "s3://b/x"}


def test_fit_takes_a_single_training_input_as_the_training_channel(project: Path) -> None:
    job = estimator()
    spec = job.job_spec(TrainingInput("data"))
    assert list(spec.inputs) == ["training"]
    assert spec.inputs["training"].s3_data == f"file://{project / 'data'}"
    assert job.dryrun(V2Like({"DataSource": {"S3DataSource": {"S3Uri": "data", "S3DataType": "S3Prefix"}}})).spec.inputs["training"].s3_data.endswith("/data")


# --- fit(experiment_config=...) -----------------------------------------------------------------


def test_experiment_config_is_checked_before_anything_starts(project: Path) -> None:
    with pytest.raises(SpecError, match="experiment_config.ExperimentNmae: unknown key \\(did you mean 'ExperimentName'\\?\\)"):
        estimator().fit(experiment_config={"ExperimentNmae": "e"})
    assert not (project / "jobs").exists()


def test_disable_output_compression_is_a_job_field_and_the_local_dry_run_says_what_differs(project: Path) -> None:
    job = estimator(disable_output_compression=True)
    assert job.spec.disable_output_compression is True  # sent as CompressionType NONE on SageMaker (tests/sagemaker/test_parity.py)
    assert any("disable_output_compression: the model and output still arrive as model.tar.gz" in note for note in job.dryrun().notes)


# --- v2 methods ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method", sorted(v2_arguments.REFUSED_METHODS))
def test_v2_methods_not_offered_say_what_to_use(project: Path, method: str) -> None:
    with pytest.raises(NotOfferedError) as info:
        getattr(estimator(), method)
    assert str(info.value).startswith(f"Estimator.{method} is a SageMaker SDK v2 feature smddp-sdk does not offer; ")
    assert info.value.exit_code == 2
    assert isinstance(info.value, NotImplementedError)  # code that catches v2's NotImplementedError still does
    assert not hasattr(estimator(), method)  # feature detection says "not here" instead of raising


def test_v2_methods_offered_here(project: Path) -> None:
    job = estimator(hyperparameters={"epochs": 1}, subnets=["subnet-1"], security_group_ids=["sg-1"], enable_network_isolation=True)
    job.set_hyperparameters(lr=0.1, epochs=2)
    assert job.hyperparameters() == {"epochs": "2", "lr": "0.1"}
    assert job.enable_network_isolation() is True
    assert job.get_vpc_config() == {"Subnets": ["subnet-1"], "SecurityGroupIds": ["sg-1"]}
    assert job.get_vpc_config(None) is None
    assert estimator().get_vpc_config() is None
    assert job.training_image_uri() is None  # local jobs run no image
    with pytest.raises(SpecError, match="call fit"):
        job.training_job_analytics


def test_training_image_uri_of_a_sagemaker_job_is_the_dlc(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    job = estimator(instance_type="ml.p4d.24xlarge", framework_version="2.2.0", py_version="py310", role="arn:aws:iam::1:role/R")
    assert job.training_image_uri() == "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:2.2.0-gpu-py310"


# --- Session / LocalSession ---------------------------------------------------------------------


def test_local_session_needs_no_aws(project: Path) -> None:
    session = LocalSession()
    assert session.config == {"local": {"local_code": True}}
    assert session.upload_data("data") == f"file://{project / 'data'}"
    job = estimator(sagemaker_session=session)
    assert job.dryrun(session.upload_data("data")).spec.inputs["training"].s3_data == f"file://{project / 'data'}"
    with pytest.raises(SpecError, match="'nope' does not exist"):
        session.upload_data("nope")


def test_session_gives_the_sagemaker_scheduler_its_region(project: Path) -> None:
    class BotoSession:
        region_name = "eu-west-1"

    job = estimator(instance_type="ml.p4d.24xlarge", framework_version="2.2.0", py_version="py310", role="arn:aws:iam::1:role/R",
                    sagemaker_session=Session(boto_session=BotoSession()))
    assert job.scheduler_options["region"] == "eu-west-1"
    assert "eu-west-1" in job.training_image_uri()


def test_session_methods_not_offered_say_what_is(project: Path) -> None:
    with pytest.raises(NotOfferedError, match="Session.create_endpoint .*upload_data"):
        Session().create_endpoint


def test_session_without_boto3_is_exit_3(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "boto3", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "smddp_sdk.schedulers.sagemaker.client", raising=False)
    with pytest.raises(UnavailableError, match="pip install 'smddp-sdk\\[aws\\]'") as info:
        Session().default_bucket()
    assert info.value.exit_code == 3


def test_fit_on_sagemaker_without_boto3_is_exit_3(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    for module in [m for m in sys.modules if m.startswith("smddp_sdk.schedulers.sagemaker.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "boto3", None)
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    job = estimator(instance_type="ml.p4d.24xlarge", framework_version="2.2.0", py_version="py310", role="arn:aws:iam::123456789012:role/R")
    with pytest.raises(UnavailableError, match="pip install 'smddp-sdk\\[aws\\]'") as info:
        job.fit()
    assert info.value.exit_code == 3
