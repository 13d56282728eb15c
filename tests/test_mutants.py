"""Every mutant in rtpo/verify/mutants.py is killed by the claim suite (the suite's tests can fail).

The fast form of `rtpo verify --mutants`: in this process, each mutant is applied, its designated killer
claim tests are called directly, and the mutant is undone; the same killers must pass with no mutant.
"""

from __future__ import annotations

import importlib

import pytest

from rtpo.verify import cli, mutants
from rtpo.verify.profiles import load_profile

load_profile()
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py puts the count back)


def test_registry_has_at_least_ten_mutants_with_killers():
    assert len(mutants.names()) >= 10
    for name in mutants.names():
        m = mutants.get(name)
        assert m.killers and m.modules and m.description
        for fn, node in zip(m.killers, mutants.killer_nodes(name)):
            assert "::" not in fn and "/" not in fn, fn  # named by the claim test's name, not its node id
            path = cli.REPO_ROOT / node.split("::")[0]
            assert path.exists() and path.name in m.modules, node  # the --mutants run executes its module
            assert f"def {fn}(" in path.read_text(), node


def test_killer_tests_pass_without_mutants():
    for node in sorted({t for n in mutants.names() for t in mutants.killer_nodes(n)}):
        path, name = node.split("::")
        getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)()


@pytest.mark.parametrize("name", mutants.names())
def test_mutant_is_killed(name):
    assert mutants.killed_by(name), f"mutant {name!r} survived its killer tests {mutants.get(name).killers}"


def test_verify_cli_rejects_bad_arguments_in_one_line(capsys):
    assert cli.main(["--bogus"]) == 2
    assert cli.main(["--mutants", "--only", "no_such_mutant"]) == 2
    assert cli.main(["--jobs", "0", "--mutants"]) == 2
    out = capsys.readouterr()
    lines = [ln for ln in (out.out + out.err).splitlines() if ln.strip()]
    assert len(lines) == 3 and all(ln.startswith("rtpo verify: ") for ln in lines), lines
    assert any("no_such_mutant" in ln and "cross_state_baseline" in ln for ln in lines)


def test_estimator_mutants_go_through_the_registry_override_and_undo():
    from rtpo.core.estimators import ESTIMATORS, sibling_advantage

    undo = mutants.activate("cross_state_baseline")
    try:
        assert ESTIMATORS.get("sibling_mean") is not sibling_advantage
        from rtpo.core import estimators

        assert estimators.sibling_advantage is sibling_advantage  # the module's own name is untouched
    finally:
        undo()
    assert ESTIMATORS.get("sibling_mean") is sibling_advantage


def test_an_unknown_killer_name_is_a_clear_error():
    with pytest.raises(KeyError, match="test_T9_no_such_claim.*no claim module"):
        mutants.find_claim_test("test_T9_no_such_claim")


def test_a_mutant_stays_active_when_its_undo_handle_is_dropped():
    """Under RTPO_MUTANT the verify conftest activates a mutant for the whole session; a dropped undo
    handle must not let the garbage collector undo it (it did, once, for every estimator mutant)."""
    import gc

    from rtpo.core.estimators import ESTIMATORS, sibling_advantage

    with ESTIMATORS.temporary():
        mutants.activate("cross_state_baseline")  # the undo handle is dropped at once
        gc.collect()
        assert ESTIMATORS.get("sibling_mean") is not sibling_advantage
    assert ESTIMATORS.get("sibling_mean") is sibling_advantage


def test_the_subprocess_form_kills_an_estimator_mutant():
    """What `rtpo verify --mutants` does, for one mutant and its killers: pytest in a subprocess with
    RTPO_MUTANT set must fail them (the in-process killed_by above cannot see a conftest-side bug)."""
    targets = [str(cli.REPO_ROOT / n) for n in mutants.killer_nodes("cross_state_baseline")]
    res = cli.run_pytest(targets, mutant="cross_state_baseline")
    assert res.returncode != 0 and res.failed, res
