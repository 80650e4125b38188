"""Terminal output: colour policy, stage lines, next-step hints and the dryrun view (log lines are
formatted by ``smddp_sdk.launcher``, shared with the estimator).

Colour is used only when the stream is a terminal and ``NO_COLOR`` is unset (or when forced with
``--color always``). Results go to stdout, everything meant for a person reading along goes to stderr.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

import click
import yaml

from smddp_sdk import launcher
from smddp_sdk.config.job_file import ResolvedJob
from smddp_sdk.config.layers import MERGED_MAPPINGS
from smddp_sdk.specs.status import JobHandle, JobState

STATE_COLORS = {
    JobState.PENDING: "yellow",
    JobState.STARTING: "yellow",
    JobState.RUNNING: "blue",
    JobState.SUCCEEDED: "green",
    JobState.FAILED: "red",
    JobState.CANCELLED: "magenta",
    JobState.UNKNOWN: "white",
}
COMMENT_COLUMN_LIMIT = 60


def color_enabled(stream: IO[str] | None, mode: str = "auto") -> bool:
    """``--color``'s rule: never with ``NO_COLOR`` (https://no-color.org), whatever else is asked;
    ``always``/``never`` otherwise win; ``auto`` means only on a terminal."""
    return launcher.use_colour(stream, {"always": True, "never": False}.get(mode))


class Console:
    """Writes people-facing lines to stderr, styled only when colour is on for it."""

    def __init__(self, color_mode: str = "auto") -> None:
        self.err = click.get_text_stream("stderr")
        self.tty = bool(getattr(self.err, "isatty", None) and self.err.isatty())
        self.color = color_enabled(self.err, color_mode)
        self._open_stage: str | None = None  # a stage line waiting for its ✓
        self._stage_broken = False  # something else was printed while it waited

    def style(self, text: str, **styles: Any) -> str:
        return click.style(text, **styles) if self.color else text

    def mark(self, symbol: str, **styles: Any) -> str:
        """``⚙ ``, ``✓ `` and the like on a terminal; nothing in a pipe or a file."""
        return f"{self.style(symbol, **styles)} " if self.tty else ""

    def say(self, text: str = "") -> None:
        if self._open_stage is not None and not self._stage_broken:
            click.echo("", err=True)  # finish the stage line; the stage repeats itself when it ends
            self._stage_broken = True
        click.echo(text, err=True, color=self.color)

    def error(self, text: str) -> None:
        self.say(f"{self.style('error:', fg='red', bold=True)} {text}")

    @contextmanager
    def stage(self, text: str) -> Iterator[None]:
        """``⚙ text ✓`` around a step, ``⨯`` when it fails (``text: done`` / ``text: failed`` off a terminal)."""
        line = f"{self.mark('⚙', fg='cyan')}{text}"
        click.echo(line, err=True, nl=False, color=self.color)
        self._open_stage, self._stage_broken = text, False
        try:
            yield
        except BaseException:
            self._end_stage(line, self.style("⨯", fg="red") if self.tty else ": failed")
            raise
        self._end_stage(line, self.style("✓", fg="green") if self.tty else ": done")

    def _end_stage(self, line: str, mark: str) -> None:
        prefix = line if self._stage_broken else ""
        self._open_stage, self._stage_broken = None, False
        click.echo(f"{prefix}{' ' if self.tty else ''}{mark}", err=True, color=self.color)

    def progress(self, text: str) -> Callable[[], None]:
        """On a terminal, ``⚙ text...`` until the returned function clears it; elsewhere nothing."""
        if not self.tty:
            return lambda: None
        click.echo(f"{self.mark('⚙', fg='cyan')}{text}...", err=True, nl=False, color=self.color)
        return lambda: click.echo("\r\033[K", err=True, nl=False, color=True)  # erase the line

    def next_steps(self, handle: JobHandle) -> None:
        self.say(self.style("Next steps:", bold=True))
        for command in next_step_commands(handle):
            self.say(f"  {command}")


def next_step_commands(handle: JobHandle) -> list[str]:
    return [f"smddp-launch status {handle}", f"smddp-launch logs {handle} --follow", f"smddp-launch cancel {handle}"]


def state_text(state: JobState, color: bool) -> str:
    return click.style(state.value, fg=STATE_COLORS[state], bold=True) if color else state.value


# --- the resolved job, annotated with where each value came from -------------------------------


def render_resolved(job: ResolvedJob, job_name: str) -> str:
    """The job as YAML, each top-level value (and each hyperparameter, variable, channel and option)
    followed by ``# <source>``."""
    values = _plain(job.spec.as_dict())
    rows: list[tuple[str, str]] = [(f"scheduler: {job.scheduler}", _origin(job, "scheduler", "default: from instance_type"))]
    rows += _block(job, "scheduler_options", _plain(job.scheduler_options))
    for key, value in values.items():
        if key == "job_name" and value is None:
            rows.append((f"job_name: {job_name}", "generated from base_job_name"))
            continue
        rows += _block(job, key, value)
    width = max((len(text) for text, _ in rows if len(text) <= COMMENT_COLUMN_LIMIT), default=0)
    return "\n".join(f"{text.ljust(width)}  # {origin}" if origin else text for text, origin in rows)


def _block(job: ResolvedJob, key: str, value: Any) -> list[tuple[str, str]]:
    if key in MERGED_MAPPINGS and isinstance(value, dict) and value:
        rows = [(f"{key}:", "")]
        for sub, item in value.items():
            lines = _dump({sub: item}).splitlines()
            rows.append(("  " + lines[0], _origin(job, f"{key}.{sub}")))
            rows += [("  " + line, "") for line in lines[1:]]
        return rows
    lines = _dump({key: value}).splitlines()
    return [(lines[0], _origin(job, key))] + [(line, "") for line in lines[1:]]


def _origin(job: ResolvedJob, path: str, default: str = "default") -> str:
    source = job.source(path)
    return default if source.kind == "default" else source.describe(path)


def _dump(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=False, width=1000).rstrip()


def _plain(value: Any) -> Any:
    """Tuples to lists and odd types to strings, so YAML shows plain values."""
    return json.loads(json.dumps(value, default=str))
