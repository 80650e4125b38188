"""smddp-sdk's stand-in for AWS's `sagemaker_training` (only `environment` is provided)."""
