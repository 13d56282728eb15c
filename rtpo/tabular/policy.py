"""Tabular policies over (turn k, context c): a softmax table and a log-linear policy on features.

Both map torch parameters to log π_k(· | c) with one function, `log_probs`, that the sampler and the
learner share, so at θ = θ_old the rollout and training log-probs are bit-identical (RTPO's ratio 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


class TabularPolicy:
    """Interface: params are one float64 array; logits(params, k, c) -> (B, A)."""

    num_turns: int
    num_contexts: int
    num_actions: int
    # True when params[k] alone parameterises turn k (a table); the learner then keeps one tensor per
    # turn so that training turn k cannot move any other turn (Algorithm 1: turn k+1.. stay frozen).
    turn_separable: bool = False

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def logits(self, params: torch.Tensor, turn: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def log_probs(self, params: torch.Tensor, turn: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """log π_k(· | c) for each (turn[i], ctx[i]): (B, A)."""
        return torch.log_softmax(self.logits(params, turn, ctx), dim=-1)

    def log_prob_table(self, params: torch.Tensor) -> torch.Tensor:
        """log π_k(· | c) of every (turn, context) cell: (K, C, A), row by row the same arithmetic as
        `log_probs` on those cells."""
        K, C = self.num_turns, self.num_contexts
        lp = self.log_probs(params, torch.arange(K).repeat_interleave(C), torch.arange(C).repeat(K))
        return lp.reshape(K, C, self.num_actions)

    def log_prob_turn(self, params: torch.Tensor, k: int) -> torch.Tensor:
        """log π_k(· | c) of every context c of turn k: (C, A), row by row `log_prob_table(params)[k]`."""
        return self.log_prob_table(params)[k]

    def table(self, params: np.ndarray) -> np.ndarray:
        """π as a dense (K, C, A) probability array (for the exact solvers)."""
        K, C = self.num_turns, self.num_contexts
        turn = torch.arange(K).repeat_interleave(C)
        ctx = torch.arange(C).repeat(K)
        with torch.no_grad():
            lp = self.log_probs(torch.as_tensor(params, dtype=torch.float64), turn, ctx)
        return lp.exp().numpy().reshape(K, C, self.num_actions)


@dataclass
class SoftmaxTable(TabularPolicy):
    """π_k(u | c) = softmax(θ[k, c])_u; params θ: (K, C, A), initialised to init_scale·N(0, 1)."""

    num_turns: int
    num_contexts: int
    num_actions: int
    init_scale: float = 0.0
    turn_separable = True

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        shape = (self.num_turns, self.num_contexts, self.num_actions)
        return self.init_scale * rng.standard_normal(shape)

    def logits(self, params, turn, ctx):
        return params[turn, ctx]

    def log_prob_table(self, params: torch.Tensor) -> torch.Tensor:
        # the table is its own (K, C, A) logits: one log_softmax over it, no gather of every cell
        return torch.log_softmax(params, dim=-1)

    def log_prob_turn(self, params: torch.Tensor, k: int) -> torch.Tensor:
        return torch.log_softmax(params[k], dim=-1)  # turn k's rows only: the same per-row arithmetic


@dataclass
class LogLinear(TabularPolicy):
    """π_k(u | c) ∝ exp(φ(k, c, u) · θ); features φ: (K, C, A, D), params θ: (D,).

    Contexts produced by different context maps (truncated vs full history) index one feature table,
    so they share θ — the setting where a flat trainer's context differs from the rollout's (MM1).
    """

    features: np.ndarray
    init_scale: float = 0.0

    def __post_init__(self) -> None:
        f = np.asarray(self.features, dtype=np.float64)
        if f.ndim != 4:
            raise ValueError(f"features must have shape (K, C, A, D), got {f.shape}")
        self.features = f
        self.num_turns, self.num_contexts, self.num_actions, self.dim = f.shape
        self._phi = torch.as_tensor(f)

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        return self.init_scale * rng.standard_normal(self.dim)

    def logits(self, params, turn, ctx):
        return self._phi[turn, ctx] @ params


def one_hot_features(num_turns: int, num_contexts: int, num_actions: int) -> np.ndarray:
    """Features that make LogLinear exactly a softmax table (one weight per (k, c, u))."""
    K, C, A = num_turns, num_contexts, num_actions
    return np.eye(K * C * A).reshape(K, C, A, K * C * A)
