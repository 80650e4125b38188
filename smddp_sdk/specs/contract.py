"""The SageMaker training contract under ``/opt/ml``: its layout and its file formats.

Schedulers (local, docker, and the SageMaker request's hyperparameters) write it; the node runtime
reads it. Both sides use this one stdlib module so the format cannot drift between them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import signal
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from smddp_sdk.errors import ContractError
from smddp_sdk.specs.archives import open_regular, read_inside, write_inside
from smddp_sdk.specs.json_files import read_json_object

DEFAULT_BASE_DIR = "/opt/ml"
BASE_DIR_ENV = "SAGEMAKER_BASE_DIR"
DEFAULT_GROUP_NAME = "homogeneousCluster"
DEFAULT_NETWORK_INTERFACE = "eth0"
N = TypeVar("N", int, float)
# SageMaker keeps the first 1024 characters of output/failure as the job's FailureReason.
FAILURE_REASON_LIMIT = 1024
MAX_CONTRACT_FILE_BYTES = 16 * 1024**2  # one /opt/ml/input/config file, read whole
MAX_CONTRACT_JSON_DEPTH = 64  # nesting in a contract file (SageMaker's are 4 deep)

# Knobs a scheduler hands the runtime beyond what SageMaker gives a container. On SageMaker none is
# set and the defaults apply (each host is its own machine, so fixed ports are safe).
HOST_ADDRESSES_ENV = "SMDDP_HOST_ADDRESSES"  # JSON {"algo-1": "127.0.0.1", ...}; names resolve via DNS when unset
MASTER_PORT_ENV = "SMDDP_MASTER_PORT"  # torch.distributed rendezvous (MASTER_PORT)
SERVER_PORT_ENV = "SMDDP_SERVER_PORT"  # SMDATAPARALLEL_SERVER_PORT
AGENT_PORT_ENV = "SMDDP_AGENT_PORT"  # runtime-to-runtime coordination (failure propagation)
NUM_GPUS_ENV = "SMDDP_NUM_GPUS"  # GPUs per host to plan for; probed with nvidia-smi when unset
JOB_TOKEN_ENV = "SMDDP_JOB_TOKEN"  # shared secret the runtimes of one job prove to each other
MESH_SECRET_ENV = "SMDDP_MESH_SECRET"  # the runtime to its ranks: the secret the inter-host mesh proves (mesh_secret)
LINK_ENCRYPT_ENV = "SMDDP_LINK_ENCRYPT"  # "1": the ranks encrypt frames between hosts (the job's encrypt_inter_container_traffic)
# A v3-shaped SageMaker job sends the user's hyperparameters only; its driver (sm_drivers/sm_train.sh) names
# a JSON file of the framework ones (sagemaker_program, the distribution flags) v2 would have sent with them.
DRIVER_HYPERPARAMETERS_ENV = "SMDDP_DRIVER_HYPERPARAMETERS"
ERROR_FILE_ENV = "SMDDP_ERROR_FILE"  # where a rank's bootstrap writes its error JSON (set per rank)
STOP_GRACE_ENV = "SMDDP_STOP_GRACE"  # seconds between SIGTERM and SIGKILL when ranks are stopped (default 5)
AGENT_TIMEOUT_ENV = "SMDDP_AGENT_TIMEOUT"  # seconds a runtime tries to reach the coordinator (default 600)
# Set by the host supervisor (local and docker modes): a FIFO the supervisor holds open for writing.
# When the supervisor dies, however it dies, the runtime reads end-of-file and stops its ranks.
LIFELINE_ENV = "SMDDP_LIFELINE"
HOST_SESSION_ENV = "SMDDP_HOST_SESSION"  # the runtime's session id, inherited by its ranks (which lead sessions of their own)
PARENT_PID_ENV = "SMDDP_PARENT_PID"  # the process whose death stops this one (PR_SET_PDEATHSIG)
SCRATCH_ENV = "SMDDP_SCRATCH_DIR"  # where the runtime keeps its scratch files (default: a temp dir)
RANK_UMASK = 0o022  # ranks create files 0644, as on SageMaker, docker and Slurm; the runtime's own stay 0600 (a local job's directory is 0700)
SNAPSHOTS = "snapshots"  # in the scratch directory: the states ranks kept for checkpointless recovery (collectives/recovery.py)
BIND_OPT_ML_ENV = "SMDDP_BIND_OPT_ML"  # "1": the runtime binds its tree on a private /opt/ml (local mode)
ENV_CACHE_ENV = "SMDDP_ENV_CACHE"  # a folder: requirements.txt goes into a cached virtualenv there (local mode)
STACKS_FILE_ENV = "SMDDP_STACKS_FILE"  # where a rank appends its Python stacks on STACKS_SIGNAL (set per rank)
STACKS_SIGNAL = signal.SIGUSR2  # to a runtime: every rank of the host writes its stacks (`smddp-launch stacks`)
# A runtime started ahead as a standby (warm restart): it starts this many spare ranks with torch imported,
# then waits for its environment, one JSON object on its stdin, before it joins the job.
STANDBY_ENV = "SMDDP_STANDBY_SPARES"
STANDBY_READY = "smddp: standby ready"  # the standby's first line once its spares are warm
WARM_RESTART_ENV = "SMDDP_WARM_RESTART"  # "1" in a local job's plan: the supervisor keeps a standby per host
SURVIVORS_ENV = "SMDDP_SURVIVORS"  # "1" in a local job's plan: a lost host is replaced alone, the others train on (docs/resuming.md)
GROUP_GENERATION_ENV = "SMDDP_GROUP_GENERATION"  # to a replaced host's ranks: the smddp group's re-formation they join
SCRIPT_ARGS_ENV = "SMDDP_SCRIPT_ARGS"  # JSON list: arguments given after the script, appended verbatim to its argv
ENTRY_MODULE_ENV = "SMDDP_ENTRY_MODULE"  # a module name: the entry point (its file) runs as `python -m MODULE` (smddp-launch -m)
RESTART_COUNT_ENV = "SMDDP_RESTART_COUNT"  # the job's attempt minus one, from the supervisor: TORCHELASTIC_RESTART_COUNT
DEFAULT_MASTER_PORT = 7777
DEFAULT_SERVER_PORT = 7592
DEFAULT_AGENT_PORT = 7778

# What the node runtime sets in every rank's environment (runtime/env.py), replacing any value a job gives:
# the toolkit's SM_* table, the launcher variables, torchrun's, and the runtime's own. tests/hostile/test_validation_gaps.py checks
# that every variable process_env sets is here, so a job's `environment` cannot silently lose one.
RUNTIME_VARIABLES = frozenset({
    "SM_HOSTS", "SM_NETWORK_INTERFACE_NAME", "SM_RESOURCE_CONFIG", "SM_INPUT_DATA_CONFIG", "SM_OUTPUT_DATA_DIR",
    "SM_CURRENT_HOST", "SM_CURRENT_INSTANCE_TYPE", "SM_CURRENT_INSTANCE_GROUP", "SM_CURRENT_INSTANCE_GROUP_HOSTS",
    "SM_INSTANCE_GROUPS", "SM_INSTANCE_GROUPS_DICT", "SM_DISTRIBUTION_INSTANCE_GROUPS", "SM_IS_HETERO", "SM_MODULE_NAME",
    "SM_LOG_LEVEL", "SM_FRAMEWORK_MODULE", "SM_INPUT_DIR", "SM_INPUT_CONFIG_DIR", "SM_OUTPUT_DIR", "SM_NUM_CPUS", "SM_NUM_GPUS",
    "SM_NUM_NEURONS", "SM_MODEL_DIR", "SM_MODULE_DIR", "SM_OUTPUT_INTERMEDIATE_DIR", "SM_USER_ENTRY_POINT",
    "SM_HPS", "SM_FRAMEWORK_PARAMS", "SM_CHANNELS", "SM_TRAINING_ENV", "SM_USER_ARGS", "SM_TOPOLOGY",
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "SMDATAPARALLEL_LOCAL_RANK", "SMDATAPARALLEL_SERVER_ADDR", "SMDATAPARALLEL_SERVER_PORT", "SAGEMAKER_INSTANCE_TYPE",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE",
    "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE",
    MESH_SECRET_ENV, ERROR_FILE_ENV, STACKS_FILE_ENV, PARENT_PID_ENV, HOST_SESSION_ENV, LIFELINE_ENV,
})
RUNTIME_VARIABLE_PREFIXES = ("SM_HP_", "SM_CHANNEL_")  # one per hyperparameter and per channel


def rank_call_file_of(stacks_file: Path) -> Path:
    """Beside a rank's stacks file: the record of the collective it is in (specs/call_record.py), which the
    smddp backend keeps there as each call begins, so that `smddp-launch stacks` can number every rank's call."""
    return stacks_file.with_suffix(".call")


def runtime_owned(name: str) -> bool:
    """Whether the node runtime sets ``name`` for every rank (so a value from the job would be replaced)."""
    return name in RUNTIME_VARIABLES or name.startswith(RUNTIME_VARIABLE_PREFIXES)


# Hyperparameters the toolkit consumes itself and never passes to the user script.
RESERVED_HYPERPARAMETERS = frozenset(
    {
        "sagemaker_program",
        "sagemaker_submit_directory",
        "sagemaker_enable_cloudwatch_metrics",
        "sagemaker_region",
        "sagemaker_container_log_level",
        "sagemaker_job_name",
        "default_user_module_name",
        "_tuning_objective_metric",
        "sagemaker_s3_output",
    }
)


class Below:
    """A path attribute: ``name`` below the owner's ``parent`` attribute, so that a class body of them
    reads as the tree's layout (``config_dir = Below("input_dir", "config")``)."""

    def __init__(self, parent: str, name: str) -> None:
        self.parent, self.name = parent, name

    def __get__(self, tree: object, owner: type | None = None) -> Path:
        return Path(getattr(tree, self.parent)) / self.name


@dataclass(frozen=True)
class OptMl:
    """The paths of one host's ``/opt/ml`` tree, rooted anywhere (local mode gives each host its own)."""

    base: Path

    input_dir = Below("base", "input")
    config_dir = Below("input_dir", "config")
    data_dir = Below("input_dir", "data")
    resource_config_file = Below("config_dir", "resourceconfig.json")
    hyperparameters_file = Below("config_dir", "hyperparameters.json")
    input_data_config_file = Below("config_dir", "inputdataconfig.json")
    code_dir = Below("base", "code")
    model_dir = Below("base", "model")
    output_dir = Below("base", "output")
    output_data_dir = Below("output_dir", "data")
    intermediate_dir = Below("output_dir", "intermediate")
    failure_file = Below("output_dir", "failure")
    failures_file = Below("output_dir", "failures.json")  # every failure record the host's runtime knows (FailureRecord JSON)
    success_file = Below("output_dir", "success")
    logs_dir = Below("output_dir", "logs")  # rank-<N>.log, written by the runtime
    errors_dir = Below("output_dir", "errors")  # rank-<N>.json, written by the rank bootstrap
    events_file = Below("output_dir", "events.jsonl")  # recovery events of this host (docs/resuming.md; specs.goodput)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OptMl:
        environ = os.environ if environ is None else environ
        return cls(Path(environ.get(BASE_DIR_ENV) or DEFAULT_BASE_DIR))

    def channel_dir(self, channel: str) -> Path:
        return self.data_dir / channel

    def rank_log_file(self, rank: int) -> Path:
        return self.logs_dir / f"rank-{rank}.log"

    def rank_error_file(self, rank: int) -> Path:
        return self.errors_dir / f"rank-{rank}.json"

    def rank_stacks_file(self, rank: int) -> Path:
        """Every thread's Python stack, appended by the rank on each STACKS_SIGNAL."""
        return self.output_dir / "stacks" / f"rank-{rank}.txt"

    def rank_call_file(self, rank: int) -> Path:
        """The record of the collective the rank is in (``rank_call_file_of`` its stacks file)."""
        return rank_call_file_of(self.rank_stacks_file(rank))

    def make_dirs(self) -> None:
        """Create the directories a container finds in place when SageMaker starts it."""
        for path in (self.config_dir, self.data_dir, self.code_dir, self.model_dir, self.output_data_dir):
            path.mkdir(parents=True, exist_ok=True)


# --- hyperparameters ----------------------------------------------------------------------------


def mesh_secret(job_token: str) -> str:
    """The ranks' secret for the inter-host mesh, from the runtimes' job token (not the token itself:
    user code sees this one). Handed to ranks in their environment, never through the rendezvous store,
    which any local user can read."""
    return hmac.new(job_token.encode(), b"smddp inter-host mesh", hashlib.sha256).hexdigest()


def encode_hyperparameters(hyperparameters: Mapping[str, Any]) -> dict[str, str]:
    """Encode values as SageMaker SDK v2 does: every value JSON-encoded inside a string."""
    return {str(key): json.dumps(value) for key, value in hyperparameters.items()}


def decode_hyperparameter(raw: str) -> Any:
    """Decode one value as the training toolkit does: JSON when it parses, else the raw string."""
    try:
        return json.loads(raw)
    except (TypeError, ValueError, RecursionError):  # deep nesting: left as the text it is
        return raw


def decode_hyperparameters(raw: Mapping[str, str]) -> dict[str, Any]:
    return {key: decode_hyperparameter(value) for key, value in raw.items()}


def split_hyperparameters(decoded: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split into (user hyperparameters, framework parameters) as the toolkit does.

    Keys starting with ``sagemaker_`` are framework parameters, except the reserved ones, which the
    toolkit consumes and drops from both.
    """
    user: dict[str, Any] = {}
    framework: dict[str, Any] = {}
    for key, value in decoded.items():
        if key in RESERVED_HYPERPARAMETERS:
            continue
        (framework if key.startswith("sagemaker_") else user)[key] = value
    return user, framework


# --- config files -------------------------------------------------------------------------------


def resource_config(current_host: str, hosts: Sequence[str], instance_type: str, *, group_name: str = DEFAULT_GROUP_NAME, network_interface_name: str = DEFAULT_NETWORK_INTERFACE) -> dict[str, Any]:
    """resourceconfig.json for one host of a homogeneous cluster, as the SageMaker platform writes it."""
    return {
        "current_host": current_host,
        "current_instance_type": instance_type,
        "current_group_name": group_name,
        "hosts": list(hosts),
        "instance_groups": [{"instance_group_name": group_name, "instance_type": instance_type, "hosts": list(hosts)}],
        "network_interface_name": network_interface_name,
    }


def input_data_config(channels: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """inputdataconfig.json: per channel its options, with the platform's defaults filled in."""
    defaults = {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"}
    return {name: {**defaults, **dict(options)} for name, options in channels.items()}


def write_config_files(opt_ml: OptMl, *, resource: Mapping[str, Any], hyperparameters: Mapping[str, str], input_data: Mapping[str, Any]) -> None:
    """Write the three config files of one host. ``hyperparameters`` must already be encoded."""
    opt_ml.make_dirs()
    _write_json(opt_ml.resource_config_file, resource)
    _write_json(opt_ml.hyperparameters_file, hyperparameters)
    _write_json(opt_ml.input_data_config_file, input_data)


_BAD_TEXT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")  # \u0000, or \uD800-\uDFFF (surrogates)


def read_json_file(path: Path, *, default: Any = None, required: bool = False) -> Any:
    """Read one contract file; a missing optional file gives ``default``, anything broken a ContractError:
    not a regular file (a FIFO is refused, never waited on), over MAX_CONTRACT_FILE_BYTES, not UTF-8 JSON,
    nested deeper than MAX_CONTRACT_JSON_DEPTH, or holding a NUL or a lone surrogate anywhere."""
    try:
        with open_regular(path) as handle:
            raw = handle.read(MAX_CONTRACT_FILE_BYTES + 1)
    except FileNotFoundError:
        if required:
            raise ContractError(f"{path}: file is missing; the scheduler must write it before the runtime starts") from None
        return default
    except OSError as exc:
        raise ContractError(f"{path}: cannot be read: {exc.strerror}") from None
    if len(raw) > MAX_CONTRACT_FILE_BYTES:
        raise ContractError(f"{path}: over {MAX_CONTRACT_FILE_BYTES} bytes, the limit for a contract file; pass large values as files in the code or an input channel")
    try:
        text = raw.decode("utf-8")
        value = json.loads(text)
    except UnicodeDecodeError as exc:
        raise ContractError(f"{path}: not UTF-8 (byte {exc.start}); contract files are UTF-8 JSON") from None
    except ValueError as exc:
        raise ContractError(f"{path}: not valid JSON: {exc}") from None
    except RecursionError:
        raise ContractError(f"{path}: JSON nested too deeply for the parser") from None
    if json_depth(value, MAX_CONTRACT_JSON_DEPTH) > MAX_CONTRACT_JSON_DEPTH:
        raise ContractError(f"{path}: JSON nested deeper than {MAX_CONTRACT_JSON_DEPTH} levels; contract files are a few levels deep")
    # JSON can only spell a NUL or a surrogate as an escape: the walk (a million hosts: seconds) runs when one is there
    problem = text_problem_at(value) if _BAD_TEXT_ESCAPE.search(text) else None
    if problem is not None:
        raise ContractError(f"{path}: {problem}, which no host name, path, argument or variable can carry; remove it")
    return value


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of decoded JSON, counted without recursion and stopping just past ``limit``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack and deepest <= limit:
        item, depth = stack.pop()
        if isinstance(item, (Mapping, list, tuple)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, Mapping) else item))
    return deepest


def text_problem_at(value: Any) -> str | None:
    """Where in decoded JSON a key or string holds what no name, path, argument or variable can carry, and
    what: a NUL character, or a lone surrogate (JSON's ``\\ud800``, not Unicode), e.g. "hosts[2] holds a NUL
    character"; None when there is none."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if problem := _text_problem(key):
                    return f"{where}.{key.encode('utf-8', 'backslashreplace').decode()!r}".lstrip(".") + problem
                stack.append((f"{where}.{key}".lstrip("."), child))
        elif isinstance(item, list):
            stack += [(f"{where}[{index}]", child) for index, child in enumerate(item)]
        elif isinstance(item, str) and (problem := _text_problem(item)):
            return (where or "the document") + problem
    return None


def _text_problem(text: str) -> str:
    if "\0" in text:
        return " holds a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return " holds a lone surrogate (text that is not Unicode)"
    return ""


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# --- outputs ------------------------------------------------------------------------------------


def write_failure(opt_ml: OptMl, reason: str) -> bool:
    """Write output/failure unless it already exists (the first writer is the root cause); True if written."""
    try:
        write_inside(opt_ml.base, "output/failure", reason.encode("utf-8", "replace"), exclusive=True)
    except FileExistsError:
        return False
    return True


def read_failure(opt_ml: OptMl) -> str | None:
    """The failure reason as SageMaker reports it (first 1024 characters), or None. Read without following
    links and bounded: in docker mode a container wrote it."""
    raw = read_inside(opt_ml.base, "output/failure", 4 * FAILURE_REASON_LIMIT)
    return None if raw is None else raw.decode("utf-8", errors="replace")[:FAILURE_REASON_LIMIT]


def write_failure_records(opt_ml: OptMl, records: Sequence[Mapping[str, Any]]) -> None:
    """Write output/failures.json atomically (readers see all of it or none)."""
    opt_ml.output_dir.mkdir(parents=True, exist_ok=True)
    partial = opt_ml.failures_file.with_name(f".failures.json.{os.getpid()}")
    partial.write_text(json.dumps(list(records), indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(partial, opt_ml.failures_file)


def read_failure_records(opt_ml: OptMl) -> list[dict[str, Any]] | None:
    """The records a runtime wrote, or None when it wrote none (killed, or an older runtime). Read
    without following links and bounded: in docker mode a container wrote it."""
    raw = read_inside(opt_ml.base, f"output/{opt_ml.failures_file.name}", 16 * 1024 * 1024)
    try:
        data = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):
        return None
    return [item for item in data if isinstance(item, dict)] if isinstance(data, list) else None


def torchelastic_error_file(error_file: Path) -> Path:
    return error_file.with_name(error_file.stem + ".torchelastic.json")


def error_record(error_file: Path) -> tuple[Path, dict[str, Any]] | None:
    """A failed rank's error record and the file it came from, or None when the rank left none.

    The rank bootstrap's own file (``error_file``: error_type, message, traceback, timestamp) wins; else the
    file torch's ``@record`` wrote beside it, in torchelastic's format
    ``{"message": {"message": "Type: text", "extraInfo": {"py_callstack": ..., "timestamp": "<s>"}}}``
    (or ``{"message": "text", "timestamp": ...}``), turned into the same keys.
    """
    own = read_json_object(error_file)
    if own is not None:
        return error_file, own
    torch_file = torchelastic_error_file(error_file)
    raw = read_json_object(torch_file)
    if raw is None or "message" not in raw:
        return None
    return torch_file, _from_torchelastic(raw)


def _from_torchelastic(raw: dict[str, Any]) -> dict[str, Any]:
    message = raw["message"]
    if isinstance(message, dict):
        text = str(message.get("message") or "")
        extra = message.get("extraInfo") or {}
        trace, stamp = str(extra.get("py_callstack") or ""), extra.get("timestamp")
    else:
        text, trace, stamp = str(message), "", raw.get("timestamp")
    error_type, _, rest = text.partition(": ")
    if not rest or " " in error_type:  # not "Type: text"
        error_type, rest = "Error", text
    return {"error_type": error_type, "message": rest, "traceback": trace, "timestamp": number_or_none(float, stamp), "source": "torchelastic"}


def number_or_none(kind: Callable[[Any], N], value: Any) -> N | None:
    """``kind(value)`` (int or float), None where value is None or not a number: records cross processes and versions."""
    try:
        return kind(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def write_success(opt_ml: OptMl) -> None:
    """output/success, never through a link the job made (OSError then)."""
    write_inside(opt_ml.base, opt_ml.success_file.relative_to(opt_ml.base).as_posix(), b"")


# --- the root-cause line -------------------------------------------------------------------------

ROOT_CAUSE_PREFIX = "Root cause: "
# SageMaker reports output/failure as the job's FailureReason prefixed with "AlgorithmError: ".
_ROOT_CAUSE = re.compile(
    r"^(?:AlgorithmError: )?Root cause: (?:rank (?P<rank>\d+) on host|the runtime on host) (?P<host>\S+) "
    r"failed with exit code (?P<code>-?\d+)(?:: (?P<message>.*))?$",
    re.M,
)


@dataclass(frozen=True)
class RootCause:
    """Which rank (or host runtime, when ``rank`` is None) failed first: the first line of output/failure,
    which every host of a failed job writes the same way, so schedulers can name it without guessing."""

    host: str
    rank: int | None
    exit_code: int
    message: str = ""

    @property
    def headline(self) -> str:
        subject = f"rank {self.rank} on host {self.host}" if self.rank is not None else f"the runtime on host {self.host}"
        return f"{subject} failed with exit code {self.exit_code}: {self.message}"

    @property
    def line(self) -> str:
        return ROOT_CAUSE_PREFIX + self.headline


def parse_root_cause(reason: str) -> RootCause | None:
    """The root cause named in a failure reason written by the runtime, or None for any other text."""
    match = _ROOT_CAUSE.search(reason)
    if match is None:
        return None
    rank = match["rank"]
    return RootCause(match["host"], int(rank) if rank is not None else None, int(match["code"]), match["message"] or "")


# --- console lines -------------------------------------------------------------------------------

# One log-line format everywhere (local console.log, container output, CloudWatch): ``[algo-2/rank3]: text``
# for a rank, ``[algo-2]: text`` for the host's runtime. One parser reads all three back.
_CONSOLE_PREFIX = re.compile(r"^\[(?P<host>[^\]/\s]+)(?:/(?:rank(?P<rank>\d+)|(?P<role>[a-z]+)))?\]: ?")


@dataclass(frozen=True)
class LogLine:
    """One line of a job's output; ``rank`` is None for lines a host's runtime prints itself."""

    host: str
    text: str
    rank: int | None = None
    stream: str = "stdout"
    timestamp: float | None = None

    def matches(self, hosts: Collection[str] | None, ranks: Collection[int] | None) -> bool:
        """Whether a ``logs(hosts=..., ranks=...)`` filter keeps this line (None keeps everything)."""
        return (hosts is None or self.host in hosts) and (ranks is None or self.rank in ranks)

    @property
    def prefix(self) -> str:
        return console_prefix(self.host, self.rank).rstrip()


def console_prefix(host: str, rank: int | None = None, role: str = "") -> str:
    """``[algo-2/rank3]: `` for a rank's line, ``[algo-2]: `` for the runtime's own (``[algo-2/setup]: ``
    for one of its steps, read back as the host's)."""
    if rank is not None:
        return f"[{host}/rank{rank}]: "
    return f"[{host}/{role}]: " if role else f"[{host}]: "


def parse_console_line(raw: str, default_host: str = "") -> LogLine:
    """A console line back into host, rank (None for the runtime's own lines) and text.

    Older runtimes wrote ``[algo-1/runtime]:`` and ``[algo-1/setup]:``; they read as the host's lines.
    A line with no prefix belongs to ``default_host`` (the container or stream it came from).
    """
    line = raw.rstrip("\r\n")
    match = _CONSOLE_PREFIX.match(line)
    if match is None:
        return LogLine(default_host, line)
    rank = match["rank"]
    return LogLine(match["host"], line[match.end() :], int(rank) if rank is not None else None)


def has_console_prefix(raw: str) -> bool:
    return _CONSOLE_PREFIX.match(raw) is not None


def bind_address(host_addresses: Mapping[str, str], host: str) -> str:
    """Where a listener on ``host`` binds: the address the scheduler mapped the host to (loopback in local
    mode, so nothing off this machine can connect), or every interface ("") where hosts find each other
    by name (a container network, SageMaker's VPC)."""
    return host_addresses.get(host, "")
