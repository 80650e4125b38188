"""Colour only on a terminal and never with NO_COLOR; rank-prefixed log lines; stage lines."""

from __future__ import annotations

import io

import click
import pytest

from smddp_sdk import launcher
from smddp_sdk.cli.output import Console, color_enabled, next_step_commands, state_text
from smddp_sdk.specs.status import JobHandle, JobState, LogLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_needs_a_terminal_and_no_NO_COLOR(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert color_enabled(Terminal()) is True
    assert color_enabled(io.StringIO()) is False
    assert color_enabled(io.StringIO(), "always") is True
    assert color_enabled(Terminal(), "never") is False
    monkeypatch.setenv("NO_COLOR", "1")
    assert color_enabled(Terminal()) is False
    assert color_enabled(Terminal(), "always") is False, "NO_COLOR wins over everything"


def test_log_lines_carry_host_and_rank_prefixes():
    line = LogLine("algo-2", "epoch 1 loss 2.30", rank=11)
    assert launcher.format_line(line, colour=False) == "[algo-2/rank11]: epoch 1 loss 2.30"
    assert launcher.format_line(LogLine("algo-1", "runtime up"), colour=False) == "[algo-1]: runtime up"
    coloured = launcher.format_line(line, colour=True)
    assert click.unstyle(coloured) == "[algo-2/rank11]: epoch 1 loss 2.30" != coloured


def test_states_are_coloured_only_when_asked():
    assert state_text(JobState.FAILED, False) == "FAILED"
    assert click.unstyle(state_text(JobState.FAILED, True)) == "FAILED" != state_text(JobState.FAILED, True)


@pytest.mark.parametrize("tty, expected", [(True, "⚙ Packaging source ✓\n⚙ Uploading ⨯\n"),
                                           (False, "Packaging source: done\nUploading: failed\n")], ids=["terminal", "pipe"])
def test_stage_lines_end_with_a_tick_or_a_cross_on_a_terminal_only(tty: bool, expected: str, capsys: pytest.CaptureFixture[str]):
    console = Console("always")
    console.tty, console.color = tty, False  # what a terminal (or a pipe) would give, without colour codes
    with console.stage("Packaging source"):
        pass
    with pytest.raises(RuntimeError), console.stage("Uploading"):
        raise RuntimeError("boom")
    assert capsys.readouterr().err == expected


def test_the_start_up_progress_line_shows_on_a_terminal_only(capsys: pytest.CaptureFixture[str]):
    console = Console("never")
    console.progress("Starting")()
    assert capsys.readouterr().err == ""
    console.tty = True
    clear = console.progress("Starting local://x")
    assert capsys.readouterr().err == "⚙ Starting local://x..."
    clear()
    assert capsys.readouterr().err == "\r\033[K"


def test_next_steps_name_the_handle():
    handle = JobHandle("sagemaker", "us-west-2/mnist-1")
    assert next_step_commands(handle) == [
        "smddp-launch status sagemaker://us-west-2/mnist-1",
        "smddp-launch logs sagemaker://us-west-2/mnist-1 --follow",
        "smddp-launch cancel sagemaker://us-west-2/mnist-1",
    ]


def test_a_message_inside_a_stage_gets_its_own_line(capsys: pytest.CaptureFixture[str]):
    console = Console("never")
    console.tty = True
    with console.stage("Validating job.yaml"):
        console.say("warning: something")
    assert capsys.readouterr().err == "⚙ Validating job.yaml\nwarning: something\n⚙ Validating job.yaml ✓\n"
