"""The Gymnasium adapter (rtpo.tabular.gym_env): a valid gymnasium.Env by Gymnasium's own checker, the
MDP's dynamics and values, and snapshot/restore forking from a turn boundary."""

from __future__ import annotations

import numpy as np
import pytest

gymnasium = pytest.importorskip("gymnasium")

from gymnasium.utils.env_checker import check_env  # noqa: E402

from rtpo.tabular import solve, tool_chain  # noqa: E402
from rtpo.tabular.generators import random_mdp  # noqa: E402
from rtpo.tabular.gym_env import TurnMDPEnv  # noqa: E402


@pytest.mark.parametrize(
    "mdp",
    [
        tool_chain(num_turns=3, num_actions=3, p_advance=0.8, seed=0),
        tool_chain(num_turns=3, num_actions=3, seed=1, max_tau=3, gamma=0.9, early_answer=True),
    ],
    ids=["tool_chain", "tau_gamma_early_end"],
)
def test_gymnasium_env_checker_passes(mdp):
    env = TurnMDPEnv(mdp)
    check_env(env, skip_render_check=True)
    check_env(TurnMDPEnv.from_scenario(None), skip_render_check=True)


def test_monte_carlo_return_of_the_optimal_policy_is_v_star():
    """Acting with the exact optimal policy through the Gym interface, the discounted returns (each reward
    times info["discount"]) average to V* (backward induction) within the sampling error."""
    mdp = tool_chain(num_turns=3, num_actions=3, seed=2, max_tau=2, gamma=0.95)
    sol = solve(mdp)
    env = TurnMDPEnv(mdp)
    returns = []
    env.reset(seed=7)
    for _ in range(4000):
        obs, info = env.reset()
        ret, done = 0.0, False
        while not done:
            action = int(np.argmax(sol.policy[info["turn"], info["state"]]))
            obs, reward, done, truncated, info = env.step(action)
            ret += info["discount"] * reward
            assert not truncated
        returns.append(ret)
    returns = np.asarray(returns)
    assert abs(returns.mean() - sol.value) < 4 * returns.std() / np.sqrt(len(returns)) + 1e-12


def test_snapshot_restore_forks_from_a_turn_boundary():
    mdp = random_mdp(num_turns=3, num_states=5, num_actions=3, branching=3, seed=4)
    env = TurnMDPEnv(mdp)
    obs0, info0 = env.reset(seed=0)
    env.step(1)
    snap = env.snapshot()
    first = env.step(2)
    seen = {first[0]}
    for _ in range(30):  # siblings: the same boundary, fresh draws of what follows
        obs, info = env.restore(snap)
        assert (info["turn"], obs) == (snap[0], info["turn"] * mdp.num_contexts + info["context"])
        seen.add(env.step(2)[0])
    assert len(seen) > 1  # the continuation is random, and forks do not replay one draw
    # the same seed replays the same episode: determinism comes from reset(seed=), not from restore
    a = [TurnMDPEnv(mdp).reset(seed=3)[0] for _ in range(2)]
    assert a[0] == a[1]


def test_bad_actions_and_snapshots():
    env = TurnMDPEnv(tool_chain(num_turns=3, num_actions=3, seed=0))
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(7)  # malformed output ends the episode, no crash
    assert (reward, terminated, info["malformed"]) == (0.0, True, True)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(0)
    with pytest.raises(ValueError, match="not a snapshot"):
        env.restore("nonsense")
    with pytest.raises(ValueError, match="does not belong to its turn"):
        env.restore((2, 0, 0, False))  # state 0 is a turn-0 state
    with pytest.raises(TypeError, match="TurnMDP"):
        TurnMDPEnv("not an mdp")


def test_the_docs_example_runs():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "python-api.md").read_text()
    block = re.search(r"## A Gymnasium environment.*?```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(block, "docs/python-api.md", "exec"), namespace)
    assert namespace["env"].snapshot() == namespace["snap"]


@pytest.mark.parametrize("action", [np.uint64(2**63), np.uint64(2**64 - 1), 2**200, -(2**70), np.int64(-1)])
def test_an_action_id_outside_int64_is_a_malformed_step(action):
    """The docstring's promise: any action that is not one of the MDP's is a malformed step, never an
    exception (np.uint64(2**63) used to overflow the int64 token array)."""
    env = TurnMDPEnv(tool_chain(num_turns=3, num_actions=3, seed=0))
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, info["malformed"]) == (0.0, True, True), info
