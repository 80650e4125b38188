"""One ``/opt/ml``-shaped tree per simulated host, written exactly as SageMaker writes a container's.

Shared by the local scheduler (process trees on this machine) and the docker scheduler (each tree is
bind-mounted at ``/opt/ml`` in its container), so both hand the runtime the same files:

- ``input/config/resourceconfig.json``, ``hyperparameters.json``, ``inputdataconfig.json`` through
  ``smddp_sdk.specs.contract``;
- ``input/data/<channel>`` for every input channel, as ``channels`` delivers it (FullyReplicated or
  ShardedByS3Key; local, ``file://`` or ``s3://``), and the restored checkpoints (``checkpoints``);
- the job's code, staged once as a snapshot (``stage_code``) and named by ``sagemaker_submit_directory``.

After the job, ``collect_artifacts`` merges every host's ``model`` and ``output/data`` directories into
``model.tar.gz`` and ``output.tar.gz`` as SageMaker local mode does (later hosts win on equal names).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smddp_sdk.errors import SpecError
from smddp_sdk.schedulers.hosttree import channels, checkpoints
from smddp_sdk.specs import contract
from smddp_sdk.specs.archives import code_ignore, code_tree_issues, write_archive
from smddp_sdk.specs.contract import OptMl
from smddp_sdk.specs.job import JobSpec, TrainingInput


def host_names(count: int) -> list[str]:
    """``algo-1`` .. ``algo-N``: the host names SageMaker gives the instances of a homogeneous cluster."""
    return [f"algo-{index}" for index in range(1, count + 1)]


def channel_config(channel: TrainingInput, default_mode: str) -> dict[str, Any]:
    """A channel's entry in inputdataconfig.json (the platform fills the remaining defaults)."""
    options: dict[str, Any] = {"TrainingInputMode": channel.input_mode or default_mode, "S3DistributionType": channel.distribution}
    if channel.content_type:
        options["ContentType"] = channel.content_type
    if channel.record_wrapping:
        options["RecordWrapperType"] = channel.record_wrapping
    if channel.compression:
        options["CompressionType"] = channel.compression
    return options


def config_files(spec: JobSpec, *, job_name: str, hosts: Sequence[str], current_host: str, submit_directory: str, region: str | None = None) -> dict[str, Any]:
    """The three config files of one host, keyed as ``contract.write_config_files`` takes them
    (``resource``, ``hyperparameters`` encoded as v2 does, ``input_data``). Pure."""
    hyperparameters = spec.training_hyperparameters(job_name=job_name, submit_directory=submit_directory, region=region)
    channels = {name: channel_config(channel, spec.input_mode) for name, channel in spec.inputs.items()}
    return {
        "resource": contract.resource_config(current_host, hosts, spec.instance_type),
        "hyperparameters": contract.encode_hyperparameters(hyperparameters),
        "input_data": contract.input_data_config(channels),
    }


@dataclass(frozen=True)
class HostTree:
    """One simulated host: its name and its ``/opt/ml`` root on this machine."""

    host: str
    opt_ml: OptMl


def prepare_host_trees(spec: JobSpec, job_dir: Path, job_name: str, hosts: Sequence[str], *, submit_directory: str, region: str | None = None, link_inputs: bool = True) -> list[HostTree]:
    """Create ``job_dir/<host>`` for every host, with its config files and (optionally) input links.

    ``submit_directory`` is what the runtime reads as ``sagemaker_submit_directory``: a ``file://`` URI
    of a staged code snapshot here, ``/opt/ml/code`` where the code is mounted into a container.
    Input channels are delivered by ``channels.deliver`` (links with ``link_inputs``; otherwise real
    files, except local data every host sees whole, which the caller mounts: see
    ``channels.bind_mount_source``), and ``checkpoint_s3_uri`` is restored into every host.
    """
    trees = [HostTree(host, OptMl(job_dir / host)) for host in hosts]
    for tree in trees:
        files = config_files(spec, job_name=job_name, hosts=hosts, current_host=tree.host, submit_directory=submit_directory, region=region)
        contract.write_config_files(tree.opt_ml, **files)
    # Channels (sharded, downloaded from S3) and checkpoints restored before any host starts, as SageMaker does.
    opt_mls = [tree.opt_ml for tree in trees]
    channels.deliver(spec.inputs, opt_mls, job_dir / "inputs", style="symlink" if link_inputs else "copy", skip_mountable=not link_inputs)
    if sync := checkpoints.for_job(spec.checkpoint_s3_uri, spec.checkpoint_local_path, [o.base for o in opt_mls]):
        sync.restore()
    return trees


def stage_code(spec: JobSpec, dest: Path) -> Path:
    """Copy the job's code into ``dest``: ``source_dir``'s contents (or the lone entry point) plus each
    ``dependencies`` directory under its own name, the layout of v2's sourcedir.tar.gz."""
    dest.mkdir(parents=True, exist_ok=True)
    ignore = code_ignore(dest)
    issues = code_tree_issues(spec.code_trees, ignore)  # checked at validation too; again here, just before the copy
    if issues:
        raise SpecError(issues)
    if spec.source_dir:
        shutil.copytree(spec.source_dir, dest, symlinks=True, ignore=ignore, dirs_exist_ok=True)
    else:
        shutil.copy2(spec.entry_point, dest / Path(spec.entry_point).name)
    for dependency in spec.dependencies:
        shutil.copytree(dependency, dest / Path(dependency).name, symlinks=True, ignore=ignore, dirs_exist_ok=True)
    return dest


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
