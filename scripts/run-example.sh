#!/usr/bin/env bash
# The README's main command: run the CNN example in local mode (2 simulated hosts x 2 ranks over the smddp
# backend, no Docker or AWS needed) from this checkout. It installs only what the example lacks in the
# current Python (torch, CPU build; click and pyyaml), never the dev extras, and runs the checkout itself
# (PYTHONPATH), so nothing is reinstalled on the next run. scripts/setup.sh sets up development instead.
# Extra arguments go to examples/cnn/launch.py (e.g. --epochs 5, --dryrun). SMDDP_SKIP_SETUP=1 installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [[ -z "${SMDDP_SKIP_SETUP:-}" ]]; then
  if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    # Pinned on purpose: an unpinned torch on Linux pulls a multi-GB CUDA build (see scripts/setup.sh).
    echo "==> installing torch ${SMDDP_TORCH_VERSION:-2.13.0} (CPU)"
    "$PYTHON" -m pip install --quiet ${SMDDP_TORCH_INDEX:+--index-url "$SMDDP_TORCH_INDEX"} "torch==${SMDDP_TORCH_VERSION:-2.13.0}"
  fi
  missing=$("$PYTHON" -c "import importlib.util as u; print(' '.join(p for m, p in (('click', 'click>=8.1'), ('yaml', 'pyyaml>=6.0')) if u.find_spec(m) is None))")
  if [[ -n "$missing" ]]; then
    echo "==> installing $missing"
    # shellcheck disable=SC2086 # one argument per package
    "$PYTHON" -m pip install --quiet --disable-pip-version-check $missing
  fi
fi
echo "==> running the CNN example locally (2 hosts x 2 ranks)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" examples/cnn/launch.py "$@"
