"""The native kernels and core: built into a cache on first use, the same results as torch (fp16/bf16
rounded once), a clear choice when no compiler is available, and the core running small collectives."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from smddp_sdk.collectives import native  # noqa: E402
from smddp_sdk.collectives.algorithms import ALGORITHMS  # noqa: E402
from smddp_sdk.collectives.reduce import RedOpType, native_codes  # noqa: E402
from smddp_sdk.planning.selection import (  # noqa: E402
    ALPHA_BYTES,
    BROADCAST_ALGORITHMS,
    MESSAGE_BYTES,
    RING_ROUND_BYTES,
    ROUNDS_FROM_BYTES,
    allgather_algorithm,
    allreduce_algorithm,
    broadcast_algorithm,
)
from tests.collectives.cluster import NATIVE_IDS, NATIVE_PATHS, PROJECT_ROOT, Cluster, native_setting  # noqa: E402
from tests.collectives.scenarios import ACROSS_HOSTS_CASES, ACROSS_HOSTS_GATHERS, ACROSS_HOSTS_OTHERS  # noqa: E402


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if not native.shutil.which("cc"):
        pytest.skip("no C compiler here: the native path cannot be built")
    path = native.build(tmp_path_factory.mktemp("native-cache"))
    loaded = ctypes.CDLL(str(path))
    native._declare(loaded)
    return loaded


def _reduce(lib, dst, sources, op):
    dtype_code, op_code = native_codes(dst.dtype, op)
    pointers = (ctypes.c_void_p * len(sources))(*(s.data_ptr() for s in sources))
    assert lib.smddp_reduce(dtype_code, op_code, dst.data_ptr(), pointers, len(sources), dst.numel()) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.int8, torch.uint8])
@pytest.mark.parametrize("op", [RedOpType.SUM, RedOpType.PRODUCT, RedOpType.MIN, RedOpType.MAX])
def test_reduce_matches_torch(lib, dtype, op):
    gen = torch.Generator().manual_seed(3)
    sources = [torch.randint(-3, 4 if dtype != torch.uint8 else 9, (3001,), generator=gen).clamp(min=0 if dtype == torch.uint8 else -3).to(dtype)
               for _ in range(3)]
    expected = sources[0].clone()
    for s in sources[1:]:
        expected = {RedOpType.SUM: torch.add, RedOpType.PRODUCT: torch.mul, RedOpType.MIN: torch.minimum,
                    RedOpType.MAX: torch.maximum}[op](expected, s).to(dtype)
    dst = torch.empty_like(sources[0])
    _reduce(lib, dst, sources, op)
    assert torch.equal(dst, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_are_summed_in_fp32_and_rounded_once(lib, dtype):
    gen = torch.Generator().manual_seed(5)
    sources = [torch.randn(10_000, generator=gen).to(dtype) for _ in range(4)]
    once = sum(s.float() for s in sources).to(dtype)
    dst = sources[0].clone()  # dst may alias the first source
    _reduce(lib, dst, [dst, *sources[1:]], RedOpType.SUM)
    assert torch.equal(dst, once)


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, cwd=PROJECT_ROOT)


def test_without_a_compiler_auto_falls_back_with_one_note_and_1_fails_clearly(tmp_path):
    code = "from smddp_sdk.collectives import native; print(native.library()); print(native.library())"
    missing = {"CC": "no-such-compiler", "SMDDP_NATIVE_CACHE": str(tmp_path)}
    auto = _run(code, SMDDP_NATIVE="auto", **missing)
    assert auto.returncode == 0, auto.stderr
    assert auto.stdout.split() == ["None", "None"]
    assert auto.stderr.count("native kernels unavailable") == 1, auto.stderr
    assert "pure-Python path" in auto.stderr
    forced = _run(code, SMDDP_NATIVE="1", **missing)
    assert forced.returncode != 0
    assert "SMDDP_NATIVE=1" in forced.stderr and "CC=no-such-compiler is not on PATH" in forced.stderr, forced.stderr
    off = _run(code, SMDDP_NATIVE="0", **missing)
    assert off.stdout.split() == ["None", "None"] and "unavailable" not in off.stderr


def test_first_use_builds_into_the_cache_keyed_by_the_source(tmp_path):
    result = _run("from smddp_sdk.collectives import native; print(native.library() is not None)",
                  SMDDP_NATIVE="1", SMDDP_NATIVE_CACHE=str(tmp_path))
    if result.returncode and "no C compiler" in result.stderr:
        pytest.skip("no C compiler here")
    assert result.stdout.strip() == "True", result.stderr
    assert [p.name for p in tmp_path.iterdir()] == [native.library_name()]


def test_without_a_cxx_compiler_the_kernels_stay_and_the_group_is_python(tmp_path):
    code = ("from smddp_sdk.collectives import native, process_group as pg; "
            "print(native.library() is not None, pg.group_class().__name__)")
    missing = {"CXX": "no-such-compiler", "SMDDP_NATIVE_CACHE": str(tmp_path)}
    auto = _run(code, SMDDP_NATIVE="auto", **missing)
    if auto.returncode == 0 and auto.stdout.split()[0] == "False":
        pytest.skip("no C compiler here: the kernels cannot be built either")
    assert auto.returncode == 0, auto.stderr
    assert auto.stdout.split() == ["True", "PythonProcessGroup"], auto.stdout
    assert auto.stderr.count("native core unavailable") == 1 and "CXX=no-such-compiler is not on PATH" in auto.stderr, auto.stderr
    forced = _run(code, SMDDP_NATIVE="1", **missing)
    assert forced.returncode != 0
    assert "SMDDP_NATIVE=1 but smddp's native core is unavailable" in forced.stderr, forced.stderr


@pytest.mark.integration
@pytest.mark.parametrize("native_path", NATIVE_PATHS, ids=NATIVE_IDS)
def test_core_runs_small_collectives_and_leaves_a_late_peer_to_python(native_path):
    cluster = Cluster(["algo-1"] * 2, scenario="core_usage", native=native_path)
    reports = [json.loads(cluster.store.get(f"report/core/{r}")) for r in range(2)]
    exits = cluster.finish(timeout=60)
    assert all(code == 0 for code, _ in exits), exits
    for rank, report in enumerate(reports):
        assert report["right"], report
        if native_setting(native_path, rank) == "1":
            assert report == {"class": "CoreProcessGroup", "core_calls": 7, "right": True}, report
        else:
            assert report == {"class": "PythonProcessGroup", "core_calls": None, "right": True}, report


def _assert_across_hosts(hosts: list[str], native_path: str, env: dict[str, str] | None = None) -> None:
    """Every case right against a reference, the same all_reduce bits on every rank, and the core really
    ran every case where it is on."""
    cluster = Cluster(hosts, scenario="allreduce_across_hosts", native=native_path,
                      env={"SMDDP_PIPELINE_CHUNK_BYTES": "65536", **(env or {})})
    reports = [json.loads(cluster.store.get(f"report/across/{r}")) for r in range(len(hosts))]
    exits = cluster.finish(timeout=60)
    assert all(code == 0 for code, _ in exits), exits
    cases = ACROSS_HOSTS_CASES + ACROSS_HOSTS_GATHERS + ACROSS_HOSTS_OTHERS
    for case in range(len(cases)):
        assert all(report["results"][case]["close"] for report in reports), (cases[case], reports)
        assert len({report["results"][case]["digest"] for report in reports}) == 1, (cases[case], reports)
    for rank, report in enumerate(reports):
        on_core = native_setting(native_path, rank) == "1"
        assert report["core_calls"] == (report["calls"] if on_core else None), (rank, report)


@pytest.mark.integration
@pytest.mark.parametrize("hosts", [["algo-1", "algo-2", "algo-3"], ["algo-1", "algo-1", "algo-2", "algo-2", "algo-3", "algo-3"]],
                         ids=["3x1", "3x2"])
@pytest.mark.parametrize("native_path", NATIVE_PATHS, ids=NATIVE_IDS)
def test_core_runs_all_reduce_and_all_gather_across_hosts_by_every_algorithm(hosts, native_path):
    """Oneshot, the sharded pipeline and the ring (all_reduce, fp16/bf16 included), all-to-all and the ring
    (all_gather), broadcast, reduce_scatter_tensor and barrier, in the core or in Python or both in one group."""
    _assert_across_hosts(hosts, native_path)


@pytest.mark.integration
@pytest.mark.parametrize(("count", "algorithm"), [(2, "auto"), (4, "auto"), (5, "auto"), (7, "auto"), (8, "auto"),
                                                  (3, "recursive_doubling"), (3, "halving_doubling"),
                                                  (5, "recursive_doubling"), (5, "halving_doubling"),
                                                  (6, "halving_doubling")])
def test_core_and_python_meet_in_the_log_depth_algorithms(count, algorithm):
    """Between 2 to 8 single-rank hosts, even ones on the core and odd ones in Python: recursive doubling,
    halving-doubling and bruck where the size picks them (4 and 8 hosts), and forced where the host count
    is no power of two (the extra hosts fold into partners), broadcast by a binomial tree and by scatter +
    all_gather: right, and the same bits on every rank."""
    _assert_across_hosts([f"algo-{h + 1}" for h in range(count)], "mixed", {"SMDDP_ALLREDUCE_ALGO": algorithm})


@pytest.mark.integration
def test_sagemaker_check_still_names_collectives_aws_lacks_when_the_core_is_on():
    cluster = Cluster(["algo-1", "algo-2"], scenario="sagemaker_check_across_hosts", native="1", env={"TRAINING_JOB_NAME": "rehearsal"})
    reports = [json.loads(cluster.store.get(f"report/sagemaker/{r}")) for r in range(2)]
    exits = cluster.finish(timeout=60)
    assert all(code == 0 for code, _ in exits), exits
    assert reports == [["dist.all_to_all_single", "dist.gather", "dist.reduce", "dist.scatter"]] * 2, reports


def test_core_chooses_the_algorithms_of_algorithms_py():
    core = native.core()
    if core is None:
        pytest.skip("the native core is not available here")
    rules = (ALPHA_BYTES, MESSAGE_BYTES, RING_ROUND_BYTES, ROUNDS_FROM_BYTES)
    for hosts in (2, 3, 4, 5, 6, 7, 8, 12, 16, 31, 64):
        for nbytes in sorted({int(1.3 ** k) for k in range(80)} | {1 << k for k in range(31)}):
            allreduce, allgather, broadcast = core._inter_host_algorithms(nbytes, hosts, *rules)
            assert ALGORITHMS[allreduce] == allreduce_algorithm(nbytes, hosts, "auto"), (nbytes, hosts)
            assert (*ALGORITHMS, "bruck")[allgather] == allgather_algorithm(nbytes, hosts), (nbytes, hosts)
            assert BROADCAST_ALGORITHMS[broadcast] == broadcast_algorithm(nbytes, hosts), (nbytes, hosts)
