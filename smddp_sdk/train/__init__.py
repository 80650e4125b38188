"""SageMaker SDK v3's training API (``sagemaker.train``): ``ModelTrainer`` and ``Mode``.

A v3 launcher moves over with its import lines changed (``sagemaker.`` becomes ``smddp_sdk.``); the
configuration objects are in ``smddp_sdk.train.configs`` and the runners in ``smddp_sdk.train.distributed``.
See docs/migration-v3.md.
"""

from __future__ import annotations

from smddp_sdk.train.model_trainer import Mode, ModelTrainer

__all__ = ["Mode", "ModelTrainer"]
