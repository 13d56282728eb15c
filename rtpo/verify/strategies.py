"""Hypothesis strategies for the claim tests: tiny TurnMDPs, full-support policies, group sizes, clip ranges.

Randomness inside an example comes from a drawn integer seed fed to numpy's default_rng, so a failure
replays and shrinks (STYLE.md).  Sizes stay tiny: exact enumeration is exponential in them.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from rtpo.tabular import TurnMDP, random_mdp

seeds = st.integers(min_value=0, max_value=2**31 - 1)
group_sizes = st.integers(min_value=2, max_value=6)
informative_group_sizes = st.integers(min_value=3, max_value=6)
clip_ranges = st.sampled_from([0.05, 0.1, 0.2, 0.28, 0.5])


@st.composite
def small_mdps(
    draw, max_turns: int = 3, max_states: int = 3, max_actions: int = 3, bernoulli: bool | None = None
) -> TurnMDP:
    """A random TurnMDP with sparse terminal rewards, γ = 1 and no early endings (the paper's setting,
    where the return counted from turn k is the whole episode's return)."""
    K = draw(st.integers(1, max_turns))
    S = draw(st.integers(2, max_states))
    A = draw(st.integers(2, max_actions))
    bern = draw(st.booleans()) if bernoulli is None else bernoulli
    return random_mdp(
        draw(seeds), num_turns=K, num_states=S, num_actions=A, terminal_reward_only=True, bernoulli_rewards=bern
    )


def random_policy(mdp: TurnMDP, seed: int, concentration: float = 1.0) -> np.ndarray:
    """A full-support policy over contexts: (K, C, A) rows drawn from Dirichlet(concentration)."""
    rng = np.random.default_rng(seed)
    pi = rng.dirichlet(np.full(mdp.num_actions, concentration), size=(mdp.num_turns, mdp.num_contexts))
    return np.maximum(pi, 1e-3) / np.maximum(pi, 1e-3).sum(-1, keepdims=True)


@st.composite
def mdp_and_policy(draw, **kw) -> tuple[TurnMDP, np.ndarray]:
    mdp = draw(small_mdps(**kw))
    return mdp, random_policy(mdp, draw(seeds))


@st.composite
def categorical_pairs(draw, max_vocab: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(π_new, π_old) over a vocabulary of 2..max_vocab tokens, both with full support."""
    v = draw(st.integers(2, max_vocab))
    rng = np.random.default_rng(draw(seeds))
    old, new = rng.dirichlet(np.ones(v), size=2)
    old, new = np.maximum(old, 0.02), np.maximum(new, 0.02)
    return new / new.sum(), old / old.sum()


@st.composite
def token_log_ratios(draw, max_len: int = 8) -> np.ndarray:
    """Per-token log-ratios log ρ_t of a continuation of 1..max_len tokens, |log ρ| ≤ 1."""
    n = draw(st.integers(1, max_len))
    return np.asarray(draw(st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=n, max_size=n)))
