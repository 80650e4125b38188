"""Survivors stay up, the pure rules and one rank's round trip: which errors re-form the group
(``is_peer_loss``), when a lost host is replaced alone (``survivors.why_not_replace``), which generation a
replaced rank joins, how ``status`` shows a replacement (``goodput``), and that a peer lost mid-step re-forms
the smddp group in place and runs the step again, ending bitwise equal to a run that lost nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from smddp_sdk.collectives.errors import CollectiveError
from smddp_sdk.collectives.recovery import Recoverable, is_peer_loss
from smddp_sdk.schedulers.hosttree.survivors import why_not_replace
from smddp_sdk.specs import goodput
from smddp_sdk.specs.contract import GROUP_GENERATION_ENV, SURVIVORS_ENV

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
process_group = pytest.importorskip("smddp_sdk.collectives.process_group")
HOSTS = ("algo-1", "algo-2", "algo-3")


def test_a_collectives_failure_is_a_peer_loss_also_when_raised_from_and_nothing_else_is() -> None:
    lost = CollectiveError("smddp all_reduce failed: rank 2 (host algo-2) closed the connection")
    assert is_peer_loss(lost)
    try:
        try:
            raise lost
        except CollectiveError as exc:
            raise RuntimeError("autograd wrapped it") from exc
    except RuntimeError as wrapped:
        assert is_peer_loss(wrapped)
    assert not is_peer_loss(ValueError("a bug in the script"))
    assert not is_peer_loss(None)


def test_a_lost_host_is_replaced_alone_unless_it_served_the_store_another_failed_or_no_retry_is_left() -> None:
    assert why_not_replace("algo-2", HOSTS, failed=[], retries_left=1) == ""
    assert why_not_replace("algo-2", HOSTS, failed=["algo-2"], retries_left=1) == ""  # its own earlier end is not another's
    assert why_not_replace("algo-1", HOSTS, failed=[], retries_left=1) == "algo-1 served the rendezvous store and the coordinator"
    assert why_not_replace("algo-2", HOSTS, failed=["algo-3"], retries_left=1) == "algo-3 failed too"
    assert why_not_replace("algo-3", HOSTS, failed=[], retries_left=0) == "no retry is left (max_retry_attempts)"
    assert why_not_replace("algo-1", HOSTS, failed=[], retries_left=1, rejoining=["algo-2"]) == (
        "algo-1 failed while algo-2 rejoined (its ranks did not re-form the group: see their error)")  # a survivor, not a loss
    assert why_not_replace("algo-2", HOSTS, failed=[], retries_left=1, rejoining=["algo-2"]) == ""  # its replacement lost again


def test_a_replaced_rank_joins_the_generation_the_supervisor_names() -> None:
    assert process_group.group_generation({}) == 0
    assert process_group.group_generation({GROUP_GENERATION_ENV: "3"}) == 3
    with pytest.raises(CollectiveError, match="must be a number"):
        process_group.group_generation({GROUP_GENERATION_ENV: "-1"})


def test_status_shows_a_replacement_by_phase_and_counts_its_pause_out_of_the_productive_time() -> None:
    item = goodput.Replacement.from_json({"attempt": 1, "host": "algo-2", "fault": 100.0, "detected": 100.2, "reformed": 101.0, "training": 101.5})
    assert item.phases() == pytest.approx({"detect": 0.2, "rejoin": 0.8, "transfer": 0.5}) and item.total == pytest.approx(1.5)
    record = {"started": 0.0, "ended": 200.0, "attempts": [{"attempt": 1, "started": 0.0, "ended": 200.0, "first_collective": 10.0}],
              "replacements": [{"attempt": 1, "host": "algo-2", "fault": 100.0, "detected": 100.2, "reformed": 101.0, "training": 101.5}]}
    result = goodput.from_record(record)
    assert result is not None and result.productive == pytest.approx(190.0 - 1.5)
    assert goodput.render(result)[1] == ("algo-2 replaced alone in attempt 1, the others training on: 1.5 s to training again "
                                         "(detect 0.2 s, rejoin 0.8 s, state transfer 0.5 s); no completed step redone")
    unknown = goodput.from_record({**record, "replacements": [{"attempt": 1, "host": "algo-2", "fault": 100.0}]})
    assert unknown is not None and unknown.productive is None  # a pause not yet known leaves the goodput unknown, never guessed


# --- one rank: the group re-formed in place, the step again ------------------------------------------


@pytest.fixture
def one_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import smddp_sdk.collectives  # noqa: F401 - registers smddp

    monkeypatch.delenv(GROUP_GENERATION_ENV, raising=False)
    dist.init_process_group("smddp", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _build() -> tuple[torch.nn.Module, torch.optim.Optimizer, Recoverable]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    return net, optimizer, Recoverable(net, optimizer, extra={"scheduler": scheduler})


def _train(net: torch.nn.Module, optimizer: torch.optim.Optimizer, state: Recoverable, steps: int, lose_at: list[int]) -> None:
    for step in state.steps(steps):
        with state.step(step):
            x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
            loss = (net(x) * (1 + torch.rand(1))).pow(2).mean()  # the forward moves the buffers, the draw the generator
            optimizer.zero_grad()
            loss.backward()
            dist.all_reduce(loss.detach())
            if step in lose_at:
                lose_at.remove(step)
                raise CollectiveError("smddp all_reduce failed: rank 2 (host algo-2) closed the connection (the peer exited or failed)")
            optimizer.step()
            state.extra["scheduler"].step()


def test_a_peer_lost_mid_step_reforms_the_group_in_place_and_the_step_runs_again_bitwise(one_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SURVIVORS_ENV, "1")
    world = dist.group.WORLD
    straight = _build()
    _train(*straight, 10, [])
    lossy = _build()
    _train(*lossy, 10, [4, 8])
    backend = process_group.smddp_backend(None)
    assert backend is not None and backend.generation == 2 and dist.group.WORLD is world  # the same group object, re-formed twice
    assert lossy[2].done == straight[2].done == 10
    for name, tensor in straight[0].state_dict().items():
        assert tensor.numpy().tobytes() == lossy[0].state_dict()[name].numpy().tobytes(), name


def test_a_peer_lost_again_before_any_progress_or_in_a_job_that_does_not_survive_one_is_raised(one_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SURVIVORS_ENV, "1")
    with pytest.raises(CollectiveError):
        _train(*_build(), 10, [4, 4])  # the same step twice, nothing completed between: no endless re-forming
    monkeypatch.delenv(SURVIVORS_ENV)
    with pytest.raises(CollectiveError):
        _train(*_build(), 10, [2])
