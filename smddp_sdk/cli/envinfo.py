"""Facts for bug reports (``smddp-launch env``): versions, the Docker engine, GPUs, and whether AWS
credentials are present. Never a credential's value, and never an import of torch or boto3: versions
come from package metadata so this stays fast and cannot fail on a broken install."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from smddp_sdk import __version__
from smddp_sdk.config.job_file import user_config_path
from smddp_sdk.config.layers import ENV_PREFIX

PROBE_TIMEOUT_S = 5.0
PACKAGES = ("click", "PyYAML", "torch", "boto3", "botocore")
_CREDENTIAL_VARIABLES = {
    "environment": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
    "AWS_PROFILE": ("AWS_PROFILE",),
    "container credentials": ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"),
    "web identity": ("AWS_WEB_IDENTITY_TOKEN_FILE",),
}
# SMDDP_* variables whose values may be secret-like are shown by name only.
_SHOWN_BY_NAME_ONLY = ("SMDDP_ROLE",)


def collect() -> dict[str, str]:
    facts = {
        "smddp-sdk": __version__,
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "platform": platform.platform(),
        "cpus": str(os.cpu_count() or "unknown"),
        "memory": _memory(),
    }
    facts.update({package: _version(package) for package in PACKAGES})
    facts["docker"] = docker_engine()
    facts["gpus"] = gpus()
    facts["aws credentials"] = aws_credentials()
    facts["aws region"] = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "not set"
    path, _ = user_config_path()
    facts["user config"] = "none" if path is None else f"{path} ({'present' if path.is_file() else 'absent'})"
    facts["SMDDP_* variables"] = _smddp_variables()
    return facts


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _memory() -> str:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "unknown"
    return f"{total / 2**30:.1f} GiB"


def _probe(command: list[str]) -> str | None:
    """First line of a command's output, or None when it fails, hangs or is missing."""
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = done.stdout.strip()
    return text if done.returncode == 0 and text else None


def docker_engine() -> str:
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    client = (_probe(["docker", "--version"]) or "unknown version").removeprefix("Docker version ").split(",")[0]
    server = _probe(["docker", "version", "--format", "{{.Server.Version}}"])
    engine = f"engine {server} reachable" if server else "engine not reachable (start it, or use the local scheduler)"
    return f"CLI {client}, {engine}"


def gpus() -> str:
    listing = _probe(["nvidia-smi", "-L"])
    if listing is None:
        return "none found (nvidia-smi absent or failed)"
    lines = listing.splitlines()
    return f"{len(lines)}: " + "; ".join(line.split(" (UUID")[0] for line in lines)


def aws_credentials() -> str:
    """Which kinds of credentials exist: ``yes (environment)`` or ``no``; values are never read out."""
    found = [kind for kind, names in _CREDENTIAL_VARIABLES.items() if all(os.environ.get(n) for n in names)]
    for kind, variable, default in (("shared credentials file", "AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"), ("config file", "AWS_CONFIG_FILE", "~/.aws/config")):
        if Path(os.environ.get(variable) or Path(default).expanduser()).is_file():
            found.append(kind)
    return f"yes ({', '.join(found)})" if found else "no"


def _smddp_variables() -> str:
    names = sorted(name for name in os.environ if name.startswith(ENV_PREFIX))
    if not names:
        return "none"
    return ", ".join(name if name in _SHOWN_BY_NAME_ONLY else f"{name}={os.environ[name]}" for name in names)
