"""smddp-sdk's stand-in for AWS's `smdistributed` namespace (used only when the real one is absent)."""
