"""What SageMaker SDK v2 offers a user, read from v2 itself (runs in the oracle virtualenv).

Prints JSON: the estimator arguments (``PyTorch``, ``Framework``, ``EstimatorBase``), the public methods and
properties of ``PyTorch``, ``TrainingInput``'s parameters in order, and ``TrainingInput(...).config`` for the
argument lists read on stdin (a JSON list of ``[args, kwargs]``).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
import warnings


def main() -> None:
    os.environ.setdefault("AWS_REGION", "us-west-2")
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from sagemaker.estimator import EstimatorBase, Framework
    from sagemaker.inputs import TrainingInput
    from sagemaker.pytorch import PyTorch

    arguments: list[str] = []
    for cls in (PyTorch, Framework, EstimatorBase):
        for name, parameter in inspect.signature(cls.__init__).parameters.items():
            if name != "self" and parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL) and name not in arguments:
                arguments.append(name)
    methods = [name for name in dir(PyTorch) if not name.startswith("_") and not name.isupper()]
    cases = json.load(sys.stdin)
    configs = [TrainingInput(*args, **kwargs).config for args, kwargs in cases]
    parameters = [name for name in inspect.signature(TrainingInput.__init__).parameters if name != "self"]
    json.dump({"arguments": arguments, "methods": methods, "training_input": parameters, "configs": configs}, sys.stdout)


if __name__ == "__main__":
    main()
