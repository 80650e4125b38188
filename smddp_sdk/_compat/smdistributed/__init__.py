"""smddp-sdk's stand-in for AWS's `smdistributed` namespace, used only when the real one is absent.

PYTHONPATH entries come before site-packages, so this folder could shadow a real installation. On import
the package therefore looks along the rest of sys.path and, when a real package of the same name exists
there, loads that one in its place (self-contained: the runtime may expose this package through a folder
of symlinks that holds nothing else).
"""

import importlib.machinery as _machinery
import importlib.util as _util
import os as _os
import sys as _sys


def _load_real_package(name: str, here: str) -> None:
    mine = _os.path.realpath(here)
    others = [p for p in _sys.path if _os.path.realpath(_os.path.join(p or _os.getcwd(), name)) != mine]
    spec = _machinery.PathFinder.find_spec(name, others)
    if spec is None or spec.loader is None:
        return
    module = _util.module_from_spec(spec)
    _sys.modules[name] = module
    spec.loader.exec_module(module)


_load_real_package(__name__, _os.path.dirname(_os.path.abspath(__file__)))
