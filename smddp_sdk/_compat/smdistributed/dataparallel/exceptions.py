"""Error classes under the module name SageMaker's training toolkit looks for in tracebacks."""

from smddp_sdk.collectives.errors import CollectiveError


class SMDDPError(CollectiveError):
    """Base of the data-parallel library's errors."""


class SMDDPTimeoutError(SMDDPError):
    """A collective did not complete within the process-group timeout."""


class SMDDPInitializationError(SMDDPError):
    """The process group could not be set up."""
