"""The clipped policy-gradient loss, written once; every learner of every backend calls it.

Implements Eq. 6 (§3.1):

    J_k(θ) = 1/(G−1) Σ_j 1/T_{j,k} Σ_t min(ρ_{j,t} A_j, clip(ρ_{j,t}, 1−ε, 1+ε) A_j),
    ρ_{j,t} = π_θ(a_t | c_k, a_<t) / π_old(a_t | c_k, a_<t),

and, through the same code, the variants the baselines need: a token-mean aggregation (GRPO, Eq. 9),
and a sequence-level ratio s = exp(mean_t log ρ_t) (GSPO).  The loss is −J so it is minimised.

Options every method reaches through its UpdateConfig (rtpo.core.methods.base): the aggregation over
tokens (`aggregate`: token-mean, seq-mean-token-mean, seq-mean-token-sum, and Dr.GRPO's constant
normaliser seq-mean-token-sum-norm), the estimator of the KL penalty to the reference policy (`kl_term`:
k1, k2, k3, low_var_kl) and an entropy bonus; both regularisers are token means added to −J.
Tokens are a flat array; `token_seq` names the sequence each token belongs to (an RTPO row is its own
sequence; a GRPO multi-turn trajectory is one sequence spread over several rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from rtpo.core.types import TurnBatch

Aggregation = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KLEstimator = Literal["k1", "k2", "k3", "low_var_kl"]
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")
RatioLevel = Literal["token", "sequence"]
Objective = Literal["clipped", "pair_regression"]


@dataclass(frozen=True)
class LossConfig:
    """Settings of the clipped surrogate.

    clip_eps:       ε of Eq. 6 (lower side; also the upper side unless clip_eps_high is set).
    clip_eps_high:  optional asymmetric upper ε ("clip-higher").
    ratio:          "token" (Eq. 6) or "sequence" (GSPO's length-normalised sequence ratio).
    aggregation:    how the per-token surrogates x_t become J (`aggregate`): "seq-mean-token-mean" (Eq. 6:
                    mean over sequences of 1/T Σ_t), "token-mean" (Eq. 9: 1/N Σ over all tokens),
                    "seq-mean-token-sum" (mean over sequences of Σ_t) or "seq-mean-token-sum-norm"
                    (Dr.GRPO: mean over sequences of Σ_t / L, L = norm_length, a constant).
    norm_length:    L of seq-mean-token-sum-norm (Dr.GRPO: the generation budget, max response tokens).
    log_ratio_clip: |log ρ| is clamped to this before exp (E.3's log-prob clip [−10, 10]); None = off.
    kl_coef:        β of an optional KL penalty to a reference policy (E.3: 0.02), a token mean.
    kl_estimator:   its per-token estimate of KL(π_θ || π_ref) (`kl_term`): k1, k2, k3 (E.3) or low_var_kl.
    entropy_coef:   c of an entropy bonus −c·H, H the token mean of the policy's entropy at the response
                    tokens (the learner passes the per-token entropies); 0 = off.
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
    kl_estimator: KLEstimator = "k3"
    entropy_coef: float = 0.0
    norm_length: float | None = None

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
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {self.aggregation!r} (valid: {', '.join(AGGREGATIONS)})")
        if self.aggregation == "seq-mean-token-sum-norm" and (self.norm_length is None or not self.norm_length > 0):
            raise ValueError(
                "norm_length must be a positive constant L for seq-mean-token-sum-norm (max response tokens)"
            )
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown kl_estimator {self.kl_estimator!r} (valid: {', '.join(KL_ESTIMATORS)})")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.entropy_coef < 0:
            raise ValueError(f"entropy_coef must be >= 0, got {self.entropy_coef}")


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
        # a host copy, then one move: torch.tensor(..., device=) would build the tensor below torch's
        # dispatch, where a device check (tests/llm/device_guard.py) cannot see it
        return FlatBatch(
            old_logp=torch.tensor(batch.old_logp.values, dtype=dtype).to(device),
            advantages=torch.tensor(batch.advantages.values, dtype=dtype).to(device),
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


def aggregate(x: torch.Tensor, flat: FlatBatch, cfg: LossConfig) -> tuple[torch.Tensor, torch.Tensor | float]:
    """J from the per-token terms x_t (LossConfig.aggregation) and ∂J/∂x_t, with S sequences of T_s tokens
    and N tokens in all:

        token-mean              J = 1/N Σ_t x_t                        (GRPO, Eq. 9)
        seq-mean-token-mean     J = 1/S Σ_s 1/T_s Σ_{t∈s} x_t           (Eq. 6)
        seq-mean-token-sum      J = 1/S Σ_s Σ_{t∈s} x_t
        seq-mean-token-sum-norm J = 1/S Σ_s Σ_{t∈s} x_t / L             (Dr.GRPO, L = norm_length)

    The derivative is the same for every t of a sequence; it is a tensor only where it varies (Eq. 6's
    1/(S·T_s)), else a number."""
    if cfg.aggregation == "token-mean":
        return x.mean(), 1.0 / x.numel()
    if cfg.aggregation == "seq-mean-token-mean":
        per_seq, count = _segment_mean(x, flat.token_seq, flat.num_seqs, flat.one_token_seqs)
        count = count if flat.one_token_seqs else count[flat.token_seq]
        return per_seq.mean(), count  # the caller divides by count·S (the order autograd uses)
    scale = float(flat.num_seqs) * (1.0 if cfg.aggregation == "seq-mean-token-sum" else float(cfg.norm_length))
    return x.sum() / scale, 1.0 / scale


def kl_term(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(π_θ || π_ref) at tokens sampled from the rollout policy (Schulman 2020,
    "Approximating KL divergence"), with d = log π_ref − log π_θ:

        k1 = −d,   k2 = d²/2,   k3 = e^d − d − 1 (E.3; non-negative),   low_var_kl = min(k3, 10)

    (low_var_kl: k3 clamped to [−10, 10] as verl's low-variance estimator; k3 ≥ 0, so only the top bites)."""
    d = ref_logp.to(logp.dtype) - logp
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    k3 = torch.exp(d) - d - 1.0
    return k3.clamp(-10.0, 10.0) if estimator == "low_var_kl" else k3


def _kl_term_grad(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """∂ kl_term / ∂ log π_θ per token: k1: 1; k2: −d; k3: 1 − e^d; low_var_kl: k3's where k3 ≤ 10, else 0."""
    d = ref_logp.to(logp.dtype) - logp
    if estimator == "k1":
        return torch.ones_like(logp)
    if estimator == "k2":
        return -d
    g = 1.0 - torch.exp(d)
    if estimator == "low_var_kl":
        g = g * ((torch.exp(d) - d - 1.0) <= 10.0)
    return g


def regularizer(
    logp: torch.Tensor,
    cfg: LossConfig,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """β·mean_t kl_t − c·mean_t H_t (token means; LossConfig.kl_coef/kl_estimator/entropy_coef), or None
    when neither is on.  entropy: (N,) the policy's entropy at each response token, differentiable."""
    out, metrics = None, {}
    if ref_logp is not None and cfg.kl_coef > 0:
        kl_value = kl_term(logp, ref_logp, cfg.kl_estimator).mean()
        out = cfg.kl_coef * kl_value
        metrics["loss/kl_ref"] = float(kl_value.detach())
    if cfg.entropy_coef > 0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the per-token entropies of the policy (the learner passes them)")
        ent = entropy.to(logp.dtype).mean()
        out = -cfg.entropy_coef * ent if out is None else out - cfg.entropy_coef * ent
        metrics["loss/entropy"] = float(ent.detach())
    return out, metrics


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
    coef: torch.Tensor | float  # ∂J/∂surrogate_t (seq-mean-token-mean: each token's sequence length T_s)


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
    objective, coef = aggregate(surrogate, flat, cfg)
    return _Clipped(old, adv, weight, raw, ratio, clipped, ratio_adv, clipped_adv, hi, surrogate, objective, coef)


def _clipped_metrics(t: _Clipped, logp: torch.Tensor, cfg: LossConfig, reg_metrics: dict) -> dict[str, float]:
    with torch.no_grad():
        r = t.ratio.detach()
        is_clipped = ((r < 1.0 - cfg.clip_eps) & (t.adv < 0)) | ((r > 1.0 + t.hi) & (t.adv > 0))
        lr_ = t.raw_log_ratio.detach()  # log π_θ − log π_old
        # the four scalars leave torch in one conversion (float64 holds each exactly as float() would)
        objective, clipfrac, approx_kl, ratio_mean = (
            torch.stack(
                [
                    x.to(torch.float64)
                    for x in (
                        t.objective.detach(),
                        is_clipped.to(logp.dtype).mean(),
                        (torch.exp(lr_) - 1.0 - lr_).mean(),  # k3 of KL(old||new)
                        r.mean(),
                    )
                ]
            )
            .cpu()
            .tolist()
        )  # one device-to-host copy, wherever the learner's model lives
        metrics = {
            "loss/policy": -objective,
            "loss/clipfrac": clipfrac,
            "loss/approx_kl": approx_kl,
            "loss/ratio_mean": ratio_mean,
        }
        metrics.update(reg_metrics)
    return metrics


def clipped_policy_loss(
    logp: torch.Tensor,
    flat: FlatBatch,
    cfg: LossConfig,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """−J(θ) of Eq. 6 (or its GRPO/GSPO variants per `cfg`) plus the token-mean regularisers
    (`regularizer`: β·KL to the reference, −c·entropy) and grouped metrics.

    logp: (N,) log π_θ of the batch's response tokens, differentiable; everything else is constant.
    Only these N tokens enter the loss, so prefix (context) and continuation tokens of other turns
    receive no gradient (Thm 2(c), Eq. 80).
    """
    t = _clipped_terms(logp, flat, cfg)
    loss = -t.objective
    reg, reg_metrics = regularizer(logp, cfg, ref_logp, entropy)
    if reg is not None:
        loss = loss + reg
    return loss, _clipped_metrics(t, logp, cfg, reg_metrics)


def closed_form_gradient(cfg: LossConfig) -> bool:
    """Whether `clipped_policy_loss_grad` covers this configuration (the token-level ratio of Eq. 6,
    without an entropy bonus, whose gradient needs the whole distribution; GSPO's sequence ratio and
    REFUEL's regression go through autograd)."""
    return cfg.objective == "clipped" and cfg.ratio == "token" and cfg.entropy_coef == 0


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

    with c_i = ∂J/∂x_i of the aggregation (`aggregate`: 1/N, 1/(S·T_seq(i)), 1/S or 1/(S·L)), and for the
    KL penalty β/N · ∂kl_i/∂log π_i (`_kl_term_grad`; k3: 1 − π_ref/π_θ).
    """
    if not closed_form_gradient(cfg):
        raise ValueError(
            "clipped_policy_loss_grad covers the clipped loss with the token-level ratio and no entropy bonus only"
        )
    with torch.no_grad():
        t = _clipped_terms(logp, flat, cfg)
        s1, s2 = t.ratio_adv, t.clipped_adv
        if cfg.aggregation == "seq-mean-token-mean":
            count = flat.num_seqs
            if flat.unit_weight and flat.one_token_seqs:
                d_min = -1.0 / count  # weight 1 and seq_count 1 everywhere: the same value as a number
            else:
                d_min = -t.weight / (t.coef * count)
        elif flat.unit_weight:
            d_min = -t.coef
        else:
            d_min = -t.coef * t.weight
        g1 = torch.where(s1 < s2, 1.0, torch.where(s1 == s2, 0.5, 0.0))
        inside = (t.ratio >= 1.0 - cfg.clip_eps) & (t.ratio <= 1.0 + t.hi)
        g_ratio = d_min * (g1 * t.adv + (1.0 - g1) * t.adv * inside)
        grad = g_ratio * t.ratio
        if cfg.log_ratio_clip is not None:
            grad = grad * (t.raw_log_ratio.abs() <= cfg.log_ratio_clip)
        loss = -float(t.objective)
        reg, reg_metrics = regularizer(logp, cfg, ref_logp)
        if reg is not None:
            loss = float(-t.objective + reg)
            g_kl = cfg.kl_coef / logp.numel()
            if cfg.kl_estimator == "k3":
                grad = grad - (g_kl * torch.exp(ref_logp.to(logp.dtype) - logp) - g_kl)  # autograd's order
            else:
                grad = grad + g_kl * _kl_term_grad(logp, ref_logp, cfg.kl_estimator)
    return loss, grad, _clipped_metrics(t, logp, cfg, reg_metrics)


@dataclass
class AdaptiveKL:
    """The adaptive KL coefficient of Ziegler et al. (2019, "Fine-Tuning Language Models from Human
    Preferences", §2.2): after an update whose measured KL to the reference is KL, over n samples,

        β ← β · (1 + clip(KL / target − 1, −0.2, 0.2) · n / horizon),

    so β grows while the policy drifts past the target and shrinks while it stays below.  Mutable: the
    method holds one across iterations and checkpoints `value`."""

    value: float
    target: float
    horizon: int = 10000

    def update(self, kl: float, n: int) -> None:
        err = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n / self.horizon


def pair_regression_loss(
    logp: torch.Tensor,
    flat: FlatBatch,
    cfg: LossConfig,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
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
    reg, metrics = regularizer(logp, cfg, ref_logp, entropy)
    if reg is not None:
        loss = loss + reg
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
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss `cfg.objective` names: the clipped surrogate (Eq. 6 and variants) or REFUEL's pair
    regression, plus the regularisers.  Learners call this one entry point."""
    if cfg.objective == "pair_regression":
        return pair_regression_loss(logp, flat, cfg, ref_logp, entropy)
    return clipped_policy_loss(logp, flat, cfg, ref_logp, entropy)
