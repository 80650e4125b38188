"""The ranks' PYTHONPATH: code dir first, then compat modules where the real ones are absent, then us.

The compat folder (``smddp_sdk/_compat``) holds drop-in ``smdistributed`` and ``sagemaker_training``
packages. It must never shadow a real AWS install, so each package is exposed only when the ranks'
interpreter cannot import the real one. When only some are missing, a private folder of symlinks to
just those packages is put on the path instead of the whole compat folder.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import site
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import smddp_sdk

COMPAT_PACKAGES = ("smdistributed", "sagemaker_training")
DEFAULT_COMPAT_DIR = Path(smddp_sdk.__file__).resolve().parent / "_compat"
PACKAGE_ROOT = Path(smddp_sdk.__file__).resolve().parent.parent


def missing_packages(names: Sequence[str], python_path: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """Which of ``names`` the ranks' interpreter (this one, with ``python_path``) cannot import."""
    probe = "import importlib.util, sys\nprint(' '.join(n for n in sys.argv[1:] if importlib.util.find_spec(n) is None))"
    env = {**environ, "PYTHONPATH": ":".join(python_path)}
    result = subprocess.run([sys.executable, "-c", probe, *names], env=env, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        return []  # cannot tell: expose nothing rather than risk shadowing a real install
    return result.stdout.split()


def compat_entries(compat_dir: Path, missing: Sequence[str], scratch: Path | None = None) -> list[str]:
    """Path entries exposing exactly the ``missing`` compat packages (empty when none or no folder)."""
    available = [name for name in missing if (compat_dir / name).is_dir()]
    if not available:
        return []
    if set(available) >= {p.name for p in compat_dir.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}:
        return [str(compat_dir)]
    folder = Path(tempfile.mkdtemp(prefix="smddp-compat-", dir=scratch))
    for name in available:
        (folder / name).symlink_to(compat_dir / name, target_is_directory=True)
    return [str(folder)]


def rank_python_path(code_dir: Path, environ: Mapping[str, str], *, compat_dir: Path = DEFAULT_COMPAT_DIR, scratch: Path | None = None) -> list[str]:
    """code dir, compat entries, the folder holding smddp_sdk (unless it is site-packages), inherited PYTHONPATH."""
    inherited = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    head = [str(code_dir)]
    if compat_dir.is_dir():
        head += compat_entries(compat_dir, missing_packages(COMPAT_PACKAGES, head + inherited, environ), scratch)
    if not _is_site_dir(PACKAGE_ROOT):
        head.append(str(PACKAGE_ROOT))  # the bootstrap and the collectives must import in every rank
    return list(dict.fromkeys(head + inherited))  # each entry once, first place kept


def _is_site_dir(path: Path) -> bool:
    sites = [*site.getsitepackages(), site.getusersitepackages()]
    return any(Path(entry).resolve() == path for entry in sites if entry)


def load_real_package(name: str, here: str) -> None:
    """Called by each compat package on import: PYTHONPATH entries come before site-packages, so the compat
    folder could shadow a real installation; when a real package ``name`` exists further along sys.path
    (anywhere but ``here``), it is loaded in the compat package's place."""
    mine = os.path.realpath(here)
    others = [p for p in sys.path if os.path.realpath(os.path.join(p or os.getcwd(), name)) != mine]
    spec = importlib.machinery.PathFinder.find_spec(name, others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
