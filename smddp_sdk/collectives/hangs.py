"""The hang warning: a rank that has waited ``SMDDP_HANG_WARN_S`` seconds in a collective says for whom,
within a host (shared memory) as between hosts (TCP), and how to see where every rank is."""

from __future__ import annotations

import logging
import os

from smddp_sdk.collectives.errors import CollectiveError

HANG_WARN_ENV = "SMDDP_HANG_WARN_S"
DEFAULT_HANG_WARN_S = 60.0
log = logging.getLogger("smddp")


def hang_warn_s() -> float:
    value = os.environ.get(HANG_WARN_ENV, "")
    try:
        return float(value) if value else DEFAULT_HANG_WARN_S
    except ValueError:
        raise CollectiveError(f"{HANG_WARN_ENV}={value!r} is not a number of seconds") from None


def this_rank() -> str:
    """``rank 3 (host algo-2)``: how a warning names the rank that waits."""
    return f"rank {os.environ.get('RANK', '?')} (host {os.environ.get('SM_CURRENT_HOST', '?')})"


def warn_hang(message: str) -> None:
    """Log ``message`` with the command that shows every rank's stack (once per collective)."""
    job = os.environ.get("TRAINING_JOB_NAME") or "JOB"
    log.warning(f"{message}; where every rank is: smddp-launch stacks {job}")  # stderr unless the script configures logging
