"""The SageMaker check of the bundled smddp backend, in real 2-rank process groups: warnings name the
script's line once per call site; SMDDP_SAGEMAKER_STRICT=1 fails as SMDDP would; =0 silences."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import smddp_sdk
from smddp_sdk.specs import smddp_support

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

PROJECT_ROOT = str(Path(smddp_sdk.__file__).resolve().parent.parent)

SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist
    import smddp_sdk.collectives  # registers smddp (as smdistributed.dataparallel.torch.torch_smddp does)
    dist.init_process_group("smddp")
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)                                   # line 7: supported, but a CPU tensor
    for _ in range(3):
        dist.all_reduce(t, op=dist.ReduceOp.AVG)             # line 9
    out = torch.empty(4)
    dist.all_to_all_single(out, t)                           # line 11
    group = dist.new_group([0, 1])                           # line 12
    print("finished", flush=True)
    dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(tmp_path: Path, **env: str) -> list[subprocess.CompletedProcess]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return _run_script(tmp_path, script, **env)


def _run_script(tmp_path: Path, script: Path, **env: str) -> list[subprocess.CompletedProcess]:
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SMDDP_SAGEMAKER", "TRAINING_JOB"))}
    base.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "SM_CURRENT_HOST": "algo-1",
                 "PYTHONPATH": PROJECT_ROOT, "OMP_NUM_THREADS": "1", "TRAINING_JOB_NAME": "rehearsal",
                 "SMDDP_SAGEMAKER_CHECK": "1", **env})  # asked for by name: CPU tensors are reported on this CUDA-less machine too
    procs = [subprocess.Popen([sys.executable, str(script)], env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out))
    return results


def test_warnings_name_the_script_line_once_per_call_site(tmp_path: Path) -> None:
    results = _run(tmp_path)
    for result in results:
        out = result.stdout
        assert result.returncode == 0 and "finished" in out, out
        script = str(tmp_path / "train.py")
        assert out.count(f"{script}:9: SageMakerCompatibilityWarning: dist.all_reduce(op=ReduceOp.AVG)") == 1, out
        assert out.count(f"{script}:11: SageMakerCompatibilityWarning: dist.all_to_all_single") == 1, out
        assert out.count(f"{script}:12: SageMakerCompatibilityWarning: dist.new_group") == 1, out
    rank0, rank1 = (result.stdout for result in results)
    assert rank0.count("CUDA tensors only") == 1 and "CUDA tensors only" not in rank1  # CPU tensors: once, by rank 0
    assert f"{tmp_path / 'train.py'}:7: SageMakerCompatibilityWarning: dist.all_reduce on a CPU" in rank0


def test_a_cpu_rehearsal_on_a_machine_without_cuda_is_not_told_about_cpu_tensors(tmp_path: Path) -> None:
    """Inside a job (TRAINING_JOB_NAME) without SMDDP_SAGEMAKER_CHECK=1, a machine without CUDA has nothing
    but CPU tensors: the local dry run's note says so once, and the ranks say the rest."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: CPU tensors are a choice of the script here, and are reported")
    results = _run(tmp_path, SMDDP_SAGEMAKER_CHECK="")
    for result in results:
        assert result.returncode == 0 and "finished" in result.stdout, result.stdout
        assert "CUDA tensors only" not in result.stdout, result.stdout
        assert "SageMakerCompatibilityWarning: dist.all_reduce(op=ReduceOp.AVG)" in result.stdout, result.stdout


def test_strict_mode_fails_where_smddp_would(tmp_path: Path) -> None:
    for result in _run(tmp_path, SMDDP_SAGEMAKER_STRICT="1"):
        assert result.returncode != 0
        assert "SageMakerCompatibilityError" in result.stdout and ":9: dist.all_reduce(op=ReduceOp.AVG)" in result.stdout
        assert "finished" not in result.stdout


def test_check_can_be_turned_off(tmp_path: Path) -> None:
    for result in _run(tmp_path, SMDDP_SAGEMAKER_CHECK="0"):
        assert result.returncode == 0 and "SageMakerCompatibility" not in result.stdout, result.stdout


def test_support_table_names_a_source_for_every_rule() -> None:
    assert {rule.kind for rule in smddp_support.RULES} == {"collective", "reduce_op", "device", "subgroup", "instance_type"}
    assert all(rule.source.startswith("https://") for rule in smddp_support.RULES)
    assert not smddp_support.collective_supported("alltoall") and smddp_support.collective_supported("allreduce")
    assert smddp_support.reduce_op_supported("sum") and not smddp_support.reduce_op_supported("AVG")


OLD_API_SCRIPT = textwrap.dedent("""
    import torch
    import smdistributed.dataparallel.torch.distributed as sdp
    from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel as DDP
    sdp.init_process_group()
    model = DDP(torch.nn.Linear(4, 1))
    model(torch.ones(2, 4)).sum().backward()                 # line 7: the wrapper averages with AVG internally
    t = torch.ones(2)
    sdp.all_reduce(t, op=sdp.ReduceOp.AVERAGE)               # line 9: the old API had AVERAGE
    print("finished", flush=True)
""")


def test_collectives_issued_by_the_compat_modules_are_not_blamed_on_the_script(tmp_path: Path) -> None:
    """The old API's DDP averages inside AWS's own code, and its functions had their own list of ops:
    only calls made through torch.distributed with the smddp backend are held to torch_smddp's rules."""
    script = tmp_path / "old_api.py"
    script.write_text(OLD_API_SCRIPT)
    compat = str(Path(smddp_sdk.__file__).resolve().parent / "_compat")
    results = _run_script(tmp_path, script, PYTHONPATH=os.pathsep.join([PROJECT_ROOT, compat]))
    for result in results:
        assert result.returncode == 0 and "finished" in result.stdout, result.stdout
        assert f"{script}:7: SageMakerCompatibilityWarning: dist.all_reduce(op" not in result.stdout, result.stdout
        assert f"{script}:9: SageMakerCompatibilityWarning: dist.all_reduce(op" not in result.stdout, result.stdout
    # the device rule still applies, at the script's first own collective (DDP's are torch's, not its)
    assert f"{script}:9: SageMakerCompatibilityWarning: dist.all_reduce on a CPU tensor" in results[0].stdout


DDP_SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist
    import smddp_sdk.collectives
    dist.init_process_group("smddp")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))  # line 5: torch's own all_gather
    model(torch.ones(2, 4)).sum().backward()                                 # line 6: torch's own buckets
    t = torch.ones(2)
    dist.all_reduce(t)                                                       # line 8: the user's call
    print("finished", flush=True)
""")


def test_only_the_users_own_calls_are_checked_not_torchs_inside_ddp(tmp_path: Path) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    rank0 = _run_script(tmp_path, script)[0]
    assert rank0.returncode == 0 and "finished" in rank0.stdout, rank0.stdout
    assert rank0.stdout.count("SageMakerCompatibilityWarning") == 1, rank0.stdout
    assert f"{script}:8: SageMakerCompatibilityWarning: dist.all_reduce on a CPU tensor" in rank0.stdout
