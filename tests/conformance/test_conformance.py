"""PyTorch's own distributed tests (torch/testing/_internal/distributed/distributed_test.py) on gloo and smddp.

Each configuration of suite.CONFIGS runs its tests on smddp, and gloo runs them at the same world size (gloo
always talks TCP, so one gloo run per world size is its baseline for every smddp configuration). smddp must
pass every test gloo passes there, except the skip list (suite.SKIPPED_ON_SMDDP, each with its reason), and
the all_to_all tests gloo cannot run; no test may fail on either. Each run's outcomes, test by test, are in
``<backend>-<config>.json`` (and its log) in SMDDP_CONFORMANCE_DIR, else pytest's temporary directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance.suite import ALL_TO_ALL, CONFIGS, SKIPPED_ON_SMDDP

pytest.importorskip("torch")
RUN_TIMEOUT_S = 1200  # one run: about a minute on a quiet 2-core machine, several under heavy load
pytestmark = [pytest.mark.jobs, pytest.mark.timeout(2 * RUN_TIMEOUT_S)]  # a test may start gloo's run and smddp's
PROJECT_ROOT = Path(__file__).resolve().parents[2]
GLOO_RUNS = {2: "ws2", 4: "ws4"}  # the gloo run of each world size: its tests include every configuration's


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory):
    """run(backend, config): that run's outcomes by test name (each run once per module)."""
    folder = Path(os.environ.get("SMDDP_CONFORMANCE_DIR") or tmp_path_factory.mktemp("conformance"))
    folder.mkdir(parents=True, exist_ok=True)
    done: dict[tuple[str, str], dict[str, dict]] = {}

    def run(backend: str, config: str) -> dict[str, dict]:
        if (backend, config) not in done:
            out, log = folder / f"{backend}-{config}.json", folder / f"{backend}-{config}.log"
            with log.open("w") as sink:
                runner = subprocess.Popen([sys.executable, "-m", "tests.conformance.runner", backend, config, "--out", str(out)], cwd=PROJECT_ROOT,
                                          env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
                try:
                    assert runner.wait(timeout=RUN_TIMEOUT_S) == 0, f"the {backend} {config} run failed: see {log}"
                finally:  # its rank processes too, whatever happened
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(runner.pid, signal.SIGKILL)
            done[backend, config] = json.loads(out.read_text())
            print(f"\n{backend} {config}: {summary(done[backend, config])} ({out})")
        return done[backend, config]

    return run


def summary(record: dict[str, dict]) -> str:
    counts = {kind: sum(o["outcome"] == kind for o in record.values()) for kind in ("passed", "failed", "skipped")}
    retried = [name for name, o in record.items() if "first_try" in o]
    return ", ".join(f"{n} {kind}" for kind, n in counts.items()) + (f" (failed once, then: {', '.join(retried)})" if retried else "")


def failures(record: dict[str, dict], names: object) -> dict[str, str]:
    return {name: f"{record[name]['outcome']}: {record[name]['detail']}" for name in names if record[name]["outcome"] != "passed"}


@pytest.mark.parametrize("world_size", sorted(GLOO_RUNS))
def test_gloo_fails_nothing_and_cannot_run_all_to_all(world_size: int, outcomes) -> None:
    config = GLOO_RUNS[world_size]
    gloo = outcomes("gloo", config)
    failed = {name: o["detail"] for name, o in gloo.items() if o["outcome"] == "failed"}
    assert not failed, f"gloo {config}: " + json.dumps(failed, indent=1)
    assert all(gloo[name]["outcome"] == "skipped" for name in ALL_TO_ALL if name in gloo), summary(gloo)
    if config == "ws4":  # the subset is what gloo passes there (suite.SUBSET)
        others = [name for name in CONFIGS[config].tests if name not in ALL_TO_ALL]
        assert not failures(gloo, others), json.dumps(failures(gloo, others), indent=1)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_smddp_passes_every_test_gloo_passes_and_all_to_all(config: str, outcomes) -> None:
    gloo = outcomes("gloo", GLOO_RUNS[CONFIGS[config].world_size])
    smddp = outcomes("smddp", config)
    gloo_passes = [name for name in CONFIGS[config].tests if gloo[name]["outcome"] == "passed"]
    expected = [name for name in (*gloo_passes, *(n for n in ALL_TO_ALL if n in CONFIGS[config].tests)) if name not in SKIPPED_ON_SMDDP]
    assert not failures(smddp, expected), f"smddp {config} ({summary(smddp)}): " + json.dumps(failures(smddp, expected), indent=1)
    failed = {name: o["detail"] for name, o in smddp.items() if o["outcome"] == "failed"}
    assert not failed, f"smddp {config} fails tests gloo skips: " + json.dumps(failed, indent=1)
