"""The runtime as a real process on one simulated host: argv safety, bad input, signals, entry-point kinds."""

from __future__ import annotations

import io
import json
import signal
import tarfile
import time
from pathlib import Path

import pytest

from smddp_sdk.specs.contract import read_failure
from tests.integration.runtime_job import alive, make_job, wait_all

pytestmark = pytest.mark.integration


def single_host(tmp_path: Path, files: dict[str, str], hps: dict, entry_point: str = "train.py", num_gpus: int = 0):
    code = tmp_path / "src"
    code.mkdir(exist_ok=True)
    for name, text in files.items():
        (code / name).write_text(text)
    return make_job(tmp_path, code, ["algo-1"], hps, entry_point=entry_point, num_gpus=num_gpus)


def run_one(job, timeout: float = 60, **extra_env: str) -> tuple[int, str]:
    return wait_all(job.start(extra_env), timeout)["algo-1"]


def test_a_hyperparameter_with_shell_characters_arrives_as_one_argument(tmp_path):
    script = "import json, sys, os\nopen(os.environ['SM_OUTPUT_DATA_DIR'] + '/argv.json', 'w').write(json.dumps(sys.argv[1:]))\n"
    job = single_host(tmp_path, {"train.py": script}, {"x": "a b; echo INJECTED", "flag": True, "epochs": 3})
    code, out = run_one(job)
    assert code == 0, out
    argv = json.loads((job.opt_ml("algo-1").output_data_dir / "argv.json").read_text())
    assert argv == ["--epochs", "3", "--flag", "True", "-x", "a b; echo INJECTED"]
    assert "\nINJECTED" not in out
    assert job.opt_ml("algo-1").success_file.exists()


def test_a_shell_entry_point_gets_the_same_argv(tmp_path):
    script = 'printf "%s\\n" "$@" > "$SM_OUTPUT_DATA_DIR/args.txt"\n'
    job = single_host(tmp_path, {"run.sh": script}, {"x": "a b; echo INJECTED"}, entry_point="run.sh")
    code, out = run_one(job)
    assert code == 0, out
    assert (job.opt_ml("algo-1").output_data_dir / "args.txt").read_text() == "-x\na b; echo INJECTED\n"


def test_missing_resource_config_exits_2_and_says_so_in_the_failure_file(tmp_path):
    job = single_host(tmp_path, {"train.py": ""}, {})
    job.opt_ml("algo-1").resource_config_file.unlink()
    code, out = run_one(job)
    assert code == 2
    reason = read_failure(job.opt_ml("algo-1")) or ""
    assert "resourceconfig.json: file is missing" in reason and "resourceconfig.json" in out


def test_unknown_entry_point_exits_2_with_a_suggestion(tmp_path):
    job = single_host(tmp_path, {"train.py": ""}, {}, entry_point="trian.py")
    code, out = run_one(job)
    assert code == 2, out
    reason = read_failure(job.opt_ml("algo-1")) or ""
    assert "sagemaker_program" in reason and "did you mean 'train.py'?" in reason


def test_an_unsafe_tarball_is_refused_with_exit_2(tmp_path):
    archive = tmp_path / "sourcedir.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        member = tarfile.TarInfo("../escape.py")
        member.size = 1
        tar.addfile(member, io.BytesIO(b"\n"))
    job = single_host(tmp_path, {}, {})
    job.opt_ml("algo-1").hyperparameters_file.write_text(
        json.dumps({"sagemaker_program": '"train.py"', "sagemaker_submit_directory": json.dumps(str(archive))})
    )
    code, out = run_one(job)
    assert code == 2, out
    assert "refusing to extract member '../escape.py'" in (read_failure(job.opt_ml("algo-1")) or "")
    assert not (tmp_path / "algo-1" / "escape.py").exists()


def test_a_rank_without_an_error_file_reports_its_code_and_last_lines(tmp_path):
    job = single_host(tmp_path, {"run.sh": "echo 'disk is full'\nexit 3\n"}, {}, entry_point="run.sh")
    code, out = run_one(job)
    assert code == 3, out
    reason = read_failure(job.opt_ml("algo-1")) or ""
    assert reason.startswith("Root cause: rank 0 on host algo-1 failed with exit code 3")
    assert "disk is full" in reason


def test_failed_requirements_install_fails_the_job(tmp_path):
    job = single_host(tmp_path, {"train.py": "", "requirements.txt": "./no-such-package-dir\n"}, {})
    code, out = run_one(job, timeout=120)
    assert code == 1, out
    assert "pip could not install requirements.txt" in (read_failure(job.opt_ml("algo-1")) or "")
    assert "[algo-1/setup]:" in out


SIGTERM_SCRIPT = """
import os, signal, sys, time
rank = os.environ["RANK"]
out = os.environ["SM_OUTPUT_DATA_DIR"]
def on_term(signum, frame):
    open(f"{out}/term-{rank}", "w").write("got SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(f"{out}/pid-{rank}", "w").write(str(os.getpid()))
time.sleep(60)
"""


def test_sigterm_to_the_runtime_reaches_every_rank(tmp_path):
    job = single_host(tmp_path, {"train.py": SIGTERM_SCRIPT}, {"sagemaker_distributed_dataparallel_enabled": True}, num_gpus=2)
    data = job.opt_ml("algo-1").output_data_dir
    runtime = job.start()["algo-1"]
    deadline = time.monotonic() + 30
    while len(list(data.glob("pid-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(p.read_text()) for p in data.glob("pid-*")]
    assert len(pids) == 2, "ranks did not start"
    runtime.send_signal(signal.SIGTERM)
    code, out = wait_all({"algo-1": runtime}, 30)["algo-1"]
    assert code == 143, out
    assert sorted(p.name for p in data.glob("term-*")) == ["term-0", "term-1"]
    assert "received SIGTERM" in (read_failure(job.opt_ml("algo-1")) or "")
    assert not [pid for pid in pids if alive(pid)]


def test_each_rank_leads_its_own_session_marked_with_the_runtimes(tmp_path):
    """A session per rank gives each its own scheduler autogroup (as torchrun's workers); the marker
    lets the host's sweep find the ranks and their children."""
    script = (
        "import os, json\n"
        "open(os.environ['SM_OUTPUT_DATA_DIR'] + f\"/ids-{os.environ['RANK']}.json\", 'w').write("
        "json.dumps([os.getpid(), os.getpgid(0), os.getsid(0), os.getppid(), int(os.environ['SMDDP_HOST_SESSION'])]))\n"
    )
    job = single_host(tmp_path, {"train.py": script}, {"sagemaker_distributed_dataparallel_enabled": True}, num_gpus=2)
    runtime = job.start()["algo-1"]
    code, out = wait_all({"algo-1": runtime}, 60)["algo-1"]
    assert code == 0, out
    for rank in (0, 1):
        pid, pgid, sid, parent, host_session = json.loads((job.opt_ml("algo-1").output_data_dir / f"ids-{rank}.json").read_text())
        assert pgid == pid == sid and parent == runtime.pid and host_session == runtime.pid
