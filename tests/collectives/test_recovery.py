"""Recovery without a checkpoint, the pure parts and one rank's round trip (smddp_sdk/collectives/recovery.py):
which snapshot wins, where snapshots live, that a kept state resumes bitwise equal and a half-done step is never
kept, and that docs/resuming.md shows the example's code as it is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smddp_sdk.collectives.errors import CollectiveError
from smddp_sdk.collectives.recovery import Recoverable, choose_source, snapshot_dir

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
ROOT = Path(__file__).resolve().parents[2]


def test_the_lowest_rank_that_kept_a_state_sends_it_even_a_step_behind_a_peer() -> None:
    assert choose_source([None, 7, 9, 9]) == 1
    assert choose_source([21, 22, None, None]) == 0  # rank 0's own buffers go on, as in a straight run
    assert choose_source([None, None, 0, 9]) == 3
    assert choose_source([5, None, None, None]) == 0
    assert choose_source([None, None]) is None
    assert choose_source([0, 0]) is None  # no step done is no progress


@given(st.lists(st.one_of(st.none(), st.integers(min_value=0, max_value=50)), min_size=1, max_size=16))
def test_the_chosen_source_is_the_first_rank_with_progress(steps: list[int | None]) -> None:
    source = choose_source(steps)
    if not any(steps):
        assert source is None
    else:
        assert source is not None and steps[source] and not any(steps[:source])


def test_snapshots_live_in_the_jobs_scratch_folder_per_host_and_nowhere_without_one() -> None:
    assert snapshot_dir({"SMDDP_SCRATCH_DIR": "/job/scratch", "SM_CURRENT_HOST": "algo-2"}) == Path("/job/scratch/snapshots/algo-2")
    assert snapshot_dir({"SM_CURRENT_HOST": "algo-2"}) is None


def _build() -> tuple[torch.nn.Module, torch.optim.Optimizer, object, Recoverable]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    return net, optimizer, scheduler, Recoverable(net, optimizer, extra={"scheduler": scheduler})


def _train(net, optimizer, scheduler, state: Recoverable, start: int, stop: int, forward_only_at: int | None = None) -> None:
    for step in range(start, stop):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        loss = (net(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()  # changes BatchNorm's buffers
        if step == forward_only_at:
            return  # stopped inside the step, as a lost peer stops backward
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        state.step_done(step)


@pytest.fixture
def one_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SMDDP_SCRATCH_DIR", str(tmp_path / "scratch"))
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-1")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield tmp_path / "scratch" / "snapshots" / "algo-1"
    finally:
        dist.destroy_process_group()


def test_a_kept_state_resumes_bitwise_equal_and_a_half_done_step_is_never_kept(one_rank: Path) -> None:
    stopped = _build()
    assert stopped[3].save() is None  # no step done yet: nothing to keep
    _train(*stopped, 0, 12, forward_only_at=7)
    stopped[1].step()  # an optimizer step without its step_done: the state is no longer a completed step's
    assert stopped[3].save() is None
    stopped[3].step_done(7)
    _train(*stopped, 8, 12, forward_only_at=9)
    assert stopped[3].save() == one_rank / "rank-0.snapshot" and (one_rank / "rank-0.snapshot").stat().st_mode & 0o777 == 0o600

    resumed = _build()
    assert resumed[3].restore() == 9
    assert not (one_rank / "rank-0.snapshot").exists()  # deleted once restored
    _train(*resumed, 9, 12)
    again = _build()  # the same steps (the extra optimizer step too), never stopped
    _train(*again, 0, 12, forward_only_at=7)
    again[1].step()
    again[3].step_done(7)
    _train(*again, 8, 12)
    for name, tensor in again[0].state_dict().items():
        assert torch.equal(tensor, resumed[0].state_dict()[name]), name
    assert _build()[3].restore() == 0  # nothing kept any more: the script's own checkpoint, or from scratch


def test_a_snapshot_this_job_did_not_write_is_never_unpickled(one_rank: Path, capsys: pytest.CaptureFixture[str]) -> None:
    net, optimizer, scheduler, state = _build()
    _train(net, optimizer, scheduler, state, 0, 2)
    kept = state.save()
    assert kept is not None
    kept.chmod(0o644)  # as if someone else had put it there
    assert _build()[3].restore() == 0
    assert "is not a snapshot this job wrote" in capsys.readouterr().err


def test_a_failed_collective_leaving_the_loop_keeps_the_last_completed_step(one_rank: Path) -> None:
    net, optimizer, scheduler, state = _build()
    with pytest.raises(CollectiveError), state:
        _train(net, optimizer, scheduler, state, 0, 5, forward_only_at=4)
        raise CollectiveError("the connection to rank 3 (host algo-2) closed", lost=())
    assert _build()[3].restore() == 4


def test_the_docs_show_the_example_as_it_is() -> None:
    text = (ROOT / "docs" / "resuming.md").read_text()
    section = text.split("## Recovery without a checkpoint", 1)[1].split("\n## ", 1)[0]
    snippet = re.search(r"```python\n(.*?)```", section, re.S)
    assert snippet, "docs/resuming.md's section has no python snippet"
    example = [line.strip() for line in (ROOT / "examples" / "checkpointless" / "train.py").read_text().splitlines()]
    missing = [line for line in snippet.group(1).splitlines() if line.strip() and line.strip() not in example]
    assert not missing, f"docs/resuming.md shows lines examples/checkpointless/train.py does not have: {missing}"
