"""The ``distribution=`` argument: every spelling users write, normalised once, translated as SDK v2 does.

Accepted (SageMaker SDK v2 names, plus our alias):
- ``{"smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_options": "..."}}}``
- ``{"smdistributed_dataparallel": {"enabled": True}}`` (alias of the above)
- ``{"pytorchddp": {"enabled": True}}`` (v2 rewrites it to smdistributed dataparallel; so do we)
- ``{"torch_distributed": {"enabled": True}}`` (torchrun-style launch; may be combined with smddp)
- ``{"mpi": {"enabled": True, "processes_per_host": 8, "custom_mpi_options": "..."}}``
- ``{"smdistributed": {"modelparallel": {"enabled": True, "parameters": {...}}}}`` (accepted and translated;
  only AWS's own containers can run it)

Unlike v2, unknown keys are an error with a suggestion, not silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smddp_sdk.errors import SpecIssue, did_you_mean

_TOP_KEYS = ("smdistributed", "smdistributed_dataparallel", "pytorchddp", "torch_distributed", "mpi")
_UNSUPPORTED_TOP_KEYS = {
    "pytorchxla": "PyTorch/XLA needs AWS's patched torch_xla and a GPU container; not supported",
    "parameter_server": "parameter_server is a TensorFlow strategy; PyTorch jobs cannot use it",
    "multi_worker_mirrored_strategy": "multi_worker_mirrored_strategy is a TensorFlow strategy; PyTorch jobs cannot use it",
    "instance_groups": "heterogeneous clusters (instance_groups) are not supported yet",
}
_OPTION_KEYS = {
    "dataparallel": ("enabled", "custom_mpi_options"),
    "modelparallel": ("enabled", "parameters"),
    "pytorchddp": ("enabled",),
    "torch_distributed": ("enabled",),
    "mpi": ("enabled", "processes_per_host", "custom_mpi_options"),
}


@dataclass(frozen=True)
class Distribution:
    """How ranks are launched and which collectives library the job asks for."""

    smddp: bool | None = None  # smdistributed dataparallel: None = not mentioned, False = explicitly off
    smddp_custom_mpi_options: str = ""
    modelparallel: Mapping[str, Any] | None = None  # SMP parameters when smdistributed modelparallel is on
    torch_distributed: bool = False
    mpi: bool | None = None
    mpi_processes_per_host: int | None = None
    mpi_custom_mpi_options: str = ""
    given: Mapping[str, Any] = field(default_factory=dict)  # what the user wrote, for display

    @property
    def launcher(self) -> str:
        """The runtime's launch shape: "smddp", "torch_distributed", "mpi" or "none" (one process per host)."""
        if self.mpi:
            return "mpi"
        if self.smddp:
            return "smddp"
        if self.torch_distributed:
            return "torch_distributed"
        return "none"

    def hyperparameters(self, instance_type: str) -> dict[str, Any]:
        """The ``sagemaker_*`` hyperparameters SageMaker SDK v2 adds for this distribution (decoded values)."""
        out: dict[str, Any] = {}
        if self.modelparallel is not None:
            out["mp_parameters"] = dict(self.modelparallel.get("parameters") or {})
            out["sagemaker_distributed_dataparallel_enabled"] = False
            out["sagemaker_instance_type"] = instance_type
        if self.smddp is not None:
            out["sagemaker_distributed_dataparallel_enabled"] = self.smddp
            out["sagemaker_instance_type"] = instance_type
            if self.smddp:
                out["sagemaker_distributed_dataparallel_custom_mpi_options"] = self.smddp_custom_mpi_options
        if self.torch_distributed:
            out["sagemaker_torch_distributed_enabled"] = True
            out["sagemaker_instance_type"] = instance_type
        if self.mpi is not None:
            out["sagemaker_mpi_enabled"] = self.mpi
            if self.mpi_processes_per_host:
                out["sagemaker_mpi_num_of_processes_per_host"] = self.mpi_processes_per_host
            out["sagemaker_mpi_custom_mpi_options"] = self.mpi_custom_mpi_options
        return out


def parse_distribution(value: Any, path: str = "distribution") -> tuple[Distribution, list[SpecIssue]]:
    """Normalise a ``distribution`` mapping; returns the result and every problem found."""
    issues: list[SpecIssue] = []
    if value is None:
        return Distribution(), issues
    if not isinstance(value, Mapping):
        issues.append(SpecIssue(path, f"must be a mapping such as {{'smdistributed': {{'dataparallel': {{'enabled': True}}}}}}, got {type(value).__name__}"))
        return Distribution(), issues

    fields: dict[str, Any] = {"given": dict(value)}
    for key, options in value.items():
        key_path = f"{path}.{key}"
        if key in _UNSUPPORTED_TOP_KEYS:
            issues.append(SpecIssue(key_path, _UNSUPPORTED_TOP_KEYS[key]))
        elif key not in _TOP_KEYS:
            issues.append(SpecIssue(key_path, "unknown distribution", did_you_mean(str(key), _TOP_KEYS) or f"expected one of {', '.join(_TOP_KEYS)}"))
        elif key == "smdistributed":
            _parse_smdistributed(options, key_path, fields, issues)
        elif key in ("smdistributed_dataparallel", "pytorchddp"):
            _parse_dataparallel(options, key_path, "dataparallel" if key == "smdistributed_dataparallel" else "pytorchddp", fields, issues)
        elif key == "torch_distributed":
            fields["torch_distributed"] = bool(_flag(_options(options, key_path, key, issues), key_path, issues))
        elif key == "mpi":
            opts = _options(options, key_path, key, issues)
            fields["mpi"] = _flag(opts, key_path, issues)
            fields["mpi_processes_per_host"] = _positive_int(opts, "processes_per_host", key_path, issues)
            fields["mpi_custom_mpi_options"] = _text(opts, "custom_mpi_options", key_path, issues)

    result = Distribution(**fields)
    if result.mpi and result.smddp:
        issues.append(SpecIssue(path, "mpi and smdistributed dataparallel both launch the ranks", "enable only one of them"))
    return result, issues


def _parse_smdistributed(options: Any, path: str, fields: dict[str, Any], issues: list[SpecIssue]) -> None:
    if not isinstance(options, Mapping) or not options:
        issues.append(SpecIssue(path, "must hold exactly one strategy: {'dataparallel': {...}} or {'modelparallel': {...}}"))
        return
    strategies = [name for name in options if name in ("dataparallel", "modelparallel")]
    for name in options:
        if name not in ("dataparallel", "modelparallel"):
            issues.append(SpecIssue(f"{path}.{name}", "unknown smdistributed strategy", did_you_mean(str(name), ("dataparallel", "modelparallel")) or "expected dataparallel or modelparallel"))
    if len(strategies) > 1:
        issues.append(SpecIssue(path, "dataparallel and modelparallel cannot be used together", "choose one smdistributed strategy"))
    if "pytorchddp" in (fields.get("given") or {}):
        issues.append(SpecIssue(path, "pytorchddp and smdistributed cannot be used together", "pytorchddp is smdistributed dataparallel; keep one"))
    if "dataparallel" in options:
        _parse_dataparallel(options["dataparallel"], f"{path}.dataparallel", "dataparallel", fields, issues)
    if "modelparallel" in options:
        opts = _options(options["modelparallel"], f"{path}.modelparallel", "modelparallel", issues)
        if _flag(opts, f"{path}.modelparallel", issues):
            parameters = opts.get("parameters", {})
            if not isinstance(parameters, Mapping):
                issues.append(SpecIssue(f"{path}.modelparallel.parameters", f"must be a mapping, got {type(parameters).__name__}"))
                parameters = {}
            fields["modelparallel"] = {"parameters": dict(parameters)}


def _parse_dataparallel(options: Any, path: str, kind: str, fields: dict[str, Any], issues: list[SpecIssue]) -> None:
    """One of the three spellings of smdistributed dataparallel; a second one is an error."""
    if "smddp" in fields:
        issues.append(SpecIssue(path, "smdistributed dataparallel is given twice", "keep one of smdistributed.dataparallel, smdistributed_dataparallel, pytorchddp"))
    opts = _options(options, path, kind, issues)
    fields["smddp"] = _flag(opts, path, issues)
    fields["smddp_custom_mpi_options"] = _text(opts, "custom_mpi_options", path, issues)


def _options(options: Any, path: str, kind: str, issues: list[SpecIssue]) -> Mapping[str, Any]:
    if not isinstance(options, Mapping):
        issues.append(SpecIssue(path, f"must be a mapping such as {{'enabled': True}}, got {type(options).__name__}"))
        return {}
    allowed = _OPTION_KEYS[kind]
    for key in options:
        if key not in allowed:
            issues.append(SpecIssue(f"{path}.{key}", "unknown option", did_you_mean(str(key), allowed) or f"expected one of {', '.join(allowed)}"))
    return options


def _flag(options: Mapping[str, Any], path: str, issues: list[SpecIssue]) -> bool:
    value = options.get("enabled", False)
    if not isinstance(value, bool):
        issues.append(SpecIssue(f"{path}.enabled", f"must be true or false, got {value!r}"))
        return False
    return value


def _text(options: Mapping[str, Any], key: str, path: str, issues: list[SpecIssue]) -> str:
    value = options.get(key, "")
    if not isinstance(value, str):
        issues.append(SpecIssue(f"{path}.{key}", f"must be a string, got {type(value).__name__}"))
        return ""
    return value


def _positive_int(options: Mapping[str, Any], key: str, path: str, issues: list[SpecIssue]) -> int | None:
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        issues.append(SpecIssue(f"{path}.{key}", f"must be a positive integer, got {value!r}"))
        return None
    return value
