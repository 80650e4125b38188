"""The local scheduler's parts that need no runtime: host trees, code snapshot, artifacts, ports, job state."""

import json
import os
import socket
import tarfile

import pytest

from smddp_sdk.errors import SpecError
from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.schedulers.hosttree.host_trees import collect_artifacts, host_names, largest_entries, prepare_host_trees
from smddp_sdk.schedulers.hosttree.job_dir import JobDir, pick_free_ports, ports_of_live_jobs
from smddp_sdk.schedulers.hosttree.process_backend import inherited_env
from smddp_sdk.schedulers.job_files import ConfigFiles, stage_code
from smddp_sdk.specs.contract import OptMl, decode_hyperparameters, parse_console_line
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobHandle, JobState


@pytest.fixture()
def spec(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('train')\n")
    (src / "pkg" / "util.py").write_text("X = 1\n")
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "dep").mkdir()
    (tmp_path / "dep" / "dep.py").write_text("Y = 2\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.csv").write_text("1\n")
    (tmp_path / "labels.csv").write_text("x\n")
    return JobSpec.from_mapping(
        {
            "entry_point": "train.py",
            "source_dir": "src",
            "dependencies": ["dep"],
            "instance_type": "local",
            "instance_count": 2,
            "hyperparameters": {"epochs": 2, "name": "cnn"},
            "inputs": {"train": "data", "labels": {"s3_data": "file://labels.csv", "content_type": "text/csv"}},
            "distribution": {"torch_distributed": {"enabled": True}},
        },
        base_dir=tmp_path,
    )


def test_host_trees_hold_the_config_files_sagemaker_writes(spec, tmp_path):
    job_dir = tmp_path / "job"
    trees = prepare_host_trees(spec, job_dir, ConfigFiles.of(spec, job_name="job-1", hosts=host_names(2), submit_directory="file:///code"))
    assert [tree.host for tree in trees] == ["algo-1", "algo-2"]
    second = OptMl(job_dir / "algo-2")
    resource = json.loads(second.resource_config_file.read_text())
    assert resource["current_host"] == "algo-2" and resource["hosts"] == ["algo-1", "algo-2"]
    assert resource["current_instance_type"] == "local" and resource["network_interface_name"] == "eth0"
    raw = json.loads(second.hyperparameters_file.read_text())
    assert raw["name"] == '"cnn"' and raw["epochs"] == "2"
    decoded = decode_hyperparameters(raw)
    assert decoded["sagemaker_submit_directory"] == "file:///code" and decoded["sagemaker_job_name"] == "job-1"
    assert decoded["sagemaker_torch_distributed_enabled"] is True and decoded["sagemaker_instance_type"] == "local"
    channels = json.loads(second.input_data_config_file.read_text())
    assert channels["labels"]["ContentType"] == "text/csv" and channels["train"]["TrainingInputMode"] == "File"
    assert (second.channel_dir("train") / "a.csv").read_text() == "1\n"
    assert (second.channel_dir("labels") / "labels.csv").read_text() == "x\n"
    assert second.model_dir.is_dir() and second.output_data_dir.is_dir() and second.code_dir.is_dir()


def test_inputs_can_be_left_to_the_caller(spec, tmp_path):
    (tree,) = prepare_host_trees(spec, tmp_path / "job", ConfigFiles.of(spec, job_name="j", hosts=["algo-1"], submit_directory="/opt/ml/code"), link_inputs=False)
    assert not tree.opt_ml.channel_dir("train").exists()


def test_code_snapshot_has_v2_sourcedir_layout_without_caches(spec, tmp_path):
    dest = stage_code(spec, tmp_path / "code")
    files = sorted(path.relative_to(dest).as_posix() for path in dest.rglob("*") if path.is_file())
    assert files == ["dep/dep.py", "pkg/util.py", "train.py"]


def test_a_lone_entry_point_is_staged_by_itself(tmp_path):
    (tmp_path / "solo.py").write_text("pass\n")
    spec = JobSpec.from_mapping({"entry_point": "solo.py", "instance_type": "local"}, base_dir=tmp_path)
    dest = stage_code(spec, tmp_path / "code")
    assert [path.name for path in dest.iterdir()] == ["solo.py"]


def test_artifacts_merge_every_hosts_model_and_output_data(tmp_path):
    first, second = OptMl(tmp_path / "algo-1"), OptMl(tmp_path / "algo-2")
    for tree in (first, second):
        tree.make_dirs()
    (first.model_dir / "model.pt").write_text("rank0")
    (first.model_dir / "sub").mkdir()
    (first.model_dir / "sub" / "shared.txt").write_text("from algo-1")
    (second.model_dir / "sub").mkdir()
    (second.model_dir / "sub" / "shared.txt").write_text("from algo-2")
    (second.output_data_dir / "metrics.json").write_text("{}")
    model, output = collect_artifacts([first, second], tmp_path / "out")
    with tarfile.open(model) as archive:
        assert sorted(archive.getnames()) == ["model.pt", "sub/shared.txt"]
        assert archive.extractfile("sub/shared.txt").read() == b"from algo-2"  # later hosts win, as in v2
    with tarfile.open(output) as archive:
        assert archive.getnames() == ["metrics.json"]


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range(tmp_path):
    low, _ = (int(part) for part in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    ports = pick_free_ports(3)
    assert len(set(ports)) == 3
    for port in ports:
        assert port < low or port > 60999
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


def test_ports_of_other_live_jobs_are_avoided(tmp_path):
    live, done = JobDir(tmp_path / "live"), JobDir(tmp_path / "done")
    for job, state in ((live, "RUNNING"), (done, "SUCCEEDED")):
        job.path.mkdir()
        job.write_state({"state": state, "ports": {"SMDDP_MASTER_PORT": 23456 if state == "RUNNING" else 23457}})
    assert ports_of_live_jobs(tmp_path) == {23456}
    assert 23456 not in pick_free_ports(50, exclude=ports_of_live_jobs(tmp_path))


def test_console_lines_parse_back_into_log_lines():
    assert parse_console_line("[algo-2/rank3]: loss 0.1\n") == parse_console_line("[algo-2/rank3]:loss 0.1")
    line = parse_console_line("[algo-2/rank3]: loss 0.1\n")
    assert (line.host, line.rank, line.text, line.prefix) == ("algo-2", 3, "loss 0.1", "[algo-2/rank3]:")
    runtime = parse_console_line("[algo-1/runtime]: started ranks [0, 1]")
    assert (runtime.host, runtime.rank, runtime.text) == ("algo-1", None, "started ranks [0, 1]")


def test_scheduler_options_are_checked(tmp_path):
    with pytest.raises(SpecError) as info:
        get_scheduler("local", job_root=str(tmp_path), processes_per_host=0, keep_job_dir="no", stop_grace_period=-1, colour=True)
    assert [issue.path for issue in info.value.issues] == [
        "scheduler_options.colour",
        "scheduler_options.processes_per_host",
        "scheduler_options.keep_job_dir",
        "scheduler_options.stop_grace_period",
    ]


def test_job_root_defaults_to_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "root"))
    assert get_scheduler("local").job_root == tmp_path / "root"


def test_status_of_unknown_or_foreign_handles_is_a_clear_error(tmp_path):
    scheduler = get_scheduler("local", job_root=str(tmp_path))
    with pytest.raises(SpecError, match="no local job 'missing'"):
        scheduler.status(JobHandle("local", "missing"))
    with pytest.raises(SpecError, match="is not a local job"):
        scheduler.status(JobHandle("docker", "x"))


def test_a_job_whose_supervisor_vanished_reads_as_failed(tmp_path):
    scheduler = get_scheduler("local", job_root=str(tmp_path))
    job = JobDir(tmp_path / "ghost")
    job.path.mkdir()
    job.write_record({"handle": "local://ghost", "plan": {"stop_grace_period": 1, "artifacts": {"model_data": str(job.path / "model.tar.gz"), "output_data": str(job.path / "output.tar.gz")}}})
    job.write_state({"state": "RUNNING", "supervisor_pid": 2**22 + 12345, "hosts": {}})
    status = scheduler.status(JobHandle("local", "ghost"))
    assert status.state is JobState.FAILED and "supervisor" in status.message
    assert (job.path / "model.tar.gz").is_file() and (job.path / "output.tar.gz").is_file()  # where the record says
    scheduler.cancel(JobHandle("local", "ghost"))  # nothing to stop: still idempotent
    assert [job.handle.job_id for job in scheduler.list_jobs()] == ["ghost"]


def test_a_job_name_that_exists_is_refused_before_writing(spec, tmp_path):
    scheduler = get_scheduler("local", job_root=str(tmp_path / "jobs"))
    (tmp_path / "jobs" / "taken").mkdir(parents=True)
    issues = scheduler.validate(spec.replace(job_name="taken"))
    assert [issue.path for issue in issues] == ["job_name"]
    assert os.listdir(tmp_path / "jobs") == ["taken"]


def test_runtimes_do_not_inherit_another_jobs_identity():
    outer = {
        "PATH": "/bin",
        "SM_CURRENT_HOST": "algo-9",
        "RANK": "5",
        "MASTER_ADDR": "10.0.0.1",
        "SMDDP_STOP_GRACE": "3",
        "SMDATAPARALLEL_SERVER_ADDR": "x",
        "TRAINING_JOB_NAME": "outer",
        "SMS_SETTING": "kept",
    }
    assert inherited_env(outer) == {"PATH": "/bin", "SMDDP_STOP_GRACE": "3", "SMS_SETTING": "kept"}


def test_largest_entries_of_a_code_snapshot(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"\0" * 5000)
    (tmp_path / "train.py").write_text("x" * 10)
    total, largest = largest_entries(tmp_path, count=1)
    assert total == 5010 and largest == [("data", 5000)]
