#!/usr/bin/env bash
# The SageMaker SDK v3 ModelTrainer (the sagemaker-train package) that the v3 parity tests compare our
# requests with, in its own virtualenv: v3 pins pydantic, boto3 and friends, so it must not share the
# project's environment. Built once per user, outside the checkout, in
# ${XDG_CACHE_HOME:-~/.cache}/smddp-sdk/sagemaker-v3-oracle/<key> (the key: Python version and the pins
# below), and .oracle/v3-venv (git-ignored) links to it, so a fresh clone reuses it. Safe to run again; it
# only installs what is missing. Override the location with SMDDP_SAGEMAKER_V3_ORACLE_VENV; the tests find
# it through SMDDP_SAGEMAKER_V3_ORACLE_PYTHON or at .oracle/v3-venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PINS=("sagemaker-train==1.27.0" "moto[s3,sagemaker]>=5.0")
KEY=$("$PYTHON" -c 'import hashlib, sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}-" + hashlib.sha256(" ".join(sys.argv[1:]).encode()).hexdigest()[:12])' "${PINS[@]}")
VENV=${SMDDP_SAGEMAKER_V3_ORACLE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/smddp-sdk/sagemaker-v3-oracle/$KEY}

ready() { "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('sagemaker.train') and u.find_spec('moto')))" 2>/dev/null; }

if ! ready; then
  echo "==> installing the SageMaker SDK v3 oracle (sagemaker-train) into $VENV (once per user; a few minutes)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}"
fi
mkdir -p .oracle
ln -sfn "$(cd "$VENV" && pwd)" .oracle/v3-venv
