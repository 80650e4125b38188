#!/usr/bin/env bash
# The test command (README and CI): set everything up on a fresh machine, then run the whole suite,
# heavy tests included. For the quick default run during development: python3 -m pytest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "==> running the tests"
python3 -m pytest -m "" "$@"
