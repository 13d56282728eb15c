"""rtpo: a testbed for Reverse-Turn Policy Optimization — one algorithm core, tabular and LLM backends.

    core/         the algorithm, backend-free          tabular/, llm/, distributed/   the backends
    scenario/     the scenario language                rundir/    the run folder and its lifecycle
    commands/     the `rtpo` command and rtpo.train    compare/, verify/   `rtpo compare`, `rtpo verify`

The modules that used to sit at the top level (rtpo.run, rtpo.config, rtpo.schema, ...) moved into
those packages; MOVED maps each old path to its new one.  Importing an old path still works (it is the
same module object, so patching through it reaches the real one) but raises a DeprecationWarning that
names the new path; the old paths go away in a later release.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

MOVED = {
    "rtpo.api": "rtpo.commands.api",
    "rtpo.backends": "rtpo.scenario.backends",
    "rtpo.checkpoint": "rtpo.rundir.checkpoint",
    "rtpo.cli": "rtpo.commands.cli",
    "rtpo.cliutil": "rtpo.commands.common",
    "rtpo.config": "rtpo.scenario.load",
    "rtpo.configdoc": "rtpo.scenario.docs",
    "rtpo.data": "rtpo.llm.data_files",
    "rtpo.eval": "rtpo.commands.eval",
    "rtpo.evaluation": "rtpo.core.sampled_eval",
    "rtpo.export": "rtpo.commands.export",
    "rtpo.llm.export": "rtpo.llm.hf_folder",
    "rtpo.metrics": "rtpo.core.metrics",
    "rtpo.plots": "rtpo.rundir.plots",
    "rtpo.plugins": "rtpo.scenario.plugins",
    "rtpo.provenance": "rtpo.rundir.provenance",
    "rtpo.run": "rtpo.rundir.runner",
    "rtpo.runlogs": "rtpo.rundir.logs",
    "rtpo.schema": "rtpo.scenario.schema",
    "rtpo.threads": "rtpo.core.threads",
    "rtpo.trackers": "rtpo.rundir.trackers",
}


def _caller_stacklevel() -> int:
    """The stacklevel of the first frame outside this file and the import machinery: the import line."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename == __file__ or "importlib" in frame.f_code.co_filename):
        frame = frame.f_back
        # warnings.warn itself skips the import machinery's frames when it counts (and so must we)
        if frame is not None and not _machinery(frame.f_code.co_filename):
            level += 1
    return level


def _machinery(filename: str) -> bool:
    return "importlib" in filename and "_bootstrap" in filename


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module path to the module at its new one, with a DeprecationWarning."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}: import {new} instead (the old path goes away in a later release)",
            DeprecationWarning,
            stacklevel=_caller_stacklevel(),
        )
        return importlib.import_module(new)

    def exec_module(self, module) -> None:
        pass  # the new module ran when it was imported


def _shown_by_default() -> None:
    """Loud: Python shows a DeprecationWarning only in __main__ by default; where the first filter that
    matches is that stock `ignore::DeprecationWarning`, ours is shown once per importing line.  A caller's
    own filter (-W, simplefilter, pytest's) comes first and is left to decide."""
    for action, message, category, module, _ in warnings.filters:
        if module is None and issubclass(DeprecationWarning, category):  # (module-specific ones: __main__)
            if (action, message, category, module) == ("ignore", None, DeprecationWarning, None):
                warnings.filterwarnings("default", message=r"rtpo\.[\w.]+ moved to ", category=DeprecationWarning)
            return


_shown_by_default()
if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())


def __getattr__(name: str):
    # rtpo.train / rtpo.TrainResult (rtpo.commands.api) load on first use, so `import rtpo` stays light
    if name in ("train", "resolve", "TrainResult"):
        from rtpo.commands import api

        return getattr(api, name)
    if f"rtpo.{name}" in MOVED:  # `rtpo.run` after a bare `import rtpo`: the moved module, with its warning
        return importlib.import_module(f"rtpo.{name}")
    raise AttributeError(f"module 'rtpo' has no attribute {name!r}")
