"""Run jobs as real SageMaker training jobs (``get_scheduler("sagemaker", region=..., role=...)``).

Only ``client`` imports boto3, and only when AWS is first called; ``request`` builds the
``CreateTrainingJob`` request without it, so ``dryrun`` works where boto3 is not installed.
"""

from smddp_sdk.schedulers.sagemaker.errors import AwsError, Detached
from smddp_sdk.schedulers.sagemaker.scheduler import SageMakerScheduler

__all__ = ["AwsError", "Detached", "SageMakerScheduler"]
