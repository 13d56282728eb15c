"""Plugins: user modules that register methods, estimators, tasks, tools or backends by importing.

Two ways in, both loaded before a scenario is validated (rtpo.scenario.load), so a plugin's names are valid
wherever a scenario is read — `rtpo run`, `rtpo eval` of a run folder, `rtpo run --resume`, `rtpo compare`
and its worker processes:

- an installed distribution's entry point in the group `rtpo.plugins` (pyproject.toml:
  `[project.entry-points."rtpo.plugins"] NAME = "package.module"`): loaded in every process, once.
  The value is a module, or `module:callable` (called once with no arguments after the import).
  `RTPO_DISABLE_PLUGIN_AUTOLOAD=1` turns entry-point loading off.
- a scenario's `plugins: [module, ...]` list, which `--plugin MODULE` (repeatable) extends: the
  modules are imported by name and recorded in the run's config.yaml, so eval and resume load them
  again without being told.

A plugin that cannot be imported (missing, raising, calling sys.exit, or registering a name that is
taken) is a one-line ConfigError naming it; the CLI prints it and exits 2.  Nothing is half-registered:
whatever the failed import registered, in any registry (one its import created too), is removed again
(rtpo.core.registry.recording and rollback_failed_import).
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from typing import Any

from rtpo.core import registry
from rtpo.scenario.schema import ConfigError, _fmt_input

ENTRY_POINT_GROUP = "rtpo.plugins"
DISABLE_ENV = "RTPO_DISABLE_PLUGIN_AUTOLOAD"
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")

_loaded: dict[str, str] = {}  # module or entry-point name -> where it came from ("--plugin/plugins", "entry point")
_entry_points_done = False


def loaded() -> dict[str, str]:
    """The plugins this process has loaded: name -> how ("plugins" or "entry point NAME = VALUE")."""
    return dict(_loaded)


def check_names(value: Any, key: str = "plugins") -> tuple[str, ...]:
    """A scenario's `plugins` value as a tuple of module names (one-line ConfigError otherwise)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}: must be a list of module names, got {_fmt_input(value)}")
    out: list[str] = []
    for i, name in enumerate(value):
        if not isinstance(name, str) or not _MODULE.fullmatch(name):
            raise ConfigError(f"{key}[{i}]: must be an importable module name (pkg.module), got {_fmt_input(name)}")
        if name not in out:
            out.append(name)
    return tuple(out)


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())


def load_module(name: str, key: str = "plugins") -> None:
    """Import plugin module `name` (once per process)."""
    if name in _loaded:
        return
    before = registry.snapshot()
    try:
        _import_all_or_nothing(name, before)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            raise ConfigError(
                f"{key}: plugin {name!r} cannot be imported: no module named {e.name!r} "
                "(install it, or put its folder on PYTHONPATH)"
            ) from None
        raise ConfigError(f"{key}: plugin {name!r} failed to import: {_one_line(e)}") from None
    except (Exception, SystemExit) as e:  # noqa: BLE001 - whatever a user's module raises is one line
        raise ConfigError(f"{key}: plugin {name!r} failed to import: {_one_line(e)}") from None
    _loaded[name] = "plugins"


def _own_modules(module: str) -> Callable[[str], bool]:
    """Whether a module belongs to plugin `module`: its top-level package (a plugin inside rtpo: the
    module and its submodules only)."""
    top = module if module.startswith("rtpo.") else module.split(".", 1)[0]
    return lambda m: m == top or m.startswith(top + ".")


def _undo(before: dict, journal: list, had: set[str], module: str) -> None:
    """A failed plugin load: the plugin's package's modules first imported by it leave sys.modules (a later
    import runs them again, registrations included), and every entry registered by a module that is not
    imported now, or by no module body (an entry point's callable), is removed
    (rtpo.core.registry.rollback_failed_import)."""
    import sys

    own = _own_modules(module)
    for mod in set(sys.modules) - had:
        if own(mod):
            sys.modules.pop(mod, None)
    present = set(sys.modules)
    registry.rollback_failed_import(before, journal, lambda m: m is not None and m in present)


def _import_all_or_nothing(name: str, before: dict) -> None:
    """Import `name`; when it raises (SystemExit included), nothing it registered stays registered (in any
    registry, one its import created included) and no module of its package that it imported first stays
    in sys.modules."""
    import sys

    had = set(sys.modules)
    with registry.recording() as journal:
        try:
            importlib.import_module(name)
        except BaseException as e:
            if not isinstance(e, (Exception, SystemExit)):
                raise
            _undo(before, journal, had, name)
            raise


def _load_entry_point(ep) -> None:
    import sys

    before = registry.snapshot()
    had = set(sys.modules)
    with registry.recording() as journal:
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type(importlib)):
                obj()
        except BaseException as e:
            if not isinstance(e, (Exception, SystemExit)):
                raise
            _undo(before, journal, had, ep.value.split(":", 1)[0].strip())
            raise


def load_entry_points() -> None:
    """Load every installed `rtpo.plugins` entry point, once per process."""
    global _entry_points_done
    if _entry_points_done:
        return
    _entry_points_done = True
    if os.environ.get(DISABLE_ENV, "").strip() not in ("", "0"):
        return
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        where = f"entry point {ep.name} = {ep.value}"
        if ep.value in _loaded:
            continue
        try:
            _load_entry_point(ep)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - a broken installed plugin is one line
            _entry_points_done = False  # the next attempt reports it again rather than running without it
            raise ConfigError(
                f"plugin {ep.name!r} ({ENTRY_POINT_GROUP} {where}) failed to load: {_one_line(e)} "
                f"({DISABLE_ENV}=1 skips installed plugins)"
            ) from None
        _loaded[ep.value] = where


def load(names: Any = (), key: str = "plugins") -> tuple[str, ...]:
    """Load the installed entry points and the named plugin modules; returns the checked names."""
    checked = check_names(names, key)
    load_entry_points()
    for name in checked:
        load_module(name, key)
    return checked
