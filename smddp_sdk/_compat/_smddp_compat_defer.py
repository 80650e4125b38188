"""Lets a compat package step aside for the real AWS package when both are on sys.path.

PYTHONPATH entries come before site-packages, so a compat folder on PYTHONPATH would otherwise shadow
a real installation. Each compat top-level package calls `load_real_package` first; when a package of
the same name exists anywhere else on sys.path, that one is loaded in its place.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))


def load_real_package(name: str) -> types.ModuleType | None:
    """Import the real package `name` from outside this folder into sys.modules, or return None."""
    others = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != HERE]
    spec = importlib.machinery.PathFinder.find_spec(name, others)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
