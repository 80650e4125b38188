#!/usr/bin/env bash
# Install what the project needs into the current Python: torch (CPU build), then this package with
# its dev extras. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  # Pinned on purpose: an unpinned torch on Linux pulls a multi-GB CUDA build. Where PyPI serves only
  # the CUDA build, point SMDDP_TORCH_INDEX at a CPU wheel index (https://download.pytorch.org/whl/cpu).
  echo "==> installing torch ${SMDDP_TORCH_VERSION:-2.13.0} (CPU)"
  "$PYTHON" -m pip install --quiet ${SMDDP_TORCH_INDEX:+--index-url "$SMDDP_TORCH_INDEX"} \
    "torch==${SMDDP_TORCH_VERSION:-2.13.0}"
fi

echo "==> installing smddp-sdk and its dev extras"
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e ".[dev]"

# smddp's native kernels and core, built now into the user cache (once per torch version; it prints how
# long it took) rather than by the first job's ranks; without a C/C++ toolchain the backend uses its Python path.
echo "==> building smddp's native code (cached)"
"$PYTHON" -m smddp_sdk.collectives.native >/dev/null \
  || echo "note: smddp's native code could not be built here; the smddp backend will use its Python path"
