"""From job file, user config, environment and flags to one validated ``JobSpec`` and its scheduler.

``resolve_job`` is the whole pipeline: it reads and merges the layers, validates everything at once and
raises ``JobFileError`` listing each problem where it was written (``job.yaml:7:3: ...``), so nothing is
started or uploaded while any problem is left.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from smddp_sdk.config.layers import CONFIG_ENV, DEFAULT_SOURCE, Layer, Source, document_layer, env_layer, lookup_source, merge
from smddp_sdk.config.yaml_io import KEY_PROBLEMS, Mark, YamlDocument, load_yaml_file
from smddp_sdk.errors import SpecError, SpecIssue
from smddp_sdk.schedulers import infer_scheduler, scheduler_class, unknown_scheduler
from smddp_sdk.specs.job import JobSpec

DOCS_HINT = "See `smddp-launch schema` or docs/job-file.md"


@dataclass(frozen=True)
class LocatedIssue:
    """A spec problem and where the offending value was written."""

    where: str  # "job.yaml:7:3", "SMDDP_ROLE", "--instance-count", or "" when nowhere in particular
    issue: SpecIssue
    mark: Mark | None = None

    def render(self) -> str:
        text = describe_issue(self.issue)
        return f"{self.where}: {text}" if self.where else text


class JobFileError(SpecError):
    """Every problem in a job and its settings, each located; exit code 2."""

    def __init__(self, located: list[LocatedIssue], advice: str = "") -> None:
        self.located = sorted(located, key=_reading_order)
        self.advice = advice  # one more line for the reader, e.g. how to name a job file
        super().__init__([item.issue for item in self.located])

    def _render(self) -> str:
        return "\n".join(item.render() for item in self.located)

    def summary(self) -> str:
        count = len(self.located)
        text = f"{count} problem{'s' if count != 1 else ''} found. {DOCS_HINT}"
        return f"{text}\n{self.advice}" if self.advice else text


@dataclass(frozen=True)
class ResolvedJob:
    """A validated job: the spec, where it runs, and where every setting came from."""

    spec: JobSpec
    scheduler: str
    scheduler_options: dict[str, Any]
    values: dict[str, Any]  # the merged settings as written (job-file keys)
    sources: dict[str, Source]
    job_file: YamlDocument | None = None
    warnings: tuple[str, ...] = ()

    def source(self, path: str) -> Source:
        return lookup_source(self.sources, path)


def describe_issue(issue: SpecIssue) -> str:
    """``unknown field 'x' (did you mean 'y'?)`` for problems with a key's name, ``path: message`` otherwise."""
    if issue.path and issue.message.startswith(KEY_PROBLEMS):
        cut = max(issue.path.rfind("."), issue.path.rfind("["))
        parent, key = (issue.path[:cut], issue.path[cut + 1 :]) if cut > 0 else ("", issue.path)
        text = f"{issue.message} '{key}'" + (f" ({issue.hint})" if issue.hint else "")
        return f"{parent}: {text}" if parent else text
    return str(issue)


def user_config_path(environ: Mapping[str, str] | None = None) -> tuple[Path | None, bool]:
    """The user config file and whether it was named explicitly (``SMDDP_CONFIG``; empty means none)."""
    environ = os.environ if environ is None else environ
    if CONFIG_ENV in environ:
        named = environ[CONFIG_ENV]
        return (Path(named).expanduser(), True) if named else (None, True)
    config_home = environ.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(config_home) / "smddp" / "config.yaml", False


def resolve_job(job_file: Path | None, *, flags: Layer | None = None, environ: Mapping[str, str] | None = None, cwd: Path | None = None, job_file_name: str | None = None) -> ResolvedJob:
    """Merge defaults < user config < job file < SMDDP_* environment < flags and validate the result."""
    environ = os.environ if environ is None else environ
    cwd = cwd or Path.cwd()
    problems: list[tuple[Source, SpecIssue]] = []
    document = load_yaml_file(job_file, job_file_name) if job_file is not None else None
    job_base = (job_file.parent if job_file.is_absolute() else (cwd / job_file).parent) if job_file else cwd

    config, config_sections = _user_config_layer(environ, problems)
    file = _mapping_layer(document, "file", job_base, problems)
    file_sections = _pop_sections(file, problems, required=False) if file else {}
    layers = [layer for layer in (config, file, env_layer(environ, cwd), flags) if layer]
    for layer in layers:
        problems += layer.issues
    values, sources = merge(layers)

    scheduler = _scheduler_name(values, sources, problems)
    sections = [config_sections, file_sections]
    options = _scheduler_options(values, sources, scheduler, sections, problems)
    problems += _other_sections_issues(scheduler, sections)
    _anchor_paths(values, sources, job_base)

    spec = None
    try:
        spec = JobSpec.from_mapping(values, base_dir=job_base)
    except SpecError as err:
        problems += [(lookup_source(sources, issue.path), issue) for issue in err.issues]
    if scheduler:
        problems += [(lookup_source(sources, issue.path), issue) for issue in check_scheduler_options(scheduler, options)]
    if problems or spec is None:
        raise JobFileError([locate(source, issue, document) for source, issue in problems], _advice(problems, document))
    values["scheduler"], values["scheduler_options"] = scheduler, options
    warnings = tuple(warning for layer in layers for warning in layer.warnings)
    return ResolvedJob(spec, scheduler, options, values, sources, document, warnings)


def _advice(problems: list[tuple[Source, SpecIssue]], document: YamlDocument | None) -> str:
    """One more line when the problems point at a better way to write the job."""
    if not document and any(issue.message == "is required" for _, issue in problems):
        return "No job file was given: name one (smddp-launch run job.yaml), or set --entry-point and --instance-type."
    if any(source.kind == "file" and not source.moved_to and issue.message.startswith("unknown option of the") for source, issue in problems):
        return (
            "Options under scheduler_options apply to whichever scheduler runs the job; key them by scheduler "
            "(scheduler_options: {local: {processes_per_host: 2}}) so one job file serves every scheduler."
        )
    return ""


def locate(source: Source, issue: SpecIssue, document: YamlDocument | None) -> LocatedIssue:
    """Place an issue: values from a file at their line, others at their variable or flag; problems with
    nothing written (a missing required field) at the top of the job file."""
    if source is DEFAULT_SOURCE or source.kind == "default":
        if document is None:
            return LocatedIssue("", issue)
        mark = document.locate("")
        return LocatedIssue(f"{document.name}:{mark.line}:{mark.column}", issue, mark)
    where, mark = source.locate(issue)
    return LocatedIssue(where, issue, mark)


def check_scheduler_options(scheduler: str, options: Mapping[str, Any], *, values: bool = True) -> list[SpecIssue]:
    """Every problem with ``scheduler``'s options, from their declarations (skipped if it cannot load);
    without ``values``, only names the scheduler does not take from a file."""
    try:
        declared = scheduler_class(scheduler).options
    except ImportError:
        return []  # the CLI reports an unavailable scheduler when it needs one
    return declared.file_issues(options) if values else declared.name_issues(options)


# The options of one scheduler from one file's section, and where that section was written.
Section = tuple[dict[str, Any], Source]


def _user_config_layer(environ: Mapping[str, str], problems: list[tuple[Source, SpecIssue]]) -> tuple[Layer | None, dict[str, Section]]:
    path, explicit = user_config_path(environ)
    if path is None or (not explicit and not path.is_file()):
        return None, {}
    if explicit and not path.is_file():
        raise SpecError(SpecIssue(CONFIG_ENV, f"user config file {str(path)!r} does not exist", f"create it or unset {CONFIG_ENV}"))
    layer = _mapping_layer(load_yaml_file(path, _display_path(path)), "config", path.parent, problems)
    if layer is None:
        return None, {}
    return layer, _pop_sections(layer, problems, required=True)


def _pop_sections(layer: Layer, problems: list[tuple[Source, SpecIssue]], *, required: bool) -> dict[str, Section]:
    """Take per-scheduler sections (``scheduler_options: {local: {...}, sagemaker: {...}}``) out of a file's
    layer. The user config ``required`` them; a job file may also give one scheduler's options flat (the
    older form), which stay in the layer and apply to whichever scheduler runs the job."""
    given = layer.values.get("scheduler_options")
    source = layer.source_of("scheduler_options")
    if given is None or (not required and not _is_keyed_by_scheduler(given)):
        return {}
    del layer.values["scheduler_options"]
    if not isinstance(given, Mapping):
        problems.append((source, SpecIssue("scheduler_options", "in the user config, must map scheduler names to options", "e.g. scheduler_options: {sagemaker: {region: us-west-2}}")))
        return {}
    sections: dict[str, Section] = {}
    for name, options in given.items():
        if unknown := unknown_scheduler(name, f"scheduler_options.{name}"):
            hint = unknown.hint if required or unknown.hint.startswith("did you mean") else f"options go under the scheduler they are for, e.g. scheduler_options.local.{name}"
            problems.append((source, SpecIssue(unknown.path, "unknown scheduler section", hint)))
        elif options is not None and not isinstance(options, Mapping):
            problems.append((source, SpecIssue(f"scheduler_options.{name}", f"must be a mapping of options, got {type(options).__name__}")))
        else:
            sections[str(name)] = (dict(options or {}), replace(source, moved_to="scheduler_options.", moved_from=f"scheduler_options.{name}."))
    return sections


def _is_keyed_by_scheduler(options: Any) -> bool:
    """Whether ``scheduler_options`` holds per-scheduler sections: a scheduler's name mapped to options."""
    return isinstance(options, Mapping) and any(unknown_scheduler(name) is None and (value is None or isinstance(value, Mapping)) for name, value in options.items())


def _display_path(path: Path) -> str:
    """``~/.config/smddp/config.yaml`` rather than the full home directory path."""
    home = Path("~").expanduser()
    return "~/" + str(path.relative_to(home)) if path.is_relative_to(home) else str(path)


def _mapping_layer(document: YamlDocument | None, kind: str, base_dir: Path, problems: list[tuple[Source, SpecIssue]]) -> Layer | None:
    if document is None:
        return None
    if not isinstance(document.data, Mapping):  # reported alone: every field would otherwise look missing
        if document.data is None:
            issue = SpecIssue("", "the file is empty", "a job needs at least entry_point: and instance_type: (run `smddp-launch init` for a commented example)")
        else:
            issue = SpecIssue("", f"must be a mapping of job fields (key: value lines), not a {type(document.data).__name__}")
        raise JobFileError([locate(Source(kind, document.name, document), issue, document)])
    return document_layer(document, kind, base_dir)


def _scheduler_name(values: dict[str, Any], sources: dict[str, Source], problems: list[tuple[Source, SpecIssue]]) -> str:
    name = values.pop("scheduler", None)
    if name is None:
        instance_type = values.get("instance_type")
        return infer_scheduler(instance_type) if isinstance(instance_type, str) else ""
    if unknown := unknown_scheduler(name):
        problems.append((lookup_source(sources, "scheduler"), unknown))
        return ""
    return str(name)


def _scheduler_options(values: dict[str, Any], sources: dict[str, Source], scheduler: str, sections: list[dict[str, Section]], problems: list[tuple[Source, SpecIssue]]) -> dict[str, Any]:
    """The chosen scheduler's options: its sections (user config, then job file) under the options given
    flat (a job file's older form, SMDDP_SCHEDULER_OPTIONS, -o flags), each value keeping its source."""
    given = values.pop("scheduler_options", None) or {}
    if not isinstance(given, Mapping):
        problems.append((lookup_source(sources, "scheduler_options"), SpecIssue("scheduler_options", f"must be a mapping of option names to values, got {type(given).__name__}")))
        given = {}
    options: dict[str, Any] = {}
    for by_scheduler in sections:
        section, source = by_scheduler.get(scheduler, ({}, None))
        for name, value in section.items():
            options[name] = value
            if name not in given and source is not None:
                sources[f"scheduler_options.{name}"] = source
    return {**options, **given}


def _other_sections_issues(scheduler: str, sections: list[dict[str, Section]]) -> list[tuple[Source, SpecIssue]]:
    """Names that no other scheduler takes, in the sections the chosen scheduler does not read: a typo
    in the sagemaker section is found while the job still runs locally."""
    problems = []
    for by_scheduler in sections:
        for name, (section, source) in by_scheduler.items():
            if name == scheduler:
                continue
            written = replace(source, moved_to="", moved_from="")  # the paths below name the section already
            for issue in check_scheduler_options(name, section, values=False):
                problems.append((written, SpecIssue(issue.path.replace("scheduler_options.", f"scheduler_options.{name}.", 1), issue.message, issue.hint)))
    return problems


def _anchor_paths(values: dict[str, Any], sources: dict[str, Source], job_base: Path) -> None:
    """Make local paths from the user config, environment or flags absolute, each against its own base
    (config file directory or cwd); the job file's stay relative to the job file."""

    def anchored(path: str, value: Any) -> Any:
        base = lookup_source(sources, path).base_dir
        if not isinstance(value, str) or base is None or base == job_base or value.startswith("s3://"):
            return value
        local = Path(value.removeprefix("file://")).expanduser()
        if local.is_absolute():
            return value
        return ("file://" if value.startswith("file://") else "") + str(base / local)

    if values.get("output_path") is not None and "://" not in str(values["output_path"]).removeprefix("file://"):
        values["output_path"] = anchored("output_path", values["output_path"])
    if values.get("source_dir") is not None:
        values["source_dir"] = anchored("source_dir", values["source_dir"])
    elif "entry_point" in values:
        values["entry_point"] = anchored("entry_point", values["entry_point"])
    if isinstance(values.get("dependencies"), list):
        values["dependencies"] = [anchored(f"dependencies[{i}]", dep) for i, dep in enumerate(values["dependencies"])]
    inputs = values.get("inputs")
    if isinstance(inputs, str):
        values["inputs"] = anchored("inputs", inputs)
    elif isinstance(inputs, Mapping):
        values["inputs"] = {name: _anchor_channel(anchored, f"inputs.{name}", channel) for name, channel in inputs.items()}


def _anchor_channel(anchored: Any, path: str, channel: Any) -> Any:
    if isinstance(channel, Mapping) and "s3_data" in channel:
        return {**channel, "s3_data": anchored(path, channel["s3_data"])}
    return anchored(path, channel)


def _reading_order(item: LocatedIssue) -> tuple[int, str, Mark]:
    if item.mark is None:
        return (1, "", Mark(0, 0))
    return (0, item.where.rsplit(":", 2)[0], item.mark)


def user_scheduler_options(scheduler: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The user config's options for one scheduler (for commands that act on a handle, not a job file)."""
    problems: list[tuple[Source, SpecIssue]] = []
    _, sections = _user_config_layer(os.environ if environ is None else environ, problems)
    if problems:
        raise JobFileError([locate(source, issue, None) for source, issue in problems])
    options, _ = sections.get(scheduler, ({}, None))
    return dict(options)
