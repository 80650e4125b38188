"""The SageMaker tests' AWS fixtures (fake credentials, moto) for the ModelTrainer's submit test."""

from tests.sagemaker.conftest import aws_env, moto_aws  # noqa: F401  fixtures, found by name
