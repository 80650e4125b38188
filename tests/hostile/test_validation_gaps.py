"""What `validate` and the dry run used to call valid and a run then refused or silently changed: a metric
regex that does not compile, variables the node runtime owns in `environment`, code trees the snapshot
refuses, hyperparameter names no option or variable can hold, more channels than SageMaker takes. Each is
now a problem at its file:line, exit 2, before anything starts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from smddp_sdk.cli.main import cli
from smddp_sdk.errors import SpecError
from smddp_sdk.runtime import env as rank_env
from smddp_sdk.runtime import plan as planning
from smddp_sdk.runtime import store
from smddp_sdk.runtime.training_env import read_training_env
from smddp_sdk.schedulers.job_files import stage_code
from smddp_sdk.specs import contract, limits
from smddp_sdk.specs.contract import OptMl
from smddp_sdk.specs.job import JobSpec

HEAD = "entry_point: train.py\ninstance_type: local\n"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith(("SMDDP_", "AWS_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    for script in (work / "train.py", work / "src" / "train.py"):
        script.write_text("print('hi')\n")
    monkeypatch.chdir(work)
    return work


def problems(text: str, *command: str) -> list[str]:
    """The ``job.yaml:L:C: ...`` lines of ``validate`` (or another command) on ``text``; exit 2 asserted."""
    Path("job.yaml").write_text(text, encoding="utf-8")
    result = CliRunner().invoke(cli, [*(command or ("validate",)), "job.yaml"], env={"SMDDP_JOB_ROOT": str(Path("jobs").resolve())}, catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    return [line for line in result.stderr.splitlines() if line.startswith("job.yaml:")]


def valid(text: str) -> str:
    Path("job.yaml").write_text(text, encoding="utf-8")
    result = CliRunner().invoke(cli, ["validate", "job.yaml"], env={"SMDDP_JOB_ROOT": str(Path("jobs").resolve())}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


# --- metric definitions -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [("validate",), ("run", "--dryrun")])
def test_a_metric_regex_that_does_not_compile_is_refused_at_its_line(workdir: Path, command: tuple[str, ...]) -> None:
    text = HEAD + "metric_definitions:\n  - {Name: loss, Regex: 'loss=([0-9.]+)'}\n  - {Name: acc, Regex: 'acc=([0-9'}\n"
    assert problems(text, *command) == [
        "job.yaml:5:24: metric_definitions[1].Regex: 'acc=([0-9' is not a regular expression: unterminated character set at position 5 "
        "(escape literal characters such as [ ( . with a backslash)"
    ]


def test_a_metric_regex_without_a_group_is_refused(workdir: Path) -> None:
    assert problems(HEAD + "metric_definitions:\n  - {Name: loss, Regex: 'loss=[0-9.]+'}\n") == [
        "job.yaml:4:25: metric_definitions[0].Regex: 'loss=[0-9.]+' has no capture group: the value is the first group (put parentheses around the number, e.g. loss=([0-9.eE+-]+))"
    ]


def test_good_metric_definitions_stay_valid(workdir: Path) -> None:
    valid(HEAD + "metric_definitions:\n  - {Name: 'train:loss', Regex: 'loss[=: ]+([0-9.eE+-]+)'}\n")


# --- the runtime's own variables ------------------------------------------------------------------------

OWNED = ["SM_CURRENT_HOST", "SMDDP_MESH_SECRET", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "SM_TRAINING_ENV", "SM_HPS",
         "SM_NUM_GPUS", "SMDATAPARALLEL_SERVER_ADDR", "TORCHELASTIC_RUN_ID", "SMDDP_ERROR_FILE", "SM_HP_LR", "SM_CHANNEL_TRAIN"]


@pytest.mark.parametrize("name", OWNED)
def test_environment_naming_a_variable_the_runtime_sets_is_refused_with_the_reason(workdir: Path, name: str) -> None:
    (line,) = problems(HEAD + f"environment:\n  {name}: x\n")
    assert line.startswith(f"job.yaml:4:{len(name) + 5}: environment.{name}: ")
    assert ("is set by the node runtime for every rank, so this value would be replaced" in line) or ("is set by smddp-sdk and cannot be overridden" in line), line
    if name.startswith("SM_HP_"):
        assert "set the hyperparameter 'lr' instead" in line


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "NCCL_SOCKET_IFNAME", "PYTHONPATH", "SM_MY_OWN", "MY_SETTING", "GLIBC_TUNABLES"])
def test_variables_the_runtime_only_defaults_stay_the_users(workdir: Path, name: str) -> None:
    valid(HEAD + f"environment:\n  {name}: x\n")


def test_every_variable_the_runtime_sets_for_a_rank_is_in_the_contracts_list(tmp_path: Path) -> None:
    """The list validation refuses is the runtime's own: a rank's environment, made by the runtime's real
    functions from a real tree (torch_distributed, so torchrun's variables too), holds no other variable
    it sets, except those it only defaults where the job gave none."""
    base = tmp_path / "opt_ml"
    hyperparameters = {"sagemaker_program": "train.py", "sagemaker_torch_distributed_enabled": True, "lr": 0.1}
    contract.write_config_files(OptMl(base), resource=contract.resource_config("algo-1", ["algo-1", "algo-2"], "ml.c5.xlarge"),
                                hyperparameters=contract.encode_hyperparameters(hyperparameters), input_data=contract.input_data_config({"train": {}}))
    environ = {contract.BASE_DIR_ENV: str(base), contract.NUM_GPUS_ENV: "2"}
    env = read_training_env(environ)
    shape = planning.launch_shape(env.framework_params, True)
    plan = planning.plan_ranks(env.ordered_hosts, env.current_host, shape, planning.processes_per_host(shape, env.framework_params, env.gpus_for_planning, 0),
                               planning.total_processes(shape, env.framework_params))
    made = rank_env.process_env(environ, env, plan, plan.local_slots[1], python_path=["/code"], error_file="/e.json")
    made.update(store.rank_environment("127.0.0.1", is_master=False, served=False))
    defaulted = {"PYTHONPATH", "PYTHONUNBUFFERED", "GLIBC_TUNABLES", "OMP_NUM_THREADS", "NCCL_SOCKET_IFNAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING", contract.BASE_DIR_ENV, contract.NUM_GPUS_ENV}
    assert {"RANK", "SM_HP_LR", "SM_CHANNEL_TRAIN", "TORCHELASTIC_RUN_ID", contract.MESH_SECRET_ENV} <= set(made)
    assert sorted(name for name in made if name not in defaulted and not contract.runtime_owned(name)) == []
    assert [name for name in made if contract.runtime_owned(name) and not limits.environment_issues({name: "x"})] == []


# --- hyperparameter names and channels -----------------------------------------------------------------


@pytest.mark.parametrize(("name", "problem"), [("a=b", "holds '=', which would end the name of its environment variable SM_HP_..."),
                                               ("a b", "holds whitespace, which no command-line option can hold"),
                                               ("a\\tb", "holds whitespace, which no command-line option can hold")])
def test_hyperparameter_names_no_option_or_variable_can_hold_are_refused(workdir: Path, name: str, problem: str) -> None:
    shown = name.replace("\\t", "\t")
    assert problems(HEAD + f'hyperparameters:\n  "{name}": 1\n') == [
        f"job.yaml:4:{len(name) + 7}: hyperparameters.{shown}: name {shown!r} {problem} (use letters, digits, '_', '-' and '.')"
    ]


def test_more_channels_than_sagemaker_takes_are_refused(workdir: Path) -> None:
    (workdir / "data").mkdir()
    channels = "".join(f"  c{index}: data\n" for index in range(limits.MAX_CHANNELS + 1))
    assert problems(HEAD + "inputs:\n" + channels) == ["job.yaml:3:1: inputs: 21 channels; the limit is 20 (SageMaker's) (put related data under one channel, in folders)"]


# --- code trees: validate, the dry run and the snapshot apply one check ------------------------------


def _hostile_source(work: Path) -> Path:
    source = work / "src"
    os.mkfifo(source / "pipe")
    (source / "passwd").symlink_to("/etc/passwd")
    (source / "gone").symlink_to("missing")
    (source / ".git").mkdir()
    os.mkfifo(source / ".git" / "ignored")  # never part of a snapshot: not a problem of one
    return source


@pytest.mark.parametrize("command", [("validate",), ("run", "--dryrun"), ("run",)])
def test_a_code_tree_the_snapshot_refuses_is_refused_by_validate_and_the_dry_run_alike(workdir: Path, command: tuple[str, ...]) -> None:
    source = _hostile_source(workdir)
    text = HEAD.replace("entry_point: train.py\n", "entry_point: train.py\nsource_dir: src\n")
    with pytest.raises(SpecError) as raised:
        stage_code(JobSpec.from_mapping({"entry_point": "train.py", "source_dir": str(source), "instance_type": "local"}), workdir / "snapshot")
    snapshot = sorted(f"job.yaml:2:13: {issue}" for issue in raised.value.issues)
    assert len(snapshot) == 3
    assert sorted(problems(text, *command)) == snapshot
    assert not (workdir / "jobs").exists() or not any((workdir / "jobs").iterdir())  # nothing started


def test_a_clean_code_tree_with_links_inside_stays_valid(workdir: Path) -> None:
    (workdir / "src" / "lib").mkdir()
    (workdir / "src" / "alias.py").symlink_to("train.py")
    (workdir / "src" / "lib" / "up").symlink_to("..")
    valid(HEAD.replace("entry_point: train.py\n", "entry_point: train.py\nsource_dir: src\n"))


def test_the_job_root_inside_source_dir_is_not_walked(workdir: Path) -> None:
    (workdir / "jobs" / "old-job").mkdir(parents=True)
    os.mkfifo(workdir / "jobs" / "old-job" / "lifeline")  # another job's live FIFO: not this job's code
    assert "valid" in valid(HEAD.replace("entry_point: train.py\n", "entry_point: train.py\nsource_dir: .\n"))


def test_validate_json_reports_the_same_problems(workdir: Path) -> None:
    Path("job.yaml").write_text(HEAD + "environment:\n  RANK: '3'\n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["validate", "--json", "job.yaml"], catch_exceptions=False)
    report = json.loads(result.stdout)
    assert result.exit_code == 2 and not report["valid"]
    assert [(p["line"], p["path"]) for p in report["problems"]] == [(4, "environment.RANK")]
