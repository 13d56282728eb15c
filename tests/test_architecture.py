"""The package's import graph, read from the source with ast (module-level and function-level imports
alike, `if TYPE_CHECKING:` blocks excluded since they never run, and the backend registry's lazy
providers counted as the imports they are): no cycle, no product module importing a test module,
rtpo.core importing no backend, and no module importing one on a higher floor (FLOORS).  Every module
also imports on its own, and the old top-level paths (rtpo.MOVED) import with a DeprecationWarning.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "rtpo"
BACKEND_PREFIXES = ("rtpo.tabular", "rtpo.llm", "rtpo.distributed", "vllm", "ray", "transformers")


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, path: Path) -> set[str]:
    """Every module `name` imports at run time (resolved to the longest existing rtpo module, or the
    top-level name of an outside package)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from pkg import submodule` is `import pkg.submodule` (which the Import branch above counts
            # as the submodule alone); the package itself only when a name is not a submodule of it
            subs = {a.name for a in node.names if f"{base}.{a.name}" in MODULES}
            if len(subs) < len(node.names):
                found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    out = set()
    for target in found:
        t = target
        while t and t not in MODULES and "." in t:
            t = t.rsplit(".", 1)[0]
        if t in MODULES:
            if t != name:
                out.add(t)
        elif not target.startswith("rtpo"):
            out.add(target.split(".")[0])
    return out


def _graph() -> dict[str, set[str]]:
    """Importing the backend registry may import its providers (lazily, by name: rtpo.scenario.backends._PROVIDERS),
    so a module that imports rtpo.scenario.backends depends on them too — except the providers themselves, which
    import the registry only to register with it."""
    from rtpo.scenario.backends import _EXTENSIONS, _PROVIDERS

    providers = set(_PROVIDERS.values()) | {m for mods in _EXTENSIONS.values() for m in mods}
    graph = {m: _imports(m, p) for m, p in MODULES.items()}
    for m, targets in graph.items():
        if "rtpo.scenario.backends" in targets and m not in providers:
            targets.update(providers - {m})
    return graph


GRAPH = _graph()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def _is_test(mod: str) -> bool:
    return mod.rsplit(".", 1)[-1].startswith(("test_", "conftest"))


def test_no_import_cycle():
    assert _cycles(GRAPH) == []


def test_the_cycle_check_can_fail():
    # the mutant: the cycle this test was written against (config -> backends -> tabular.build -> eval -> config)
    graph = {k: set(v) for k, v in GRAPH.items()}
    graph["rtpo.tabular.build"].add("rtpo.commands.eval")
    graph["rtpo.commands.eval"].add("rtpo.scenario.load")
    assert _cycles(graph)


def test_no_product_module_imports_a_test_module():
    bad = [(m, t) for m, ts in GRAPH.items() if not _is_test(m) for t in ts if _is_test(t)]
    assert bad == []


def test_core_imports_no_backend():
    bad = [
        (m, t)
        for m, ts in GRAPH.items()
        if m == "rtpo.core" or m.startswith("rtpo.core.")
        for t in ts
        if any(t == p or t.startswith(p + ".") for p in BACKEND_PREFIXES)
    ]
    assert bad == []


@pytest.mark.parametrize(
    "name",
    sorted(
        m
        for m in MODULES
        if not _is_test(m) and not m.startswith(("rtpo.llm", "rtpo.distributed")) and "_launcher" not in m
    ),
)
def test_every_module_imports_on_its_own(name):
    importlib.import_module(name)


def _method_modules() -> set[str]:
    from rtpo.core.methods import method_modules

    return {f"rtpo.core.methods.{m}" for m in method_modules()}


def _method_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    methods = _method_modules()
    return sorted((m, t) for m in methods for t in graph[m] if t in methods)


def test_no_method_module_imports_another():
    # a method module imports only rtpo.core.methods.{base, flat, reverse} (SHARED_MODULES) and the core
    assert len(_method_modules()) >= 10
    assert _method_imports(GRAPH) == []


def test_the_method_import_check_can_fail():
    # the mutant: the layout this test was written against (gspo subclassing grpo's registered class)
    graph = {k: set(v) for k, v in GRAPH.items()}
    graph["rtpo.core.methods.gspo"].add("rtpo.core.methods.grpo")
    assert _method_imports(graph) == [("rtpo.core.methods.gspo", "rtpo.core.methods.grpo")]


# The floors, bottom up: a module imports only modules on its own floor or below (longest prefix wins).
FLOORS = {
    # 0: the algorithm
    "rtpo.core": 0,
    # 1: what the backends build on: the scenario's sections, the backend registry, plugins, and the run
    # folder's pieces that know nothing of a run (file layout, provenance, logs, trackers, plots)
    "rtpo.scenario.schema": 1,
    "rtpo.scenario.backends": 1,
    "rtpo.scenario.plugins": 1,
    "rtpo.rundir.checkpoint": 1,
    "rtpo.rundir.provenance": 1,
    "rtpo.rundir.logs": 1,
    "rtpo.rundir.trackers": 1,
    "rtpo.rundir.plots": 1,
    "rtpo.commands.common": 1,
    # 2: the backends
    "rtpo.tabular": 2,
    "rtpo.llm": 2,
    "rtpo.distributed": 2,
    "rtpo.worlds": 2,  # the wiring of the llm backend's exact worlds to the tabular task kinds (both)
    # 3: a whole scenario (parsed through the registry, i.e. above the backends) and the runner
    "rtpo.scenario": 3,
    "rtpo.rundir": 3,
    "rtpo.tabular.gym_env": 3,  # a Gymnasium env built from a scenario file: it loads one
    "rtpo.plan": 3,  # `rtpo plan`'s cost model: reads the backends' sections; the runner asks it check_fits
    # 4: the commands and the Python API
    "rtpo.commands": 4,
    "rtpo.compare": 4,
    "rtpo.verify": 4,
    "rtpo": 4,
}


def _floor(module: str) -> int:
    prefixes = [p for p in FLOORS if module == p or module.startswith(p + ".")]
    return FLOORS[max(prefixes, key=len)]


def _upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted(
        (m, t)
        for m, ts in graph.items()
        if not _is_test(m)
        for t in ts
        if t in graph and not _is_test(t) and _floor(t) > _floor(m)
    )


def test_no_module_imports_a_higher_floor():
    assert _upward_imports(GRAPH) == [], "a lower floor imports a higher one (see FLOORS)"


def test_the_floor_check_can_fail():
    # the mutants: a backend reaching up for the runner, a section model for the scenario parser
    graph = {k: set(v) for k, v in GRAPH.items()}
    graph["rtpo.llm.build"].add("rtpo.rundir.runner")
    graph["rtpo.scenario.schema"].add("rtpo.scenario.load")
    assert _upward_imports(graph) == [
        ("rtpo.llm.build", "rtpo.rundir.runner"),
        ("rtpo.scenario.schema", "rtpo.scenario.load"),
    ]


def test_every_module_has_a_floor():
    assert all(any(m == p or m.startswith(p + ".") for p in FLOORS) for m in MODULES)


def test_the_top_level_holds_packages_only():
    # the regrouping: no loose module (and no compatibility shim file) beside the subpackages
    loose = sorted(p.name for p in PKG.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert loose == [], f"modules at rtpo's top level: {loose}; put them in a subpackage (rtpo/__init__.py)"


def test_every_moved_path_imports_the_new_module_with_a_warning():
    import rtpo

    for old, new in rtpo.MOVED.items():
        assert new in MODULES and old not in MODULES, (old, new)
    # a fresh interpreter: the warning names the new path and points at the importing line, the module
    # object is the new one (so patching through the old path reaches it), `from rtpo import run` too
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import rtpo.rundir.runner, rtpo.scenario.schema\n"
        "try:\n    import rtpo.run\nexcept DeprecationWarning as w:\n    print('warned:', w)\n"
        "warnings.simplefilter('ignore')\n"
        "import rtpo.run\nfrom rtpo import schema\nfrom rtpo.config import load_scenario\n"
        "assert rtpo.run is rtpo.rundir.runner and schema is rtpo.scenario.schema\n"
        "assert load_scenario.__module__ == 'rtpo.scenario.load'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "warned: rtpo.run moved to rtpo.rundir.runner" in out.stdout and out.stdout.endswith("ok\n"), out.stdout


def test_python_m_on_a_new_path_runs_the_command():
    out = subprocess.run(
        [sys.executable, "-m", "rtpo.scenario.docs", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0 and "docs/config.md" in out.stdout + out.stderr, out.stderr


def _contributing_floors(text: str) -> dict[str, int]:
    """CONTRIBUTING.md's floors table as {module or package/: floor}: each row `| N | what | `path`, ... |`, a
    path `rtpo/a/` the package and everything in it (`rtpo.a.`), `rtpo/a/b.py` that module alone, `{x,y}` one
    entry per name (`__init__` the package's own module)."""
    table: dict[str, int] = {}
    for floor, cells in re.findall(r"^\| (\d) \|[^|]*\|(.*)\|$", text, re.M):
        for path in re.findall(r"`(rtpo/[^`]*)`", cells):
            m = re.fullmatch(r"(.*?)\{([^}]*)\}(.*)", path)
            for p in [m.group(1) + x + m.group(3) for x in m.group(2).split(",")] if m else [path]:
                if p.endswith("/"):
                    table[p.replace("/", ".")] = int(floor)
                else:
                    table[p.removesuffix(".py").replace("/", ".").removesuffix(".__init__")] = int(floor)
    return table


def _floor_map_mismatches(table: dict[str, int]) -> list[tuple[str, int | None, int]]:
    """(module, floor by the table or None where no row covers it, floor by FLOORS) where they differ."""
    out = []
    for m in sorted(MODULES):
        if m in table:
            documented = table[m]
        else:
            packages = [p for p in table if p.endswith(".") and (m + ".").startswith(p)]
            documented = table[max(packages, key=len)] if packages else None
        if documented != _floor(m):
            out.append((m, documented, _floor(m)))
    return out


def test_contributing_floors_table_maps_every_module_to_its_floor():
    table = _contributing_floors((ROOT / "CONTRIBUTING.md").read_text())
    assert len(table) >= 20, f"CONTRIBUTING.md's floors table not found or cut short: {table}"
    bad = _floor_map_mismatches(table)
    assert bad == [], f"CONTRIBUTING.md's floors table disagrees with FLOORS (module, table, FLOORS): {bad[:10]}"


def test_the_floors_table_check_can_fail():
    # the mutants: the table as it stood before rtpo/worlds/ and rtpo/rundir/report.py were added (no row
    # covers them), and a module listed on the wrong floor
    table = _contributing_floors((ROOT / "CONTRIBUTING.md").read_text())
    del table["rtpo.worlds."], table["rtpo.rundir.report"]
    missing = {m for m, doc, _ in _floor_map_mismatches(table) if doc is None}
    assert "rtpo.worlds" in missing and "rtpo.rundir.report" in missing, missing
    table = _contributing_floors((ROOT / "CONTRIBUTING.md").read_text())
    table["rtpo.rundir.plots"] = 3
    assert ("rtpo.rundir.plots", 3, 1) in _floor_map_mismatches(table)


def test_readme_layout_names_every_subpackage():
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```")[1]
    packages = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").is_file())
    missing = [p for p in packages if f"rtpo/{p}/" not in layout]
    assert missing == [], f"README's Layout leaves out rtpo/{missing}: a newcomer reading it misses them"
