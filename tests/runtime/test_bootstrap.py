"""The rank bootstrap records failures of undecorated scripts (real interpreter processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import smddp_sdk

PACKAGE_ROOT = str(Path(smddp_sdk.__file__).resolve().parent.parent)


def run(tmp_path: Path, source: str, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    (tmp_path / "train.py").write_text(source)
    error_file = tmp_path / "errors/rank-3.json"
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT, "SMDDP_ERROR_FILE": str(error_file), "RANK": "3", "LOCAL_RANK": "1", "SM_CURRENT_HOST": "algo-2"}
    result = subprocess.run(
        [sys.executable, "-m", "smddp_sdk.runtime.bootstrap", "train.py", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    return result, error_file


def test_an_exception_is_recorded_with_the_users_traceback_only(tmp_path):
    result, error_file = run(tmp_path, "def step():\n    raise ValueError('bad batch')\nstep()\n")
    assert result.returncode == 1
    record = json.loads(error_file.read_text())
    assert (record["host"], record["rank"], record["local_rank"], record["exit_code"]) == ("algo-2", 3, 1, 1)
    assert (record["error_type"], record["message"]) == ("ValueError", "bad batch")
    assert record["traceback"].startswith("Traceback") and "runpy" not in record["traceback"]
    assert "bootstrap" not in record["traceback"] and "in step" in record["traceback"]
    assert "ValueError: bad batch" in result.stderr


def test_script_sees_argv_main_and_its_directory_like_python_does(tmp_path):
    source = "import sys, os\nprint(__name__, sys.argv[1:], os.path.basename(sys.argv[0]), sys.path[0] == os.path.dirname(__file__))\n"
    result, error_file = run(tmp_path, source, "--x", "a b; echo INJECTED")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "__main__ ['--x', 'a b; echo INJECTED'] train.py True"
    assert not error_file.exists()


def test_sys_exit_codes_pass_through(tmp_path):
    result, error_file = run(tmp_path, "import sys\nsys.exit(7)\n")
    assert result.returncode == 7
    assert json.loads(error_file.read_text())["exit_code"] == 7
    result, error_file = run(tmp_path, "import sys\nsys.exit(0)\n")
    assert result.returncode == 0


def test_sys_exit_with_a_message_exits_1_and_prints_it(tmp_path):
    result, error_file = run(tmp_path, "import sys\nsys.exit('giving up')\n")
    assert result.returncode == 1 and "giving up" in result.stderr
    assert json.loads(error_file.read_text())["message"] == "giving up"


def test_the_fast_exit_keeps_what_a_normal_exit_does(tmp_path):
    """No module teardown, but threads are joined, atexit handlers run, open files and stdio flushed."""
    source = (
        "import atexit, sys, threading, time\n"
        "kept = open('open.txt', 'w'); kept.write('kept')\n"
        "atexit.register(lambda: open('atexit.txt', 'w').write('ran'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), open('thread.txt', 'w').write('joined'))).start()\n"
        "sys.stdout.write('no newline')\n"
        "sys.exit(3)\n"
    )
    result, _ = run(tmp_path, source)
    assert result.returncode == 3 and result.stdout == "no newline"
    assert [(tmp_path / name).read_text() for name in ("open.txt", "atexit.txt", "thread.txt")] == ["kept", "ran", "joined"]


def test_stacks_are_written_on_the_stacks_signal(tmp_path):
    source = "import os, signal, time\nos.kill(os.getpid(), signal.SIGUSR2)\ntime.sleep(0.2)\nprint('alive')\n"
    stacks = tmp_path / "stacks" / "rank-3.txt"
    (tmp_path / "train.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT, "SMDDP_STACKS_FILE": str(stacks), "RANK": "3"}
    result = subprocess.run([sys.executable, "-m", "smddp_sdk.runtime.bootstrap", "train.py"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and result.stdout == "alive\n", result.stderr
    assert 'train.py", line 2 in <module>' in stacks.read_text()
