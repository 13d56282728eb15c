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
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from rtpo.core.loss import KL_ESTIMATORS, kl_term
from rtpo.core.protocols import ReferenceLogprobs
from rtpo.core.rollout import RolloutResult
from rtpo.core.types import Ragged, TurnBatch


def turn_kl_penalty(logp: Ragged, ref_logp: Ragged, beta: float, estimator: str) -> np.ndarray:
    """(N,) β · Σ_t kl_t over each row's tokens (module docstring), rows = turns."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {estimator!r} (valid: {', '.join(KL_ESTIMATORS)})")
    if not np.array_equal(logp.offsets, ref_logp.offsets):
        raise ValueError("reference log-probs must align token for token with the rollout's")
    kl = kl_term(torch.as_tensor(logp.values, dtype=torch.float64), torch.as_tensor(ref_logp.values), estimator)
    per_row = np.add.reduceat(kl.numpy(), logp.offsets[:-1]) if logp.values.size else np.zeros(0)
    per_row[logp.lengths == 0] = 0.0  # reduceat reads the next row's first value for an empty row
    return beta * per_row


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


def penalise_rewards(res: RolloutResult, learner: Any, beta: float, estimator: str) -> RolloutResult:
    """The same rollout with every turn's reward r_k replaced by r̃_k = r_k − β Σ_t kl_t (module docstring);
    the reference log-probs come from learner.ref_logprobs (rtpo.core.protocols.ReferenceLogprobs)."""
    if not isinstance(learner, ReferenceLogprobs):
        raise TypeError(f"kl_placement 'reward' needs a learner with ref_logprobs; {type(learner).__name__} has none")
    cols = res.columns
    if cols is not None:
        batch = _rows_batch(cols.contexts, cols.tokens, cols.logp, cols.turn)
        pen = turn_kl_penalty(cols.logp, learner.ref_logprobs(batch), beta, estimator)
        new = cols.with_reward(cols.reward - pen)
        return dataclasses.replace(res, trajectories=new, columns=new)
    trajs = list(res.trajectories)
    if not trajs:
        return res
    batch = _rows_batch(
        Ragged.concat([t.contexts for t in trajs]),
        Ragged.concat([t.tokens for t in trajs]),
        Ragged.concat([t.logp for t in trajs]),
        np.concatenate([t.start_turn + np.arange(len(t.tokens)) for t in trajs]),
    )
    pen = turn_kl_penalty(batch.old_logp, learner.ref_logprobs(batch), beta, estimator)
    out, lo = [], 0
    for t in trajs:
        n = len(t.tokens)
        out.append(dataclasses.replace(t, rewards=t.rewards - pen[lo : lo + n]))
        lo += n
    return dataclasses.replace(res, trajectories=out)
