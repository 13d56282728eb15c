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

    old_logp, advantages, weight: (N,) float64; token_seq: (N,) int64 in [0, S).  All four live on one
    device, the one `from_batch(..., device=)` names: the learner's, so the loss never mixes devices.
    one_token_seqs: token i is the whole of sequence i (token_seq = 0..N−1, e.g. tabular RTPO rows),
    so a sequence mean is the token itself and is not computed.
    unit_weight: every weight is 1, so multiplying by it (exact) is skipped.
    """

    old_logp: torch.Tensor
    advantages: torch.Tensor
    weight: torch.Tensor
    token_seq: torch.Tensor
    num_seqs: int
    one_token_seqs: bool = False
    unit_weight: bool = False

    @staticmethod
    def from_batch(
        batch: TurnBatch, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
    ) -> FlatBatch:
        """The token-level view of `batch`, its tensors on `device` (None: the CPU)."""
        lengths = batch.tokens.lengths
        seq_id = batch.seq_id
        if seq_id.size and np.all(seq_id[1:] > seq_id[:-1]):  # distinct and increasing: its own inverse
            seq_index = np.arange(seq_id.size)
        else:
            _, seq_index = np.unique(seq_id, return_inverse=True)
        token_seq = np.repeat(seq_index, lengths)
        num_seqs = int(seq_index.max()) + 1 if seq_index.size else 0
        return FlatBatch(
            old_logp=torch.tensor(batch.old_logp.values, dtype=dtype, device=device),
            advantages=torch.tensor(batch.advantages.values, dtype=dtype, device=device),
            weight=torch.as_tensor(np.repeat(batch.weight, lengths), dtype=dtype, device=device),
            token_seq=torch.as_tensor(token_seq, dtype=torch.int64, device=device),
            num_seqs=num_seqs,
            one_token_seqs=bool(num_seqs == token_seq.size and np.array_equal(token_seq, np.arange(num_seqs))),
            unit_weight=bool(np.all(batch.weight == 1.0)),
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


@dataclass(frozen=True)
class _Clipped:
    """The forward terms of Eq. 6 that the loss, its metrics and its closed-form gradient share."""

    old: torch.Tensor
    adv: torch.Tensor
    weight: torch.Tensor
    raw_log_ratio: torch.Tensor  # log π_θ − log π_old, before the log-ratio clip
    ratio: torch.Tensor  # ρ (token level, or the sequence's s spread over its tokens)
    clipped: torch.Tensor  # clip(ρ, 1 − ε, 1 + ε_high)
    ratio_adv: torch.Tensor  # ρ A
    clipped_adv: torch.Tensor  # clip(ρ) A
    hi: float
    surrogate: torch.Tensor  # min(ρ A, clip(ρ) A) · weight, per token
    objective: torch.Tensor  # J of Eq. 6 (or its GRPO/GSPO aggregation)
    seq_count: torch.Tensor  # tokens of each token's sequence (ones when one_token_seqs)


def _clipped_terms(logp: torch.Tensor, flat: FlatBatch, cfg: LossConfig) -> _Clipped:
    """J(θ) of Eq. 6 and the terms on the way to it (the one place the clipped surrogate is written)."""
    old = flat.old_logp.to(logp.dtype)
    adv = flat.advantages.to(logp.dtype)
    weight = flat.weight.to(logp.dtype)
    raw = log_ratio = logp - old
    if cfg.log_ratio_clip is not None:
        log_ratio = log_ratio.clamp(-cfg.log_ratio_clip, cfg.log_ratio_clip)
    if cfg.ratio == "sequence":
        seq_log_ratio, _ = _segment_mean(log_ratio, flat.token_seq, flat.num_seqs, flat.one_token_seqs)
        log_ratio = seq_log_ratio[flat.token_seq]
    ratio = torch.exp(log_ratio)
    hi = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    clipped = ratio.clamp(1.0 - cfg.clip_eps, 1.0 + hi)
    ratio_adv, clipped_adv = ratio * adv, clipped * adv
    surrogate = torch.minimum(ratio_adv, clipped_adv)
    if not flat.unit_weight:
        surrogate = surrogate * weight

    if cfg.aggregation == "token-mean":
        objective = surrogate.mean()
        count = torch.ones_like(surrogate)
    else:
        per_seq, count = _segment_mean(surrogate, flat.token_seq, flat.num_seqs, flat.one_token_seqs)
        objective = per_seq.mean()
        count = count if flat.one_token_seqs else count[flat.token_seq]
    return _Clipped(old, adv, weight, raw, ratio, clipped, ratio_adv, clipped_adv, hi, surrogate, objective, count)


def _clipped_metrics(t: _Clipped, logp: torch.Tensor, cfg: LossConfig, kl_value) -> dict[str, float]:
    with torch.no_grad():
        r = t.ratio.detach()
        is_clipped = ((r < 1.0 - cfg.clip_eps) & (t.adv < 0)) | ((r > 1.0 + t.hi) & (t.adv > 0))
        lr_ = t.raw_log_ratio.detach()  # log π_θ − log π_old
        metrics = {
            "loss/policy": -float(t.objective),
            "loss/clipfrac": float(is_clipped.to(logp.dtype).mean()),
            "loss/approx_kl": float((torch.exp(lr_) - 1.0 - lr_).mean()),  # k3 of KL(old||new)
            "loss/ratio_mean": float(r.mean()),
        }
        if kl_value is not None:
            metrics["loss/kl_ref"] = float(kl_value.detach())
    return metrics


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
    t = _clipped_terms(logp, flat, cfg)
    loss = -t.objective
    kl_value = None
    if ref_logp is not None and cfg.kl_coef > 0:
        d = ref_logp.to(logp.dtype) - logp
        kl_tok = torch.exp(d) - d - 1.0  # k3 estimator of KL(π_θ || π_ref), non-negative
        kl_value = kl_tok.mean()
        loss = loss + cfg.kl_coef * kl_value
    return loss, _clipped_metrics(t, logp, cfg, kl_value)


def closed_form_gradient(cfg: LossConfig) -> bool:
    """Whether `clipped_policy_loss_grad` covers this configuration (the token-level ratio of Eq. 6;
    GSPO's sequence ratio and REFUEL's regression go through autograd)."""
    return cfg.objective == "clipped" and cfg.ratio == "token"


def clipped_policy_loss_grad(
    logp: torch.Tensor,
    flat: FlatBatch,
    cfg: LossConfig,
    ref_logp: torch.Tensor | None = None,
) -> tuple[float, torch.Tensor, dict[str, float]]:
    """`clipped_policy_loss` without autograd: its value, its gradient with respect to logp in closed
    form, and the same metrics.  For learners whose log-probs have a cheap closed-form derivative (a
    softmax table), so a step needs no graph.  Token-level ratio only (`closed_form_gradient`).

    Differentiating −J of Eq. 6 term by term, with the subgradient conventions autograd uses (a clamp
    passes its gradient on the closed interval; min(x, y) splits it evenly when x = y):

        ∂(−J)/∂log π_i = −c_i w_i A_i ρ_i [∂min/∂(ρA) + ∂min/∂(clip(ρ)A) · 1{1−ε ≤ ρ_i ≤ 1+ε_high}] · 1{|log ρ_i| ≤ L}

    with c_i = 1/N (token mean) or 1/(S·T_seq(i)) (mean over sequences of token means), and for the k3
    KL penalty β/N · (1 − π_ref/π_θ).
    """
    if not closed_form_gradient(cfg):
        raise ValueError("clipped_policy_loss_grad covers the clipped loss with the token-level ratio only")
    with torch.no_grad():
        t = _clipped_terms(logp, flat, cfg)
        s1, s2 = t.ratio_adv, t.clipped_adv
        count = flat.num_seqs if cfg.aggregation != "token-mean" else logp.numel()
        if flat.unit_weight and (flat.one_token_seqs or cfg.aggregation == "token-mean"):
            d_min = -1.0 / count  # weight 1 and seq_count 1 everywhere: the same value as a number
        else:
            d_min = -t.weight / (t.seq_count * count)
        g1 = torch.where(s1 < s2, 1.0, torch.where(s1 == s2, 0.5, 0.0))
        inside = (t.ratio >= 1.0 - cfg.clip_eps) & (t.ratio <= 1.0 + t.hi)
        g_ratio = d_min * (g1 * t.adv + (1.0 - g1) * t.adv * inside)
        grad = g_ratio * t.ratio
        if cfg.log_ratio_clip is not None:
            grad = grad * (t.raw_log_ratio.abs() <= cfg.log_ratio_clip)
        loss = -float(t.objective)
        kl_value = None
        if ref_logp is not None and cfg.kl_coef > 0:
            d = ref_logp.to(logp.dtype) - logp
            kl_value = (torch.exp(d) - d - 1.0).mean()
            loss = float(-t.objective + cfg.kl_coef * kl_value)
            g_kl = cfg.kl_coef / logp.numel()
            grad = grad - (g_kl * torch.exp(d) - g_kl)  # autograd's order of operations
    return loss, grad, _clipped_metrics(t, logp, cfg, kl_value)


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
