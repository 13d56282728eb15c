"""A Gymnasium environment over a tabular turn-boundary MDP (extra `gym`: `pip install rtpo[gym]`).

    from rtpo.tabular.gym_env import TurnMDPEnv
    env = TurnMDPEnv(tool_chain(num_turns=4))          # or TurnMDPEnv.from_scenario("scenarios/tabular/aliased.yaml")
    obs, info = env.reset(seed=0)
    snap = env.snapshot()                              # the turn boundary (turn, state)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    obs, info = env.restore(snap)                      # back to the boundary: fork another continuation

One step is one turn (one macro-action of Eq. 19).  The dynamics are rtpo's own tabular environment
(rtpo.tabular.backend.TabularEnv, one episode), so a Gymnasium agent and an rtpo method see the same
MDP with the same randomness rules.

- observation: Discrete(K * C), the index `turn * C + context`: what a policy sees at turn k is ψ_k(s),
  the context (the MDP's ψ; identity ψ gives every state its own context).  `info` has "turn", "context"
  and "state" (the state index within its turn's state space).
- action: Discrete(A).  An action outside it is malformed model output, not an error: the episode ends
  with reward 0 and `info["malformed"]` True, as in an rtpo rollout.
- reward: r_k(s, a) of this turn (a Bernoulli draw when the MDP has Bernoulli rewards); `info["tau"]` is
  the turn's token duration τ_k, and `info["discount"]` is γ^(steps before this turn), the factor of this
  reward in the discounted return of Eq. 19.
- terminated: the episode ended (the last turn, or an (s, a) with no successor); truncated: never.
- snapshot() / restore(snap): the turn-boundary state, a tuple of plain ints; restore does not touch the
  random generator, so continuations forked from one snapshot are independent draws (RTPO's siblings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

try:
    import gymnasium
    from gymnasium import spaces
except ModuleNotFoundError as e:  # pragma: no cover - exercised only without the extra
    raise ModuleNotFoundError("rtpo.tabular.gym_env needs gymnasium: pip install 'rtpo[gym]'", name=e.name) from None

from rtpo.core.types import Generation, Ragged
from rtpo.tabular.backend import TabularEnv, TabularEpisodes
from rtpo.tabular.mdp import TurnMDP


class TurnMDPEnv(gymnasium.Env):
    """gymnasium.Env over a TurnMDP; see the module docstring for the spaces and the snapshot API."""

    metadata = {"render_modes": []}

    def __init__(self, mdp: TurnMDP) -> None:
        if not isinstance(mdp, TurnMDP):
            raise TypeError(f"mdp must be a rtpo.tabular TurnMDP, got {type(mdp).__name__}")
        super().__init__()
        self.mdp = mdp
        self._env = TabularEnv(mdp)
        K, C, A = mdp.num_turns, mdp.num_contexts, mdp.num_actions
        self.observation_space = spaces.Discrete(K * C)
        self.action_space = spaces.Discrete(A)
        self._ep: TabularEpisodes | None = None
        self._elapsed = 0  # token steps before the current turn (for the discount)
        self._done = True

    @classmethod
    def from_scenario(cls, scenario: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()):
        """The MDP of a tabular scenario file (None = the embedded default), seen through its ψ."""
        from rtpo.scenario.load import ConfigError, load_scenario
        from rtpo.tabular.build import build_mdp

        cfg = load_scenario(scenario, list(overrides))
        if cfg.backend.kind != "tabular":
            raise ConfigError(
                f"backend.kind: a Gymnasium TurnMDPEnv needs a tabular scenario, got {cfg.backend.kind!r}"
            )
        return cls(build_mdp(cfg.task))

    # -- observations ---------------------------------------------------------------------------------
    def _obs_info(self) -> tuple[int, dict[str, Any]]:
        ep = self._ep
        turn = int(ep.turn[0])
        context = int(self._env._psi[ep.state[0]])
        state = int(self._env.local_state(ep)[0])
        return turn * self.mdp.num_contexts + context, {"turn": turn, "context": context, "state": state}

    # -- gymnasium.Env ----------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._ep = self._env.reset(np.zeros(1, dtype=np.int64), self.np_random)
        self._elapsed, self._done = 0, False
        return self._obs_info()

    def step(self, action):
        if self._ep is None or self._done:
            raise RuntimeError("TurnMDPEnv.step: call reset() (or restore()) first; the episode has ended")
        a = int(action) if np.ndim(action) == 0 and np.issubdtype(np.asarray(action).dtype, np.integer) else -1
        if not 0 <= a <= np.iinfo(np.int64).max:  # np.uint64(2**63) and the like: no action id, malformed
            a = -1
        tokens = Ragged.from_dense(np.array([[a]], dtype=np.int64))
        gen = Generation(tokens, Ragged.from_dense(np.zeros((1, 1))))
        discount = float(self.mdp.gamma**self._elapsed)
        self._ep, out = self._env.step(self._ep, gen, self.np_random)
        tau = int(out.duration[0])
        self._elapsed += tau
        self._done = bool(out.done[0])
        obs, info = self._obs_info()
        info.update({"tau": tau, "discount": discount, "malformed": bool(out.malformed[0])})
        return obs, float(out.reward[0]), self._done, False, info

    # -- forking ----------------------------------------------------------------------------------------
    def snapshot(self) -> tuple[int, int, int, bool]:
        """(turn, flat state, token steps elapsed, done) of the current turn boundary."""
        if self._ep is None:
            raise RuntimeError("TurnMDPEnv.snapshot: call reset() first")
        return int(self._ep.turn[0]), int(self._ep.state[0]), int(self._elapsed), bool(self._done)

    def restore(self, snap: tuple[int, int, int, bool]):
        """Return to a snapshot's boundary; returns (observation, info) as reset() does."""
        try:
            turn, state, elapsed, done = (int(snap[0]), int(snap[1]), int(snap[2]), bool(snap[3]))
        except (TypeError, ValueError, IndexError):
            raise ValueError(f"TurnMDPEnv.restore: not a snapshot of this environment: {snap!r}") from None
        if not 0 <= state < int(self.mdp.state_offset[-1]) or elapsed < 0:
            raise ValueError(f"TurnMDPEnv.restore: not a snapshot of this environment: {snap!r}")
        self._ep = self._env.restore([np.array([turn, state])])  # checks the state belongs to the turn
        self._elapsed, self._done = elapsed, done
        return self._obs_info()
