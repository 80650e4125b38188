"""Reading the step profiles that ``SMDDP_PROFILE`` runs write (smddp_sdk/collectives/profile.py).

Stdlib only: the CLI and the estimator read profiles without importing torch.

A step runs from one optimizer step to the next. In it, each collective's ``submit`` is the moment its
data was ready (for DDP, the bucket's last gradient), and the time the step spent waiting for
communication is what ran after the last submit: ``exposed = max(end) - last submit``. The rest of the
step is compute. The planner takes the median step (by duration) of rank 0, skipping the first (warm-up).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from smddp_sdk.errors import SpecError, SpecIssue
from smddp_sdk.planning.step import CommEvent, StepProfile

FORMAT = "smddp-profile/1"
# The cost model's op for a recorded collective's name, by prefix, first match wins (None: moves no modelled data).
_OP_KINDS = (
    (("barrier", "shared_buffers"), None), (("reduce_scatter",), "reduce_scatter"), (("all_reduce", "reduce"), "all_reduce"),
    (("all_gather", "gather", "all_to_all"), "all_gather"), (("broadcast", "scatter"), "broadcast"),
)


def load(path: str | Path) -> list[dict]:
    """Every rank's profile in a directory (or the one file given), rank order; clear errors otherwise."""
    path = Path(path)
    files = sorted(path.glob("rank-*.json")) if path.is_dir() else [path]
    if not path.exists() or not files:
        raise SpecError(SpecIssue("profile", f"no profile at {path}", "run the job with SMDDP_PROFILE=<dir> in its environment, then pass that dir"))
    docs = []
    for file in files:
        try:
            doc = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise SpecError(SpecIssue("profile", f"{file} is not a readable profile: {exc}")) from exc
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise SpecError(SpecIssue("profile", f"{file} is not an smddp profile (expected format {FORMAT!r})"))
        docs.append(doc)
    return sorted(docs, key=lambda d: d.get("rank", 0))


def op_kind(what: str) -> str | None:
    return next((kind for prefixes, kind in _OP_KINDS if what.startswith(prefixes)), None)


def steps_of(doc: dict) -> list[dict]:
    """Per step after the first: duration, compute, time inside collectives and the collectives themselves."""
    marks = doc.get("steps") or []
    events = sorted(doc.get("events") or [], key=lambda e: e[2])
    result = []
    for begin, end in zip(marks, marks[1:]):
        inside = [e for e in events if begin < e[2] <= end]
        step_s = end - begin
        exposed = max(0.0, min(end, max(e[4] for e in inside)) - inside[-1][2]) if inside else 0.0
        result.append(
            {
                "step_s": step_s,
                "compute_s": step_s - exposed,
                "comm_s": sum(e[4] - e[3] for e in inside),
                "events": [CommEvent(kind, int(e[1]), e[2] - begin) for e in inside if (kind := op_kind(e[0])) is not None and e[1] > 0],
            }
        )
    return result


def to_step_profile(docs: Sequence[dict], source: str = "") -> StepProfile:
    """The planner's step from the profiles of a run (rank 0's median step)."""
    if not docs:
        raise ValueError("no profiles given")
    steps = steps_of(docs[0])
    if not steps:
        raise ValueError("fewer than two step marks in the profile: train with a torch.optim optimizer, or call smddp_sdk.collectives.profile.step() after each step")
    # Every figure from one step, so that they agree (an even count's averaged median step could be
    # shorter than the chosen step's compute).
    median = sorted(steps, key=lambda s: s["step_s"])[len(steps) // 2]
    return StepProfile(
        median["compute_s"],
        tuple(median["events"]),
        source=source,
        measured_step_s=median["step_s"],
        measured_comm_s=median["comm_s"],
        notes=(f"{len(steps)} steps of rank 0, world size {docs[0].get('world_size')}",),
    )


def read_step_profile(path: str | Path) -> StepProfile:
    try:
        return to_step_profile(load(path), source=str(path))
    except ValueError as exc:
        if isinstance(exc, SpecError):
            raise
        raise SpecError(SpecIssue("profile", f"{path}: {exc}")) from exc


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.1f} kB"


def summary_lines(doc: dict, profile: StepProfile) -> list[str]:
    """The short communication summary printed at the end of a profiled job."""
    steps = steps_of(doc)
    kinds: dict[str, list[int]] = {}
    for event in profile.events:
        kinds.setdefault(event.op, []).append(event.nbytes)
    per_op = ", ".join(f"{op} {len(sizes)} x up to {_mb(max(sizes))}" for op, sizes in kinds.items()) or "none"
    step_s = profile.measured_step_s or 0.0
    comm_s = profile.measured_comm_s or 0.0
    exposed = max(0.0, step_s - profile.compute_s)
    overlapped = 1.0 if comm_s == 0 else max(0.0, 1 - exposed / comm_s)
    return [
        f"smddp profile (rank 0, world size {doc.get('world_size')}): {len(steps)} steps, median {step_s * 1e3:.1f} ms (compute {profile.compute_s * 1e3:.1f} ms)",
        f"  per step: {_mb(profile.bytes_per_step)} in collectives ({per_op}); {comm_s * 1e3:.1f} ms inside them, {overlapped:.0%} overlapped with compute",
    ]
