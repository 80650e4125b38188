"""Run the CNN example with the estimator: 2 simulated hosts x 2 ranks on this machine.

python examples/cnn/launch.py                                  # local mode, no Docker and no AWS needed
python examples/cnn/launch.py --epochs 5
python examples/cnn/launch.py --scheduler docker               # 2 containers (an engine and the image)
python examples/cnn/launch.py --scheduler sagemaker --dryrun   # the SageMaker request, no AWS needed
smddp-launch examples/cnn/job.yaml                             # the same job from its job file
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


def scheduler_options(scheduler: str, processes_per_host: int) -> dict[str, object]:
    """job.yaml's per-scheduler sections: ranks per simulated host here, the GPU type rehearsed on CPU in docker."""
    return {"local": {"processes_per_host": processes_per_host}, "docker": {"processes_per_host": processes_per_host, "gpus": "none"}}.get(scheduler, {})


def main() -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `launch.py --dryrun | head` ends quietly, as Unix tools do
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4096, help="training images in all")
    parser.add_argument("--instance-count", type=int, default=2)
    parser.add_argument("--processes-per-host", type=int, default=2, help="simulated GPUs (ranks) per host (local and docker)")
    parser.add_argument("--scheduler", choices=("local", "docker", "sagemaker"), default="local")
    parser.add_argument("--dryrun", action="store_true", help="print the request and start nothing")
    args = parser.parse_args()

    estimator = PyTorch(
        entry_point="train.py",
        source_dir=str(HERE),
        instance_type="ml.p4d.24xlarge",  # 8 GPUs per host on SageMaker; rehearsed here with --processes-per-host ranks
        instance_count=args.instance_count,
        framework_version="2.2.0",  # picks AWS's PyTorch image on SageMaker
        py_version="py310",
        distribution={"smdistributed": {"dataparallel": {"enabled": True}}},
        hyperparameters={"epochs": args.epochs, "batch-size": 64, "samples": args.samples},
        metric_definitions=[{"Name": "loss", "Regex": "loss ([0-9.]+)"}, {"Name": "test:accuracy", "Regex": "test accuracy ([0-9.]+)"}],
        base_job_name="cnn-example",
        scheduler=args.scheduler,
        scheduler_options=scheduler_options(args.scheduler, args.processes_per_host),
    )
    if args.dryrun:
        plan = estimator.dryrun()
        print(plan.render())
        for note in plan.notes:  # placeholders, what would be uploaded, where a rehearsal differs
            print(f"note: {note}", file=sys.stderr)
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
