"""Run the CNN example with the estimator: 2 simulated hosts x 2 ranks on this machine.

    python examples/cnn/launch.py                 # local mode, no Docker and no AWS needed
    python examples/cnn/launch.py --epochs 5
    smddp-launch examples/cnn/job.yaml            # the same job from its job file
"""

from __future__ import annotations

import argparse
import signal
import sys
import tarfile
from pathlib import Path

from smddp_sdk import PyTorch
from smddp_sdk.errors import SmddpError

HERE = Path(__file__).resolve().parent


def main() -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `launch.py --dryrun | head` ends quietly, as Unix tools do
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--instance-count", type=int, default=2)
    parser.add_argument("--processes-per-host", type=int, default=2, help="simulated GPUs (ranks) per host")
    parser.add_argument("--dryrun", action="store_true", help="print the request and start nothing")
    args = parser.parse_args()

    estimator = PyTorch(
        entry_point="train.py",
        source_dir=str(HERE),
        instance_type="local",
        instance_count=args.instance_count,
        distribution={"smdistributed": {"dataparallel": {"enabled": True}}},
        hyperparameters={"epochs": args.epochs, "batch-size": 64},
        metric_definitions=[{"Name": "loss", "Regex": "loss ([0-9.]+)"}, {"Name": "test:accuracy", "Regex": "test accuracy ([0-9.]+)"}],
        base_job_name="cnn-example",
        scheduler="local",
        scheduler_options={"processes_per_host": args.processes_per_host},
    )
    if args.dryrun:
        print(estimator.dryrun().render())
        return 0
    try:
        estimator.fit()
    except SmddpError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    with tarfile.open(estimator.model_data) as archive:
        print(f"model: {estimator.model_data} holds {', '.join(archive.getnames())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
