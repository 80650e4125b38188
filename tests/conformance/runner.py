"""Run tests of PyTorch's distributed_test.py against one backend in one configuration; write each outcome.

    python3 -m tests.conformance.runner smddp ws4-tcp --out results.json [test_name ...]

torch's own driver (test/distributed/test_distributed_spawn.py, not in the wheel) is imitated: BACKEND,
WORLD_SIZE, TEMP_DIR and INIT_METHOD in the environment before the module is imported, then a class
``TestDistBackend + DistributedTest._DistTestBase`` whose processes start in setUp, one per rank. The ranks
are forked from this process, which has imported torch already, instead of spawned: the same test code, in
a fraction of the time. torch's module is imported from the installed wheel, never copied. A test that
fails runs once more (a loaded machine upsets timing, gloo's as well); the record keeps both tries.

A test listed in suite.NAME_GATED runs on smddp with the name check bypassed: it comes from another import
of the module during which ``os.environ["BACKEND"]`` reads as, say, ``NamedAs("smddp", "gloo")``, a string
whose value is smddp (what torch receives) but which compares equal to "gloo" in the module's checks.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import unittest
from pathlib import Path
from types import ModuleType
from unittest import mock

from tests.conformance.suite import CONFIGS, NAME_GATED, SKIPPED_ON_SMDDP, Config


class NamedAs(str):
    """A backend name that is `name` for torch and equal to `alias` too in the test module's checks."""

    alias: str

    def __new__(cls, name: str, alias: str) -> NamedAs:
        named = super().__new__(cls, name)
        named.alias = alias
        return named

    def __eq__(self, other: object) -> bool:
        return str.__eq__(self, other) or other == self.alias

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:  # set membership ({"gloo"}) finds the alias
        return hash(self.alias)


def prepare_environment(backend: str, config: Config) -> None:
    """What test_distributed_spawn.py expects, set before torch's test module is imported."""
    temp = tempfile.mkdtemp(prefix="conformance-")
    for name in ("barrier", "test_dir", "init_dir"):
        os.mkdir(os.path.join(temp, name))
    os.environ.update({
        "BACKEND": backend, "WORLD_SIZE": str(config.world_size), "TEMP_DIR": temp,
        "INIT_METHOD": "file://" + os.path.join(temp, "init_dir", "shared_init_file"),
        "OMP_NUM_THREADS": "1",  # forked ranks on a small machine
    })
    os.environ.update(config.env)


def import_test_module(backend: str, gated_as: str | None) -> ModuleType:
    """torch's distributed_test.py; with gated_as, a separate import whose BACKEND also reads as gated_as."""
    import torch.testing._internal.distributed.distributed_test as plain

    if gated_as is None:
        return plain
    spec = importlib.util.spec_from_file_location(f"{plain.__name__}_as_{gated_as}", plain.__file__)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # where pickle finds its classes
    with mock.patch.object(os, "environ", {**os.environ, "BACKEND": NamedAs(backend, gated_as)}):  # read at its top
        spec.loader.exec_module(module)
    return module


def test_class(module: ModuleType, config: Config) -> type:
    """test_distributed_spawn.py's class, with forked ranks, each on its simulated host."""
    import torch

    class TestDistBackendWithFork(module.TestDistBackend, module.DistributedTest._DistTestBase):
        def setUp(self) -> None:
            super().setUp()
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

        @classmethod
        def _run(cls, rank: int, test_name: str, file_name: str, pipe: object, **kwargs: object) -> None:
            if config.ranks_per_host:
                os.environ["SM_CURRENT_HOST"] = f"host-{rank // config.ranks_per_host + 1}"
            super()._run(rank, test_name, file_name, pipe, **kwargs)

    return TestDistBackendWithFork


class Outcomes(unittest.TestResult):
    """Each test's outcome (passed, failed, skipped) with the reason, and its seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.record: dict[str, dict[str, object]] = {}
        self._started = 0.0

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's name
        super().startTest(test)
        self._started = time.monotonic()

    def _note(self, test: unittest.TestCase, outcome: str, detail: str = "") -> None:
        name = test.id().rsplit(".", 1)[-1]
        self.record[name] = {"outcome": outcome, "detail": detail[-3000:], "seconds": round(time.monotonic() - self._started, 2)}
        print(f"{name}: {outcome} ({self.record[name]['seconds']} s)", file=sys.stderr, flush=True)

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        self._note(test, "passed")

    def addFailure(self, test: unittest.TestCase, err: object) -> None:  # noqa: N802
        self._note(test, "failed", self._exc_info_to_string(err, test))

    addError = addFailure  # noqa: N815

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        self._note(test, "skipped", reason)


def run(backend: str, config: Config, names: list[str]) -> dict[str, dict[str, object]]:
    prepare_environment(backend, config)
    from torch.testing._internal.common_distributed import DistTestCases

    if backend == "smddp":
        import smddp_sdk.collectives  # noqa: F401 - registers the backend

        for feature in ("plugin", "ddp", "subgroup"):  # torch's registry of what a backend supports
            DistTestCases.backend_feature[feature].add(backend)
    classes = {gate: test_class(import_test_module(backend, gate), config) for gate in {None, *NAME_GATED.values()}}
    outcomes = Outcomes()
    for name in names:
        if backend == "smddp" and name in SKIPPED_ON_SMDDP:
            outcomes.record[name] = {"outcome": "skipped", "detail": f"skip list: {SKIPPED_ON_SMDDP[name]}", "seconds": 0}
            continue
        gate = NAME_GATED.get(name) if backend == "smddp" else None
        classes[gate](name).run(outcomes)
        first = outcomes.record[name]
        if first["outcome"] == "failed":  # once more: a loaded machine upsets timing (gloo's too); both are kept
            classes[gate](name).run(outcomes)
            outcomes.record[name]["first_try"] = first
    return outcomes.record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", choices=("smddp", "gloo"))
    parser.add_argument("config", choices=sorted(CONFIGS))
    parser.add_argument("tests", nargs="*", help="test names (default: the configuration's, suite.CONFIGS)")
    parser.add_argument("--out", type=Path, required=True, help="where the outcomes go (JSON)")
    args = parser.parse_intermixed_args(argv)
    config = CONFIGS[args.config]
    record = run(args.backend, config, args.tests or list(config.tests))
    args.out.write_text(json.dumps(record, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
