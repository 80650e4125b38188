"""The slurm scheduler (see ``scheduler``): sbatch script = the dry run, one task per node runs the node runtime."""

from smddp_sdk.schedulers.slurm.scheduler import SlurmScheduler

__all__ = ["SlurmScheduler"]
