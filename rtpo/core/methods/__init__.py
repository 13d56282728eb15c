"""Registered methods.  Each method lives in its own module here; importing this package registers all.

>>> from rtpo.core import methods
>>> cls = methods.get("rtpo"); method = cls(cls.Config(G=4))
"""

from __future__ import annotations

import importlib
import pkgutil

from rtpo.core.methods.base import METHODS, IterationState, Method, RunContext, register_method


def _import_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")


_import_all()


def get(name: str) -> type[Method]:
    return METHODS.get(name)


def names() -> list[str]:
    return METHODS.names()


__all__ = ["METHODS", "IterationState", "Method", "RunContext", "get", "names", "register_method"]
