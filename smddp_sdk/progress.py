"""Progress bars for long steps (uploads, image pulls and builds): click's bar on a terminal, a few plain
lines when piped. ``SMDDP_PROGRESS=0`` turns bars off, ``SMDDP_PROGRESS=1`` forces them on (e.g. in CI
logs that render carriage returns)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, TextIO

import click

PROGRESS_ENV = "SMDDP_PROGRESS"
_STEP = re.compile(r"^Step (\d+)/(\d+)")
_LAYER = re.compile(r"^([0-9a-f]{12}): (.+)$")


def enabled(stream: TextIO | None = None) -> bool:
    """Bars only on a terminal, unless SMDDP_PROGRESS says otherwise."""
    setting = os.environ.get(PROGRESS_ENV, "").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return False
    if setting in ("1", "true", "yes", "on"):
        return True
    isatty = getattr(stream or sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def _click_bar(**options: Any) -> Any:
    """click's bar on stderr; drawn even off a terminal when SMDDP_PROGRESS=1 asked for it."""
    shown = click.progressbar(file=sys.stderr, **options)
    # click draws only the label off a terminal; enabled() already decided (click < 8.2 and >= 8.2 spellings).
    if hasattr(shown, "is_hidden"):
        shown.is_hidden = False
    if hasattr(shown, "_is_atty"):
        shown._is_atty = True
    return shown


@contextmanager
def bar(total: int, label: str, *, unit_bytes: bool = False) -> Iterator[Callable[[int], None]]:
    """A thread-safe ``advance(n)`` for ``total`` units; on a terminal a bar, otherwise the label once and
    a closing line (no line per step in logs)."""
    lock = threading.Lock()
    if not enabled():
        click.echo(f"{label} ...", err=True)
        yield lambda n: None
        click.echo(f"{label}: done", err=True)
        return
    shown = _click_bar(length=max(total, 1), label=label, show_pos=not unit_bytes, show_percent=True)
    with shown:
        def advance(n: int) -> None:
            with lock:
                shown.update(n)

        yield advance


def run_with_steps(argv: Sequence[str], label: str, env: Mapping[str, str] | None = None) -> int:
    """Run a command whose stderr reports ``Step i/n`` (docker's classic builder) and show those steps as
    a bar; its other stderr lines are passed through, stdout is left alone. Returns the exit code."""
    proc = subprocess.Popen(list(argv), stderr=subprocess.PIPE, text=True, env=dict(env) if env is not None else None)
    assert proc.stderr is not None
    progress: Any = None
    with ExitStack() as bars:
        for line in proc.stderr:
            match = _STEP.match(line)
            if match and enabled():
                done, total = int(match.group(1)), int(match.group(2))
                progress = progress or bars.enter_context(_click_bar(length=total, label=label, show_pos=True))
                progress.update(done - progress.pos)
                continue
            if progress is not None:  # a message in the middle of the bar: end the bar's line first
                sys.stderr.write("\n")
            sys.stderr.write(line)
            sys.stderr.flush()
    return proc.wait()


def docker_pull(docker: str, image: str, *, timeout: float = 1800) -> int:
    """``docker pull image`` with its layers as a bar (or start and end lines when piped); the exit code."""
    proc = subprocess.Popen([docker, "pull", image], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    layers: dict[str, bool] = {}
    show = enabled()
    progress: Any = None
    if not show:
        click.echo(f"pulling {image} (may take minutes) ...", err=True)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    with ExitStack() as cleanup:
        cleanup.callback(timer.cancel)
        for line in proc.stdout:
            match = _LAYER.match(line.strip())
            if not match:
                continue
            layer, state = match.groups()
            layers.setdefault(layer, False)
            if state in ("Pull complete", "Already exists"):
                layers[layer] = True
            if show:
                progress = progress or cleanup.enter_context(_click_bar(length=1, label=f"pulling {image}", show_pos=True))
                progress.length = len(layers)
                progress.update(sum(layers.values()) - progress.pos)
    code = proc.wait()
    if not show:
        click.echo(f"pulling {image}: {'done' if code == 0 else f'failed (exit {code})'}", err=True)
    return code


__all__ = ["PROGRESS_ENV", "enabled", "bar", "run_with_steps", "docker_pull"]
