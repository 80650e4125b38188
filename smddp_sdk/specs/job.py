"""JobSpec: the one typed description of a training job, with SageMaker SDK v2's names.

The estimator's keyword arguments, the job file and the CLI all end in ``JobSpec.from_mapping``, which
checks everything at once and raises a ``SpecError`` listing every problem before anything is written,
uploaded or started.
"""

from __future__ import annotations

import dataclasses
import re
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any

from smddp_sdk.errors import SpecError, SpecIssue, did_you_mean
from smddp_sdk.specs import instance_types, limits
from smddp_sdk.specs.contract import RESERVED_HYPERPARAMETERS
from smddp_sdk.specs.distribution import Distribution, parse_distribution
from smddp_sdk.specs.v2_arguments import REFUSED_ARGUMENTS

DEFAULT_BASE_JOB_NAME = "pytorch-training"
_CHANNEL_NAME = re.compile(r"^[A-Za-z0-9\.\-_]{1,64}$")
# The entry-point rule of sagemaker-training 5.1.4: relative, plain characters, no "." or ".." parts.
_ENTRY_POINT = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._+-]*(/[A-Za-z0-9._+-]+)*$")
_S3_DISTRIBUTIONS = ("FullyReplicated", "ShardedByS3Key")
_S3_DATA_TYPES = ("S3Prefix", "ManifestFile", "AugmentedManifestFile")
_INPUT_MODES = ("File", "Pipe", "FastFile")
# Which SageMaker Python SDK the job mirrors: it decides only the shape of the SageMaker request (v3's
# ModelTrainer sends code and drivers as channels); every scheduler runs both alike.
APIS = ("v2", "v3")


@dataclass(frozen=True)
class RetryPolicy:
    """Retries, the one job-level policy local, docker and Slurm jobs obey (SageMaker's RetryStrategy).

    After a failed attempt the job starts again, at most ``max_retry_attempts`` times (1 to 30:
    ``limits.BOUNDS``, checked once with the spec), when the platform
    failed it (a host lost, a runtime or container killed); when the script itself failed, only with
    ``script_errors`` (torchrun's ``--max-restarts``, for rehearsing a flaky script). A spot interruption
    is not a retry: it restarts the job whatever this says, until ``max_wait``.
    """

    max_retry_attempts: int = 0
    script_errors: bool = False

    @classmethod
    def of(cls, spec: JobSpec, *, script_errors: bool = False) -> RetryPolicy:
        return cls(spec.max_retry_attempts or 0, script_errors)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> RetryPolicy:
        data = data or {}
        return cls(int(data.get("max_retry_attempts") or 0), bool(data.get("retry_script_errors", False)))

    def to_json(self) -> dict[str, Any]:
        return {"max_retry_attempts": self.max_retry_attempts, "retry_script_errors": self.script_errors}


@dataclass(frozen=True)
class TrainingInput:
    """One input channel, as v2's ``sagemaker.inputs.TrainingInput``: an S3 URI, ``file://`` URI or local path."""

    s3_data: str
    distribution: str = "FullyReplicated"
    content_type: str | None = None
    s3_data_type: str = "S3Prefix"
    input_mode: str | None = None
    compression: str | None = None
    record_wrapping: str | None = None

    @property
    def is_s3(self) -> bool:
        return self.s3_data.startswith("s3://")

    @property
    def local_path(self) -> Path | None:
        """The local directory or file behind a ``file://`` URI or plain path; None for S3."""
        if self.is_s3:
            return None
        return Path(self.s3_data.removeprefix("file://"))


@dataclass(frozen=True)
class JobSpec:
    """A training job. Field names and defaults are SageMaker SDK v2's estimator arguments."""

    entry_point: str
    instance_type: str
    instance_count: int = 1
    source_dir: str | None = None
    dependencies: tuple[str, ...] = ()
    hyperparameters: Mapping[str, Any] = field(default_factory=dict)
    distribution: Distribution = field(default_factory=Distribution)
    inputs: Mapping[str, TrainingInput] = field(default_factory=dict)
    environment: Mapping[str, str] = field(default_factory=dict)
    role: str | None = None
    image_uri: str | None = None
    framework_version: str | None = None
    py_version: str | None = None
    output_path: str | None = None
    code_location: str | None = None
    base_job_name: str | None = None
    job_name: str | None = None
    max_run: int = 86_400
    max_wait: int | None = None
    volume_size: int = 30
    input_mode: str = "File"
    use_spot_instances: bool = False
    checkpoint_s3_uri: str | None = None
    checkpoint_local_path: str | None = None
    max_retry_attempts: int | None = None
    keep_alive_period_in_seconds: int | None = None
    container_log_level: int = 20
    tags: tuple[Mapping[str, str], ...] = ()
    subnets: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    encrypt_inter_container_traffic: bool = False
    enable_network_isolation: bool = False
    disable_output_compression: bool = False
    debugger_hook_config: bool | None = None
    disable_profiler: bool = False
    enable_sagemaker_metrics: bool | None = None
    metric_definitions: tuple[Mapping[str, str], ...] = ()
    api: str = "v2"

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, base_dir: Path | None = None) -> JobSpec:
        """Build and validate a spec; relative local paths are taken from ``base_dir`` (default: cwd)."""
        return _Builder(data, base_dir or Path.cwd()).build()

    @property
    def instance(self) -> instance_types.InstanceType | None:
        return instance_types.lookup(self.instance_type)

    @property
    def code_trees(self) -> dict[str, Path]:
        """The local directories the job's code comes from, by the field that names them."""
        named = {"source_dir": self.source_dir, **{f"dependencies[{index}]": dep for index, dep in enumerate(self.dependencies)}}
        return {where: Path(tree.removeprefix("file://")) for where, tree in named.items() if tree and not tree.startswith("s3://")}

    @property
    def program(self) -> str:
        """``sagemaker_program``: the entry point relative to the code directory."""
        return self.entry_point if self.source_dir else Path(self.entry_point).name

    def replace(self, **changes: Any) -> JobSpec:
        return dataclasses.replace(self, **changes)

    def training_hyperparameters(self, *, job_name: str, submit_directory: str, region: str | None) -> dict[str, Any]:
        """All hyperparameters the job receives (decoded), in the order SageMaker SDK v2 adds them."""
        out: dict[str, Any] = dict(self.hyperparameters)
        out["sagemaker_submit_directory"] = submit_directory
        out["sagemaker_program"] = self.program
        out["sagemaker_container_log_level"] = self.container_log_level
        out["sagemaker_job_name"] = job_name
        if region is not None:
            out["sagemaker_region"] = region
        out.update(self.distribution.hyperparameters(self.instance_type))
        return out

    def as_dict(self) -> dict[str, Any]:
        """A plain, JSON-friendly view (for dryrun output and job records)."""
        out = dataclasses.asdict(self)
        out["distribution"] = dict(self.distribution.given)
        out["inputs"] = {name: _input_as_dict(channel) for name, channel in self.inputs.items()}
        return out


def make_job_name(base: str | None) -> str:
    """``<base>-<UTC timestamp with ms>``, as SageMaker SDK v2 names jobs (at most 63 characters)."""
    base = base or DEFAULT_BASE_JOB_NAME
    now = time.time()
    stamp = time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime(now)) + f"-{int(now * 1000) % 1000:03d}"
    return f"{base[: 63 - len(stamp) - 1]}-{stamp}"


def validate_entry_point(name: str) -> str | None:
    """Why ``name`` is not an acceptable entry point, or None when it is (the job's check and the runtime's)."""
    if not _ENTRY_POINT.match(name):
        return "must be a relative path of letters, digits and . _ + - (no spaces, shell characters or leading /)"
    if any(part in (".", "..") for part in name.split("/")):
        return "must not contain '.' or '..' path parts"
    return None


def _input_as_dict(channel: TrainingInput) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(channel).items() if v is not None}


# --- building and validating --------------------------------------------------------------------

# The fields written as one scalar (nullable ones included) and the types each takes, from JobSpec's own hints.
_SIMPLE_TYPES: dict[str, tuple[type, ...]] = {
    name: types for name, hint in typing.get_type_hints(JobSpec).items()
    if set(types := typing.get_args(hint) if isinstance(hint, UnionType) else (hint,)) <= {str, int, bool, type(None)}
}
_TYPE_WORDS = {str: "a string", int: "an integer", bool: "true or false", type(None): "null"}


class _Builder:
    """Collects every problem in one pass so users fix them all at once."""

    def __init__(self, data: Mapping[str, Any], base_dir: Path) -> None:
        self.data = data
        self.base_dir = base_dir
        self.issues: list[SpecIssue] = []
        self.values: dict[str, Any] = {}

    def build(self) -> JobSpec:
        if not isinstance(self.data, Mapping):
            raise SpecError(SpecIssue("", f"a job must be a mapping of fields, got {type(self.data).__name__}"))
        known = JobSpec.field_names()
        for key in self.data:
            if key not in known:
                refused = REFUSED_ARGUMENTS.get(str(key))  # v2 habits get v2's reason, as the estimator gives
                self.issue(str(key), "unknown field", did_you_mean(str(key), known) or (f"a SageMaker SDK v2 argument not offered here: {refused}" if refused else ""))
        for name in ("entry_point", "instance_type"):
            if self.data.get(name) in (None, ""):
                self.issue(name, "is required")
        self.simple_fields()
        self.collections()
        self.values["distribution"], issues = parse_distribution(self.data.get("distribution"))
        self.issues += issues
        self.values["inputs"] = self.channels(self.data.get("inputs"))
        self.check_instance_type()
        self.semantics()
        if self.issues:
            raise SpecError(self.issues)
        return JobSpec(**self.values)

    def issue(self, path: str, message: str, hint: str = "") -> None:
        self.issues.append(SpecIssue(path, message, hint))

    def simple_fields(self) -> None:
        for name, types in _SIMPLE_TYPES.items():
            if name not in self.data:
                continue
            value = self.data[name]
            # bool is an int in Python; a flag where a number belongs is still a mistake.
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                expected = " or ".join(_TYPE_WORDS[t] for t in types)
                # YAML reads 2.3 or yes as a number or a flag; a version or name needs quotes.
                quote = str in types and isinstance(value, (int, float, bool))
                self.issue(name, f"must be {expected}, got {value!r}", "put it in quotes so YAML reads it as text" if quote else "")
                continue
            self.values[name] = value

    def collections(self) -> None:
        self.values["hyperparameters"] = self.mapping("hyperparameters", value_check=None)
        self.reserved_hyperparameters(self.values["hyperparameters"])
        self.values["environment"] = self.mapping("environment", value_check=str)
        self.values["dependencies"] = self.string_list("dependencies")
        self.values["subnets"] = self.string_list("subnets")
        self.values["security_group_ids"] = self.string_list("security_group_ids")
        self.values["tags"] = self.key_value_list("tags", ("Key", "Value"))
        self.values["metric_definitions"] = self.key_value_list("metric_definitions", ("Name", "Regex"))

    def reserved_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Names the toolkit sets or consumes itself: a value given for one would be replaced or dropped
        without a word, and never reach the script, so it is refused."""
        for key in hyperparameters:
            if str(key) in RESERVED_HYPERPARAMETERS:
                self.issue(f"hyperparameters.{key}", "is reserved: the SageMaker toolkit sets or consumes it, so the script would never see this value",
                           "rename it (names starting with sagemaker_ belong to the toolkit), or set the matching option instead (entry_point, source_dir, container_log_level, job_name)")

    def mapping(self, name: str, value_check: type | None) -> dict[str, Any]:
        value = self.data.get(name) or {}
        if not isinstance(value, Mapping):
            self.issue(name, f"must be a mapping, got {type(value).__name__}")
            return {}
        for key, item in value.items():
            if not isinstance(key, str):
                self.issue(f"{name}.{key}", "keys must be strings")
            elif value_check is not None and not isinstance(item, value_check):
                self.issue(f"{name}.{key}", f"must be a string, got {item!r}", "quote the value")
        return dict(value)

    def string_list(self, name: str) -> tuple[str, ...]:
        value = self.data.get(name) or ()
        if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
            self.issue(name, f"must be a list of strings, got {value!r}")
            return ()
        return tuple(value)

    def key_value_list(self, name: str, keys: tuple[str, str]) -> tuple[Mapping[str, str], ...]:
        value = self.data.get(name) or ()
        if isinstance(value, Mapping) and name == "tags":
            value = [{"Key": k, "Value": v} for k, v in value.items()]  # {"team": "ml"} is accepted too
        if isinstance(value, str) or not isinstance(value, Sequence):
            self.issue(name, f"must be a list of {{{keys[0]!r}: ..., {keys[1]!r}: ...}} mappings")
            return ()
        for index, item in enumerate(value):
            if not isinstance(item, Mapping) or set(item) != set(keys) or not all(isinstance(v, str) for v in item.values()):
                self.issue(f"{name}[{index}]", f"must be {{{keys[0]!r}: <string>, {keys[1]!r}: <string>}}, got {item!r}")
        return tuple(dict(item) for item in value if isinstance(item, Mapping))

    def channels(self, value: Any) -> dict[str, TrainingInput]:
        if value is None:
            return {}
        if isinstance(value, str):
            value = {"training": value}  # fit("s3://...") means the "training" channel, as in v2
        if not isinstance(value, Mapping):
            self.issue("inputs", f"must map channel names to data locations, got {type(value).__name__}")
            return {}
        return {name: channel for name, spec in value.items() if (channel := self.channel(str(name), spec))}

    def channel(self, name: str, spec: Any) -> TrainingInput | None:
        path = f"inputs.{name}"
        if not _CHANNEL_NAME.match(name):
            self.issue(path, "channel names use letters, digits, '.', '-' and '_' (at most 64)")
        if isinstance(spec, TrainingInput):
            spec = _input_as_dict(spec)
        if isinstance(spec, str):
            spec = {"s3_data": spec}
        if not isinstance(spec, Mapping):
            self.issue(path, f"must be a URI or a mapping with s3_data, got {type(spec).__name__}")
            return None
        known = tuple(f.name for f in dataclasses.fields(TrainingInput))
        for key in spec:
            if key not in known:
                self.issue(f"{path}.{key}", "unknown channel option", did_you_mean(str(key), known))
        if not isinstance(spec.get("s3_data"), str) or not spec["s3_data"]:
            self.issue(f"{path}.s3_data", "is required: an s3:// URI, a file:// URI or a local path")
            return None
        for key, choices in (("distribution", _S3_DISTRIBUTIONS), ("s3_data_type", _S3_DATA_TYPES), ("input_mode", _INPUT_MODES)):
            if key in spec and spec[key] is not None and spec[key] not in choices:
                self.issue(f"{path}.{key}", f"must be one of {', '.join(choices)}, got {spec[key]!r}", did_you_mean(str(spec[key]), choices))
        channel = TrainingInput(**{k: v for k, v in spec.items() if k in known})
        if channel.local_path is not None:
            local = channel.local_path if channel.local_path.is_absolute() else self.base_dir / channel.local_path
            if not _exists(local, Path.exists):
                self.issue(f"{path}.s3_data", f"local data {channel.s3_data!r} does not exist")
                return channel
            channel = dataclasses.replace(channel, s3_data=f"file://{local.resolve()}")
        return channel

    def semantics(self) -> None:
        """Checks across fields; each looks only at values that passed their type check."""
        self.check_code()
        self.resolve_local_locations()
        if self.values.get("api", "v2") not in APIS:
            self.issue("api", f"must be one of {', '.join(APIS)} (the SageMaker SDK whose request the job mirrors)", did_you_mean(self.values["api"], APIS))
        if self.values.get("input_mode", "File") not in _INPUT_MODES:
            self.issue("input_mode", f"must be one of {', '.join(_INPUT_MODES)}", did_you_mean(self.values["input_mode"], _INPUT_MODES))
        if self.values.get("max_wait") is not None and not self.values.get("use_spot_instances"):
            self.issue("max_wait", "only applies to spot training", "set use_spot_instances: true or drop max_wait")
        if self.values.get("use_spot_instances") and self.values.get("max_wait") is None:
            self.issue("use_spot_instances", "needs max_wait", "set max_wait to at least max_run")
        self.issues += limits.spec_issues(self.values)
        self.issues += metric_definition_issues(self.values.get("metric_definitions", ()))
        distribution = self.values.get("distribution")
        if distribution is not None:
            self.issues += limits.processes_per_host_issues(distribution.mpi_processes_per_host, "distribution.mpi.processes_per_host")

    def resolve_local_locations(self) -> None:
        """A relative local output or checkpoint location means relative to the job file (or cwd), like
        every other path: a rerun from another directory finds the same checkpoints."""
        for key in ("output_path", "checkpoint_s3_uri"):
            location = self.values.get(key)
            if not location or "://" in location and not location.startswith("file://"):
                continue
            local = Path(location.removeprefix("file://")).expanduser()
            if not local.is_absolute():
                self.values[key] = str(self.base_dir / local)

    def check_instance_type(self) -> None:
        name = self.values.get("instance_type", "")
        if name and instance_types.lookup(name) is None:
            hint = did_you_mean(name, instance_types.CATALOG) or "use local, local_gpu or an ml.* type listed in docs/instance-types.md"
            self.issue("instance_type", f"unknown instance type {name!r}", hint)

    def check_code(self) -> None:
        entry_point = self.values.get("entry_point", "")
        if not entry_point:
            return  # missing or not a string: already reported
        if entry_point.startswith("s3://"):
            self.issue("entry_point", "must be a local file, not an S3 URI", "put the code in source_dir (which may be an s3:// sourcedir.tar.gz)")
            return
        source_dir = self.values.get("source_dir")
        if source_dir and not source_dir.startswith("s3://"):
            resolved = self.local_dir("source_dir", source_dir)
            self.values["source_dir"] = str(resolved) if resolved else source_dir
            if resolved and not _exists(resolved / entry_point, Path.is_file):
                self.issue("entry_point", f"{entry_point!r} is not a file in source_dir {source_dir!r}", script_hint(resolved / entry_point))
        elif not source_dir:
            entry = Path(entry_point) if Path(entry_point).is_absolute() else self.base_dir / entry_point
            if not _exists(entry, Path.is_file):
                self.issue("entry_point", f"file {entry_point!r} does not exist", script_hint(entry) or "give the script's path, or set source_dir")
            else:
                self.values["entry_point"] = str(entry.resolve())
        program = entry_point if source_dir else Path(entry_point).name
        if validate_entry_point(program):
            self.issue("entry_point", f"{program!r} must be a relative path of letters, digits, '.', '_', '+', '-' without '.' or '..' parts")
        resolved_deps = []
        for index, dep in enumerate(self.values.get("dependencies", ())):
            resolved = self.local_dir(f"dependencies[{index}]", dep)
            resolved_deps.append(str(resolved) if resolved else dep)
        self.values["dependencies"] = tuple(resolved_deps)

    def local_dir(self, path: str, value: str) -> Path | None:
        local = Path(value.removeprefix("file://")).expanduser()
        local = local if local.is_absolute() else self.base_dir / local
        if not _exists(local, Path.is_dir):
            self.issue(path, f"directory {value!r} does not exist")
            return None
        return local.resolve()


def metric_definition_issues(definitions: Sequence[Any]) -> list[SpecIssue]:
    """Each ``{Name, Regex}`` whose Regex does not compile or has no group (the metric's value is the
    first group): found when the job is checked, not when its metrics are read after it ran."""
    issues = []
    for index, item in enumerate(definitions):
        name, regex = (item.get("Name"), item.get("Regex")) if isinstance(item, Mapping) else (None, None)
        if not isinstance(name, str) or not isinstance(regex, str):
            continue  # the shape is the type check's
        try:
            groups = re.compile(regex).groups
        except (re.error, RecursionError, OverflowError) as err:
            issues.append(SpecIssue(f"metric_definitions[{index}].Regex", f"{regex!r} is not a regular expression: {err}", "escape literal characters such as [ ( . with a backslash"))
            continue
        if not groups:
            issues.append(SpecIssue(f"metric_definitions[{index}].Regex", f"{regex!r} has no capture group: the value is the first group",
                                    f"put parentheses around the number, e.g. {name}=([0-9.eE+-]+)"))
    return issues


def script_hint(missing: Path) -> str:
    """``did you mean 'train.py'?`` from the scripts beside a missing entry point."""
    try:
        scripts = [p.name for p in missing.parent.iterdir() if p.suffix in (".py", ".sh") and p.is_file()]
    except OSError:
        return ""
    return did_you_mean(missing.name, scripts)


def _exists(path: Path, test: Callable[[Path], bool]) -> bool:
    """``path.exists()``/``is_file()``/``is_dir()``, False where the OS cannot even look the name up (a NUL
    character, a name too long): reported as missing, not raised."""
    try:
        return test(path)
    except (OSError, ValueError):
        return False
