#!/usr/bin/env bash
# The test command (README and CI): set everything up on a fresh machine, then run the whole suite,
# heavy tests included. For the quick default run during development: python3 -m pytest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The SageMaker SDK v2 oracle for the parity tests lives in its own virtualenv; where it cannot be
# installed the parity tests skip and say so.
bash scripts/setup-sagemaker-oracle.sh || echo "warning: the SageMaker SDK v2 oracle could not be installed; the parity tests will skip"
echo "==> running the tests"
python3 -m pytest -m "" "$@"
