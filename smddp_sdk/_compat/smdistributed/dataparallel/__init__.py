"""smddp-sdk's stand-in for `smdistributed.dataparallel`, backed by the bundled smddp backend."""

__version__ = "2.0.0+smddp_sdk"
