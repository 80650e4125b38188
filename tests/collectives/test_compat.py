"""Compat packages: AWS-style scripts run unchanged on smddp, and the packages read the runtime's env."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
import smddp_sdk  # noqa: E402
from smddp_sdk.schedulers.hosttree.job_dir import pick_free_ports  # noqa: E402
from tests.collectives.cluster import PROJECT_ROOT  # noqa: E402

pytestmark = pytest.mark.integration
COMPAT = os.path.join(os.path.dirname(smddp_sdk.__file__), "_compat")

CURRENT_API_SCRIPT = """
import os, torch, torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp
dist.init_process_group(backend="smddp")
t = torch.ones(3) * (dist.get_rank() + 1)
dist.all_reduce(t)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
model(torch.ones(2, 4)).sum().backward()
print("RESULT", dist.get_backend(), t.tolist(), flush=True)
dist.destroy_process_group()
"""

OLD_API_SCRIPT = """
import torch
import smdistributed.dataparallel.torch.distributed as dist
from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel as DDP
from sagemaker_training import environment
dist.init_process_group()
env = environment.Environment()
t = torch.ones(2) * (dist.get_rank() + 1)
dist.all_reduce(t, op=dist.ReduceOp.AVERAGE)
model = DDP(torch.nn.Linear(4, 2), broadcast_buffers=False)
with model.no_sync():
    model(torch.ones(2, 4)).sum().backward()
dist.barrier()
print("RESULT", dist.get_world_size(), dist.get_local_rank(), env.current_host, env.hosts, t.tolist(), flush=True)
"""


def _run_script(source: str, world: int, port: int) -> list[str]:
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), SM_CURRENT_HOST="algo-1", SM_HOSTS=json.dumps(["algo-1"]),
                   SM_TRAINING_ENV=json.dumps({"current_host": "algo-1", "hosts": ["algo-1"], "num_gpus": 0}),
                   PYTHONPATH=os.pathsep.join([COMPAT, str(PROJECT_ROOT)]))
        procs.append(subprocess.Popen([sys.executable, "-c", source], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(next(line for line in out.splitlines() if line.startswith("RESULT")))
    return outputs


def test_current_api_script_runs_unchanged():
    assert _run_script(CURRENT_API_SCRIPT, 2, pick_free_ports(1)[0]) == ["RESULT smddp [3.0, 3.0, 3.0]"] * 2


def test_old_api_script_runs_unchanged():
    outputs = _run_script(OLD_API_SCRIPT, 2, pick_free_ports(1)[0])
    assert outputs == [f"RESULT 2 {r} algo-1 ['algo-1'] [1.5, 1.5]" for r in range(2)]


def test_environment_reads_training_env_and_variables():
    sys.path.insert(0, COMPAT)
    try:
        from sagemaker_training.environment import Environment
    finally:
        sys.path.remove(COMPAT)
    env = Environment({
        "SM_TRAINING_ENV": json.dumps({"current_host": "algo-2", "hosts": ["algo-1", "algo-2"], "num_gpus": 8,
                                       "channel_input_dirs": {"train": "/opt/ml/input/data/train"}}),
        "SM_MODEL_DIR": "/opt/ml/model", "SM_HPS": '{"epochs": 3}', "SM_USER_ARGS": '["--epochs", "3"]',
    })
    assert (env.current_host, env.hosts, env.num_gpus) == ("algo-2", ["algo-1", "algo-2"], 8)
    assert env.channel_input_dirs == {"train": "/opt/ml/input/data/train"}
    assert env.hyperparameters == {"epochs": 3} and env.model_dir == "/opt/ml/model"
    assert env.master_hostname == "algo-1" and env["hosts"] == env.hosts
    assert env.to_cmd_args() == ["--epochs", "3"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = env.nope


def test_registration_is_idempotent_and_keeps_an_existing_smddp():
    code = ("import torch.distributed as d, smddp_sdk.collectives as c; c.register(); c.register(); "
            "print(d.Backend.backend_list.count('smddp'), d.Backend.SMDDP)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT, check=True).stdout
    assert out.split() == ["1", "smddp"]


def test_compat_steps_aside_for_a_real_installation(tmp_path):
    real = tmp_path / "site" / "sagemaker_training"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("ORIGIN = 'real'\n")
    (real / "environment.py").write_text("class Environment:\n    origin = 'real'\n")
    code = ("import sagemaker_training, smdistributed.dataparallel.torch.torch_smddp as t\n"
            "from sagemaker_training.environment import Environment\n"
            "print(sagemaker_training.ORIGIN, Environment.origin, t.__name__)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COMPAT, str(PROJECT_ROOT), str(tmp_path / "site")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["real", "real", "smdistributed.dataparallel.torch.torch_smddp"]


def test_compat_package_works_through_a_folder_of_symlinks(tmp_path):
    """The runtime exposes only the missing packages through symlinks; they must still import."""
    (tmp_path / "sagemaker_training").symlink_to(os.path.join(COMPAT, "sagemaker_training"), target_is_directory=True)
    code = "from sagemaker_training.environment import Environment; print(Environment({'SM_CURRENT_HOST': 'algo-3'}).current_host)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(PROJECT_ROOT)]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "algo-3"


def test_old_api_ddp_with_its_defaults_prints_no_future_warning(monkeypatch):
    """torch warns on every rank when broadcast_buffers is passed; the shim passes it only when asked."""
    monkeypatch.setenv("PYTHONWARNINGS", "error::FutureWarning")
    source = OLD_API_SCRIPT.replace("DDP(torch.nn.Linear(4, 2), broadcast_buffers=False)", "DDP(torch.nn.Linear(4, 2))")
    assert _run_script(source, 1, pick_free_ports(1)[0]) == ["RESULT 1 0 algo-1 ['algo-1'] [1.0, 1.0]"]
