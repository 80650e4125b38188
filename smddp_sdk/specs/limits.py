"""Every bound on a job's input, in one place, checked before anything is written, uploaded or started.

The job file, the environment, CLI flags and the estimator all end in ``JobSpec.from_mapping``, which
calls ``spec_issues`` here; the numbers are documented in docs/job-file.md ("Limits"). A value past a
bound is refused with what to change, never passed on to fail later as an OS error in a rank's
``execve`` ("Argument list too long", "embedded null byte") or to grow a dry run without end.

Stdlib only: ``specs`` must import nothing else.
"""

from __future__ import annotations

import json
import re
import resource
from collections.abc import Mapping, Sequence
from typing import Any

from smddp_sdk.errors import SpecIssue
from smddp_sdk.specs import contract

# --- the numbers (docs/job-file.md lists the same) ---------------------------------------------------
MAX_INSTANCE_COUNT = 1000  # hosts per job; one runtime, one coordinator peer per host
MAX_PROCESSES_PER_HOST = 512  # ranks per host
MAX_LOCAL_PROCESSES = 1024  # a local job's processes in all (a runtime per host, its ranks): one machine runs them
MAX_RUN_SECONDS = 28 * 24 * 3600  # SageMaker's own ceiling for MaxRuntimeInSeconds
MAX_VOLUME_SIZE_GB = 16384
MAX_RETRY_ATTEMPTS = 30  # SageMaker's RetryStrategy.MaximumRetryAttempts: 1 to 30
MAX_HYPERPARAMETERS_BYTES = 128 * 1024  # a rank's argv: Linux refuses one argument above 128 KiB
MAX_ENVIRONMENT_BYTES = 128 * 1024
MAX_NAME_LENGTH = 63
MAX_YAML_BYTES = 1024 * 1024
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 100_000  # with aliases expanded
MAX_INT_DIGITS = 1000  # integers written in a job file (Python reads at most 4300 digits at all)
MAX_JSON_DEPTH = 32  # hyperparameter values
MAX_CHANNELS = 20  # SageMaker's bound on InputDataConfig
# What the kernel accepts at execve (fs/exec.c): one argument or "NAME=value" of at most MAX_ARG_STRLEN
# bytes with its NUL, and all of them with their pointers within a quarter of the stack limit, capped at
# 6 MiB (3/4 of _STK_LIM) and never below 128 KiB.
MAX_ARG_STRLEN = 32 * 4096
_EXEC_CEILING, _EXEC_FLOOR = 6 * 1024**2, 128 * 1024

# SageMaker's job-name rule; base_job_name follows it too, so it can never be a path.
JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables the schedulers set for the runtime; a user value would move or break the job's own tree.
RESERVED_ENVIRONMENT = {
    "SAGEMAKER_BASE_DIR": "it is where each host's /opt/ml tree lives; read it in the script instead",
    "TRAINING_JOB_NAME": "it is set to the job's name",
    "SMDDP_HOST_ADDRESSES": "the scheduler maps host names to addresses",
    "SMDDP_JOB_TOKEN": "each job gets its own secret",
    "SMDDP_ERROR_FILE": "the runtime sets one per rank",
}


def spec_issues(values: Mapping[str, Any]) -> list[SpecIssue]:
    """Every bound the typed values of a job break (values that failed their type check are absent)."""
    issues: list[SpecIssue] = []
    issues += _number_issues(values)
    issues += name_issues(values.get("job_name"), "job_name")
    issues += name_issues(values.get("base_job_name"), "base_job_name")
    issues += hyperparameter_issues(values.get("hyperparameters") or {})
    issues += environment_issues(values.get("environment") or {})
    if len(values.get("inputs") or {}) > MAX_CHANNELS:
        issues.append(SpecIssue("inputs", f"{len(values['inputs'])} channels; the limit is {MAX_CHANNELS} (SageMaker's)", "put related data under one channel, in folders"))
    checked = ("hyperparameters", "environment", "job_name", "base_job_name")  # their own rules cover NUL
    issues += nul_issues({k: v for k, v in values.items() if k not in checked})
    return issues


def nul_issues(values: Mapping[str, Any]) -> list[SpecIssue]:
    """Any other text with a NUL character: no path, URI, name or tag can hold one, and the OS refuses
    it later with a traceback ("embedded null byte")."""
    issues = []
    stack: list[tuple[str, Any]] = list(values.items())
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if "\0" in value:
                issues.append(SpecIssue(path, "contains a NUL character", "remove it"))
        elif isinstance(value, Mapping):
            stack += [(f"{path}.{key}", item) for key, item in value.items()]
        elif isinstance(value, (list, tuple)):
            stack += [(f"{path}[{index}]", item) for index, item in enumerate(value)]
        elif hasattr(value, "__dataclass_fields__"):  # TrainingInput, Distribution: their given values
            given = getattr(value, "given", None)
            fields = given if isinstance(given, Mapping) else {name: getattr(value, name) for name in value.__dataclass_fields__}
            stack += [(f"{path}.{key}", item) for key, item in fields.items()]
    return sorted(issues, key=lambda issue: issue.path)


# The whole-number fields' bounds, each stated once: the spec's checks, its JSON schema and the CLI read them.
# field -> (least, most or None, what to do about a value above the most)
BOUNDS: dict[str, tuple[int, int | None, str]] = {
    "instance_count": (1, MAX_INSTANCE_COUNT, "split the work into several jobs"),
    "max_run": (1, MAX_RUN_SECONDS, "28 days is SageMaker's maximum"),
    "max_wait": (0, MAX_RUN_SECONDS, "28 days is SageMaker's maximum"),
    "volume_size": (1, MAX_VOLUME_SIZE_GB, "SageMaker volumes hold at most 16384 GB"),
    "max_retry_attempts": (1, MAX_RETRY_ATTEMPTS, "SageMaker's RetryStrategy allows 30; leave it unset for no retries"),
    "keep_alive_period_in_seconds": (0, None, ""),
}


def _number_issues(values: Mapping[str, Any]) -> list[SpecIssue]:
    issues = []
    for name, (least, most, hint) in BOUNDS.items():
        value = values.get(name)
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if value < least:
            issues.append(SpecIssue(name, f"must be at least {least}, got {short_repr(value)}" if least else f"must not be negative, got {short_repr(value)}"))
        elif most is not None and value > most:
            issues.append(SpecIssue(name, f"must be at most {most}, got {short_repr(value)}", hint))
    return issues


def processes_per_host_issues(value: Any, path: str) -> list[SpecIssue]:
    """Ranks per host: a positive integer up to MAX_PROCESSES_PER_HOST (scheduler option or mpi setting)."""
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return [SpecIssue(path, f"must be a positive integer, got {short_repr(value)}")]
    if value > MAX_PROCESSES_PER_HOST:
        return [SpecIssue(path, f"must be at most {MAX_PROCESSES_PER_HOST}, got {short_repr(value)}", "use more hosts (instance_count) instead")]
    return []


def name_issues(name: Any, path: str) -> list[SpecIssue]:
    """job_name and base_job_name: SageMaker's rule (letters, digits, hyphens), so never a path."""
    if not isinstance(name, str) or not name:
        return []
    if JOB_NAME.match(name):
        return []
    return [SpecIssue(path, f"must be 1-{MAX_NAME_LENGTH} letters, digits and hyphens, starting and ending with a letter or digit, got {short_repr(name)}")]


def hyperparameter_issues(hyperparameters: Mapping[Any, Any]) -> list[SpecIssue]:
    """Keys are text without NUL; values encode as JSON (as SageMaker does) without NUL; the total is bounded."""
    issues = []
    total = 0
    for key, value in hyperparameters.items():
        if not isinstance(key, str):
            continue  # reported by the type check
        path = f"hyperparameters.{key.encode('utf-8', 'backslashreplace').decode()}"  # printable even with surrogates
        problem = hyperparameter_name_problem(key) or ("" if _is_unicode(key) else "is not valid Unicode (it holds a lone surrogate)")
        if problem:
            issues.append(SpecIssue(path, f"name {key[:60]!r} {problem}", "use letters, digits, '_', '-' and '.'"))
            continue
        encoded, problem = encode_hyperparameter(value)
        if not problem and not _is_unicode(json.dumps(value, ensure_ascii=False)):
            problem = "is not valid Unicode (it holds a lone surrogate)"
        if problem:
            hint = "pass large data as an input channel or a file in source_dir" if problem.startswith("holds") else "use strings, numbers, booleans, null, lists and mappings of them"
            issues.append(SpecIssue(path, problem, hint))
            continue
        if "\\u0000" in encoded:  # JSON escapes NUL; the runtime decodes it back into a rank's argv
            issues.append(SpecIssue(path, "contains a NUL character, which cannot be passed to a process", "remove it"))
            continue
        total += len(key.encode()) + len(encoded.encode()) + 4  # "--key value" as two argv strings
    if total > MAX_HYPERPARAMETERS_BYTES:
        issues.append(SpecIssue("hyperparameters", f"encode to {total} bytes; the limit is {MAX_HYPERPARAMETERS_BYTES}", "pass large data as an input channel or a file in source_dir"))
    return issues


def _is_unicode(text: str) -> bool:
    """False for text no process can receive: lone surrogates (from JSON escapes or surrogateescape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def encode_hyperparameter(value: Any) -> tuple[str, str]:
    """The JSON text SageMaker stores for a value, or "" and why it has none."""
    depth, count = _json_shape(value)
    if depth > MAX_JSON_DEPTH:
        return "", f"nests deeper than {MAX_JSON_DEPTH} levels (or contains itself)"
    if count > MAX_HYPERPARAMETERS_BYTES:
        return "", f"holds more than {MAX_HYPERPARAMETERS_BYTES} values; hyperparameters are limited to {MAX_HYPERPARAMETERS_BYTES} bytes in all"
    try:
        return json.dumps(value, allow_nan=False), ""
    except ValueError as err:
        if "integer string conversion" in str(err):
            return "", "contains an integer too long to write (over 4300 digits); pass it as a string"
        return "", "NaN and infinity are not JSON; pass them as strings"
    except TypeError:
        return "", f"a value of type {type(_unencodable(value)).__name__} is not JSON"


def hyperparameter_name_problem(name: str) -> str:
    """Why a hyperparameter name cannot be passed on, or "": it becomes an option (``--name``) and an
    environment variable (``SM_HP_NAME``), where '=' ends the name, NUL ends the string and whitespace
    makes an option no argument parser reads."""
    if not name:
        return "is empty"
    if "\0" in name:
        return "holds a NUL character"
    if "=" in name:
        return "holds '=', which would end the name of its environment variable SM_HP_..."
    if any(char.isspace() for char in name):
        return "holds whitespace, which no command-line option can hold"
    return ""


def exec_limit() -> int:
    """Bytes of arguments and environment (strings with their NULs, and one pointer each) a process
    started from here may be given: the kernel's own rule from the stack limit (``getrlimit``)."""
    stack, _ = resource.getrlimit(resource.RLIMIT_STACK)
    quarter = _EXEC_CEILING if stack == resource.RLIM_INFINITY else stack // 4
    return max(min(quarter, _EXEC_CEILING), _EXEC_FLOOR)


def exec_text_problem(argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """Why Python or the kernel would refuse the text of ``argv`` or ``environ`` at exec, or "": an
    environment name that is empty or holds '=' or NUL, a string with NUL or a lone surrogate."""
    for name in environ:
        if not name or "=" in name or "\0" in name:
            return f"environment variable name {name[:60]!r} is empty or holds '=' or NUL"
    for what, text in _exec_strings(argv, environ):
        if "\0" in text:
            return f"{what} holds a NUL character, which no argument or variable can carry"
        try:
            text.encode("utf-8", "surrogateescape")  # as os.fsencode, which Popen uses
        except UnicodeEncodeError:
            return f"{what} holds a lone surrogate (text that is not Unicode), which no argument or variable can carry"
    return ""


def exec_size_problem(argv: Sequence[str], environ: Mapping[str, str], limit: int | None = None) -> str:
    """Why the kernel would refuse ``argv`` and ``environ`` as too big (E2BIG), naming what is too big,
    or "". Only for text ``exec_text_problem`` accepts."""
    strings = _exec_strings(argv, environ)
    total = 0
    for what, text in strings:
        size = len(text.encode("utf-8", "surrogateescape")) + 1
        if size > MAX_ARG_STRLEN:
            return f"{what} takes {size} bytes; Linux passes at most {MAX_ARG_STRLEN} in one argument or variable"
        total += size + 8  # and its pointer
    limit = exec_limit() if limit is None else limit
    if total > limit:
        largest = sorted(strings, key=lambda item: -len(item[1]))[:3]
        named = ", ".join(f"{what} ({len(text)} bytes)" for what, text in largest)
        return f"arguments and environment take {total} bytes; Linux passes at most {limit} here (a quarter of the stack limit, ulimit -s); largest: {named}"
    return ""


def _exec_strings(argv: Sequence[str], environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """Each string execve copies, with what the message calls it."""
    return [(f"argument {index}", arg) for index, arg in enumerate(argv)] + [(f"environment variable {name[:60]}", f"{name}={value}") for name, value in environ.items()]


def environment_issues(environment: Mapping[Any, Any]) -> list[SpecIssue]:
    """Names as in a shell (no '=', no NUL), values without NUL, none reserved, a bounded total."""
    issues = []
    total = 0
    for key, value in environment.items():
        if not isinstance(key, str):
            continue  # reported by the type check
        path = f"environment.{key}"
        if not ENV_NAME.match(key):
            issues.append(SpecIssue(path, f"{short_repr(key)} is not a valid variable name", "use letters, digits and '_', not starting with a digit; no '=', spaces or NUL"))
        elif key in RESERVED_ENVIRONMENT:
            issues.append(SpecIssue(path, "is set by smddp-sdk and cannot be overridden", RESERVED_ENVIRONMENT[key]))
        elif contract.runtime_owned(key):
            issues.append(SpecIssue(path, "is set by the node runtime for every rank, so this value would be replaced", _owned_hint(key)))
        if isinstance(value, str):
            if "\0" in value:
                issues.append(SpecIssue(path, "contains a NUL character, which cannot be passed to a process", "remove it"))
            total += len(key.encode()) + len(value.encode("utf-8", "surrogatepass")) + 2
    if total > MAX_ENVIRONMENT_BYTES:
        issues.append(SpecIssue("environment", f"takes {total} bytes; the limit is {MAX_ENVIRONMENT_BYTES}", "pass large values in a file in source_dir"))
    return issues


def _owned_hint(name: str) -> str:
    if name.startswith("SM_HP_"):
        return f"set the hyperparameter {name.removeprefix('SM_HP_').lower()!r} instead"
    if name.startswith("SM_CHANNEL_"):
        return "add the channel to inputs instead"
    return "the runtime sets it from the job's hosts, ranks, paths and secrets; read it in the script, or use another name"


def _json_shape(value: Any) -> tuple[int, int]:
    """Nesting depth and number of values (repeats counted), iteratively, stopping just past either bound.

    Values shared between places (``x = [y] * 10`` nested, or a list holding itself) count every time, as
    JSON would write them; each takes at least a byte, so more values than the byte limit cannot fit.
    """
    deepest = count = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > MAX_HYPERPARAMETERS_BYTES:
            break
        if not isinstance(item, (Mapping, list, tuple)):
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            break
        children = item.values() if isinstance(item, Mapping) else item
        stack.extend((child, depth + 1) for child in children)
    return deepest, count


def _unencodable(value: Any) -> Any:
    """The first value json cannot encode, to name its type."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            bad = [k for k in item if not isinstance(k, (str, int, float, bool)) and k is not None]
            if bad:
                return bad[0]
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif not isinstance(item, (str, int, float, bool)) and item is not None:
            return item
    return value


def short_repr(value: Any, limit: int = 40) -> str:
    """A value as the message shows it: its repr, cut short (a 1e23 count or a 100 KiB name)."""
    if isinstance(value, int) and value.bit_length() > 256:
        try:
            return f"a number of {len(str(abs(value)))} digits"
        except ValueError:  # Python refuses to write ints past 4300 digits
            return "a number of more than 4300 digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def local_processes_issues(hosts: int, per_host: int) -> list[SpecIssue]:
    """A local job's processes in all, each host's runtime and its ranks, up to MAX_LOCAL_PROCESSES: every
    simulated host runs on this one machine."""
    total = hosts * (1 + per_host)
    if total <= MAX_LOCAL_PROCESSES:
        return []
    ranks = f"{per_host} rank{'s' if per_host != 1 else ''}"
    return [SpecIssue("instance_count", f"{hosts} hosts x (1 runtime + {ranks}) plan {total} processes, and every simulated host runs "
                      f"on this machine; the limit is {MAX_LOCAL_PROCESSES}", "use fewer hosts or ranks per host, or scheduler='sagemaker'")]
