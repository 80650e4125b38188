"""The one error type collectives raise: a RuntimeError (what torch users catch) that is also an SmddpError."""

from __future__ import annotations

from smddp_sdk.errors import SmddpError


class CollectiveError(SmddpError, RuntimeError):
    """A collective failed: timeout, dead or hung peer, bad input, or a broken transport."""
