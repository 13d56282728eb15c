"""KL to the reference policy as a reward penalty (UpdateConfig.kl_placement = "reward"), before advantages.

Implements the KL-shaped reward of Ziegler et al. (2019, "Fine-Tuning Language Models from Human
Preferences", §2.2, Eq. 2: R(x, y) = r(x, y) − β·log(π(y|x) / ρ(y|x))), per token as verl applies it
(`use_kl_in_reward`: token_level_rewards = token_level_scores − β·kl_t):

    r̃_k = r_k − β · Σ_{t ∈ turn k} kl_t,     kl_t = kl_term(log π_old(a_t | c_k, a_<t), log π_ref(a_t | c_k, a_<t))

with log π_old the log-prob the sampler recorded for the token (the rollout policy) and log π_ref the
reference policy's at the same context c_k (as the model saw it: ψ-truncated for RTPO), kl_term the
loss's estimator (k1 = log π_old − log π_ref, verl's "kl"; k2; k3; low_var_kl).  The turn is this
package's unit of reward (Eq. 19), so a turn's tokens' penalties are summed onto its reward r_k and
discounted with it; every return, baseline and advantage downstream then reads r̃.  The penalty is a
constant of the update (no gradient flows through it), unlike the loss placement's β·KL term.

Each penalised rollout also measures its KL for the metrics and the adaptive controller (Ziegler et al.
2019, §2.2; UpdateConfig.kl_target), as verl measures it for `use_kl_in_reward` (the mean over rows of
each row's token-mean kl_t, with the estimator above):

    KL = (1/n) Σ_rows (1/|row|) Σ_{t ∈ row} kl_t,     n = the rollout's turn rows with at least one token,

a row being one turn of one trajectory (verl's row is one response: the same for one-turn rollouts).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rtpo.core.loss import KL_ESTIMATORS, kl_term
from rtpo.core.protocols import ReferenceLogprobs
from rtpo.core.rollout import RolloutResult
from rtpo.core.types import Ragged, TurnBatch


@dataclass(frozen=True)
class KLRewardStats:
    """What one penalised rollout measured (module docstring): rows = n, the turn rows with tokens;
    token_kl_sum = Σ over them of the row's token-mean kl_t; penalty_sum = Σ_rows β Σ_t kl_t; beta = β."""

    rows: int
    token_kl_sum: float
    penalty_sum: float
    beta: float

    @property
    def token_kl_mean(self) -> float:
        """KL of the module docstring (0 without rows): what the adaptive controller reads."""
        return self.token_kl_sum / self.rows if self.rows else 0.0


def kl_reward_metrics(stats: list[KLRewardStats]) -> dict[str, float]:
    """Row-weighted means over a phase's penalised rollouts: kl_reward/token_kl_mean (the measured KL),
    kl_reward/penalty_mean (β Σ_t kl_t per turn row), kl_reward/coef (the β applied), kl_reward/rows."""
    rows = sum(s.rows for s in stats)
    if rows == 0:
        return {}
    return {
        "kl_reward/token_kl_mean": sum(s.token_kl_sum for s in stats) / rows,
        "kl_reward/penalty_mean": sum(s.penalty_sum for s in stats) / rows,
        "kl_reward/coef": sum(s.beta * s.rows for s in stats) / rows,
        "kl_reward/rows": float(rows),
    }


def turn_kl_sums(logp: Ragged, ref_logp: Ragged, estimator: str) -> np.ndarray:
    """(N,) Σ_t kl_t over each row's tokens (module docstring), rows = turns; 0 for an empty row."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {estimator!r} (valid: {', '.join(KL_ESTIMATORS)})")
    if not np.array_equal(logp.offsets, ref_logp.offsets):
        raise ValueError("reference log-probs must align token for token with the rollout's")
    kl = kl_term(torch.as_tensor(logp.values, dtype=torch.float64), torch.as_tensor(ref_logp.values), estimator)
    per_row = np.add.reduceat(kl.numpy(), logp.offsets[:-1]) if logp.values.size else np.zeros(0)
    per_row[logp.lengths == 0] = 0.0  # reduceat reads the next row's first value for an empty row
    return per_row


def _stats(sums: np.ndarray, lengths: np.ndarray, beta: float) -> KLRewardStats:
    has = lengths > 0
    return KLRewardStats(
        rows=int(has.sum()),
        token_kl_sum=float((sums[has] / lengths[has]).sum()),
        penalty_sum=float(beta * sums.sum()),
        beta=float(beta),
    )


def _rows_batch(contexts: Ragged, tokens: Ragged, logp: Ragged, turn: np.ndarray) -> TurnBatch:
    """The turns as a TurnBatch a learner evaluates (advantages 0, one sequence per row)."""
    n = len(tokens)
    return TurnBatch(
        contexts=contexts,
        tokens=tokens,
        old_logp=logp,
        advantages=Ragged(np.zeros(tokens.values.size), tokens.offsets),
        seq_id=np.arange(n),
        weight=np.ones(n),
        turn=np.asarray(turn, dtype=np.int64),
    )


def penalise_rewards(
    res: RolloutResult, learner: Any, beta: float, estimator: str
) -> tuple[RolloutResult, KLRewardStats]:
    """The same rollout with every turn's reward r_k replaced by r̃_k = r_k − β Σ_t kl_t (module docstring),
    and what it measured; the reference log-probs come from learner.ref_logprobs
    (rtpo.core.protocols.ReferenceLogprobs)."""
    if not isinstance(learner, ReferenceLogprobs):
        raise TypeError(f"kl_placement 'reward' needs a learner with ref_logprobs; {type(learner).__name__} has none")
    cols = res.columns
    if cols is not None:
        batch = _rows_batch(cols.contexts, cols.tokens, cols.logp, cols.turn)
        sums = turn_kl_sums(cols.logp, learner.ref_logprobs(batch), estimator)
        new = cols.with_reward(cols.reward - beta * sums)
        return dataclasses.replace(res, trajectories=new, columns=new), _stats(sums, cols.logp.lengths, beta)
    trajs = list(res.trajectories)
    if not trajs:
        return res, KLRewardStats(0, 0.0, 0.0, float(beta))
    batch = _rows_batch(
        Ragged.concat([t.contexts for t in trajs]),
        Ragged.concat([t.tokens for t in trajs]),
        Ragged.concat([t.logp for t in trajs]),
        np.concatenate([t.start_turn + np.arange(len(t.tokens)) for t in trajs]),
    )
    sums = turn_kl_sums(batch.old_logp, learner.ref_logprobs(batch), estimator)
    pen = beta * sums
    out, lo = [], 0
    for t in trajs:
        n = len(t.tokens)
        out.append(dataclasses.replace(t, rewards=t.rewards - pen[lo : lo + n]))
        lo += n
    return dataclasses.replace(res, trajectories=out), _stats(sums, batch.old_logp.lengths, beta)
