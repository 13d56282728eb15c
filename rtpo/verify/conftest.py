"""Suite-wide setup: the Hypothesis profile (rtpo.verify.profiles, the one definition the root conftest
shares; HYPOTHESIS_PROFILE selects ci, the default, or dev) and the active mutant.  RTPO_MUTANT=<name>
applies a deliberately broken variant from rtpo/verify/mutants.py before any test module is imported,
so `RTPO_MUTANT=no_sync pytest rtpo/verify` runs the suite against it.
"""

from __future__ import annotations

import os

import pytest

from rtpo.core.threads import torch_threads
from rtpo.verify.profiles import load_profile

load_profile()


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The claim tests run tiny tensors; one intra-op thread avoids thread hand-off costs that dominate them
    (and oversubscription on a shared 2-core machine).  Set per test of this folder and put back after it:
    this conftest is imported when `pytest` collects, so a module-level call would hold for tests/ too."""
    with torch_threads(1):
        yield


_MUTANT = os.environ.get("RTPO_MUTANT", "").strip()
if _MUTANT:
    from rtpo.verify import mutants

    try:
        _UNDO = mutants.activate(_MUTANT)  # held for the session (never called: the process ends)
    except KeyError as err:
        raise pytest.UsageError(str(err.args[0])) from None


def pytest_report_header(config):
    return f"rtpo verify: mutant={_MUTANT or '(none)'}"
