"""The native kernels: built into a cache on first use, the same results as torch (fp16/bf16 rounded once),
and a clear choice when no compiler is available."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from smddp_sdk.collectives import native  # noqa: E402
from smddp_sdk.collectives.reduce import RedOpType, native_codes  # noqa: E402
from tests.collectives.cluster import PROJECT_ROOT  # noqa: E402


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
