"""Every command through click's runner: help texts (golden), init, env, schema, completion, validate,
the shorthand, handles and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from smddp_sdk.cli.main import cli, insert_default_command
from tests.cli.conftest import assert_golden

COMMANDS = sorted(cli.commands)


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_text(invoke, command: str):
    args = [command, "--help"] if command else ["--help"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert_golden(f"help_{command or 'main'}.txt", result.stdout)


def test_short_help_option_and_version(invoke):
    assert invoke("-h").stdout == invoke("--help").stdout
    result = invoke("--version")
    assert result.exit_code == 0 and "smddp-launch, version" in result.stdout


def test_a_job_file_without_a_command_means_run():
    commands = cli.commands
    assert insert_default_command(["job.yaml", "--dryrun"], commands) == ["run", "job.yaml", "--dryrun"]
    assert insert_default_command(["--debug", "jobs/x.yml"], commands) == ["--debug", "run", "jobs/x.yml"]
    assert insert_default_command(["validate", "job.yaml"], commands) == ["validate", "job.yaml"]
    assert insert_default_command(["stauts"], commands) == ["stauts"]


def test_unknown_command_is_a_usage_error_with_a_suggestion(invoke):
    result = invoke("stauts", "local://x")
    assert result.exit_code == 2
    assert "Did you mean" in result.stderr and "'status'" in result.stderr


def make_job(work: Path, extra: str = "") -> Path:
    (work / "train.py").write_text("print('hi')\n")
    job = work / "job.yaml"
    job.write_text("entry_point: train.py\ninstance_type: ml.g5.12xlarge\ninstance_count: 2\n"
                   "distribution:\n  smdistributed:\n    dataparallel:\n      enabled: true\n" + extra)
    return job


def test_validate_accepts_a_good_job_and_summarises_it(invoke, isolated):
    make_job(isolated, "job_name: mnist-1\nscheduler: local\n")
    result = invoke("validate", "job.yaml")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("job.yaml: valid · mnist-1 · 2 hosts × ml.g5.12xlarge, 4 GPUs each · distribution smddp · scheduler local")


def test_validate_reports_problems_from_flags_and_environment_too(invoke, isolated):
    make_job(isolated)
    result = invoke("validate", "job.yaml", "--set", "instance_cout=2", env={"SMDDP_MAX_RUN": "soon"})
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "--set instance_cout: unknown field 'instance_cout' (did you mean 'instance_count'?)",
        "SMDDP_MAX_RUN: max_run: must be an integer, got 'soon'",
        "2 problems found. See `smddp-launch schema` or docs/job-file.md",
    ]


def test_bad_flag_values_are_usage_errors(invoke, isolated):
    make_job(isolated)
    for args in (["--instance-count", "0"], ["-H", "novalue"], ["--scheduler", "dokcer"], ["--rank", "a-b"], ["--", "positional"],
                 ["--set", "tags[0].Key=a"], ["--set", "hyperparameters={a: [1"]):
        result = invoke("run", "job.yaml", *args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output


def test_missing_job_file_is_exit_2_without_traceback(invoke):
    result = invoke("run", "nope.yaml")
    assert result.exit_code == 2
    assert "nope.yaml: file not found (check the path, or run `smddp-launch init` to write one)" in result.stderr
    assert "Traceback" not in result.output


def test_debug_shows_the_traceback(invoke):
    result = invoke("--debug", "run", "nope.yaml")
    assert result.exit_code == 2
    assert "Traceback" in result.stderr


def test_yaml_syntax_error_shows_the_line_and_a_caret(invoke, isolated):
    (isolated / "job.yaml").write_text("entry_point: train.py\ninstance_type: [local\n")
    result = invoke("job.yaml")
    assert result.exit_code == 2
    assert_golden("yaml_syntax_error.txt", result.stderr)


def test_an_unknown_job_or_bad_handle_is_a_usage_error(invoke):
    for command in ("status", "logs", "cancel", "metrics"):
        result = invoke(command, "pytorch-training-1")
        assert result.exit_code == 2
        assert "no job named 'pytorch-training-1' was submitted from this machine" in result.stderr
    result = invoke("status", "lcoal://job")
    assert result.exit_code == 2 and "did you mean 'local'?" in result.stderr


# --- init --------------------------------------------------------------------------------------


def test_init_without_a_terminal_writes_defaults_and_the_schema(invoke, isolated):
    result = invoke("init")
    assert result.exit_code == 0, result.output
    written = (isolated / "job.yaml").read_text()
    assert written.startswith("# yaml-language-server: $schema=smddp-job.schema.json\n")
    assert yaml.safe_load(written)["instance_type"] == "ml.g5.2xlarge"
    assert json.loads((isolated / "smddp-job.schema.json").read_text())["title"] == "smddp-sdk job file"
    assert "Next: create train.py" in result.stderr
    assert_golden("init_job.yaml", written)


def test_init_refuses_to_overwrite_without_force(invoke, isolated):
    assert invoke("init").exit_code == 0
    again = invoke("init")
    assert again.exit_code == 2 and "already exists" in again.stderr
    assert invoke("init", "--force", "--instance-count", "3").exit_code == 0
    assert yaml.safe_load((isolated / "job.yaml").read_text())["instance_count"] == 3


def test_init_answers_become_a_job_that_validates(invoke, isolated):
    (isolated / "main.py").write_text("print('hi')\n")
    answers = "local\nmain.py\nml.g5.xlarge\n3\ntorch_distributed\n"
    result = invoke("init", "jobs/mnist.yaml", "--no-schema", "--interactive", input=answers)
    assert result.exit_code == 0, result.output
    data = yaml.safe_load((isolated / "jobs" / "mnist.yaml").read_text())
    assert data == {**data, "scheduler": "local", "entry_point": "main.py", "instance_type": "ml.g5.xlarge", "instance_count": 3,
                    "distribution": {"torch_distributed": {"enabled": True}}}
    assert not (isolated / "jobs" / "smddp-job.schema.json").exists()
    (isolated / "jobs" / "main.py").write_text("print('hi')\n")
    assert invoke("validate", "jobs/mnist.yaml").exit_code == 0


# --- env, completion, options -----------------------------------------------------------------


def test_env_says_whether_credentials_exist_but_never_prints_them(invoke):
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    result = invoke("env", env={"AWS_ACCESS_KEY_ID": "AKIAEXAMPLEID123", "AWS_SECRET_ACCESS_KEY": secret,
                                "AWS_SESSION_TOKEN": "token-value", "SMDDP_ROLE": "arn:aws:iam::1:role/R"})
    assert result.exit_code == 0
    assert secret not in result.output and "AKIAEXAMPLEID123" not in result.output and "token-value" not in result.output
    facts = dict(line.split("  ", 1) for line in result.stdout.splitlines())
    assert facts["aws credentials"].strip() == "yes (environment)"
    assert facts["smddp-sdk"].strip() == "0.1.0"
    assert "arn:aws" not in result.stdout and "SMDDP_ROLE" in result.stdout
    as_json = json.loads(invoke("env", "--json").stdout)
    assert as_json["aws credentials"] == "no"
    assert {"python", "torch", "docker", "gpus"} <= set(as_json)


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_a_script_for_the_shell(invoke, shell):
    result = invoke("completion", shell)
    assert result.exit_code == 0
    assert "_SMDDP_LAUNCH_COMPLETE" in result.stdout
    assert f"{shell}_complete" in result.stdout


def test_completion_suggests_commands_and_schedulers(isolated):
    from click.shell_completion import ShellComplete

    complete = ShellComplete(cli, {}, "smddp-launch", "_SMDDP_LAUNCH_COMPLETE")
    assert "validate" in [item.value for item in complete.get_completions([], "val")]
    assert [item.value for item in complete.get_completions(["run", "job.yaml", "--scheduler"], "sa")] == ["sagemaker"]


def test_run_without_a_job_file_says_how_to_give_one(invoke, isolated):
    result = invoke("run")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[1:] == [
        "entry_point: is required",
        "instance_type: is required",
        "2 problems found. See `smddp-launch schema` or docs/job-file.md",
        "No job file was given: name one (smddp-launch run job.yaml), or set --entry-point and --instance-type.",
    ]
    (isolated / "train.py").write_text("print('hi')\n")
    assert invoke("validate", "--entry-point", "train.py", "--instance-type", "local").exit_code == 0


def test_every_problem_is_reported_in_one_run_in_file_order(invoke, isolated):
    (isolated / "train.py").write_text("print('hi')\n")
    (isolated / "job.yaml").write_text(
        "entry_point: train.py\n"
        "instance_type: local-gpu\n"
        "instance_cout: 2\n"
        "hyperparameters:\n"
        "  epochs: 3\n"
        "distribution:\n"
        "  smdistributed:\n"
        "    dataparalel:\n"
        "      enabled: true\n"
        "input_mode: file\n"
        "max_run: ten\n"
        "inputs:\n"
        "  train: ./missing\n"
    )
    result = invoke("job.yaml", env={"SMDDP_VOLUME_SIZE": "big"})
    assert result.exit_code == 2
    assert_golden("many_problems.txt", result.stderr)


def test_a_misspelt_setting_variable_is_pointed_out(invoke, isolated):
    make_job(isolated, "scheduler: local\n")
    result = invoke("validate", "job.yaml", env={"SMDDP_INSTANCE_CONT": "4", "SMDDP_MASTER_PORT": "1234"})
    assert result.exit_code == 0
    assert result.stderr.splitlines() == ["warning: SMDDP_INSTANCE_CONT is not a setting and is ignored (did you mean SMDDP_INSTANCE_COUNT?)"]


def test_validate_json_lists_problems_with_positions(invoke, isolated):
    make_job(isolated, "instance_cout: 2\n")
    result = invoke("validate", "job.yaml", "--json", env={"SMDDP_MAX_RUN": "soon"})
    assert result.exit_code == 2
    assert json.loads(result.stdout) == {"valid": False, "problems": [
        {"file": "job.yaml", "line": 8, "column": 1, "source": None, "path": "instance_cout", "message": "unknown field", "hint": "did you mean 'instance_count'?"},
        {"file": None, "line": None, "column": None, "source": "SMDDP_MAX_RUN", "path": "max_run", "message": "must be an integer, got 'soon'", "hint": ""},
    ]}
    (isolated / "job.yaml").write_text("entry_point: [train.py\n")
    syntax = json.loads(invoke("validate", "job.yaml", "--json").stdout)
    assert syntax["problems"][0]["line"] == 1 and syntax["problems"][0]["message"].startswith("YAML syntax error")
    make_job(isolated, "scheduler: local\njob_name: ok-1\n")
    good = json.loads(invoke("validate", "job.yaml", "--json").stdout)
    assert good["valid"] is True and good["spec"]["instance_count"] == 2 and good["scheduler"] == "local"


def test_an_unavailable_environment_is_exit_3_without_traceback(invoke, isolated):
    # SageMaker with no AWS region anywhere (isolated HOME, no AWS_* variables): a dry run shows a
    # placeholder region, a submit cannot go anywhere.
    make_job(isolated, "scheduler: sagemaker\nrole: arn:aws:iam::111122223333:role/SageMakerRole\noutput_path: s3://bucket/out\n"
                       "image_uri: 111122223333.dkr.ecr.us-west-2.amazonaws.com/smddp-sdk:latest\n")
    result = invoke("run", "job.yaml", env={"AWS_CONFIG_FILE": str(isolated / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(isolated / "none")})
    assert result.exit_code == 3, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.output
    assert result.stderr.splitlines()[-1].startswith("error: ")


@pytest.mark.parametrize("scheduler", ["local", "docker", "sagemaker", "slurm"])
def test_options_describe_every_option(invoke, scheduler):
    result = invoke("options", scheduler)
    assert result.exit_code == 0, result.output
    header, *rows = [line for line in result.stdout.split("\n\n")[0].splitlines() if line]
    assert header.split() == ["OPTION", "TYPE", "DEFAULT", "DESCRIPTION"]
    from smddp_sdk.schedulers import scheduler_class

    declared = {option.name: option.help for option in scheduler_class(scheduler).options}
    for row in rows:
        name = row.split()[0]
        assert declared.get(name) and row.rstrip().endswith(declared[name]), row


def test_set_null_unsets_a_string_field(invoke, isolated):
    (isolated / "train.py").write_text("")
    result = invoke("run", "--set", "output_path=null", "--set", "base_job_name=~", "--dryrun", "train.py")
    assert result.exit_code == 0, result.output
    assert "output_path: null" in result.stdout and "'null'" not in result.stdout


def test_job_files_give_v2s_reason_for_refused_fields(invoke, isolated):
    (isolated / "train.py").write_text("")
    (isolated / "job.yaml").write_text("entry_point: train.py\ninstance_type: local\ngit_config: {repo: x}\n")
    result = invoke("validate", "job.yaml")
    assert result.exit_code == 2
    assert "job.yaml:3:1: unknown field 'git_config' (a SageMaker SDK v2 argument not offered here: clone the repository" in result.stderr
