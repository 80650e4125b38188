"""``python -m smddp_sdk.runtime``: run this host's share of a training job (see docs/runtime.md).

As a task of a Slurm job (``SMDDP_SLURM_JOB_DIR`` set) it first builds the node's contract from Slurm's
environment (``slurm_node``)."""

import os

from smddp_sdk.runtime import slurm_node
from smddp_sdk.runtime.bootstrap import exit_without_teardown
from smddp_sdk.runtime.main import main

if __name__ == "__main__":
    # As the ranks do: the job's end waits for this process, not for the interpreter's module teardown.
    exit_without_teardown(slurm_node.main() if slurm_node.wanted(os.environ) else main())
