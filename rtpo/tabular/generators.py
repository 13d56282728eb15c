"""TurnMDP generators: random MDPs from a seed, the sparse-reward tool-use chain, aliasing context maps."""

from __future__ import annotations

import numpy as np

from rtpo.tabular.mdp import TurnMDP

# Above this many (s, a, s') cells the argsort draw would need S·A·S floats (10 GB for the 10⁵-state
# benchmark MDP); smaller MDPs keep the original draw, so existing seeds give the same MDPs.
_DENSE_DRAW_LIMIT = 1 << 22


def _distinct_successors(rng: np.random.Generator, S: int, A: int, B: int) -> np.ndarray:
    """(S, A, B) distinct successor ids per row in O(S·A·B): B sorted draws from 0..S−B, plus 0..B−1
    (a bijection from multisets onto B-subsets), in random order."""
    base = np.sort(rng.integers(0, S - B + 1, size=(S, A, B)), axis=-1) + np.arange(B)
    return np.take_along_axis(base, np.argsort(rng.random((S, A, B)), axis=-1), axis=-1)


def random_mdp(
    seed: int,
    num_turns: int = 3,
    num_states: int = 4,
    num_actions: int = 3,
    branching: int | None = None,
    gamma: float = 1.0,
    max_tau: int = 1,
    terminal_reward_only: bool = False,
    end_prob: float = 0.0,
    bernoulli_rewards: bool = False,
) -> TurnMDP:
    """A random TurnMDP with S states per turn.

    branching: successors per (s, a) (None = all S, a dense Dirichlet row); sparse rows make 10⁵-state
    MDPs cheap.  end_prob: chance that an (s, a) row ends the episode early.  terminal_reward_only: r is
    0 except on the last turn (and on rows that end early), as in the paper's sparse-reward tasks.
    """
    rng = np.random.default_rng(seed)
    K, S, A = num_turns, num_states, num_actions
    B = S if branching is None else min(branching, S)
    succ, prob, reward, tau = [], [], [], []
    for k in range(K):
        if B == S:
            sk = np.broadcast_to(np.arange(S), (S, A, S)).copy()
        elif S * A * S <= _DENSE_DRAW_LIMIT:
            sk = np.argsort(rng.random((S, A, S)), axis=-1)[..., :B]  # a uniform B-subset per row
        else:
            sk = _distinct_successors(rng, S, A, B)
        pk = rng.dirichlet(np.ones(B), size=(S, A))
        r = rng.random((S, A))
        ends = np.zeros((S, A), dtype=bool) if k < K - 1 else np.ones((S, A), dtype=bool)
        if k < K - 1 and end_prob > 0:
            ends = rng.random((S, A)) < end_prob
        pk[ends] = 0.0
        if terminal_reward_only:
            r = np.where(ends, r, 0.0)
        succ.append(sk)
        prob.append(pk)
        reward.append(r)
        tau.append(rng.integers(1, max_tau + 1, size=(S, A)))
    init = rng.dirichlet(np.ones(S))
    psi = tuple(np.arange(S) for _ in range(K))
    return TurnMDP(tuple(succ), tuple(prob), tuple(reward), tuple(tau), psi, init, S, gamma, bernoulli_rewards)


def tool_chain(
    num_turns: int = 6,
    num_actions: int = 4,
    p_advance: float = 0.8,
    seed: int = 0,
    sharpness: float = 2.0,
    gamma: float = 1.0,
    max_tau: int = 1,
) -> TurnMDP:
    """A sparse-reward tool-use chain: early turns must pick tools well; reward comes only at the end.

    State at boundary k: (p, ok) — p ∈ {0..k} tools used successfully so far, ok ∈ {0, 1} whether the
    previous tool call succeeded (the feedback the model just read).  At turn k < K−1 one tool
    (chosen by the seed, depending on k and p) is right: it advances p with probability p_advance;
    any other tool does nothing.  The last turn answers: reward ~ Bernoulli(((p + [right]) / K)^sharpness),
    so reward is binary, sparse and only at the end, and the value of an early tool depends on every
    later turn.  States are numbered s = 2p + ok; ψ is the identity (decision-sufficient).
    """
    if num_turns < 1 or num_actions < 2:
        raise ValueError("tool_chain needs num_turns >= 1 and num_actions >= 2")
    if not 0.0 < p_advance <= 1.0:
        raise ValueError("p_advance must be in (0, 1]")
    rng = np.random.default_rng(seed)
    K, A = num_turns, num_actions
    succ, prob, reward, tau = [], [], [], []
    for k in range(K):
        S = 2 * (k + 1)
        right = rng.integers(A, size=k + 1)  # right tool for each progress level p
        p_of = np.arange(S) // 2
        is_right = np.arange(A)[None, :] == right[p_of][:, None]  # (S, A)
        if k < K - 1:
            sk = np.zeros((S, A, 2), dtype=np.int64)
            pk = np.zeros((S, A, 2))
            # success: (p+1, ok=1); failure: (p, ok=0)
            sk[..., 0] = 2 * (p_of[:, None] + 1) + 1
            sk[..., 1] = 2 * p_of[:, None]
            pk[..., 0] = np.where(is_right, p_advance, 0.0)
            pk[..., 1] = 1.0 - pk[..., 0]
            r = np.zeros((S, A))
        else:
            sk = np.zeros((S, A, 1), dtype=np.int64)
            pk = np.zeros((S, A, 1))
            r = ((p_of[:, None] + is_right) / K) ** sharpness
        succ.append(sk)
        prob.append(pk)
        reward.append(r)
        tau.append(rng.integers(1, max_tau + 1, size=(S, A)))
    init = np.array([1.0, 0.0])
    psi = tuple(np.arange(2 * (k + 1)) for k in range(K))
    return TurnMDP(tuple(succ), tuple(prob), tuple(reward), tuple(tau), psi, init, 2 * K, gamma, bernoulli_rewards=True)


def last_feedback_psi(mdp: TurnMDP) -> tuple[np.ndarray, ...]:
    """For tool_chain: ψ keeps only the last feedback (ok bit), dropping the progress count — a
    truncation to the last turn that aliases decision-relevant history (the right tool depends on p)."""
    return tuple((np.arange(s) % 2).astype(np.int64) for s in mdp.num_states)


def modulo_psi(mdp: TurnMDP, num_contexts: int) -> tuple[np.ndarray, ...]:
    """A generic aliasing ψ: state s of every turn shows context s mod num_contexts."""
    if num_contexts < 1:
        raise ValueError("num_contexts must be >= 1")
    return tuple((np.arange(s) % num_contexts).astype(np.int64) for s in mdp.num_states)
