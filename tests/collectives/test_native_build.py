"""The core's build: a cache key over every source file, its units compiled at once (the kernels beside
them), a core that loads, and a broken unit reported with the compiler's message naming the file."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
from smddp_sdk.collectives import native  # noqa: E402

needs_cxx = pytest.mark.skipif(not shutil.which("c++"), reason="no C++ compiler here: the core cannot be built")


@pytest.fixture
def core_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the core's sources that the build reads instead of the package's."""
    copy = tmp_path / "core"
    shutil.copytree(native.CORE_DIR, copy)
    monkeypatch.setattr(native, "CORE_DIR", copy)
    return copy


def test_every_source_file_is_in_the_key(core_copy):
    names = {native.core_name()}
    for source in native.core_sources():
        original = source.read_bytes()
        source.write_bytes(original + b"\n// changed\n")
        names.add(native.core_name())
        source.write_bytes(original)
        assert native.core_name() in names
    (core_copy / "extra.hpp").write_text("#pragma once\n")
    names.add(native.core_name())
    assert {p.suffix for p in native.core_sources()} == {".cpp", ".hpp"}
    assert len(names) == len(native.core_sources()) + 1  # each change, and a new file, gave its own key


def _fake_compiler(tmp_path: Path, at_once: int) -> Path:
    """A compiler that logs when it ran (process boundary: CXX); each waits until at_once of them have
    started (20 s at most), so units compiled one after another would show, however loaded the machine."""
    script = tmp_path / "fake-c++"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        started=$(date +%s.%N)
        mkdir -p {tmp_path / "started"} && : > {tmp_path / "started"}/$$
        waited=0
        while [ "$(ls {tmp_path / "started"} | wc -l)" -lt {at_once} ] && [ $waited -lt 200 ]; do sleep 0.1; waited=$((waited + 1)); done
        previous=""
        for argument in "$@"; do [ "$previous" = "-o" ] && output="$argument"; previous="$argument"; done
        : > "$output"
        echo "$started $(date +%s.%N) $previous" >> {tmp_path / "log"}
        """))
    script.chmod(0o755)
    return script


def test_units_compile_at_once_then_link(core_copy, tmp_path, monkeypatch):
    for name in ("one.cpp", "two.cpp", "three.cpp"):
        (core_copy / name).write_text("int unit() { return 0; }\n")
    units = [p for p in native.core_sources() if p.suffix == ".cpp"]
    monkeypatch.setenv("CXX", str(_fake_compiler(tmp_path, at_once=len(units))))
    target = native.build_core(tmp_path / "out")
    runs = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    compiles, link = runs[:-1], runs[-1]
    assert len(compiles) == len(units) >= 4
    assert max(float(start) for start, _, _ in compiles) < min(float(end) for _, end, _ in compiles)  # all ran at once
    assert float(link[0]) >= max(float(end) for _, end, _ in compiles)  # linked after every unit
    assert target.exists() and target.name == native.core_name()
    assert {p.name for p in target.parent.iterdir()} == {target.name, target.with_suffix(".lock").name}  # no leftovers


def test_a_broken_unit_is_named_with_the_compilers_error(core_copy, tmp_path):
    if not shutil.which("c++"):
        pytest.skip("no C++ compiler here")
    for source in core_copy.iterdir():
        source.unlink()
    (core_copy / "fine.cpp").write_text("int fine() { return 1; }\n")
    (core_copy / "broken.cpp").write_text("int broken() { return ; }\n")
    (core_copy / "also_broken.cpp").write_text("int also_broken() { undeclared(); return 0; }\n")
    with pytest.raises(native.NativeUnavailable) as failure:
        native.build_core(tmp_path / "out")
    message = str(failure.value)
    assert "failed to build broken.cpp" in message and "broken.cpp:1:" in message and "error" in message
    assert "failed to build also_broken.cpp" in message and "undeclared" in message  # every failure at once
    assert "failed to build fine.cpp" not in message
    assert not (tmp_path / "out" / native.core_name()).exists()
    assert [p.name for p in (tmp_path / "out").iterdir()] == [f"{Path(native.core_name()).stem}.lock"]


@needs_cxx
def test_a_build_beside_the_kernels_gives_a_loadable_core(tmp_path):
    core = native.build_core(tmp_path, with_kernels=True)
    assert (tmp_path / native.library_name()).exists()  # the kernels were built beside the core's units
    check = textwrap.dedent(f"""\
        import importlib.util, torch.distributed
        spec = importlib.util.spec_from_file_location("smddp_core", {str(core)!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert issubclass(module.SmddpCore, torch.distributed.ProcessGroup)
        print(module.SmddpCore._inter_host_algorithms(1 << 20, 4, 1, 1, 1 << 30, 1 << 30))
        """)
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("(")
