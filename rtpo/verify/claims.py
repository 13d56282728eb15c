"""Shared pieces of the claim tests: the exact computations and settings that both the tests
(rtpo/verify/test_*.py) and `rtpo verify --report` use.  Product code imports these, never a test module.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from rtpo.core import estimators
from rtpo.core.loss import FlatBatch, LossConfig, clipped_policy_loss
from rtpo.core.train import turn_rows
from rtpo.core.types import Generation, Ragged, Trajectory
from rtpo.tabular import (
    LogLinear,
    SoftmaxTable,
    TabularEnv,
    TabularSampler,
    TurnMDP,
    evaluate,
    last_feedback_psi,
    state_distribution,
    tool_chain,
)
from rtpo.verify import exact

VOCAB = 12


class TinyCausalLM(torch.nn.Module):
    """logits_t = W · mean(embed(x_<t)) + b: position t sees only earlier tokens (a causal LM in miniature)."""

    def __init__(self, seed: int = 0, dim: int = 6) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.nn.Parameter(torch.randn(VOCAB, dim, generator=g, dtype=torch.float64))
        self.out = torch.nn.Parameter(torch.randn(dim, VOCAB, generator=g, dtype=torch.float64))
        self.bias = torch.nn.Parameter(torch.randn(VOCAB, generator=g, dtype=torch.float64))

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        e = self.embed[seq]  # (L, D)
        prev = torch.cat([torch.zeros_like(e[:1]), torch.cumsum(e, 0)[:-1]])  # sum of tokens before t
        count = torch.arange(seq.numel(), dtype=e.dtype).clamp(min=1)[:, None]
        return (prev / count) @ self.out + self.bias  # (L, V): row t scores token t


def make_sibling(prefix, response, feedback, next_response, model) -> Trajectory:
    """A sibling forked at boundary k: turn k (context c_k = prefix) and turn k+1 (context c_k∘l_k∘f_k)."""
    c_k = np.array(prefix)
    c_kp1 = np.concatenate([c_k, response, feedback])
    seq = torch.as_tensor(np.concatenate([c_kp1, next_response]))
    with torch.no_grad():
        lp_all = torch.log_softmax(model(seq), -1).gather(1, seq[:, None]).squeeze(1).numpy()
    lp_k = lp_all[len(c_k) : len(c_k) + len(response)]
    lp_kp1 = lp_all[len(c_kp1) :]
    return Trajectory(
        contexts=Ragged.from_rows([c_k, c_kp1], dtype=np.int64),
        tokens=Ragged.from_rows([np.array(response), np.array(next_response)], dtype=np.int64),
        logp=Ragged.from_rows([lp_k, lp_kp1]),
        rewards=np.array([0.0, 1.0 if sum(response) % 2 else 0.0]),
        durations=np.ones(2),
        malformed=np.zeros(2, bool),
        query_id=0,
        start_turn=1,
    )


def shared_setting(seed: int = 0) -> tuple[TurnMDP, LogLinear, np.ndarray, np.ndarray]:
    """(MDP seen through the truncating ψ, shared-θ LogLinear policy, θ, full-context id of every state)."""
    base = tool_chain(num_turns=3, num_actions=3, seed=seed)
    n_full = max(base.num_states)
    trunc = tuple(n_full + p for p in last_feedback_psi(base))  # truncated contexts after the full ones
    mdp = base.with_psi(trunc, num_contexts=n_full + 2)
    rng = np.random.default_rng(seed + 100)
    features = rng.standard_normal((mdp.num_turns, n_full + 2, mdp.num_actions, 5))
    policy = LogLinear(features)
    theta = rng.standard_normal(5)
    return mdp, policy, theta, np.arange(n_full)


def exact_rows(mdp, policy, theta, full_ids, k):
    """Every (state, action) of turn k reachable under the rollout policy, with its rollout probability."""
    pi = policy.table(theta)
    d = state_distribution(mdp, pi)[k]
    states = np.flatnonzero(d > 0)
    trunc_ctx = mdp.psi[k][states]
    p_roll = pi[k][trunc_ctx]  # (n, A) π_old(· | ψ(S_k))
    p_full = pi[k][full_ids[states]]  # (n, A) π_old(· | S_k) under the same θ
    return d[states] / d[states].sum(), states, trunc_ctx, p_roll, p_full


def all_sequences(vocab: int, n: int) -> np.ndarray:
    return np.array(list(itertools.product(range(vocab), repeat=n)), dtype=np.int64).reshape(-1, n)


def sequence_weight(logp_new: np.ndarray, logp_old: np.ndarray) -> np.ndarray:
    """ω through the core's trajectory weight with the clamp switched off ([0, ∞))."""
    return estimators.clamped_trajectory_weight(logp_new, logp_old, 0.0, np.inf)


def iid_weight_variance(new: np.ndarray, old: np.ndarray, n: int) -> tuple[float, float]:
    """Exact E[ω] and Var(ω) over all V^n continuations drawn i.i.d. from `old`."""
    seqs = all_sequences(new.size, n)
    p = np.prod(old[seqs], axis=1)
    w = sequence_weight(np.log(new)[seqs], np.log(old)[seqs])
    m = float(p @ w)
    return m, float(p @ (w - m) ** 2)


def mse_comparison(mdp: TurnMDP, pi: np.ndarray, k: int, G: int) -> dict[str, float]:
    """Exact marginal MSEs of both estimators against A^π(S_k, u), (S_k, u) ~ d_k × π_k, and the
    moments of the closed form: σ_V² = Var_{S_k} V(S_k), E[σ_Q²] = E Var(R | S_k, u), E[A²]."""
    ev = evaluate(mdp, pi)
    d = state_distribution(mdp, pi)[k]
    d = d / d.sum()
    full = exact.initial_return_distribution(mdp, pi)
    mu = float(full[1] @ full[0])
    sib, traj = estimators.get("sibling_mean"), estimators.get("group_mean")
    out = dict(mse_sibling=0.0, mse_traj=0.0, sigma_v2=float(d @ (ev.v[k] - mu) ** 2), e_sigma_q2=0.0, e_a2=0.0)
    for s in np.flatnonzero(d > 0):
        others = exact.state_return_distribution(mdp, pi, k, s)
        for u in range(mdp.num_actions):
            w = d[s] * pi[k][mdp.psi[k][s], u]
            if w == 0:
                continue
            own = exact.state_return_distribution(mdp, pi, k, s, u)
            a_pi = ev.q[k][s, u] - ev.v[k][s]
            out["mse_sibling"] += w * exact.group_expectation(sib, own, others, G - 2, a_pi)[1]
            out["mse_traj"] += w * exact.group_expectation(traj, own, full, G - 1, a_pi)[1]
            out["e_sigma_q2"] += w * exact.mean_var(own)[1]
            out["e_a2"] += w * a_pi**2
    out["gap"] = out["mse_traj"] - out["mse_sibling"]
    out["gap_closed_form"] = (G - 1) / G * out["sigma_v2"] + (out["e_sigma_q2"] - out["e_a2"]) / (G * (G - 1))
    return out


def counterexample_t2b() -> TurnMDP:
    """One turn, two equally likely states, two actions, deterministic rewards: σ_V² > 0 but small,
    E[A²] large, no downstream noise.  The minimal MDP where the trajectory estimator wins."""
    P = np.zeros((1, 2, 2, 2))
    R = np.array([[[1.0, 0.0], [1.0, 0.1]]])
    return TurnMDP.from_arrays(P, R, np.array([0.5, 0.5]))


def robbins_monro_turn(mdp: TurnMDP, k: int, pi_star: np.ndarray, blocks: int, block: int, seed: int):
    """Tabular Robbins–Monro at turn k (Eq. 24) with downstream turns frozen at π*, driven by the real
    environment and sampler: exploring starts (every state of turn k, `block` times per block),
    GLIE ε_n = n^{-1/4}-greedy actions (ε from the state's visit count at the block's start; Σε = ∞,
    ε → 0), step sizes α_n = 1/n(s, u).  Returns (Q, visit counts)."""
    rng = np.random.default_rng(seed)
    env = TabularEnv(mdp)
    logits = np.where(pi_star > 0, 0.0, -1e9)  # π* as a (numerically) deterministic softmax table
    sampler = TabularSampler(SoftmaxTable(mdp.num_turns, mdp.num_contexts, mdp.num_actions), logits)
    S, A = mdp.num_states[k], mdp.num_actions
    Q, n = np.zeros((S, A)), np.zeros((S, A), dtype=np.int64)
    states = np.repeat(np.arange(S), block)
    for b in range(blocks):
        eps = np.maximum(b * block, 1) ** -0.25
        explore = rng.random(states.size) < eps
        u = np.where(explore, rng.integers(A, size=states.size), np.argmax(Q[states], axis=1))
        ep = env.restore([np.array([k, mdp.state_offset[k] + s]) for s in states])
        gen = Generation(Ragged.from_dense(u[:, None]), Ragged.from_dense(np.zeros((states.size, 1))))
        ep, out = env.step(ep, gen, rng)
        y = np.asarray(out.reward, np.float64).copy()
        live = np.flatnonzero(~np.asarray(out.done))
        disc = mdp.gamma ** np.asarray(out.duration, np.float64)
        ep = env.take(ep, live)
        while live.size:  # continue under the frozen π* with the real sampler and environment
            gen = sampler.generate(env.contexts(ep), env.turn_index(ep), 1, rng)
            ep, out = env.step(ep, gen, rng)
            y[live] += disc[live] * np.asarray(out.reward, np.float64)
            disc[live] *= mdp.gamma ** np.asarray(out.duration, np.float64)
            keep = np.flatnonzero(~np.asarray(out.done))
            ep, live = env.take(ep, keep), live[keep]
        for s, a, target in zip(states, u, y):
            n[s, a] += 1
            Q[s, a] += (target - Q[s, a]) / n[s, a]  # α_n = 1/n: Q is the running mean of the targets
    return Q, n


def trap_mdp() -> TurnMDP:
    """Two turns, two actions.  Turn 0: action 0 → state 0 ("hard": turn-1 action 0 pays 1, action 1 pays 0),
    action 1 → state 1 ("safe": 0.7 or 0.65).  π* = (0; 0, 0), V* = 1.  Against the *untrained* (uniform)
    turn-1 policy action 0 is worth 0.5 < 0.675, so training turn 0 before turn 1 locks in the wrong turn-0
    action: the minimal MDP separating reverse from forward order."""
    P = np.zeros((2, 2, 2, 2))
    P[0, 0, 0, 0] = 1.0
    P[0, 0, 1, 1] = 1.0
    R = np.array([[[0.0, 0.0], [0.0, 0.0]], [[1.0, 0.0], [0.7, 0.65]]])
    return TurnMDP.from_arrays(P, R, np.array([1.0, 0.0]))


def check_t2c_llm_gradient_support() -> None:
    """T2c, Eq. 80: ∂(−J_k)/∂logits is exactly 0 at every prefix (c_k) and continuation position and
    non-zero at every turn-k response position of a sibling with A ≠ 0."""
    model = TinyCausalLM()
    prefix = [1, 4, 2, 7, 3]
    sibs = [
        make_sibling(prefix, [5, 6, 8], [9, 2], [4, 10], model),
        make_sibling(prefix, [5, 6], [9, 2], [11, 3, 3], model),
        make_sibling(prefix, [8, 8, 1, 6], [9, 0], [4], model),
    ]
    rewards = np.array([1.0, 0.0, 0.25])
    sibs = [
        Trajectory(s.contexts, s.tokens, s.logp, np.array([0.0, r]), s.durations, s.malformed, 0, 1)
        for s, r in zip(sibs, rewards)
    ]
    adv = estimators.get("sibling_mean")(np.array([s.ret for s in sibs]))
    assert np.all(adv != 0)
    batch = turn_rows(sibs, np.zeros(len(sibs), np.int64), adv)

    transcripts, logits, logps = [], [], []
    for i, s in enumerate(sibs):
        full = np.concatenate([s.contexts[1], s.tokens[1]])  # the sibling's whole transcript
        seq = torch.as_tensor(full)
        lg = model(seq)
        lg.retain_grad()
        ctx, tok = batch.contexts[i], batch.tokens[i]
        assert np.array_equal(full[: len(ctx)], ctx)  # the row's context is a prefix of the transcript
        pos = torch.as_tensor(len(ctx) + np.arange(len(tok)))
        logps.append(torch.log_softmax(lg[pos], -1).gather(1, torch.as_tensor(np.array(tok))[:, None]).squeeze(1))
        transcripts.append(full)
        logits.append(lg)
    loss, _ = clipped_policy_loss(torch.cat(logps), FlatBatch.from_batch(batch), LossConfig(clip_eps=0.2))
    loss.backward()

    for s, lg in zip(sibs, logits):
        g = lg.grad.abs().sum(-1).numpy()
        lo, hi = len(s.contexts[0]), len(s.contexts[0]) + len(s.tokens[0])
        assert np.all(g[:lo] == 0.0), "gradient reached the prefix c_k"
        assert np.all(g[hi:] == 0.0), "gradient reached the continuation"
        assert np.all(g[lo:hi] > 0.0), "a turn-k token got no gradient"
