"""The shared job directory of a Slurm job: written by the ``slurm`` scheduler, read by every node's runtime.

One module for both sides, so the layout cannot drift between them (stdlib only: the runtime imports it):

    <job_root>/<job_name>/          on the cluster's shared file system (FSx for Lustre on HyperPod)
      job.json                      what was submitted: handle, spec, request, Slurm job id (scheduler)
      job.sbatch                    the exact batch script ``--dryrun`` shows
      node.json                     what every node's runtime needs beyond Slurm's environment (0600: the token)
      code/                         the code snapshot (sagemaker_submit_directory)
      nodes/<i>/                    the /opt/ml tree of the job's i-th node (SLURM_NODEID), staged with the
                                    hyperparameters and channels; resourceconfig.json is written by the node
      checkpoints/                  every node's /opt/ml/checkpoints (a link here): survives requeues
      logs/<node>.log               one file per node, lines prefixed ``[<node>/rank<r>]:`` by the runtime
      logs/batch.log                the batch script's own output
      result.json                   the job step's exit code and the archives, written after the step ends
      output/model.tar.gz, output/output.tar.gz   the nodes' model/ and output/data/ merged (as local mode)
      cancel-requested              present once someone cancelled the job
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from smddp_sdk.specs.contract import Below

JOB_DIR_ENV = "SMDDP_SLURM_JOB_DIR"  # set in the batch script: the node runtime builds its tree from Slurm's env


@dataclass(frozen=True)
class SlurmJobDir:
    path: Path

    record_file = Below("path", "job.json")
    script_file = Below("path", "job.sbatch")
    node_file = Below("path", "node.json")
    code_dir = Below("path", "code")
    nodes_dir = Below("path", "nodes")
    checkpoint_dir = Below("path", "checkpoints")
    logs_dir = Below("path", "logs")
    batch_log = Below("logs_dir", "batch.log")
    result_file = Below("path", "result.json")
    cancel_file = Below("path", "cancel-requested")

    def node_tree(self, index: int) -> Path:
        return self.nodes_dir / str(index)

    def node_trees(self) -> list[Path]:
        """Every node's tree, in node order."""
        if not self.nodes_dir.is_dir():
            return []
        return sorted((p for p in self.nodes_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))

    def exists(self) -> bool:
        return self.record_file.is_file()


def scontrol_records(text: str) -> list[dict[str, str]]:
    """``scontrol show ... -o`` output: one ``Key=Value`` record per line."""
    return [dict(token.split("=", 1) for token in line.split() if "=" in token) for line in text.splitlines() if line.strip()]
