"""How long local mode takes around the user's code: estimator import, and fit() of a 2-host x 2-rank job.

    python -m benchmarks.local_launch              # import time and launch overhead (trivial ranks)
    python -m benchmarks.local_launch --example    # also the CNN example end to end (needs the smddp backend)

Every run is checked before it is timed: the job must succeed and model.tar.gz must hold what rank 0
wrote. Reports the median (and min/max) of --repeat runs; the machine is shared, so single runs are noise.
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

import smddp_sdk
from smddp_sdk import PyTorch

PACKAGE_ROOT = Path(smddp_sdk.__file__).resolve().parent.parent
TRIVIAL_RANK = """
import os
if os.environ["RANK"] == "0":
    open(os.path.join(os.environ["SM_MODEL_DIR"], "rank0.txt"), "w").write("ok")
"""


def import_seconds() -> float:
    code = "import time; t = time.perf_counter(); from smddp_sdk import PyTorch; print(time.perf_counter() - t)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE_ROOT)
    return float(result.stdout)


def fit_seconds(source_dir: Path, job_root: Path, *, example: bool) -> float:
    arguments = dict(
        entry_point="train.py", source_dir=str(source_dir), instance_count=2, instance_type="local",
        scheduler_options={"processes_per_host": 2, "job_root": str(job_root)},
    )
    if example:
        arguments.update(distribution={"smdistributed": {"dataparallel": {"enabled": True}}}, hyperparameters={"epochs": 3})
    else:
        arguments.update(distribution={"torch_distributed": {"enabled": True}})
    estimator = PyTorch(**arguments)
    started = time.perf_counter()
    with redirect_stdout(io.StringIO()):
        estimator.fit()
    elapsed = time.perf_counter() - started
    expected = "model.pt" if example else "rank0.txt"
    with tarfile.open(estimator.model_data) as archive:
        if archive.getnames() != [expected]:
            raise SystemExit(f"wrong artifacts {archive.getnames()} in {estimator.model_data}; not timing a broken run")
    return elapsed


def report(name: str, samples: list[float]) -> None:
    print(f"{name:<40} median {statistics.median(samples):7.3f} s   min {min(samples):7.3f}   max {max(samples):7.3f}   (n={len(samples)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--example", action="store_true", help="also time examples/cnn (3 epochs)")
    args = parser.parse_args()
    report("import smddp_sdk.PyTorch", [import_seconds() for _ in range(args.repeat)])
    with tempfile.TemporaryDirectory(prefix="smddp-bench-") as scratch:
        source = Path(scratch) / "src"
        source.mkdir()
        (source / "train.py").write_text(TRIVIAL_RANK)
        report("fit(), 2 hosts x 2 trivial ranks", [fit_seconds(source, Path(scratch) / "jobs", example=False) for _ in range(args.repeat)])
        if args.example:
            example = PACKAGE_ROOT / "examples" / "cnn"
            report("fit(), examples/cnn 2 x 2, 3 epochs", [fit_seconds(example, Path(scratch) / "jobs", example=True) for _ in range(args.repeat)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
