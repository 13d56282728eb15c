"""Every mutant in rtpo/verify/mutants.py is killed by the claim suite (the suite's tests can fail).

The fast form of `rtpo verify --mutants`: in this process, each mutant is applied, its designated killer
claim tests are called directly, and the mutant is undone; the same killers must pass with no mutant.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from rtpo.verify import cli, mutants

mutants.ensure_profile()
torch.set_num_threads(1)


def test_registry_has_at_least_ten_mutants_with_killers():
    assert len(mutants.names()) >= 10
    for name in mutants.names():
        m = mutants.get(name)
        assert m.killers and m.modules and m.description
        for node in m.killers:
            path = cli.REPO_ROOT / node.split("::")[0]
            assert path.exists(), node
            assert f"def {node.split('::')[1]}(" in path.read_text(), node


def test_killer_tests_pass_without_mutants():
    for node in sorted({t for n in mutants.names() for t in mutants.get(n).killers}):
        path, name = node.split("::")
        getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)()


@pytest.mark.parametrize("name", mutants.names())
def test_mutant_is_killed(name):
    assert mutants.killed_by(name), f"mutant {name!r} survived its killer tests {mutants.get(name).killers}"
