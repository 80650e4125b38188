"""v2's ``sagemaker.inputs``: ``TrainingInput`` with v2's signature and positional order.

    from smddp_sdk.inputs import TrainingInput      # instead of: from sagemaker.inputs import TrainingInput

    estimator.fit(TrainingInput("s3://bucket/train", "ShardedByS3Key", "Gzip"))   # 3rd is compression, as in v2
    estimator.fit({"train": TrainingInput("data/train"), "test": "file://data/test"})

Channels also accept v2's own ``sagemaker.inputs.TrainingInput`` objects (read through their ``config``),
so code that builds inputs with the real SDK runs unchanged. Arguments v2 has for features this project
does not run (``instance_groups``, ``shuffle_config``, augmented manifests, hub/model access) raise
``NotOfferedError`` saying what to do instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from smddp_sdk.errors import NotOfferedError, SpecError, SpecIssue
from smddp_sdk.specs.job import TrainingInput as ChannelSpec

_REFUSED = {
    "instance_groups": "heterogeneous clusters are not run here; every host receives every channel",
    "attribute_names": "augmented manifest files are not read here; use S3Prefix or ManifestFile data",
    "target_attribute_name": "augmented manifest files are not read here; use S3Prefix or ManifestFile data",
    "shuffle_config": "channel shuffling is not emulated; shuffle in your data loader",
    "hub_access_config": "SageMaker Hub model access is not offered; pass the model as a channel",
    "model_access_config": "SageMaker Hub model access is not offered; pass the model as a channel",
}


class TrainingInput(ChannelSpec):
    """One input channel, built the way v2 builds it: ``TrainingInput(s3_data, distribution, compression,
    content_type, record_wrapping, s3_data_type, instance_groups, input_mode, ...)``.

    ``s3_data`` is an ``s3://`` URI, a ``file://`` URI or a local path (local and docker jobs mount it;
    SageMaker needs S3). ``config`` is the channel as v2 puts it in ``CreateTrainingJob``.
    """

    def __init__(
        self,
        s3_data: str,
        distribution: str | None = None,
        compression: str | None = None,
        content_type: str | None = None,
        record_wrapping: str | None = None,
        s3_data_type: str = "S3Prefix",
        instance_groups: Any = None,
        input_mode: str | None = None,
        attribute_names: Any = None,
        target_attribute_name: Any = None,
        shuffle_config: Any = None,
        hub_access_config: Any = None,
        model_access_config: Any = None,
    ) -> None:
        given = {"instance_groups": instance_groups, "attribute_names": attribute_names, "target_attribute_name": target_attribute_name,
                 "shuffle_config": shuffle_config, "hub_access_config": hub_access_config, "model_access_config": model_access_config}
        for name, value in given.items():
            if value is not None:
                raise NotOfferedError(f"TrainingInput({name}=...)", _REFUSED[name])
        if not isinstance(s3_data, str) or not s3_data:
            raise SpecError(SpecIssue("s3_data", f"must be an s3:// URI, a file:// URI or a local path, got {s3_data!r}"))
        super().__init__(
            s3_data=s3_data,
            distribution=distribution or "FullyReplicated",
            content_type=content_type,
            s3_data_type=s3_data_type,
            input_mode=input_mode,
            compression=compression,
            record_wrapping=record_wrapping,
        )

    @property
    def config(self) -> dict[str, Any]:
        """The channel as v2's ``TrainingInput.config`` (the ``InputDataConfig`` entry minus its name)."""
        return channel_config(self)


def channel_config(channel: ChannelSpec) -> dict[str, Any]:
    """A channel in ``InputDataConfig`` shape (``ChannelName`` excluded), as v2's ``TrainingInput.config``."""
    config: dict[str, Any] = {"DataSource": {"S3DataSource": {"S3DataType": channel.s3_data_type, "S3Uri": channel.s3_data, "S3DataDistributionType": channel.distribution}}}
    for key, value in (("CompressionType", channel.compression), ("ContentType", channel.content_type), ("RecordWrapperType", channel.record_wrapping), ("InputMode", channel.input_mode)):
        if value is not None:
            config[key] = value
    return config


def from_v2(value: Any) -> Any:
    """A v2 ``sagemaker.inputs.TrainingInput`` (or anything with its ``config``) as this project's channel;
    other values are returned unchanged. v2's ``FileSystemInput`` (EFS/FSx) is refused with a hint."""
    if isinstance(value, ChannelSpec) or not hasattr(value, "config") or not isinstance(value.config, Mapping):
        return value
    config = value.config
    source = config.get("DataSource", {})
    if "FileSystemDataSource" in source:
        raise NotOfferedError("FileSystemInput (EFS/FSx channels)", "copy the data to S3 or a local directory and pass that as the channel")
    s3 = source.get("S3DataSource")
    if not isinstance(s3, Mapping) or "S3Uri" not in s3:
        raise SpecError(SpecIssue("inputs", f"{type(value).__name__} has no S3 data source: {dict(config)!r}", "use TrainingInput(s3_data=...)"))
    for where, key, name in ((s3, "InstanceGroupNames", "instance_groups"), (s3, "AttributeNames", "attribute_names"), (s3, "ModelAccessConfig", "model_access_config"),
                             (s3, "HubAccessConfig", "hub_access_config"), (config, "ShuffleConfig", "shuffle_config"), (config, "TargetAttributeName", "target_attribute_name")):
        if key in where:
            raise NotOfferedError(f"TrainingInput({name}=...)", _REFUSED[name])
    return TrainingInput(
        s3_data=s3["S3Uri"],
        distribution=s3.get("S3DataDistributionType"),
        compression=config.get("CompressionType"),
        content_type=config.get("ContentType"),
        record_wrapping=config.get("RecordWrapperType"),
        s3_data_type=s3.get("S3DataType", "S3Prefix"),
        input_mode=config.get("InputMode"),
    )


def normalise_inputs(inputs: Any) -> Any:
    """``fit()``'s argument as the spec reads it: a single channel object means the ``training`` channel
    (as in v2); v2's channel objects become this project's."""
    if inputs is None or isinstance(inputs, str):
        return inputs
    if isinstance(inputs, Mapping):
        return {name: from_v2(value) for name, value in inputs.items()}
    converted = from_v2(inputs)
    if isinstance(converted, ChannelSpec):
        return {"training": converted}
    return inputs


__all__ = ["TrainingInput", "channel_config", "from_v2", "normalise_inputs"]
