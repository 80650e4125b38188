"""The shared job directory of a Slurm job (``<job_root>/<job_name>/``, drawn in docs/slurm.md): written by
the ``slurm`` scheduler, read by every node's runtime. One module for both sides, so the layout cannot drift
between them (stdlib only: the runtime imports it); the class body below is the layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from smddp_sdk.specs.contract import Below

JOB_DIR_ENV = "SMDDP_SLURM_JOB_DIR"  # set in the batch script: the node runtime builds its tree from Slurm's env
AUTO_RANKS = "auto"  # processes_per_host as torchrun's --nproc-per-node auto: counted on each node (node.json)


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
    attempts_file = Below("path", "attempts.jsonl")  # a line as each attempt starts and ends (the batch script)
    cancel_file = Below("path", "cancel-requested")
    stacks_request = Below("path", "stacks-requested")  # `smddp-launch stacks`: each new version is one request
    scratch_dir = Below("path", "scratch")  # scratch/<node index>: each node's SMDDP_SCRATCH_DIR, kept across requeues

    def node_scratch(self, index: int) -> Path:
        return self.scratch_dir / str(index)

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
