#!/usr/bin/env bash
# The README's main command: run the CNN example in local mode (2 simulated hosts x 2 ranks over the smddp
# backend, no Docker or AWS needed) from this checkout. It installs only what the example lacks in the
# current Python (torch, CPU build; click and pyyaml), never the dev extras, and runs the checkout itself
# (PYTHONPATH), so nothing is reinstalled on the next run; the native code is compiled before the job, once.
# scripts/setup.sh sets up development instead.
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
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# smddp's native code is compiled once per torch version into ~/.cache/smddp-sdk/native (or
# $SMDDP_NATIVE_CACHE): here, with a line that says so and how long it took, rather than in silence by
# the job's first ranks. Without a C/C++ toolchain the backend uses its Python path (slower, same results).
"$PYTHON" - <<'PY'
import time
from smddp_sdk.collectives import native

def built(name: str) -> bool:
    return native.SOURCE.with_name(name).exists() or (native.cache_dir() / name).exists()

if native.mode() != "off" and not (built(native.library_name()) and built(native.core_name())):
    started = time.monotonic()
    try:
        native.build_core(with_kernels=True)  # says "smddp: building the native core ..."; the kernels beside it
        native.build()
    except native.NativeUnavailable as exc:
        print(f"note: smddp's native code cannot be built here ({exc}); the smddp backend uses its Python path")
    else:
        print(f"==> compiled smddp's native code in {time.monotonic() - started:.0f} s (cached in {native.cache_dir()} for later runs)", flush=True)
PY
echo "==> running the CNN example locally (2 hosts x 2 ranks)"
exec "$PYTHON" examples/cnn/launch.py "$@"
