"""The smddp DDP comm hooks (smddp_sdk.collectives.ddp) train like one process, on every rank alike."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from smddp_sdk.collectives import ddp  # noqa: E402
from tests.collectives.cluster import PROJECT_ROOT, rank_env  # noqa: E402

pytestmark = pytest.mark.integration
HOSTS = ["algo-1", "algo-1", "algo-2", "algo-2"]  # shared memory and TCP in one group
# fp32 buckets reduce exactly like the reference up to summation order; bf16/fp16 on the wire round once
TOLERANCE = {"smddp": 1e-5, "bf16": 5e-2, "fp16": 5e-3, "default": 1e-5, "default-bf16": 5e-2, "default-no-sync": 1e-5, "replaced": 1e-5}


def _run(hook: str) -> list[dict]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.collectives.hook_worker", hook], cwd=PROJECT_ROOT, env=rank_env(r, HOSTS, store.port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for r in range(len(HOSTS))
    ]
    outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outputs
    return [json.loads(store.get(f"report/{hook}/{r}")) for r in range(len(HOSTS))]


@pytest.mark.parametrize("hook", ["smddp", "bf16"])
def test_hooked_ddp_matches_single_process_training(hook: str) -> None:
    reports = _run(hook)
    assert len({r["digest"] for r in reports}) == 1, "parameters differ between ranks"
    assert max(r["max_diff"] for r in reports) < TOLERANCE[hook], reports


@pytest.mark.parametrize("hook", ["default", "default-bf16", "default-no-sync"])
def test_torch_ddp_over_smddp_gets_the_hook_and_keeps_gradients_in_shared_buckets(hook: str) -> None:
    reports = _run(hook)
    assert len({r["digest"] for r in reports}) == 1, "parameters differ between ranks"
    assert max(r["max_diff"] for r in reports) < TOLERANCE[hook], reports
    assert all(r["default_installed"] and r["gradients_in_buckets"] and r["gradients_shared"] for r in reports), reports


def test_a_hook_the_script_registers_replaces_the_backends_once() -> None:
    reports = _run("replaced")
    assert len({r["digest"] for r in reports}) == 1, "parameters differ between ranks"
    assert max(r["max_diff"] for r in reports) < TOLERANCE["replaced"], reports
    assert all("only be called once" in r["second_registration"] for r in reports), reports


def test_an_unknown_compression_is_rejected_with_the_choices() -> None:
    with pytest.raises(ValueError, match="'int8'.*'fp16', 'bf16'"):
        ddp.register(None, compress="int8")  # type: ignore[arg-type]
