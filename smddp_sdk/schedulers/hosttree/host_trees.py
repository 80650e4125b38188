"""One ``/opt/ml``-shaped tree per simulated host, written exactly as SageMaker writes a container's.

Shared by the local scheduler (process trees on this machine) and the docker scheduler (each tree is
bind-mounted at ``/opt/ml`` in its container), so both hand the runtime the same files:

- ``input/config/resourceconfig.json``, ``hyperparameters.json``, ``inputdataconfig.json`` through
  ``smddp_sdk.specs.contract``;
- ``input/data/<channel>`` for every input channel, as ``channels`` delivers it (FullyReplicated or
  ShardedByS3Key; local, ``file://`` or ``s3://``), and the restored checkpoints (``checkpoints``);
- the job's code, staged once as a snapshot (``job_files.stage_code``) and named by ``sagemaker_submit_directory``.

The config files come from the plan (``job_files.ConfigFiles``), computed once when the job was planned.

After the job, ``collect_artifacts`` merges every host's ``model`` and ``output/data`` directories into
``model.tar.gz`` and ``output.tar.gz`` as SageMaker local mode does (later hosts win on equal names).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from smddp_sdk.schedulers import channels
from smddp_sdk.schedulers.hosttree import checkpoints
from smddp_sdk.schedulers.job_files import ConfigFiles
from smddp_sdk.specs.archives import write_archive
from smddp_sdk.specs.contract import OptMl
from smddp_sdk.specs.job import JobSpec


def host_names(count: int) -> list[str]:
    """``algo-1`` .. ``algo-N``: the host names SageMaker gives the instances of a homogeneous cluster."""
    return [f"algo-{index}" for index in range(1, count + 1)]


@dataclass(frozen=True)
class HostTree:
    """One simulated host: its name and its ``/opt/ml`` root on this machine."""

    host: str
    opt_ml: OptMl


def prepare_host_trees(spec: JobSpec, job_dir: Path, config: ConfigFiles, *, link_inputs: bool = True) -> list[HostTree]:
    """Create ``job_dir/<host>`` for every host of ``config``, with its config files and (optionally) input links.

    Input channels are delivered by ``channels.deliver`` (links with ``link_inputs``; otherwise real
    files, except local data every host sees whole, which the caller mounts: see
    ``channels.bind_mount_source``), and ``checkpoint_s3_uri`` is restored into every host.
    """
    trees = [HostTree(host, OptMl(job_dir / host)) for host in config.hosts]
    for tree in trees:
        config.write(tree.opt_ml, tree.host)
    # Channels (sharded, downloaded from S3) and checkpoints restored before any host starts, as SageMaker does.
    opt_mls = [tree.opt_ml for tree in trees]
    channels.deliver(spec.inputs, opt_mls, job_dir / "inputs", style="symlink" if link_inputs else "copy", skip_mountable=not link_inputs)
    if sync := checkpoints.for_job(spec.checkpoint_s3_uri, spec.checkpoint_local_path, [o.base for o in opt_mls]):
        sync.restore()
    return trees


def largest_entries(root: Path, count: int = 3) -> tuple[int, list[tuple[str, int]]]:
    """Total bytes under ``root`` and its ``count`` largest top-level entries (name, bytes)."""
    sizes: dict[str, int] = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            top = path.relative_to(root).parts[0]
            sizes[top] = sizes.get(top, 0) + path.stat().st_size
    ranked = sorted(sizes.items(), key=lambda item: item[1], reverse=True)
    return sum(sizes.values()), ranked[:count]


def collect_artifacts(trees: Iterable[OptMl], dest: Path, on_skip: Callable[[str], None] | None = None) -> tuple[Path, Path]:
    """Merge the hosts' ``model`` and ``output/data`` dirs into ``dest/model.tar.gz`` and ``dest/output.tar.gz``;
    what is left out (links out of a tree, FIFOs, unreadable files) goes to ``on_skip``, one line each."""
    trees = list(trees)
    dest.mkdir(parents=True, exist_ok=True)
    bases = [tree.base for tree in trees]
    for archive, roots in (("model.tar.gz", [tree.model_dir for tree in trees]), ("output.tar.gz", [tree.output_data_dir for tree in trees])):
        write_archive(dest / archive, roots, trees=bases, on_skip=on_skip and (lambda line, name=archive: on_skip(f"{name}: {line}")))
    return dest / "model.tar.gz", dest / "output.tar.gz"
