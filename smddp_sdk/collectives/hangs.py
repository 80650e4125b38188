"""The hang warning: a rank that has waited ``SMDDP_HANG_WARN_S`` seconds in a collective names the ranks
that have not entered it, on every rank, within a host as between hosts, and says how to see where every
rank is.

A transport alone cannot know who is late: rank 0 waiting for the other host's leader only knows that the
leader has not answered, and the leader may itself wait for a rank behind it. So every rank says which call
it is in: a rank's host peers read it from the shared-memory arena (each rank's call record at its latest
barrier), and a rank that has waited ``publish_after`` seconds in a call publishes that call in the
rendezvous store (signed, ``StoreValues``: one store write per slow call, none on the fast path). The late
ranks are those whose latest known call is older than the waiting rank's, or who said nothing at all.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence

from smddp_sdk.collectives.calls import describe
from smddp_sdk.collectives.errors import CollectiveError
from smddp_sdk.collectives.store_values import StoreValues

HANG_WARN_ENV = "SMDDP_HANG_WARN_S"
DEFAULT_HANG_WARN_S = 60.0
PUBLISH_AFTER_S = 1.0  # a call waited on this long is published: well before anyone warns, never on the fast path
NAMED_AT_MOST = 8  # late ranks named in one warning; the rest are counted
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


def behind(theirs: int, mine: int) -> bool:
    """Whether call number ``theirs`` comes before ``mine``, wrap-safe on 32 bits."""
    return 0 < (mine - theirs) & 0xFFFFFFFF < 1 << 31


class HangWatch:
    """One group's view of which ranks have entered the call a rank waits in (see the module's docstring).

    ``values`` is None where no store is known (a transport used on its own): the warning then names the
    peer the transport waits for, all it knows."""

    def __init__(self, values: StoreValues | None = None, rank: int = -1, hosts: Sequence[str] = (),
                 local_calls: Callable[[], Mapping[int, list[int] | None]] | None = None) -> None:
        self._values = values
        self._rank = rank
        self._hosts = list(hosts)
        self._local_calls = local_calls or dict  # this host's ranks: group rank -> its latest call record (None: none yet)
        self.warn_s = hang_warn_s()
        self.publish_after_s = min(PUBLISH_AFTER_S, self.warn_s / 4)
        self._published: int | None = None
        self._warned: int | None = None

    def waiting(self, record: Sequence[int], waited_s: float, what: str, transport_view: Callable[[], str]) -> None:
        """Called while a wait of this call goes on: publishes the call once it is slow, warns once per call.
        ``transport_view``: the transport's own words for whom it waits, used when nobody is known to be late."""
        seq = int(record[0])
        if waited_s >= self.publish_after_s and self._published != seq:
            self._published = seq
            self._publish(record)
        if waited_s >= self.warn_s and self._warned != seq:
            self._warned = seq
            late = self.late_ranks(seq)
            if late:
                warn_hang(f"smddp: rank {self._rank} (host {self._host(self._rank)}) has waited {waited_s:.0f} s in {describe(list(record))} "
                          f"for {self._named(late)}, which {'has' if len(late) == 1 else 'have'} not entered it")
            else:
                warn_hang(transport_view())

    def late_ranks(self, seq: int) -> dict[int, str]:
        """The ranks whose latest known call comes before ``seq``: rank -> what it last called ("" unknown)."""
        if self._values is None:
            return {}
        local = self._local_calls()
        late: dict[int, str] = {}
        for rank in range(len(self._hosts)):
            if rank == self._rank:
                continue
            theirs = local[rank] if rank in local else self._published_call(rank)
            if theirs is None or behind(int(theirs[0]), seq):
                late[rank] = describe(theirs) if theirs else ""
        return late

    def _named(self, late: Mapping[int, str]) -> str:
        ranks = sorted(late)
        parts = [f"rank {r} (host {self._host(r)}" + (f", last seen in {late[r]})" if late[r] else ")") for r in ranks[:NAMED_AT_MOST]]
        if len(ranks) > NAMED_AT_MOST:
            parts.append(f"{len(ranks) - NAMED_AT_MOST} more")
        return ", ".join(parts)

    def _host(self, rank: int) -> str:
        return self._hosts[rank] if 0 <= rank < len(self._hosts) else os.environ.get("SM_CURRENT_HOST", "?")

    # A diagnostic never fails the collective it describes: a store that cannot be reached, or a value a
    # stranger wrote, only makes the warning know less.
    def _publish(self, record: Sequence[int]) -> None:
        if self._values is None:
            return
        try:
            self._values.set(f"call/{self._rank}", [int(word) for word in record])
        except (CollectiveError, RuntimeError, OSError):
            pass

    def _published_call(self, rank: int) -> list[int] | None:
        assert self._values is not None
        try:
            if not self._values.check([f"call/{rank}"]):
                return None
            words = self._values.get(f"call/{rank}")
        except (CollectiveError, RuntimeError, OSError):
            return None
        return [int(word) for word in words] if isinstance(words, list) and len(words) == 6 else None
