"""The three protocols a backend implements, batched: Environment, Sampler, Learner.

The core drives them without knowing which backend (tabular arrays, vLLM + FSDP, Ray actors) is
behind them.  All batch data crossing these boundaries is in rtpo.core.types.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rtpo.core.loss import LossConfig
from rtpo.core.types import Generation, Ragged, StepOutcome, TurnBatch


@runtime_checkable
class Environment(Protocol):
    """A batch of episodes with turn-boundary snapshots.

    `Episodes` is the backend's own opaque batch object; the core only passes it back.
    """

    num_turns: int  # K, the turn horizon
    gamma: float

    def reset(self, query_ids: np.ndarray, rng: np.random.Generator) -> Any:
        """Start one episode per query id; returns the batch at boundary 0."""

    def contexts(self, episodes: Any) -> Ragged:
        """c_k = ψ(S_k) for each episode, as token ids (the exact ids the model will see)."""

    def turn_index(self, episodes: Any) -> np.ndarray:
        """(B,) the current turn k of each episode."""

    def step(self, episodes: Any, gen: Generation, rng: np.random.Generator) -> tuple[Any, StepOutcome]:
        """Apply one response per episode; returns the next batch (same order) and the outcome."""

    def snapshot(self, episodes: Any) -> list:
        """One picklable snapshot of S_k per episode."""

    def restore(self, snapshots: Sequence[Any]) -> Any:
        """A batch of episodes at the snapshots' boundaries; forking must not re-run the trunk."""

    def take(self, episodes: Any, idx: np.ndarray) -> Any:
        """The sub-batch idx (any order, repeats allowed, each repeat an independent copy)."""


@runtime_checkable
class Sampler(Protocol):
    def generate(self, contexts: Ragged, turn: np.ndarray, n: int, rng: np.random.Generator) -> Generation:
        """n responses per context, row-major: rows i*n..i*n+n-1 answer contexts[i]."""

    def load_weights(self, weights: Any) -> None:
        """Replace the policy weights (the sync of Algorithm 1 step 2.1)."""


@runtime_checkable
class Learner(Protocol):
    def logprobs(self, batch: TurnBatch) -> Ragged:
        """log π_θ(a_t | context, a_<t) for every response token, aligned with batch.tokens."""

    def train_step(self, batch: TurnBatch, loss: LossConfig) -> dict[str, float]:
        """One optimiser step on rtpo.core.loss.clipped_policy_loss over this minibatch."""

    def weights(self) -> Any:
        """Current weights, in the form the paired Sampler.load_weights accepts."""

    def state_dict(self) -> dict:
        """Weights and optimiser state for checkpoints."""

    def load_state_dict(self, state: dict) -> None: ...
