"""Settings layers and their precedence: defaults < user config < job file < SMDDP_* environment < flags.

Each layer is a mapping of job-file keys plus the ``Source`` of every value, so the merged job can say
where each value came from (``--dryrun`` prints it) and a bad value is reported where it was written:
``job.yaml:7:3``, ``SMDDP_INSTANCE_COUNT`` or ``--instance-count``.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smddp_sdk.config.schema import EXTRA_KEYS, scalar_kind
from smddp_sdk.config.yaml_io import Mark, YamlDocument, YamlSyntaxError, ancestors, parse_yaml
from smddp_sdk.errors import SpecIssue
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.limits import short_repr

ENV_PREFIX = "SMDDP_"
CONFIG_ENV = "SMDDP_CONFIG"
# Mappings merged key by key across layers (a flag adds one hyperparameter, it does not replace them all).
MERGED_MAPPINGS = ("hyperparameters", "environment", "inputs", "scheduler_options")


@dataclass(frozen=True)
class Source:
    """Where a value came from. ``kind`` is default, config, file, env, flag or args."""

    kind: str
    label: str
    document: YamlDocument | None = None
    base_dir: Path | None = None  # relative local paths given here are relative to this directory
    # A value moved before validation (per-scheduler options in the user config) is located at its
    # written path: issues under ``moved_to`` are looked up under ``moved_from`` in the document.
    moved_to: str = ""
    moved_from: str = ""

    def describe(self, path: str) -> str:
        """Short provenance for the dryrun: ``job.yaml:7``, ``env SMDDP_ROLE``, ``flag --role``."""
        if self.document is not None:
            return f"{self.document.name}:{self.document.locate(self._written(path)).line}"
        return {"default": "default", "env": f"env {self.label}", "flag": f"flag {self.label}"}.get(self.kind, self.label)

    def locate(self, issue: SpecIssue) -> tuple[str, Mark | None]:
        """Where an issue about a value from this source is reported, and its mark in a file."""
        if self.document is None:
            return self.label, None
        mark = self.document.locate(self._written(issue.path), issue.message)
        return f"{self.document.name}:{mark.line}:{mark.column}", mark

    def _written(self, path: str) -> str:
        if self.moved_to and path.startswith(self.moved_to):
            return self.moved_from + path[len(self.moved_to) :]
        return path


DEFAULT_SOURCE = Source("default", "default")


@dataclass
class Layer:
    """One level of settings: values by job-file key and the source of each (dotted paths allowed)."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, Source] = field(default_factory=dict)
    issues: list[tuple[Source, SpecIssue]] = field(default_factory=list)
    # Values set at a path inside the merged result (flags: ``--set distribution.mpi.enabled=false``,
    # ``-H lr=0.1``), applied after every layer's ``values`` in the order given.
    patches: list[tuple[tuple[str, ...], Any, Source]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # worth saying, not worth stopping for

    def set(self, key: str, value: Any, source: Source) -> None:
        self.values[key] = value
        self.sources[key] = source

    def patch(self, path: tuple[str, ...], value: Any, source: Source) -> None:
        self.patches.append((path, value, source))

    def source_of(self, path: str) -> Source:
        return lookup_source(self.sources, path)


def lookup_source(sources: Mapping[str, Source], path: str) -> Source:
    """The source recorded for ``path`` or its nearest enclosing key."""
    return next((sources[p] for p in ancestors(path) if p in sources), sources.get("", DEFAULT_SOURCE))


def document_layer(document: YamlDocument, kind: str, base_dir: Path) -> Layer:
    """A layer holding a parsed YAML mapping (job file or user config)."""
    source = Source(kind, document.name, document, base_dir)
    data = dict(document.data or {})
    # Settings are named by text keys; `1: x` or `null: x` was reported while reading and is left out.
    layer = Layer({key: value for key, value in data.items() if isinstance(key, str)}, {"": source})
    layer.issues += [(source, issue) for issue in document.issues]
    return layer


def env_layer(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Layer:
    """``SMDDP_<FIELD>`` variables for every job-file key; empty variables count as unset."""
    environ = os.environ if environ is None else environ
    layer = Layer()
    cwd = cwd or Path.cwd()
    for key in (*JobSpec.field_names(), *EXTRA_KEYS):
        name = ENV_PREFIX + key.upper()
        raw = environ.get(name, "")
        if raw == "":
            continue
        source = Source("env", name, base_dir=cwd)
        value, problem = parse_setting(key, raw)
        if problem:
            layer.issues.append((source, SpecIssue(key, problem, f"fix or unset {name}")))
            continue
        layer.set(key, value, source)
    layer.warnings += misspelt_variables(environ)
    return layer


def misspelt_variables(environ: Mapping[str, str]) -> list[str]:
    """``SMDDP_INSTANCE_CONT`` sets nothing; say so when it is one typo away from a setting.

    Other SMDDP_* variables (runtime knobs such as SMDDP_MASTER_PORT) are not settings and pass quietly.
    """
    settings = [ENV_PREFIX + key.upper() for key in (*JobSpec.field_names(), *EXTRA_KEYS)]
    warnings = []
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in settings:
            close = difflib.get_close_matches(name, settings, n=1, cutoff=0.9)
            if close:
                warnings.append(f"{name} is not a setting and is ignored (did you mean {close[0]}?)")
    return warnings


def parse_setting(key: str, raw: str) -> tuple[Any, str]:
    """A value given as text (environment, ``--set``): strings stay verbatim, the rest is read as YAML."""
    if scalar_kind(key) == "str":
        return (None, "") if raw in ("null", "~") else (raw, "")  # YAML's null unsets a string field too
    try:
        return parse_yaml(raw, key or "value").data, ""  # bounded like a job file: no alias bombs from a flag
    except YamlSyntaxError as err:
        where = f" at column {err.mark.column}" if err.mark != Mark(1, 1) else ""
        return None, f"cannot read {short_repr(raw, 60)} as YAML{where}: {err.problem}"


def merge(layers: list[Layer]) -> tuple[dict[str, Any], dict[str, Source]]:
    """Apply layers lowest first; MERGED_MAPPINGS combine key by key, everything else is replaced."""
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for layer in layers:
        for key, value in layer.values.items():
            if key in MERGED_MAPPINGS and isinstance(value, Mapping) and isinstance(values.get(key), Mapping):
                values[key] = {**values[key], **value}
            else:
                values[key] = value
                _set_source(sources, key, layer.source_of(key))
            if key in MERGED_MAPPINGS and isinstance(value, Mapping):
                sources.update({f"{key}.{sub}": layer.source_of(f"{key}.{sub}") for sub in value})
    for layer in layers:
        for path, value, source in layer.patches:
            _deep_set(values, path, value)
            _set_source(sources, ".".join(path), source)
    return values, sources


def _set_source(sources: dict[str, Source], path: str, source: Source) -> None:
    """``path`` now holds a value from ``source`` alone: the sources recorded below it are stale."""
    for stale in [p for p in sources if p.startswith((f"{path}.", f"{path}["))]:
        del sources[stale]
    sources[path] = source


def _deep_set(values: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Set ``values[a][b][c] = value``, turning anything in the way that is not a mapping into one."""
    target = values
    for key in path[:-1]:
        child = target.get(key)
        target[key] = dict(child) if isinstance(child, Mapping) else {}
        target = target[key]
    target[path[-1]] = value
