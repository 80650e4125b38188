#!/usr/bin/env bash
# The SageMaker SDK v2 (sagemaker<3) that the parity tests compare our requests with, in its own
# virtualenv under .oracle/ (git-ignored): v2 pins packaging, attrs and friends to older releases, so it
# must not share the project's environment. Safe to run again; it only installs what is missing.
# Override the location with SMDDP_SAGEMAKER_ORACLE_VENV; the tests find it through
# SMDDP_SAGEMAKER_ORACLE_PYTHON or at .oracle/venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${SMDDP_SAGEMAKER_ORACLE_VENV:-.oracle/venv}

if "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('sagemaker') and u.find_spec('moto')))" 2>/dev/null; then
  exit 0
fi
echo "==> installing the SageMaker SDK v2 oracle into $VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "sagemaker>=2.200,<3" "moto[s3,sagemaker]>=5.0"
