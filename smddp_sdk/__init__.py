"""smddp-sdk: describe a distributed PyTorch job once, run it locally, in Docker or on SageMaker.

Importing this package is cheap: the public names load their modules on first use, and nothing
here imports torch, boto3 or docker.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "PyTorch": "smddp_sdk.estimator",
    "Estimator": "smddp_sdk.estimator",
    "JobSpec": "smddp_sdk.specs.job",
    "SmddpError": "smddp_sdk.errors",
    "SpecError": "smddp_sdk.errors",
    "JobFailedError": "smddp_sdk.errors",
    "UnavailableError": "smddp_sdk.errors",
    "Session": "smddp_sdk.session",
    "LocalSession": "smddp_sdk.session",
    "get_execution_role": "smddp_sdk.session",
    "TrainingInput": "smddp_sdk.inputs",
}
# v2's module names, so that code written `import sagemaker; sagemaker.inputs.TrainingInput(...)` runs with
# `import smddp_sdk as sagemaker` (sagemaker.local.LocalSession is the session module's).
_MODULES = {"inputs": "smddp_sdk.inputs", "session": "smddp_sdk.session", "local": "smddp_sdk.session", "pytorch": "smddp_sdk.estimator"}

__all__ = ["__version__", *_LAZY]

if TYPE_CHECKING:
    from smddp_sdk.errors import JobFailedError, SmddpError, SpecError, UnavailableError
    from smddp_sdk.estimator import Estimator, PyTorch
    from smddp_sdk.inputs import TrainingInput
    from smddp_sdk.session import LocalSession, Session, get_execution_role
    from smddp_sdk.specs.job import JobSpec


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'smddp_sdk' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
