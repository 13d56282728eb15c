"""The scenarios shipped in the package, by name, and the one rule that turns a scenario argument into a file.

Every scenario of the repository's scenarios/ folder is package data (`rtpo/scenarios`, a link to it in a
checkout; copied into the wheel), so an installed rtpo runs them without the repository:

    rtpo scenarios                       every name, its backend and the file it lives in
    rtpo run region_chain                the same as rtpo run scenarios/tabular/region_chain.yaml
    rtpo run tabular/region_chain        the same (a name may carry its folder)

`scenario_file(arg)` is what `rtpo run|compare|config show|solve` and `rtpo.train` use: an existing file
is itself; a folder is a one-line error; anything else is looked up among the shipped names (a trailing
`.yaml` and a leading `scenarios/` are ignored, so `scenarios/tabular/math_short.yaml` works from any
folder); a name that matches nothing is a one-line ConfigError suggesting the closest names.

May import: rtpo.scenario.schema (ConfigError) only.
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import get_close_matches
from importlib import resources
from pathlib import Path

from rtpo.scenario.schema import ConfigError

DEFAULT = "tabular/default"  # the embedded default scenario (`rtpo run` with no scenario)


@dataclass(frozen=True)
class Shipped:
    """One shipped scenario: `name` (its file's stem), `kind` (its folder: tabular, llm) and `path`."""

    name: str
    kind: str
    path: Path

    @property
    def qualified(self) -> str:
        return f"{self.kind}/{self.name}"


def scenarios_root() -> Path:
    """The folder holding the shipped scenarios (inside the installed package)."""
    return Path(str(resources.files("rtpo").joinpath("scenarios")))


def shipped() -> list[Shipped]:
    """Every shipped scenario, sorted by folder then name."""
    root = scenarios_root()
    return [
        Shipped(p.stem, kind.name, p)
        for kind in sorted(q for q in root.iterdir() if q.is_dir())
        for p in sorted(kind.glob("*.yaml"))
    ]


def default_path() -> Path:
    return scenarios_root() / f"{DEFAULT}.yaml"


def scenario_file(arg: str | Path) -> Path:
    """The scenario file `arg` names: an existing file as given, else the shipped scenario of that name."""
    p = Path(arg)
    if p.is_dir():
        raise ConfigError(f"{arg}: is a folder; give a scenario file (.yaml) or a shipped name (rtpo scenarios)")
    if p.is_file():
        return p
    key = str(arg).replace("\\", "/")
    key = key.removesuffix(".yaml").removesuffix(".yml")
    key = key.removeprefix("./").removeprefix("scenarios/")
    found = shipped()
    by_name: dict[str, list[Shipped]] = {}
    for s in found:
        by_name.setdefault(s.name, []).append(s)
        by_name.setdefault(s.qualified, []).append(s)
    hits = by_name.get(key, [])
    if len(hits) == 1:
        return hits[0].path
    if len(hits) > 1:
        names = ", ".join(s.qualified for s in hits)
        raise ConfigError(f"{arg}: more than one shipped scenario has this name ({names}); name its folder")
    names = sorted({s.name for s in found})
    near = get_close_matches(key.rsplit("/", 1)[-1], names, n=1, cutoff=0.0)
    closest = f"; the closest shipped name is {near[0]!r}" if near else ""
    raise ConfigError(f"{arg}: no such scenario file, nor a shipped scenario name{closest} (rtpo scenarios lists them)")
