"""Suite-wide fixtures and settings, and what the default run leaves out (``JOBS``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

# Tests marked `jobs`: they start real jobs or many processes (several torch ranks, a job end to end),
# seconds to minutes each on a 2-core machine. A plain `python3 -m pytest` (no paths, no -m of its own) leaves
# them out; naming files or directories, or any -m, runs them as selected (scripts/test.sh runs them in a step
# of their own). An entry is a directory/, a file, or a file::test with all its parameters; new tests under a
# listed directory or file are marked too.
JOBS = (
    "tests/collectives/",  # groups of torch ranks, on one host and across simulated hosts
    "tests/integration/",  # the runtime and the local scheduler end to end
    "tests/cli/test_quickstart.py",  # the documented first commands, the example job included
    "tests/cli/test_example.py",
    "tests/cli/test_run_local.py",
    "tests/cli/test_hangs.py::test_a_hang_between_hosts_is_named_and_stacks_show_every_rank",
    "tests/planning/test_profile.py",  # profiles a DDP job over torch's backend and smddp
    "tests/fidelity/test_sagemaker_compat.py",  # DDP jobs under the SageMaker check
    "tests/fidelity/test_local_rehearsal.py",
    "tests/hostile/test_listeners.py",  # stores that import torch, jobs of 2 hosts
    "tests/hostile/test_model_dir.py",
    "tests/hostile/test_attack_flood.py",  # attacks as nobody on live jobs of 2 hosts x 2 ranks
    "tests/hostile/test_attack_store_keys.py",
    "tests/hostile/test_attack_arena.py",
)
# Kept in the default run from the places above: the quick ones, and a real job or rank group as a smoke test.
KEEP = (
    "tests/collectives/test_layering.py",
    "tests/collectives/test_transports.py",  # in-process meshes
    "tests/collectives/test_native.py::test_reduce_matches_torch",
    "tests/collectives/test_native.py::test_half_types_are_summed_in_fp32_and_rounded_once",
    "tests/collectives/test_native.py::test_core_chooses_the_algorithms_of_algorithms_py",
    "tests/collectives/test_native.py::test_core_runs_small_collectives_and_leaves_a_late_peer_to_python[native]",  # 2 ranks
    "tests/integration/test_runtime_single_host.py::test_an_unsafe_tarball_is_refused_with_exit_2",
    "tests/integration/test_runtime_single_host.py::test_unknown_entry_point_exits_2_with_a_suggestion",
    "tests/integration/test_runtime_single_host.py::test_missing_resource_config_exits_2_and_says_so_in_the_failure_file",
    "tests/integration/test_runtime_multihost.py::test_two_hosts_two_ranks_each_train_together",  # 2 x 2 ranks over smddp
    "tests/cli/test_run_local.py::test_dryrun_prints_job_and_request_and_starts_nothing",
    "tests/cli/test_run_local.py::test_unknown_scheduler_option_is_located",
    "tests/cli/test_run_local.py::test_status_of_a_missing_job_is_exit_2",
    "tests/cli/test_run_local.py::test_options_lists_what_the_local_scheduler_accepts",
    "tests/cli/test_run_local.py::test_run_follows_logs_with_rank_prefixes_and_exits_0",  # a 2-host job from the CLI
    "tests/cli/test_run_local.py::test_ctrl_c_cancels_a_local_job_and_exits_130",
)


@pytest.hookimpl(tryfirst=True)  # marked before -m selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if listed(item.nodeid, JOBS) and not listed(item.nodeid, KEEP):
            item.add_marker(pytest.mark.jobs)
    if is_plain_run(config):
        left_out = [item for item in items if item.get_closest_marker("jobs")]
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker("jobs")]


def is_plain_run(config: pytest.Config) -> bool:
    """No paths given (pyproject's testpaths) and no -m but pyproject's own."""
    addopts = config.getini("addopts")
    default_markexpr = addopts[addopts.index("-m") + 1] if "-m" in addopts else ""
    return config.args_source is pytest.Config.ArgsSource.TESTPATHS and config.option.markexpr == default_markexpr


def listed(nodeid: str, entries: tuple[str, ...]) -> bool:
    """Whether a test id falls under one of the entries (a directory/, a file, or file::test)."""
    for entry in entries:
        if entry.endswith("/") and nodeid.startswith(entry):
            return True
        if nodeid == entry or nodeid.startswith((f"{entry}::", f"{entry}[")):
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    """Started with SIGINT ignored (a script's background job: ``cmd &``, nohup, some CI runners), pytest
    would pass that on to every process a test starts, and the Ctrl-C tests send their SIGINT to a
    launcher that ignores it: it follows its job to the end, past the test's limit. A handler that does
    nothing keeps pytest deaf to SIGINT as it was started, and exec resets a handler to the default, so
    the launchers the tests start take SIGINT as a terminal's foreground process does."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, _still_ignored)


def _still_ignored(_signum: int, _frame: object) -> None:
    pass


@pytest.fixture(autouse=True)
def _private_job_root(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs and the job index of a test never land in the user's ~/.smddp (tests that set their own keep it)."""
    if not os.environ.get("SMDDP_JOB_ROOT"):
        root: Path = tmp_path_factory.mktemp("job-root")
        monkeypatch.setenv("SMDDP_JOB_ROOT", str(root))
