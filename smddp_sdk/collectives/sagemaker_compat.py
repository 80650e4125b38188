"""Would AWS's SMDDP accept this call? The bundled backend does more than SMDDP (CPU tensors, every
collective and reduce op, subgroups), so a script can pass a rehearsal and fail on SageMaker. This
check says so at the call, naming the line of the user's script.

- Active inside a training job (``TRAINING_JOB_NAME`` is set, as local and docker modes do) or when
  ``SMDDP_SAGEMAKER_CHECK=1``; ``SMDDP_SAGEMAKER_CHECK=0`` turns it off.
- By default a ``SageMakerCompatibilityWarning`` (a ``UserWarning``: the usual ``warnings`` filters
  apply) once per kind of problem and call site; CPU tensors are reported once, by rank 0, where the
  script could have used CUDA (the machine has it) or the check was asked for (``SMDDP_SAGEMAKER_CHECK=1``):
  on a machine without CUDA every tensor is a CPU tensor, and the local scheduler's dry-run note says so
  once, before the job.
- ``SMDDP_SAGEMAKER_STRICT=1`` raises ``SageMakerCompatibilityError`` instead, as SMDDP would fail;
  CPU tensors stay a warning on a machine without CUDA (a CPU rehearsal could not run otherwise).

The rules and their sources are in ``smddp_sdk.specs.smddp_support`` (docs/compat.md has the table).
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist

from smddp_sdk.collectives.errors import CollectiveError
from smddp_sdk.specs import smddp_support as support

CHECK_ENV = "SMDDP_SAGEMAKER_CHECK"
STRICT_ENV = "SMDDP_SAGEMAKER_STRICT"

_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])  # smddp_sdk/, its _compat/ included
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_STDLIB_DIR = str(Path(sysconfig.get_paths()["stdlib"]).resolve())
_SEEN: set[tuple[str, str, int]] = set()
_DEVICE_KEY = ("device", "", 0)
_LOCK = threading.Lock()


class SageMakerCompatibilityWarning(UserWarning):
    """This call works here but AWS's SMDDP would reject it on SageMaker."""


class SageMakerCompatibilityError(CollectiveError):
    """Raised instead of the warning under ``SMDDP_SAGEMAKER_STRICT=1``."""


@functools.cache
def enabled() -> bool:
    """Read once per process: the check sits on every collective's path."""
    setting = os.environ.get(CHECK_ENV, "").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return False
    return setting in ("1", "true", "yes", "on") or bool(os.environ.get("TRAINING_JOB_NAME"))


@functools.cache
def strict() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def check_call(method: str, tensors: Sequence[torch.Tensor], args: Sequence[object] = ()) -> None:
    """Called by the backend for every collective: ``method`` is the ProcessGroup method's name.
    Cheap when nothing is wrong (a set lookup and the options' reduce op); messages are built only
    for a problem."""
    if not enabled():
        return
    if method not in support.SUPPORTED_COLLECTIVES:
        _report("collective", f"{_call(method)}: AWS's SMDDP does not offer this collective; on SageMaker the call fails")
    op = _reduce_op_name(args)
    if op is not None:
        _report("reduce_op", f"{_call(method)}(op=ReduceOp.{op}): AWS's SMDDP reduces with ReduceOp.SUM only (AVG fails with 'SMDDP does not support: ReduceOp'); sum and divide instead")
    if _DEVICE_KEY in _SEEN and not strict():
        return  # the hot path of a CPU rehearsal: said once already, no stack walk per call
    if not _reports_cpu_tensors():
        return
    if (os.environ.get("RANK", "0") == "0" or strict()) and any(t.device.type != "cuda" for t in tensors):
        hard = torch.cuda.is_available()  # said by rank 0 only: every rank of a CPU rehearsal would say it
        _report("device", f"{_call(method)} on a {tensors[0].device.type.upper()} tensor: AWS's SMDDP takes CUDA tensors only; move the model and data to the GPU on SageMaker (reported once)", once_per_process=True, may_raise=hard)


def quiet_for_sum() -> bool:
    """Whether check_call says nothing more about a CPU all_reduce, broadcast, all_gather or barrier with
    ReduceOp.SUM (the native core then runs them without asking)."""
    if not enabled() or not _reports_cpu_tensors():
        return True
    return not strict() and (_DEVICE_KEY in _SEEN or os.environ.get("RANK", "0") != "0")


@functools.cache
def _reports_cpu_tensors() -> bool:
    """CPU tensors are worth a word where the script had CUDA to use, or the check was asked for by name."""
    return torch.cuda.is_available() or os.environ.get(CHECK_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _call(method: str) -> str:
    return f"dist.{support.TORCH_NAMES.get(method, method)}"


def check_subgroup(size: int) -> None:
    """Called when a group other than the default one is created with the smddp backend."""
    if enabled():
        _report("subgroup", f"dist.new_group(...) of {size} ranks with backend smddp: AWS's SMDDP supports no subgroups (only the default group)")


_OPTIONS_WITH_OP = tuple(
    option for option in (getattr(dist, name, None) for name in ("AllreduceOptions", "AllreduceCoalescedOptions", "ReduceOptions", "ReduceScatterOptions"))
    if option is not None
)
_SUM = dist.ReduceOp.RedOpType.SUM


def _reduce_op_name(args: Sequence[object]) -> str | None:
    """The name of a reduce op other than SUM among the call's options; None for SUM or none."""
    for arg in args:
        if isinstance(arg, _OPTIONS_WITH_OP):
            kind = arg.reduceOp.op  # a ReduceOp wraps a RedOpType
            return None if kind == _SUM else str(getattr(kind, "name", kind)).rsplit(".", 1)[-1]
    return None


def _report(kind: str, message: str, *, once_per_process: bool = False, may_raise: bool = True) -> None:
    if not _users_own_call():
        return  # torch's own collectives (DDP's set-up all_gather, its gradient buckets): not in the user's script
    if kind in ("collective", "reduce_op") and _issued_by_this_package():
        return  # e.g. the old API's DistributedDataParallel averaging its buckets: on SageMaker AWS's own code does that
    filename, lineno, module = _user_frame()
    key = (kind, "" if once_per_process else filename, 0 if once_per_process else lineno)
    if strict() and may_raise:
        raise SageMakerCompatibilityError(f"{filename}:{lineno}: {message} ({STRICT_ENV}=1)")
    with _LOCK:
        if key in _SEEN:
            return
        _SEEN.add(key)
    warnings.warn_explicit(message, SageMakerCompatibilityWarning, filename, lineno, module=module, registry={})


def _user_frame() -> tuple[str, int, str]:
    """The innermost frame outside torch, this package and the standard library: the user's call."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(("<", _PACKAGE_DIR, _TORCH_DIR, _STDLIB_DIR)):
            return name, frame.f_lineno, frame.f_globals.get("__name__", "")
        frame = frame.f_back
    return "<unknown>", 0, ""


_BACKEND_FILES = tuple(str(Path(__file__).resolve().with_name(name)) for name in ("sagemaker_compat.py", "process_group.py", "__init__.py"))


_TORCH_API_DIR = str(Path(dist.__file__).resolve().parent)  # torch.distributed: the API a user's call goes through
# smddp's DDP: its own wrapper and the hook it gives torch's DDP reduce buckets on the user's behalf, as
# torch's reducer does (on SageMaker AWS's code does that), so their calls are not the user's either.
_DDP_FILE = str(Path(__file__).resolve().with_name("ddp.py"))


def _users_own_call() -> bool:
    """Whether the collective was called from outside torch (the user's script, or this package): past
    the backend and torch.distributed's API, the next frame decides; torch.nn's DDP, autograd or smddp's
    DDP calling it means they did, on the user's behalf."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith((_TORCH_API_DIR, *_BACKEND_FILES)):
        frame = frame.f_back
    return frame is not None and not frame.f_code.co_filename.startswith((_TORCH_DIR, _DDP_FILE))


def _issued_by_this_package() -> bool:
    """Whether the collective was called by this package's own code (compat modules, our DDP) rather
    than by the user's script or by torch on its behalf: the innermost caller outside torch and the
    backend itself decides."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith((_TORCH_DIR, *_BACKEND_FILES)):
            return name.startswith(_PACKAGE_DIR)
        frame = frame.f_back
    return False


def reset() -> None:
    """Forget what was reported and the settings read (tests)."""
    with _LOCK:
        _SEEN.clear()
    enabled.cache_clear()
    strict.cache_clear()
