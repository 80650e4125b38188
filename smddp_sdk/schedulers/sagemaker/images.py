"""Which AWS PyTorch training container a job gets when it names no ``image_uri``.

The facts (registries per region, Python versions per framework version) live in
``training_images.json`` beside this module; this module only applies SageMaker SDK v2's rules for
reading them, so that the same arguments give the same image URI.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from smddp_sdk.errors import SpecIssue
from smddp_sdk.specs.distribution import Distribution

_DATA_FILE = Path(__file__).with_name("training_images.json")
# SMP v2 images are built per CUDA version; v2 picks the CUDA build from the framework version.
_SMP_CUDA_BY_VERSION = (("cu124", ("2.5",)), ("cu121", ("2.1", "2.2", "2.3", "2.4")))
_SMP_DEFAULT_CUDA = "cu118"


@functools.cache
def _data() -> dict[str, Any]:
    return json.loads(_DATA_FILE.read_text(encoding="utf-8"))


def dns_suffix(region: str) -> str:
    """The partition's DNS suffix for ``region`` (``amazonaws.com``, ``amazonaws.com.cn``, ...)."""
    for prefix, suffix in _data()["dns_suffixes"].items():
        if region.startswith(prefix):
            return suffix
    return "amazonaws.com"


def partition(region: str) -> str:
    """The ARN partition of ``region`` (``aws``, ``aws-cn``, ``aws-us-gov``, ``aws-iso``, ...)."""
    for prefix, name in (("cn-", "aws-cn"), ("us-gov-", "aws-us-gov"), ("us-isob-", "aws-iso-b"), ("us-isof-", "aws-iso-f"), ("us-iso-", "aws-iso"), ("eu-isoe-", "aws-iso-e")):
        if region.startswith(prefix):
            return name
    return "aws"


def base_job_name_from_image(image_uri: str) -> str:
    """The repository part of an image URI, as v2 names jobs after it (``.../pytorch-training:2.2`` -> ``pytorch-training``).

    Unlike v2, characters a job name cannot hold (``_``, ``.``, a digest's ``@``) become ``-``.
    """
    repository = image_uri.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    cleaned = re.sub(r"[^A-Za-z0-9-]+", "-", repository).strip("-")
    return cleaned or "training"


def training_image_uri(*, region: str, framework_version: str | None, py_version: str | None, instance_type: str, distribution: Distribution) -> tuple[str | None, list[SpecIssue]]:
    """The AWS training image for these arguments, or None with the problems that prevent choosing one."""
    if not framework_version:
        hint = "set framework_version (and py_version), e.g. framework_version='2.2.0', py_version='py310'"
        return None, [SpecIssue("framework_version", "is required when image_uri is not given", hint)]
    # SMP v2 (torch_distributed plus smdistributed modelparallel) has its own images.
    framework = "pytorch-smp" if distribution.torch_distributed and distribution.modelparallel is not None else "pytorch"
    config = _data()["frameworks"][framework]
    issues: list[SpecIssue] = []
    version_key = config["version_aliases"].get(framework_version, framework_version)
    version_config = config["versions"].get(version_key)
    if version_config is None:
        known = ", ".join([*config["versions"], *config["version_aliases"]])
        what = "SMP v2 (smdistributed modelparallel)" if framework == "pytorch-smp" else "PyTorch"
        issues.append(SpecIssue("framework_version", f"AWS publishes no {what} training image for version {framework_version!r}", f"use one of {known}, or set image_uri"))
        return None, issues
    py = _python_version(py_version, version_config, framework_version, issues)
    registry = _data()["registry_sets"][version_config["registries"]].get(region)
    if registry is None:
        issues.append(SpecIssue("image_uri", f"AWS publishes no PyTorch {framework_version} training image in region {region!r}", "set image_uri to an image in that region (see docs/sagemaker.md), or use another region"))
    processor = _processor(instance_type, config["processors"], issues)
    if issues:
        return None, issues
    container_version = _smp_cuda(framework_version, instance_type) if framework == "pytorch-smp" else None
    tag = "-".join(part for part in (framework_version, processor, py, container_version) if part)
    tag = _legacy_tag_suffix(tag, instance_type, distribution)
    return f"{registry}.dkr.ecr.{region}.{dns_suffix(region)}/{version_config['repository']}:{tag}", []


def _python_version(py_version: str | None, version_config: dict[str, Any], framework_version: str, issues: list[SpecIssue]) -> str | None:
    available = version_config["py_versions"]
    if py_version is None and len(available) == 1:
        return available[0]
    if py_version not in available:
        issues.append(SpecIssue("py_version", f"PyTorch {framework_version} images are built for {', '.join(available)}, not {py_version!r}", f"set py_version to {available[-1]!r}"))
        return None
    return py_version


def _processor(instance_type: str, available: list[str], issues: list[SpecIssue]) -> str | None:
    if instance_type.startswith("local"):
        processor = "cpu" if instance_type == "local" else "gpu"
    else:
        match = re.match(r"^ml[._]([a-z0-9]+)", instance_type)
        family = match.group(1) if match else ""
        if family in available:
            processor = family
        elif family.startswith(("inf", "trn")):
            processor = family[:3]
        else:
            processor = "gpu" if family[:1] in ("g", "p") else "cpu"
    if processor not in available:
        issues.append(SpecIssue("instance_type", f"AWS has no {processor.upper()} build of this training image for {instance_type!r}", f"use a {' or '.join(p.upper() for p in available)} instance type, or set image_uri"))
        return None
    return processor


def _smp_cuda(framework_version: str, instance_type: str) -> str:
    for cuda, versions in _SMP_CUDA_BY_VERSION:
        if any(version in framework_version for version in versions) or (cuda == "cu121" and "p5" in instance_type):
            return cuda
    return _SMP_DEFAULT_CUDA


def _legacy_tag_suffix(tag: str, instance_type: str, distribution: Distribution) -> str:
    """PyTorch 1.6 GPU images on p4d or with smdistributed carry a CUDA 11 build suffix."""
    on_p4d = re.match(r"^ml[._]p4d\b", instance_type) is not None
    smdistributed = any(key in distribution.given for key in ("smdistributed", "pytorchddp", "smdistributed_dataparallel"))
    if not (on_p4d or smdistributed):
        return tag
    suffix = _data()["p4d_or_smdistributed_tag_suffixes"].get(f"pytorch-{tag}")
    return f"{tag}-{suffix}" if suffix else tag
