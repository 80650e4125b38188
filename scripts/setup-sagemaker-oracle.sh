#!/usr/bin/env bash
# The SageMaker SDK v2 (sagemaker<3) that the parity tests compare our requests with, in its own
# virtualenv: v2 pins packaging, attrs and friends to older releases, so it must not share the project's
# environment. The virtualenv is built once per user, outside the checkout, in
# ${XDG_CACHE_HOME:-~/.cache}/smddp-sdk/sagemaker-oracle/<key> (the key: Python version and the pins below),
# and .oracle/venv (git-ignored) links to it, so a fresh clone reuses it instead of installing it again.
# Safe to run again; it only installs what is missing. Override the location with
# SMDDP_SAGEMAKER_ORACLE_VENV; the tests find it through SMDDP_SAGEMAKER_ORACLE_PYTHON or at .oracle/venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PINS=("sagemaker>=2.200,<3" "moto[s3,sagemaker]>=5.0")
KEY=$("$PYTHON" -c 'import hashlib, sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}-" + hashlib.sha256(" ".join(sys.argv[1:]).encode()).hexdigest()[:12])' "${PINS[@]}")
VENV=${SMDDP_SAGEMAKER_ORACLE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/smddp-sdk/sagemaker-oracle/$KEY}
if [[ -z ${SMDDP_SAGEMAKER_ORACLE_VENV:-} && -d .oracle/venv && ! -L .oracle/venv ]]; then
  VENV=.oracle/venv  # made in the checkout by an earlier version of this script: keep using it
fi

ready() { "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('sagemaker') and u.find_spec('moto')))" 2>/dev/null; }

if ! ready; then
  echo "==> installing the SageMaker SDK v2 oracle into $VENV (once per user; a few minutes)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}"
fi
if [[ $VENV != .oracle/venv ]]; then
  mkdir -p .oracle
  ln -sfn "$(cd "$VENV" && pwd)" .oracle/venv
fi
