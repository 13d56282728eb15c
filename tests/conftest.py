"""Fixtures shared by the tests under tests/."""

from __future__ import annotations

import pytest


@pytest.fixture
def tabular_stack():
    """The tabular stack factory of tests/_method_helpers.stack: `tabular_stack(mdp=None, K=3, seed=0,
    lr=0.1, truncate=False, ...)` -> (mdp, policy, RunContext) on tool_chain(K) or `mdp`."""
    from tests._method_helpers import stack

    return stack
