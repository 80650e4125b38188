"""Optional features are capabilities: declared on the scheduler, enforced by the base class, asked for by the
CLI and the estimator (never a scheduler's name or type), and refused by name with the scheduler's own advice."""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import pytest
from click.testing import CliRunner

from smddp_sdk.cli.main import cli
from smddp_sdk.errors import SpecError
from smddp_sdk.schedulers import scheduler_class
from smddp_sdk.schedulers.base import OPTIONAL_OPERATIONS, Capabilities, DryRun, Scheduler
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import SCHEDULER_NAMES, JobHandle, JobState, JobStatus, LogLine

ROOT = Path(__file__).resolve().parents[2]
# Where optional features are used: they may name no scheduler and test no scheduler type.
CALLERS = [*sorted((ROOT / "smddp_sdk" / "cli").glob("*.py")), ROOT / "smddp_sdk" / "estimator.py", ROOT / "smddp_sdk" / "launcher.py"]


class Minimal(Scheduler):
    """The interface and nothing more: what a new scheduler must write."""

    name: ClassVar[str] = "minimal"

    def plan(self, spec: JobSpec) -> DryRun:
        return DryRun(self.name, spec, "job", {})

    def run(self, dryrun: DryRun, *, owner_pid: int | None) -> JobHandle:
        return JobHandle(self.name, dryrun.job_name)

    def status(self, handle: JobHandle) -> JobStatus:
        return JobStatus(handle, JobState.SUCCEEDED, submitted=1.0)

    def logs(self, handle: JobHandle, *, hosts: Sequence[str] | None = None, ranks: Sequence[int] | None = None, follow: bool = False) -> Iterator[LogLine]:
        return iter(())

    def cancel(self, handle: JobHandle) -> None:
        pass

    def list_jobs(self, limit: int | None = None, states: Collection[JobState] = ()) -> list[JobStatus]:
        return [self.status(JobHandle(self.name, "job"))]


def test_a_scheduler_without_a_capability_refuses_it_naming_itself_and_its_advice() -> None:
    class Advised(Minimal):
        capabilities: ClassVar[Capabilities] = Capabilities(instead={"stacks": "use py-spy"})

    handle = JobHandle("minimal", "job")
    with pytest.raises(SpecError, match=r"the minimal scheduler cannot show the ranks' Python stacks \(use py-spy\)"):
        Advised().stacks(handle, timeout=1)
    with pytest.raises(SpecError, match="the minimal scheduler cannot interrupt a job as a spot reclaim would"):
        Minimal().interrupt(handle, None)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="the minimal scheduler cannot remove a finished job's directory"):
        Minimal().remove(handle)


def test_a_declaration_must_match_the_methods_both_ways() -> None:
    with pytest.raises(TypeError, match="Promising declares 'stacks' but does not implement it"):
        class Promising(Minimal):  # noqa: F841 - defining it is the test
            capabilities: ClassVar[Capabilities] = Capabilities(stacks=True)

    with pytest.raises(TypeError, match="Hiding implements 'remove' but does not declare it"):
        class Hiding(Minimal):  # noqa: F841
            def remove(self, handle: JobHandle) -> None:
                pass


def test_listing_is_abstract_and_a_listing_merges_what_list_jobs_returns() -> None:
    class Unlisted(Scheduler):
        name: ClassVar[str] = "unlisted"
        plan = Minimal.plan
        run = Minimal.run
        status = Minimal.status
        logs = Minimal.logs
        cancel = Minimal.cancel

    with pytest.raises(TypeError, match="list_jobs"):
        Unlisted()  # type: ignore[abstract]
    (entry,) = Minimal().listed(5)
    assert (str(entry.handle), entry.submitted, entry.describe().state) == ("minimal://job", 1.0, JobState.SUCCEEDED)


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
def test_every_scheduler_implements_exactly_what_it_declares(name: str) -> None:
    scheduler = scheduler_class(name)
    for operation in OPTIONAL_OPERATIONS:
        implemented = getattr(scheduler, operation) is not getattr(Scheduler, operation)
        assert implemented == scheduler.capabilities.has(operation), (name, operation)
        if not implemented:
            assert scheduler.capabilities.instead.get(operation), f"{name} lacks {operation} without saying what to do instead"


def test_what_each_scheduler_declares() -> None:
    declared = {name: {field for field in ("bound_to_owner", "cancel_on_interrupt", "lists_locally", *OPTIONAL_OPERATIONS)
                       if scheduler_class(name).capabilities.has(field)} for name in SCHEDULER_NAMES}
    host_tree = {"bound_to_owner", "cancel_on_interrupt", "lists_locally", "interrupt", "stacks", "remove"}
    assert declared == {"local": host_tree, "docker": host_tree, "slurm": {"lists_locally", "stacks"}, "sagemaker": set()}


@pytest.mark.parametrize(("command", "scheduler", "said", "advice"), [
    ("interrupt", "slurm", "the slurm scheduler cannot interrupt a job as a spot reclaim would", "scontrol requeue"),
    ("stacks", "sagemaker", "the sagemaker scheduler cannot show the ranks' Python stacks", "CloudWatch"),
    ("interrupt", "sagemaker", "the sagemaker scheduler cannot interrupt", "SageMaker interrupts spot jobs itself"),
])
def test_the_cli_says_which_scheduler_lacks_what(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, scheduler: str, said: str, advice: str) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "jobs"))
    handle = f"{scheduler}://us-west-2/job" if scheduler == "sagemaker" else f"{scheduler}://job"
    options = ["-o", "region=us-west-2"] if scheduler == "sagemaker" else []
    result = CliRunner().invoke(cli, [command, handle, *options])
    assert result.exit_code == 2, result.output
    assert said in result.stderr and advice in result.stderr, result.stderr
    assert "Traceback" not in result.output


def _scheduler_tests(path: Path) -> list[str]:
    """Where ``path`` compares with the name of a scheduler other than SageMaker or tests a scheduler's type,
    as file:line. SageMaker may be named: the estimator and the CLI speak its API (sessions, regions, its
    images, Experiments), which no capability stands for."""
    names = set(SCHEDULER_NAMES) - {"sagemaker"}
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            constants = [item for operand in operands for item in (operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand])]
            named = [item.value for item in constants if isinstance(item, ast.Constant) and item.value in names]
            if named:
                found.append(f"{path.name}:{node.lineno}: compares with {named}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            text = ast.unparse(node.args[1])
            if "Scheduler" in text:
                found.append(f"{path.name}:{node.lineno}: isinstance(..., {text})")
    return found


def test_callers_ask_for_capabilities_not_names_or_types() -> None:
    assert [problem for path in CALLERS for problem in _scheduler_tests(path)] == []


def test_the_check_above_finds_a_name_test_and_a_type_test(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("if handle.scheduler in ('local', 'docker'):\n    pass\nok = isinstance(s, HostTreeScheduler)\n"
                      "aws = name == 'sagemaker'\nfound = shutil.which('docker') is None\n")
    assert _scheduler_tests(sample) == ["sample.py:1: compares with ['local', 'docker']", "sample.py:3: isinstance(..., HostTreeScheduler)"]
