#!/usr/bin/env bash
# The README's main command: install what is needed (scripts/setup.sh), then run the CNN example in
# local mode (2 simulated hosts x 2 ranks over the smddp backend, no Docker or AWS needed).
# Extra arguments go to examples/cnn/launch.py (e.g. --epochs 5, --dryrun). SMDDP_SKIP_SETUP=1 skips setup.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [[ -z "${SMDDP_SKIP_SETUP:-}" ]]; then
  bash scripts/setup.sh
fi
echo "==> running the CNN example locally (2 hosts x 2 ranks)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" examples/cnn/launch.py "$@"
