"""CONTRIBUTING.md's worked examples run as written.

The estimator example: its `# contributing-example` code blocks are executed in order in one namespace.
The method example: the `# contributing-method: PATH` block is written as a module file into a scratch
package, its imports are held to the architecture rule (no other method module, no backend), it is
imported (which registers it), and the test functions of the `# contributing-method-test: PATH` block
run against it; every registration is undone afterwards.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "CONTRIBUTING.md").read_text()


def _block(marker: str) -> tuple[str, str]:
    """(path named after the marker, code) of the one block that starts with `# <marker>: PATH`."""
    found = re.findall(rf"```python\n# {marker}: (\S+)\n(.*?)```", TEXT, re.S)
    assert len(found) == 1, f"CONTRIBUTING.md: expected one `# {marker}: PATH` block, found {len(found)}"
    return found[0]


def test_contributing_example_runs(tmp_path):
    blocks = re.findall(r"```python\n# contributing-example\n(.*?)```", TEXT, re.S)
    assert len(blocks) >= 2
    from rtpo.core.estimators import ESTIMATORS

    namespace = {"OUT": tmp_path}
    with ESTIMATORS.temporary():
        for block in blocks:
            exec(compile(block, "CONTRIBUTING.md", "exec"), namespace)
        adv = ESTIMATORS.get("sibling_median")([[1.0, 0.0, 0.0]])
        assert adv.tolist() == [[1.0, 0.0, 0.0]]
    assert "sibling_median" not in ESTIMATORS


def _imported(code: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_the_method_example_is_one_file_that_follows_the_architecture():
    from rtpo.core.methods import SHARED_MODULES

    path, code = _block("contributing-method")
    assert path.startswith("rtpo/core/methods/") and path.endswith(".py")
    assert not (ROOT / path).exists(), f"{path} is the example; it must not shadow a real method"
    imported = _imported(code)
    shared = {f"rtpo.core.methods.{m}" for m in SHARED_MODULES}
    method_imports = {m for m in imported if m.startswith("rtpo.core.methods.")}
    assert method_imports <= shared, method_imports - shared  # no other method module
    assert all(m.startswith("rtpo.core") or "." not in m and m != "rtpo" for m in imported), imported
    assert not any(m.startswith(("rtpo.tabular", "rtpo.llm", "rtpo.distributed")) for m in imported)


def test_the_method_example_registers_and_passes_its_own_test(tmp_path, tabular_stack):
    from rtpo.core.methods import METHODS

    path, code = _block("contributing-method")
    test_path, test_code = _block("contributing-method-test")
    name = re.search(r'@register_method\("(\w+)"\)', code).group(1)
    assert name not in METHODS
    pkg = tmp_path / "contrib_example"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    file = pkg / Path(path).name
    file.write_text(code)
    mod_name = f"contrib_example.{file.stem}"
    with METHODS.temporary():
        spec = importlib.util.spec_from_file_location(mod_name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)  # registers the method
            assert name in METHODS
            namespace: dict = {"__name__": "contributing_method_test"}
            exec(compile(test_code, test_path, "exec"), namespace)
            tests = {k: f for k, f in namespace.items() if k.startswith("test_") and callable(f)}
            assert len(tests) >= 2
            fixtures = {"tabular_stack": tabular_stack}
            for i, fn in enumerate(tests.values()):
                params = inspect.signature(fn).parameters
                args = {p: fixtures[p] for p in params if p in fixtures}
                if "tmp_path" in params:
                    args["tmp_path"] = tmp_path / f"t{i}"
                    args["tmp_path"].mkdir()
                missing = set(params) - set(args)
                if missing:
                    pytest.fail(f"{test_path}: {fn.__name__} needs fixtures {missing} this runner does not provide")
                fn(**args)
        finally:
            sys.modules.pop(mod_name, None)
    assert name not in METHODS
