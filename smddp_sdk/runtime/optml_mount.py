"""Give one simulated host its own ``/opt/ml``: a private mount namespace with the host's tree bound there.

SageMaker scripts write to literal paths (``torch.save(model, "/opt/ml/model/model.pth")``). In local mode
every simulated host has its own tree somewhere under the job directory, so the runtime of each host (when
the local scheduler sets ``SMDDP_BIND_OPT_ML=1``) enters a mount namespace of its own before anything else
happens and arranges, in that namespace only:

- a small tmpfs over ``/opt``, with every entry the machine has in ``/opt`` bound back (so ``/opt/conda``
  and friends keep working); a real ``/opt/ml`` on the machine is hidden, never touched;
- the host's tree bound on ``/opt/ml``.

The rank processes inherit the namespace; other hosts, other jobs and the rest of the machine see nothing.
As root this needs only ``unshare(CLONE_NEWNS)``. Otherwise the runtime tries an unprivileged user
namespace (the process maps its own uid to root inside it; files it creates stay owned by the real user).
When neither is possible ``OptMlUnavailable`` says why and what to do; the job fails before it starts.

Stdlib only, Linux only; must run while the process is still single-threaded (a user namespace cannot be
entered by a threaded process).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from smddp_sdk.errors import UnavailableError
from smddp_sdk.specs import contract

BIND_OPT_ML_ENV = contract.BIND_OPT_ML_ENV
OPT = Path("/opt")
OPT_ML = OPT / "ml"

# <sched.h> and <sys/mount.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

HOW_TO_FIX = (
    "run as root, or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 and "
    "user.max_user_namespaces > 0; on Ubuntu 24.04 also kernel.apparmor_restrict_unprivileged_userns=0), "
    "or use scheduler='docker'; or set SMDDP_BIND_OPT_ML=0 in the job's environment to run without /opt/ml "
    "(the script must then use SM_MODEL_DIR, SM_CHANNEL_* and friends instead of literal /opt/ml paths)"
)


class OptMlUnavailable(UnavailableError):
    """This machine cannot give the host a private /opt/ml (exit 3: an environment problem, not a job failure)."""


def wanted(environ: Mapping[str, str]) -> bool:
    return environ.get(BIND_OPT_ML_ENV, "").strip().lower() in ("1", "true", "yes")


def bind_host_tree(tree: Path) -> str:
    """Enter a private mount namespace with ``tree`` on /opt/ml; returns how ("root" or "user namespace")."""
    tree = tree.resolve()
    if not tree.is_dir():
        raise OptMlUnavailable(f"cannot bind {tree} on /opt/ml: it is not a directory")
    if not OPT.is_dir():
        raise OptMlUnavailable("cannot give this host its own /opt/ml: the machine has no /opt directory to mount over; create it (mkdir /opt) or use scheduler='docker'")
    if tree.is_relative_to(OPT_ML):
        raise OptMlUnavailable(f"the host tree {tree} lies inside /opt/ml itself; choose a job_root outside /opt/ml")
    libc = _libc()
    how = _enter_namespace(libc)
    try:
        _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount leaks back to the machine
        _overlay_opt(libc, tree)
    except OSError as exc:
        # Ubuntu 24.04's AppArmor lets an unprivileged user namespace be created but not mount anything.
        hint = _userns_hint() if how == "user namespace" else ""
        raise OptMlUnavailable(f"cannot give this host its own /opt/ml ({how}): {exc}{hint}; {HOW_TO_FIX}") from None
    return how


def _enter_namespace(libc: ctypes.CDLL) -> str:
    """A new mount namespace, inside a new user namespace when we are not root."""
    reasons = []
    if os.geteuid() == 0:
        if libc.unshare(CLONE_NEWNS) == 0:
            return "root"
        reasons.append(f"unshare(CLONE_NEWNS) as root failed: {os.strerror(ctypes.get_errno())}")
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0:
        try:
            _map_ids(uid, gid)
        except OSError as exc:
            raise OptMlUnavailable(f"cannot set up the user namespace for /opt/ml: {exc}; {HOW_TO_FIX}") from None
        return "user namespace"
    code = ctypes.get_errno()
    reasons.append(f"an unprivileged user namespace is not allowed here ({os.strerror(code)}{_userns_hint()})")
    raise OptMlUnavailable("cannot give this host its own /opt/ml: " + "; ".join(reasons) + "; " + HOW_TO_FIX)


def _map_ids(uid: int, gid: int) -> None:
    """Map our own ids to root in the new user namespace: that gives the mount rights inside it."""
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
    Path("/proc/self/gid_map").write_text(f"0 {gid} 1")


def _userns_hint() -> str:
    for path, bad in (("/proc/sys/kernel/unprivileged_userns_clone", "0"), ("/proc/sys/user/max_user_namespaces", "0"), ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1")):
        try:
            if Path(path).read_text().strip() == bad:
                return f"; {path.removeprefix('/proc/sys/').replace('/', '.')} is {bad}"
        except OSError:
            continue
    return ""


def _overlay_opt(libc: ctypes.CDLL, tree: Path) -> None:
    """tmpfs over /opt with the machine's entries bound back, then the host's tree on /opt/ml."""
    opt_fd = os.open(OPT, os.O_RDONLY | os.O_DIRECTORY)  # the real /opt stays reachable through it
    try:
        entries = [entry for entry in os.listdir(opt_fd) if entry != "ml"]
        _mount(libc, "smddp-opt", str(OPT), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
        for name in entries:
            _bind_back(libc, opt_fd, name)
    finally:
        os.close(opt_fd)
    OPT_ML.mkdir()
    _mount(libc, str(tree), str(OPT_ML), None, MS_BIND | MS_REC)


def _bind_back(libc: ctypes.CDLL, opt_fd: int, name: str) -> None:
    mode = os.lstat(name, dir_fd=opt_fd).st_mode
    target = OPT / name
    if stat.S_ISLNK(mode):
        os.symlink(os.readlink(name, dir_fd=opt_fd), target)
        return
    if stat.S_ISDIR(mode):
        target.mkdir()
    else:
        target.touch()
    _mount(libc, f"/proc/self/fd/{opt_fd}/{name}", str(target), None, MS_BIND | MS_REC)


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def raw(text: str | None) -> bytes | None:
        return None if text is None else os.fsencode(text)

    if libc.mount(raw(source), raw(target), raw(fstype), ctypes.c_ulong(flags), raw(data)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {source or fstype or ''} on {target}: {os.strerror(code)}")


def _libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise OptMlUnavailable(f"cannot load the C library to create a mount namespace: {exc}; {HOW_TO_FIX}") from None
    for function in ("unshare", "mount"):
        if not hasattr(libc, function):
            raise OptMlUnavailable(f"the C library has no {function}() (not Linux?); {HOW_TO_FIX}")
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.unshare.argtypes = [ctypes.c_int]
    return libc
