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
    bernoulli: bool = True,
    early_answer: bool = False,
) -> TurnMDP:
    """A sparse-reward tool-use chain: early turns must pick tools well; reward comes only at the end.

    State at boundary k: (p, ok) — p ∈ {0..k} tools used successfully so far, ok ∈ {0, 1} whether the
    previous tool call succeeded (the feedback the model just read).  At turn k < K−1 one tool
    (chosen by the seed, depending on k and p) is right: it advances p with probability p_advance;
    any other tool does nothing.  The last turn answers: reward ((p + [right]) / K)^sharpness, drawn
    as a Bernoulli coin with that mean when `bernoulli` (binary, verifiable-looking but noisy) or paid
    exactly when not (a deterministic reward), so the value of an early tool depends on every later
    turn.  early_answer: at turns k < K−1 the last action (A−1) answers at once — the episode ends
    with reward (p / K)^sharpness — so episodes can end before K (as math and search episodes do);
    the right tool is then drawn from the other A−1.  States are numbered s = 2p + ok; ψ is the
    identity (decision-sufficient).
    """
    return region_chain(
        num_turns, num_actions, p_advance, seed, sharpness, gamma, max_tau, bernoulli, early_answer, w=0.0
    )


def region_chain(
    num_turns: int = 6,
    num_actions: int = 4,
    p_advance: float = 0.8,
    seed: int = 0,
    sharpness: float = 2.0,
    gamma: float = 1.0,
    max_tau: int = 1,
    bernoulli: bool = False,
    early_answer: bool = False,
    w: float = 0.8,
    p_region: float = 0.5,
) -> TurnMDP:
    """The tool chain plus an exogenous upstream event that sets a share w of the reward.

    After turn 0 (whatever tool was picked) the environment draws a region bit g ~ Bernoulli(p_region)
    that the agent cannot influence; it stays fixed for the rest of the episode.  Every reward the
    tool chain pays (the answer's, and an early answer's) becomes
        (1 − w) · (tool-chain reward) + w · g,
    so with w large the value of the state reached at turn k ≥ 1 explains most of Var(R): σ_V²(k) is
    large (Theorem 2's regime where a sibling baseline, which shares g, removes what a group baseline
    over whole trajectories, which redraws g, cannot).  With K = 1 there is no transition, so g is
    drawn with the start state.  States at boundary k: s = g · 2(k+1) + 2p + ok, with one region
    block at k = 0 (two for K = 1) and two afterwards; w = 0 is exactly tool_chain (one block).
    """
    if num_turns < 1 or num_actions < 2:
        raise ValueError("tool_chain needs num_turns >= 1 and num_actions >= 2")
    if early_answer and num_actions < 3:
        raise ValueError("early_answer needs num_actions >= 3 (a right tool, a wrong one and the answer)")
    if not 0.0 < p_advance <= 1.0:
        raise ValueError("p_advance must be in (0, 1]")
    if not 0.0 <= w <= 1.0:
        raise ValueError("w must be in [0, 1]")
    if not 0.0 < p_region < 1.0:
        raise ValueError("p_region must be in (0, 1)")
    rng = np.random.default_rng(seed)
    K, A = num_turns, num_actions
    regions = w > 0.0

    def blocks(k: int) -> int:
        return 2 if regions and (k >= 1 or K == 1) else 1

    ans = A - 1 if early_answer else -1
    n_tools = A - 1 if early_answer else A
    succ, prob, reward, tau = [], [], [], []
    for k in range(K):
        per = 2 * (k + 1)
        G = blocks(k)
        S = G * per
        right = rng.integers(n_tools, size=k + 1)  # right tool for each progress level p
        g_of = np.arange(S) // per
        p_of = (np.arange(S) % per) // 2
        is_right = np.arange(A)[None, :] == right[p_of][:, None]  # (S, A)
        chain = lambda prog: (prog / K) ** sharpness  # noqa: E731
        if k < K - 1:
            nxt_per = 2 * (k + 2)
            split = blocks(k + 1) > G  # the region is drawn on this transition
            Bk = 4 if split else 2
            sk = np.zeros((S, A, Bk), dtype=np.int64)
            pk = np.zeros((S, A, Bk))
            adv = np.where(is_right, p_advance, 0.0)
            # success: (p+1, ok=1); failure: (p, ok=0), within the region block
            ok_s = 2 * (p_of[:, None] + 1) + 1
            fail_s = 2 * p_of[:, None] + 0 * is_right
            if split:
                for g, pg in ((0, 1.0 - p_region), (1, p_region)):
                    sk[..., 2 * g] = g * nxt_per + ok_s
                    sk[..., 2 * g + 1] = g * nxt_per + fail_s
                    pk[..., 2 * g] = pg * adv
                    pk[..., 2 * g + 1] = pg * (1.0 - adv)
            else:
                sk[..., 0] = g_of[:, None] * nxt_per + ok_s
                sk[..., 1] = g_of[:, None] * nxt_per + fail_s
                pk[..., 0] = adv
                pk[..., 1] = 1.0 - adv
            r = np.zeros((S, A))
            if early_answer:
                pk[:, ans] = 0.0  # answering ends the episode
                if split:
                    # the region is drawn on this transition: the expected region reward
                    r[:, ans] = (1.0 - w) * chain(p_of) + w * p_region
                else:
                    r[:, ans] = (1.0 - w) * chain(p_of) + w * g_of
        else:
            sk = np.zeros((S, A, 1), dtype=np.int64)
            pk = np.zeros((S, A, 1))
            r = (1.0 - w) * chain(p_of[:, None] + is_right) + w * g_of[:, None]
        succ.append(sk)
        prob.append(pk)
        reward.append(r)
        tau.append(rng.integers(1, max_tau + 1, size=(S, A)))
    init = np.zeros(2 * blocks(0))
    if blocks(0) == 2:  # K = 1: the region comes with the start state
        init[0], init[2] = 1.0 - p_region, p_region
    else:
        init[0] = 1.0
    psi = tuple(np.arange(blocks(k) * 2 * (k + 1)) for k in range(K))
    nc = max(p.size for p in psi)
    return TurnMDP(
        tuple(succ), tuple(prob), tuple(reward), tuple(tau), psi, init, nc, gamma, bernoulli_rewards=bernoulli
    )


def last_feedback_psi(mdp: TurnMDP) -> tuple[np.ndarray, ...]:
    """For tool_chain: ψ keeps only the last feedback (ok bit), dropping the progress count — a
    truncation to the last turn that aliases decision-relevant history (the right tool depends on p)."""
    return tuple((np.arange(s) % 2).astype(np.int64) for s in mdp.num_states)


def modulo_psi(mdp: TurnMDP, num_contexts: int) -> tuple[np.ndarray, ...]:
    """A generic aliasing ψ: state s of every turn shows context s mod num_contexts."""
    if num_contexts < 1:
        raise ValueError("num_contexts must be >= 1")
    return tuple((np.arange(s) % num_contexts).astype(np.int64) for s in mdp.num_states)
