"""RTPO with adaptive sibling allocation (the paper's G.9 future work; our design, not the paper's).

Fixed-G RTPO forks G−1 siblings at every trunk boundary.  A group whose siblings all return the same
value has zero advantage (Eq. 7) and trains nothing, and such groups are predictable: a boundary state
from which the policy (nearly) always succeeds or (nearly) always fails.  This variant keeps fixed G's
spend per phase, B_k = (G−1) · M_k siblings for the M_k turn-k boundaries, and spends it where a group
is likely to be informative:

1. Posterior.  Every boundary state s (keyed by k and the recorded context c_k = ψ(S_k)) carries a
   Beta(a_s, b_s) posterior on its success probability p_s under the current policy: the prior
   Beta(prior_a, prior_b) plus pseudo-counts from every return-to-go observed from s (the trunk's, at
   no cost, and every sibling's).  A return R maps to the outcome y = clip((R − reward_low) /
   (reward_high − reward_low), 0, 1) and adds y successes and 1 − y failures (exact Beta–Bernoulli for
   0/1 rewards; for graded rewards the Bernoulli surrogate "a group ties when every sibling falls on
   the same side").  At the start of every iteration all counts are multiplied by `forget`, because the
   policy the old outcomes came from has moved.
2. Predicted tie.  A group of n siblings from s ties under the Bernoulli model with probability
       P_tie(n) = E[p^n + (1 − p)^n] = Π_{i<n} (a+i)/(a+b+i) + Π_{i<n} (b+i)/(a+b+i)
   (the Beta moments E[p^n] = B(a+n, b)/B(a, b)), so the probability that it is informative is
       I(n) = 1 − P_tie(n) for n ≥ 2 and I(0) = I(1) = 0
   (one sibling is its own baseline: A = 0).
3. Allocation.  Choose n_1..n_M with Σ n_i = B_k and n_i ∈ {0} ∪ [2, max_siblings] maximising
   Σ_i I_i(n_i), the expected number of groups with a non-zero advantage (exactly, by a knapsack
   dynamic programme; ties go to the most even allocation).  A boundary predicted to tie adds almost
   nothing and gets no siblings (it is skipped); its share goes to uncertain states.  Two facts fix the
   reductions: I(2) = 2·E[p(1−p)] and I(3) = 3·E[p(1−p)], and I is concave on {0, 2, 3, ...}, so on
   boundaries that share one posterior the even allocation G − 1 each is optimal; and with
   max_siblings = G − 1 the capacity equals the budget.  In both cases the method is fixed-G RTPO draw
   for draw (tests/test_rtpo_adaptive.py): at K = 1 on a task where every query starts in the same
   state, and at any K with max_siblings = G − 1.

Bias.  The allocation depends on the prior, the trunk's return and earlier phases' siblings, never on
the siblings it allocates, so each group's sibling-mean advantage is still unbiased for the advantage
at its boundary state (Eq. 7, 52).  What changes is the weight of each state in the update.  With a
linear estimator whose own-return coefficient is c(n) (sibling_mean: 1 − 1/n; leave_one_out: 1), a group
of n siblings from s contributes, in expectation at θ = θ_old,

    E[Σ_j A_j ∇log π(y_j | c_k)] = n · c(n) · g(s),   g(s) = E_{y~π}[R(y) ∇log π(y | c_k)],

where fixed-G RTPO's group contributes (G−1) · c(G−1) · g(s).  So `weighting: per_group` (the default,
the behaviour the tables were measured with) reweights each state by n·c(n) / ((G−1)·c(G−1)): with
sibling_mean (c(n) = 1 − 1/n, so n·c(n) = n − 1) a state given n siblings counts (n − 1)/(G − 2): at G = 3,
0× skipped, 1× with 2 siblings, 2× with 3 and 3× at the cap of 2(G − 1) = 4.  In a table each
state has its own parameters and only the step size per state changes; with shared parameters it
changes the direction of the whole gradient.  A skipped state is not free either: its g(s) is zero only
where its return is deterministic under π, so "predicted to tie" removes a small but non-zero term in
expectation.  `weighting: fixed_g` multiplies every row of a group of n by (G−1)·c(G−1) / (n·c(n)): each
state that gets a group then contributes exactly fixed-G RTPO's expected gradient (tests/
test_rtpo_adaptive.py checks both weightings by exact enumeration; rtpo/verify/test_baselines.py holds
the claim with a mutant); the skipped states' terms remain missing.  `fixed_g` needs a linear estimator
(sibling_mean, leave_one_out, ...): a normalising one (group_norm) has no such coefficient and is
refused.  The spend per phase is exactly B_k, fixed G's, so equal-rollout comparisons against fixed G
hold iteration by iteration.

The posterior store is the method's state across iterations; the runner checkpoints it
(Method.state_dict), so a resumed run allocates as the uninterrupted one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from rtpo.core import estimators
from rtpo.core.methods.base import IterationState, RunContext, register_method
from rtpo.core.methods.reverse import ReverseTurn, RTPOConfig, boundary_inputs, check_sibling_contexts
from rtpo.core.types import BoundaryRows, Ragged, ReverseTree, Rollouts, discounted_return, segment_returns

MIN_GROUP = 2  # a group of one sibling is its own baseline (A = 0)
WEIGHTINGS = ("per_group", "fixed_g")


@dataclass(frozen=True)
class RTPOAdaptiveConfig(RTPOConfig):
    """RTPO's settings (G sets the phase budget: (G−1) siblings per boundary on average) plus:

    max_siblings: the most siblings one boundary gets (None: 2·(G−1)); at least G−1, so the budget fits.
    prior_a:      Beta prior pseudo-successes of a boundary state's success probability.
    prior_b:      Beta prior pseudo-failures.
    forget:       factor on every state's outcome counts at each iteration start (1: never forget).
    reward_low:   the return mapped to outcome 0 (returns below count as 0).
    reward_high:  the return mapped to outcome 1 (returns above count as 1).
    weighting:    "per_group" (each group's rows weigh 1: a state given n siblings counts n·c(n), see the
                  module's Bias paragraph) or "fixed_g" (rows of a group of n weigh (G−1)·c(G−1)/(n·c(n)), so
                  every state given a group carries fixed-G RTPO's expected gradient; linear estimators only).
    """

    max_siblings: int | None = None
    prior_a: float = 1.0
    prior_b: float = 1.0
    forget: float = 0.5
    reward_low: float = 0.0
    reward_high: float = 1.0
    weighting: str = "per_group"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.G - 1 < MIN_GROUP:
            raise ValueError(f"rtpo_adaptive needs G >= {MIN_GROUP + 1} (groups of at least {MIN_GROUP}), got {self.G}")
        if self.max_siblings is not None and self.max_siblings < self.G - 1:
            raise ValueError(f"max_siblings ({self.max_siblings}) must be >= G-1 ({self.G - 1})")
        if not (self.prior_a > 0 and self.prior_b > 0):
            raise ValueError(f"prior_a and prior_b must be > 0, got {self.prior_a}, {self.prior_b}")
        if not 0.0 <= self.forget <= 1.0:
            raise ValueError(f"forget must be in [0, 1], got {self.forget}")
        if not self.reward_high > self.reward_low:
            raise ValueError(f"reward_high ({self.reward_high}) must be > reward_low ({self.reward_low})")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if self.weighting == "fixed_g":
            own_return_coefficient(self.estimator, self.G - 1)  # refuses a non-linear estimator now

    @property
    def cap(self) -> int:
        return 2 * (self.G - 1) if self.max_siblings is None else self.max_siblings


def beta_moment(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """E[p^n] for p ~ Beta(a, b): Π_{i<n} (a+i)/(a+b+i) (= B(a+n, b)/B(a, b))."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    out = np.ones(np.broadcast(a, b).shape)
    for i in range(n):
        out = out * (a + i) / (a + b + i)
    return out


def informative_table(a: np.ndarray, b: np.ndarray, cap: int) -> np.ndarray:
    """(M, cap+1): I_i(n) = 1 − E[p^n + (1−p)^n] for n ≥ 2, and 0 for n < 2 (module docstring, step 2)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    table = np.zeros((a.size, cap + 1))
    for n in range(MIN_GROUP, cap + 1):
        table[:, n] = 1.0 - beta_moment(a, b, n) - beta_moment(b, a, n)
    return table


SPREAD = 1e-9  # weight of the tie-break −Σ n_i² (far below any real difference in expected informative groups)


def allocate(a: np.ndarray, b: np.ndarray, budget: int, cap: int) -> np.ndarray:
    """(M,) siblings per boundary on Beta(a_i, b_i): the exact maximiser of Σ_i I_i(n_i) with Σ n_i =
    budget and n_i ∈ {0} ∪ [2, cap] (module docstring, step 3), ties broken towards the most even
    allocation (−SPREAD · Σ n_i²).  A knapsack dynamic programme over the boundaries, O(M · cap · budget)."""
    table = informative_table(a, b, cap)
    m = table.shape[0]
    sizes = np.array([0, *range(MIN_GROUP, cap + 1)], np.int64)
    value = table[:, sizes] - SPREAD * sizes.astype(np.float64) ** 2  # (M, choices)
    budget = int(budget)
    if m * cap < budget:
        raise ValueError(f"allocate: {m} boundaries of at most {cap} siblings cannot take {budget}")
    best = np.full(budget + 1, -np.inf)
    best[0] = 0.0  # best[s]: the best value of the boundaries so far with exactly s siblings
    choice = np.zeros((m, budget + 1), np.int64)
    for i in range(m):
        cand = np.full((sizes.size, budget + 1), -np.inf)
        for j, n in enumerate(sizes[sizes <= budget]):
            cand[j, n:] = best[: budget + 1 - n] + value[i, j]
        choice[i] = np.argmax(cand, axis=0)
        best = cand[choice[i], np.arange(budget + 1)]
    if not np.isfinite(best[budget]):  # only budget = 1 (no group of one), which RTPOAdaptiveConfig rules out
        raise ValueError(f"allocate: no allocation of groups of 0 or {MIN_GROUP}..{cap} sums to {budget}")
    counts = np.zeros(m, np.int64)
    s = budget
    for i in range(m - 1, -1, -1):
        counts[i] = sizes[choice[i, s]]
        s -= counts[i]
    return counts


def state_keys(k: int, contexts: Ragged) -> list[bytes]:
    """A key per boundary state: a digest of the turn and the recorded context c_k."""
    prefix = np.int64(k).tobytes()
    return [
        hashlib.blake2b(prefix + np.asarray(contexts[i], np.int64).tobytes(), digest_size=16).digest()
        for i in range(len(contexts))
    ]


def returns_to_go(tree: ReverseTree, k: int) -> np.ndarray:
    """(M,) each turn-k boundary's trunk return from turn k on (the same quantity a sibling's return is)."""
    bounds, trunks = tree.boundaries[k], tree.trunks
    if isinstance(bounds, BoundaryRows) and isinstance(trunks, Rollouts):
        t = bounds.trunk
        skip = k - trunks.start_turn[t]
        return segment_returns(
            trunks.reward, trunks.duration, trunks.row_start[t] + skip, trunks.num_rows[t] - skip, trunks.gamma
        )
    out = []
    for b in bounds:
        tr = trunks[b.trunk]
        j = k - tr.start_turn
        out.append(discounted_return(tr.rewards[j:], tr.durations[j:], tr.gamma))
    return np.array(out, np.float64)


def ragged_advantages(estimator: str, returns: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The registered estimator on groups of unequal size: returns (Σ sizes,) in group order, sizes (G,)
    with every size ≥ 2.  Gives (advantage per sibling, tied mask per group)."""
    est = estimators.get(estimator)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    adv = np.zeros(returns.shape[0])
    zero = np.zeros(sizes.size, dtype=bool)
    for n in np.unique(sizes):
        groups = np.flatnonzero(sizes == n)
        idx = starts[groups][:, None] + np.arange(n)[None, :]
        block = returns[idx]
        adv[idx] = est(block)
        zero[groups] = estimators.zero_advantage_mask(block)
    return adv, zero


def own_return_coefficient(estimator: str, n: int) -> float:
    """c(n): the coefficient of a sibling's own return in its advantage, for a registered estimator that is
    linear in the group's returns (A = M R, c(n) = M_jj, the same for every j).  sibling_mean (Eq. 7):
    1 − 1/n; leave_one_out: 1.  A non-linear estimator (one that normalises) has none: ValueError."""
    est = estimators.get(estimator)
    m = np.asarray(est(np.eye(n)), np.float64)  # row j: the advantages when only sibling j returns 1
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 1, n))
    linear = np.allclose(est(x + 2.5 * y), est(x) + 2.5 * np.asarray(est(y)), atol=1e-9) and np.allclose(
        est(3.0 * x), 3.0 * np.asarray(est(x)), atol=1e-9
    )
    if not linear or not np.allclose(np.diag(m), m[0, 0], atol=1e-12):
        raise ValueError(f"weighting 'fixed_g' needs an estimator linear in the returns; {estimator!r} is not")
    return float(m[0, 0])


def group_weights(estimator: str, sizes: np.ndarray, fixed_n: int) -> np.ndarray:
    """(len(sizes),) weighting='fixed_g': (G−1)·c(G−1) / (n·c(n)) for each group of n = sizes[i] siblings,
    so that n·c(n)·w = (G−1)·c(G−1), fixed-G RTPO's expected contribution per state (module docstring)."""
    target = fixed_n * own_return_coefficient(estimator, fixed_n)
    per_n = {int(n): target / (n * own_return_coefficient(estimator, int(n))) for n in np.unique(sizes)}
    return np.array([per_n[int(n)] for n in sizes], np.float64)


def _take(snapshots, idx: np.ndarray):
    if isinstance(snapshots, np.ndarray):
        return snapshots[idx]
    return [snapshots[int(i)] for i in idx]


@register_method("rtpo_adaptive")
class RTPOAdaptive(ReverseTurn):
    Config = RTPOAdaptiveConfig

    def __init__(self, cfg: RTPOAdaptiveConfig) -> None:
        super().__init__(cfg)
        self.counts: dict[bytes, np.ndarray] = {}  # state key -> observed (successes, failures)

    # -- the posterior store: the method's state across iterations -----------------------------------
    def state_dict(self) -> dict:
        return {"counts": {k: v.copy() for k, v in self.counts.items()}}

    def load_state_dict(self, state) -> None:
        if state is None:  # a checkpoint written before the store existed, or at an empty store
            self.counts = {}
            return
        if not isinstance(state, dict) or not isinstance(state.get("counts"), dict):
            raise ValueError("rtpo_adaptive: checkpointed method state is not {'counts': {...}}")
        self.counts = {k: np.asarray(v, np.float64).copy() for k, v in state["counts"].items()}

    def outcomes(self, returns: np.ndarray) -> np.ndarray:
        lo, hi = self.cfg.reward_low, self.cfg.reward_high
        return np.clip((np.asarray(returns, np.float64) - lo) / (hi - lo), 0.0, 1.0)

    def observe(self, keys: list[bytes], returns: np.ndarray) -> None:
        """Add each return's outcome y to its state's counts: y successes, 1 − y failures."""
        for key, y in zip(keys, self.outcomes(returns), strict=True):
            c = self.counts.setdefault(key, np.zeros(2))
            c += (y, 1.0 - y)

    def posterior(self, keys: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        seen = np.array([self.counts.get(key, (0.0, 0.0)) for key in keys], np.float64).reshape(-1, 2)
        return self.cfg.prior_a + seen[:, 0], self.cfg.prior_b + seen[:, 1]

    def begin(self, ctx: RunContext, query_ids: np.ndarray) -> IterationState:
        f = self.cfg.forget
        self.counts = {key: c * f for key, c in self.counts.items() if (c * f).sum() >= 1e-3}
        return super().begin(ctx, query_ids)

    def fork_and_train(self, ctx: RunContext, state: IterationState, k: int, metrics: dict) -> dict[str, float]:
        tree = state.data.tree
        m = len(tree.boundaries[k])
        trunk_q, snaps, recorded = boundary_inputs(tree, k)
        keys = state_keys(k, recorded)
        self.observe(keys, returns_to_go(tree, k))  # the trunk's outcome from c_k, free
        a, b = self.posterior(keys)
        budget = (self.cfg.G - 1) * m
        counts = allocate(a, b, budget, self.cfg.cap)
        table = informative_table(a, b, self.cfg.cap)
        used = counts > 0
        metrics.update(
            {
                "alloc/skipped_rate": float((~used).mean()),
                "alloc/max_group": float(counts.max()),
                "alloc/predicted_informative": float(table[np.arange(m), counts][used].mean()) if used.any() else 0.0,
            }
        )
        if not used.any():
            return metrics
        boundary_of = np.repeat(np.arange(m), counts)
        n = self.cfg.G - 1
        if np.all(counts == n):  # the fixed-G draw: one rollout call with n responses per boundary
            res = self.rollout(ctx, trunk_q, snaps, n=n)
        else:
            res = self.rollout(ctx, trunk_q[boundary_of], _take(snaps, boundary_of), n=1)
        sibs = res.trajectories
        check_sibling_contexts(sibs, recorded, boundary_of, k)
        returns = np.asarray(self.sibling_returns(ctx, state, k, sibs), np.float64)
        self.observe([keys[i] for i in boundary_of], returns)
        sizes = counts[used]
        adv, zero = ragged_advantages(self.cfg.estimator, returns, sizes)
        tied = np.repeat(zero, sizes)
        means = np.array([returns[boundary_of == i].mean() for i in np.flatnonzero(used)])
        metrics.update(
            {
                "return/mean": float(returns.mean()),
                "adv/zero_rate": float(zero.mean()),
                "adv/zero_rollout_share": float(tied.mean()),
                "adv/abs_mean": float(np.abs(adv).mean()),
                "adv/value_std_across_boundaries": float(means.std()),
            }
        )
        keep = ~tied if self.cfg.drop_zero_groups else np.ones(len(sibs), dtype=bool)
        weight = None
        if self.cfg.weighting == "fixed_g":
            weight = np.repeat(group_weights(self.cfg.estimator, sizes, self.cfg.G - 1), sizes)
            metrics["alloc/weight_mean"] = float(weight.mean())
        return self.update_turn(ctx, sibs, adv, keep, metrics, weight=weight)
