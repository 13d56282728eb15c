"""The clipped policy-gradient loss, written once; every learner of every backend calls it.

Implements Eq. 6 (§3.1):

    J_k(θ) = 1/(G−1) Σ_j 1/T_{j,k} Σ_t min(ρ_{j,t} A_j, clip(ρ_{j,t}, 1−ε, 1+ε) A_j),
    ρ_{j,t} = π_θ(a_t | c_k, a_<t) / π_old(a_t | c_k, a_<t),

and, through the same code, the variants the baselines need: a token-mean aggregation (GRPO, Eq. 9),
and a sequence-level ratio s = exp(mean_t log ρ_t) (GSPO).  The loss is −J so it is minimised.
Tokens are a flat array; `token_seq` names the sequence each token belongs to (an RTPO row is its own
sequence; a GRPO multi-turn trajectory is one sequence spread over several rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from rtpo.core.types import TurnBatch

Aggregation = Literal["seq-mean-token-mean", "token-mean"]
RatioLevel = Literal["token", "sequence"]
Objective = Literal["clipped", "pair_regression"]


@dataclass(frozen=True)
class LossConfig:
    """Settings of the clipped surrogate.

    clip_eps:       ε of Eq. 6 (lower side; also the upper side unless clip_eps_high is set).
    clip_eps_high:  optional asymmetric upper ε ("clip-higher").
    ratio:          "token" (Eq. 6) or "sequence" (GSPO's length-normalised sequence ratio).
    aggregation:    "seq-mean-token-mean" (Eq. 6: mean over sequences of 1/T Σ_t) or "token-mean".
    log_ratio_clip: |log ρ| is clamped to this before exp (E.3's log-prob clip [−10, 10]); None = off.
    kl_coef:        β of an optional k3 KL penalty to a reference policy (E.3: 0.02).
    objective:      "clipped" (the surrogate above) or "pair_regression" (REFUEL's squared relative-future
                    regression, `pair_regression_loss`; clip_eps, ratio and aggregation do not apply).
    eta:            REFUEL's η: the log-ratio difference of a pair regresses onto η·(R − R′).
    """

    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    ratio: RatioLevel = "token"
    aggregation: Aggregation = "seq-mean-token-mean"
    log_ratio_clip: float | None = 10.0
    kl_coef: float = 0.0
    objective: Objective = "clipped"
    eta: float = 1.0

    def __post_init__(self) -> None:
        if self.objective not in ("clipped", "pair_regression"):
            raise ValueError(f"objective must be 'clipped' or 'pair_regression', got {self.objective!r}")
        if not self.eta > 0:
            raise ValueError(f"eta must be positive, got {self.eta}")
        if not 0.0 < self.clip_eps < 1.0:
            raise ValueError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.clip_eps_high is not None and self.clip_eps_high <= 0:
            raise ValueError("clip_eps_high must be positive")
        if self.ratio not in ("token", "sequence"):
            raise ValueError(f"ratio must be 'token' or 'sequence', got {self.ratio!r}")
        if self.aggregation not in ("seq-mean-token-mean", "token-mean"):
            raise ValueError(f"unknown aggregation {self.aggregation!r}")


@dataclass(frozen=True)
class FlatBatch:
    """A TurnBatch's token-level view as torch tensors (N tokens, S sequences).

    old_logp, advantages, weight: (N,) float64; token_seq: (N,) int64 in [0, S).
    one_token_seqs: token i is the whole of sequence i (token_seq = 0..N−1, e.g. tabular RTPO rows),
    so a sequence mean is the token itself and is not computed.
    """

    old_logp: torch.Tensor
    advantages: torch.Tensor
    weight: torch.Tensor
    token_seq: torch.Tensor
    num_seqs: int
    one_token_seqs: bool = False

    @staticmethod
    def from_batch(batch: TurnBatch, dtype: torch.dtype = torch.float64) -> FlatBatch:
        lengths = batch.tokens.lengths
        seq_id = batch.seq_id
        if seq_id.size and np.all(seq_id[1:] > seq_id[:-1]):  # distinct and increasing: its own inverse
            seq_index = np.arange(seq_id.size)
        else:
            _, seq_index = np.unique(seq_id, return_inverse=True)
        token_seq = np.repeat(seq_index, lengths)
        num_seqs = int(seq_index.max()) + 1 if seq_index.size else 0
        return FlatBatch(
            old_logp=torch.tensor(batch.old_logp.values, dtype=dtype),
            advantages=torch.tensor(batch.advantages.values, dtype=dtype),
            weight=torch.as_tensor(np.repeat(batch.weight, lengths), dtype=dtype),
            token_seq=torch.as_tensor(token_seq, dtype=torch.int64),
            num_seqs=num_seqs,
            one_token_seqs=bool(num_seqs == token_seq.size and np.array_equal(token_seq, np.arange(num_seqs))),
        )


def _segment_mean(
    x: torch.Tensor, seg: torch.Tensor, num: int, identity: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of x over each segment (and the segment sizes); identity: segment i is element i alone."""
    if identity:
        return x, torch.ones_like(x)
    total = torch.zeros(num, dtype=x.dtype, device=x.device).index_add(0, seg, x)
    count = torch.zeros(num, dtype=x.dtype, device=x.device).index_add(0, seg, torch.ones_like(x))
    return total / count, count


def clipped_policy_loss(
    logp: torch.Tensor,
    flat: FlatBatch,
    cfg: LossConfig,
    ref_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """−J(θ) of Eq. 6 (or its GRPO/GSPO variants per `cfg`) and grouped metrics.

    logp: (N,) log π_θ of the batch's response tokens, differentiable; everything else is constant.
    Only these N tokens enter the loss, so prefix (context) and continuation tokens of other turns
    receive no gradient (Thm 2(c), Eq. 80).
    """
    old = flat.old_logp.to(logp.dtype)
    adv = flat.advantages.to(logp.dtype)
    weight = flat.weight.to(logp.dtype)
    log_ratio = logp - old
    if cfg.log_ratio_clip is not None:
        log_ratio = log_ratio.clamp(-cfg.log_ratio_clip, cfg.log_ratio_clip)
    if cfg.ratio == "sequence":
        seq_log_ratio, _ = _segment_mean(log_ratio, flat.token_seq, flat.num_seqs, flat.one_token_seqs)
        log_ratio = seq_log_ratio[flat.token_seq]
    ratio = torch.exp(log_ratio)
    hi = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    clipped = ratio.clamp(1.0 - cfg.clip_eps, 1.0 + hi)
    surrogate = torch.minimum(ratio * adv, clipped * adv) * weight

    if cfg.aggregation == "token-mean":
        objective = surrogate.mean()
    else:
        per_seq, _ = _segment_mean(surrogate, flat.token_seq, flat.num_seqs, flat.one_token_seqs)
        objective = per_seq.mean()
    loss = -objective

    metrics: dict[str, float] = {}
    kl_value = None
    if ref_logp is not None and cfg.kl_coef > 0:
        d = ref_logp.to(logp.dtype) - logp
        kl_tok = torch.exp(d) - d - 1.0  # k3 estimator of KL(π_θ || π_ref), non-negative
        kl_value = kl_tok.mean()
        loss = loss + cfg.kl_coef * kl_value
    with torch.no_grad():
        r = ratio.detach()
        is_clipped = ((r < 1.0 - cfg.clip_eps) & (adv < 0)) | ((r > 1.0 + hi) & (adv > 0))
        lr_ = logp.detach() - old
        metrics["loss/policy"] = float(-objective.detach())
        metrics["loss/clipfrac"] = float(is_clipped.to(logp.dtype).mean())
        metrics["loss/approx_kl"] = float((torch.exp(lr_) - 1.0 - lr_).mean())  # k3 of KL(old||new)
        metrics["loss/ratio_mean"] = float(r.mean())
        if kl_value is not None:
            metrics["loss/kl_ref"] = float(kl_value.detach())
    return loss, metrics


def pair_regression_loss(
    logp: torch.Tensor,
    flat: FlatBatch,
    cfg: LossConfig,
    ref_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REFUEL's loss (Gao et al. 2024; the paper's G.1/G.8; SPEC §3): for each pair (y, y′) of turn-h
    responses drawn from one shared prefix and continued to the end,

        L = mean_pairs ( (Δ(y) − Δ(y′)) − η (R − R′) )²,   Δ(y) = Σ_{t ∈ y} log π_θ(a_t | ·) − log π_old(a_t | ·),

    the log-probs summed over the turn-h tokens only.  Batch layout: a pair is one sequence (one seq_id)
    of two rows; `weight` is +1 on y's row and −1 on y′'s, and every token of the pair carries the
    target difference R − R′ in `advantages`.  So Δ(y) − Δ(y′) is the weighted sum of the pair's token
    log-ratios, and at θ = θ_old the gradient is −2η(R − R′)(∇log π(y) − ∇log π(y′)) per pair.
    """
    old = flat.old_logp.to(logp.dtype)
    weight = flat.weight.to(logp.dtype)
    log_ratio = logp - old
    if cfg.log_ratio_clip is not None:
        log_ratio = log_ratio.clamp(-cfg.log_ratio_clip, cfg.log_ratio_clip)
    n = flat.num_seqs
    diff = torch.zeros(n, dtype=logp.dtype, device=logp.device).index_add(0, flat.token_seq, weight * log_ratio)
    target, _ = _segment_mean(flat.advantages.to(logp.dtype), flat.token_seq, n)
    residual = diff - cfg.eta * target
    loss = (residual**2).mean()
    metrics: dict[str, float] = {}
    if ref_logp is not None and cfg.kl_coef > 0:
        d = ref_logp.to(logp.dtype) - logp
        kl_value = (torch.exp(d) - d - 1.0).mean()
        loss = loss + cfg.kl_coef * kl_value
        metrics["loss/kl_ref"] = float(kl_value.detach())
    with torch.no_grad():
        lr_ = logp.detach() - old
        metrics["loss/policy"] = float((residual.detach() ** 2).mean())
        metrics["loss/approx_kl"] = float((torch.exp(lr_) - 1.0 - lr_).mean())
        metrics["loss/ratio_mean"] = float(torch.exp(lr_).mean())
    return loss, metrics


def policy_loss(
    logp: torch.Tensor,
    flat: FlatBatch,
    cfg: LossConfig,
    ref_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss `cfg.objective` names: the clipped surrogate (Eq. 6 and variants) or REFUEL's pair
    regression.  Learners call this one entry point."""
    if cfg.objective == "pair_regression":
        return pair_regression_loss(logp, flat, cfg, ref_logp)
    return clipped_policy_loss(logp, flat, cfg, ref_logp)
