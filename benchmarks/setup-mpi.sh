#!/usr/bin/env bash
# Installs the Open MPI anchor for benchmarks/mpi_bench.py: Debian's Open MPI and pip's mpi4py.
# Benchmark-only: smddp-sdk itself never needs MPI. Run as root (or with sudo) on Debian/Ubuntu.
set -euo pipefail
if ! command -v mpirun >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev
fi
python3 -c "import mpi4py" 2>/dev/null || python3 -m pip install --quiet mpi4py
python3 -c "import mpi4py; from mpi4py import MPI; print('mpi4py', mpi4py.__version__, '|', MPI.Get_library_version().splitlines()[0])"
