"""Supervised fine-tuning on demonstrations (a warm start before RL), through the same learner and loss.

An SFT row is one assistant turn of a demonstration: its context c_k = ψ(S_k), rendered by the
environment's own context map from the demonstration's earlier turns (`DemonstrationEnvironment`), and
its response, the assistant's tokens.  Only response tokens enter a loss (TurnBatch, Eq. 80), so the
prompt, tool output and user turns that sit in the contexts are never trained on.

The update is the one clipped loss of Eq. 6 at ρ ≡ 1 and A ≡ 1: each optimiser step first takes the
log-probs at the current weights (π_old = π_θ), so the surrogate min(ρA, clip(ρ)A) has gradient
A ∇ρ = ∇ log π_θ per token, and with token-mean aggregation the step follows the gradient of the mean
log-likelihood of the assistant tokens (the usual SFT cross-entropy; the learner's temperature T
applies to it as to every log-prob).  The logged loss is that negative log-likelihood (`sft/nll`,
measured before the step).  No rollout is made and no budget is charged but the phase count.

One iteration = `queries_per_iteration` demonstrations (the runner cycles through them in order) =
`epochs` optimiser steps per minibatch, each with fresh log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rtpo.core.methods.base import IterationState, Method, RunContext, UpdateConfig, register_method
from rtpo.core.protocols import DemonstrationEnvironment
from rtpo.core.types import Ragged, TurnBatch


@dataclass(frozen=True)
class Demonstrations:
    """Training rows of some demonstrations: one row per assistant turn.

    contexts: Ragged (B rows) c_k = ψ(S_k) as the environment renders it.
    tokens:   Ragged (B rows) the assistant's response ids (the only tokens trained on).
    seq_id:   (B,) int64, the demonstration each row belongs to.
    turn:     (B,) int64, the turn index k of each row.
    """

    contexts: Ragged
    tokens: Ragged
    seq_id: np.ndarray
    turn: np.ndarray

    def __post_init__(self) -> None:
        b = len(self.tokens)
        if len(self.contexts) != b:
            raise ValueError("Demonstrations.contexts must have one row per response")
        for name in ("seq_id", "turn"):
            arr = np.asarray(getattr(self, name), dtype=np.int64)
            if arr.shape != (b,):
                raise ValueError(f"Demonstrations.{name} must have shape ({b},), got {arr.shape}")
            object.__setattr__(self, name, arr)


@dataclass(frozen=True)
class SFTConfig(UpdateConfig):
    """Supervised fine-tuning: `epochs` optimiser steps per iteration's demonstrations (fresh log-probs
    each), `minibatch_size` demonstrations per step (None = all of the iteration's).  data: the
    demonstrations file (the backend reads it: llm, rtpo.llm.sft).  clip_eps, kl_coef and
    log_ratio_clip do not act (ρ ≡ 1, no KL)."""

    data: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.data, str) or not self.data.strip():
            raise ValueError("sft: data must name the demonstrations file (method.data)")
        if self.kl_coef != 0:
            raise ValueError("sft: kl_coef must be 0 (supervised fine-tuning has no reference policy)")


def sft_batch(demos: Demonstrations, logp: Ragged | None = None) -> TurnBatch:
    """The TurnBatch of SFT rows: A ≡ 1, π_old = `logp` (the current log-probs; zeros before they exist)."""
    ones = Ragged(np.ones(demos.tokens.values.size), demos.tokens.offsets)
    old = logp if logp is not None else Ragged(np.zeros(demos.tokens.values.size), demos.tokens.offsets)
    return TurnBatch(
        contexts=demos.contexts,
        tokens=demos.tokens,
        old_logp=old,
        advantages=ones,
        seq_id=demos.seq_id,
        weight=np.ones(len(demos.tokens)),
        turn=demos.turn,
    )


@register_method("sft")
class SFT(Method):
    Config = SFTConfig

    def begin(self, ctx: RunContext, query_ids: np.ndarray) -> IterationState:
        if not isinstance(ctx.env, DemonstrationEnvironment):
            raise ValueError("method sft: this environment holds no demonstrations (set method.data)")
        return IterationState(pending=[0], data=np.asarray(query_ids, dtype=np.int64))

    def run_phase(self, ctx: RunContext, state: IterationState, key: Any) -> dict[str, float]:
        ids = state.data
        size = self.cfg.minibatch_size or ids.size
        loss = self.cfg.loss_config(aggregation="token-mean")
        sums: dict[str, float] = {}
        steps = 0
        nll, tokens, rows = 0.0, 0, 0
        for _ in range(self.cfg.epochs):
            for start in range(0, ids.size, size):
                demos = ctx.env.demonstrations(ids[start : start + size])
                logp = ctx.learner.logprobs(sft_batch(demos))
                nll -= float(np.sum(logp.values))
                tokens += logp.values.size
                rows += len(demos.tokens)
                metrics = ctx.learner.train_step(sft_batch(demos, logp), loss)
                steps += 1
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
        out = {k: v / steps for k, v in sums.items()}
        out.update(
            {
                "sft/nll": nll / max(tokens, 1),  # mean over every assistant token seen this iteration
                "sft/tokens": float(tokens),
                "sft/rows": float(rows),
                "sft/steps": float(steps),
            }
        )
        return out
