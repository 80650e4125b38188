"""The one error type collectives raise: a RuntimeError (what torch users catch) that is also an SmddpError.

A failure caused by a peer names it as data, not only in prose: ``lost`` (its connection or process went
away) and ``awaited`` (it did not arrive in time: hung, or on another code path). The rank's bootstrap writes
them into its error file (``specs.failure.blame_of``), and ``specs.failure.decide`` reads them from the record.
"""

from __future__ import annotations

from collections.abc import Iterable

from smddp_sdk.errors import SmddpError
from smddp_sdk.specs.failure import PeerRank, remember_failed_collective

__all__ = ["CollectiveError", "PeerRank"]


class CollectiveError(SmddpError, RuntimeError):
    """A collective failed: timeout, dead or hung peer, bad input, or a broken transport."""

    def __init__(self, message: str, *, lost: Iterable[PeerRank] = (), awaited: Iterable[PeerRank] = ()) -> None:
        super().__init__(message)
        self.lost, self.awaited = tuple(lost), tuple(awaited)
        if self.lost or self.awaited:
            remember_failed_collective(self)
