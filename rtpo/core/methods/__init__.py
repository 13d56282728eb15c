"""Registered methods.  Each method lives in its own module here; importing this package registers all.

>>> from rtpo.core import methods
>>> cls = methods.get("rtpo"); method = cls(cls.Config(G=4))
"""

from __future__ import annotations

import importlib
import pkgutil

from rtpo.core.methods.base import METHODS, IterationState, Method, RunContext, register_method

# the modules every method may import: the base (Method, its bookkeeping, the registry) and the pieces
# the flat and the reverse-turn methods share.  Every other module here is one registered method and
# imports no other method module (tests/test_architecture.py).
SHARED_MODULES = ("base", "flat", "reverse")


def method_modules() -> list[str]:
    """The names of the method modules (one registered method each), without the package prefix."""
    return [info.name for info in pkgutil.iter_modules(__path__) if info.name not in SHARED_MODULES]


def _import_all() -> None:
    for name in method_modules():
        importlib.import_module(f"{__name__}.{name}")


_import_all()


def get(name: str) -> type[Method]:
    return METHODS.get(name)


def names() -> list[str]:
    return METHODS.names()


__all__ = ["METHODS", "IterationState", "Method", "RunContext", "get", "names", "register_method"]
