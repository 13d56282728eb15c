"""Fixtures and the tier rule shared by the tests under tests/.

The slow tier (`pytest -m slow`; plain `pytest` deselects it, see pyproject.toml) holds the tests marked
`@pytest.mark.slow` by hand (longer than ~20 s on 2 cores: whole runs, subprocess trainings, multi-process
FSDP) and, by the rule below, every test that starts Ray or vLLM: one that uses the `ray_cluster` or
`vllm_session_engine` fixture, or runs the `engine` fixture's vllm parameter.  A test that reaches those
fixtures only through `request.getfixturevalue` is marked by hand.
"""

from __future__ import annotations

import pytest

STARTS_RAY_OR_VLLM = frozenset({"ray_cluster", "vllm_session_engine"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if STARTS_RAY_OR_VLLM & set(getattr(item, "fixturenames", ())) or params.get("engine") == "vllm":
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def one_torch_thread():
    """torch with one intra-op thread for the test, the process's count put back after it (a module-level
    set_num_threads would hold for every test collected after it)."""
    from rtpo.core.threads import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture
def tabular_stack():
    """The tabular stack factory of tests/_method_helpers.stack: `tabular_stack(mdp=None, K=3, seed=0,
    lr=0.1, truncate=False, ...)` -> (mdp, policy, RunContext) on tool_chain(K) or `mdp`."""
    from tests._method_helpers import stack

    return stack
