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


# -- optional capabilities: a backend object offers one by having the method; the core asks with isinstance --


@runtime_checkable
class FullHistoryEnvironment(Protocol):
    """An Environment that can also show each episode's full-history context (ψ = identity), beside the
    ψ-truncated `contexts`; the rollout records both and the flat baselines may train on it (Eq. 2/10)."""

    def full_contexts(self, episodes: Any) -> Ragged:
        """The full-history context of each episode, as token ids."""


@runtime_checkable
class EntropySampler(Protocol):
    """A Sampler that reports the normalised entropy of its policy at each context (ARPO's trigger)."""

    def normalized_entropy(self, contexts: Ragged, turn: np.ndarray) -> np.ndarray:
        """(B,) H(π(·|c)) / log|V| for each context (the tabular sampler: exact; an LLM: an estimate)."""


@runtime_checkable
class EpisodeRunner(Protocol):
    """A Sampler that runs whole episodes on its own workers (rtpo.distributed); rtpo.core.rollout hands
    the call to it unchanged, so methods drive local and distributed backends through one function."""

    def run_rollout(
        self, env: Any, episodes: Any, query_ids: np.ndarray, rng: np.random.Generator, n: int, record_boundaries: bool
    ) -> Any:
        """The RolloutResult rtpo.core.rollout would return for these arguments."""


@runtime_checkable
class IncrementalSync(Protocol):
    """A Sampler that takes the weights from its learner itself (RunContext.sync), copying only what changed
    since its last sync from that learner (rtpo.tabular's sampler: the turns a phase trained); it must end
    holding exactly the weights `load_weights(learner.weights())` would give it."""

    def load_from(self, learner: Any) -> None:
        """Hold `learner`'s current weights (the sync of Algorithm 1 step 2.1)."""


@runtime_checkable
class ReferenceLogprobs(Protocol):
    """A Learner that also evaluates its KL reference policy (the initial weights): what a KL penalty in the
    reward reads (rtpo.core.kl_reward)."""

    def ref_logprobs(self, batch: TurnBatch) -> Ragged:
        """log π_ref(a_t | context, a_<t) for every response token, aligned with batch.tokens."""


@runtime_checkable
class ReportsMetrics(Protocol):
    """A context or environment that keeps its own counters (timings, tool calls) and hands them over once."""

    def pop_metrics(self) -> dict[str, float]:
        """The counters since the last call, then reset."""


@runtime_checkable
class CountsGeneration(Protocol):
    """A sampler that counts what it generated: summed counts that add up across samplers (a Ray pool's
    workers), turned into the record's gen/* keys by rtpo.core.metrics.generation_metrics."""

    def pop_generation_counts(self) -> dict[str, float]:
        """{"time/generate_s", "gen/tokens", "gen/responses"} since the last call, then reset."""


@runtime_checkable
class Closeable(Protocol):
    """A built context that holds processes or actors to stop when the run ends."""

    def shutdown(self) -> None: ...


@runtime_checkable
class DemonstrationEnvironment(Protocol):
    """An Environment that also holds demonstrations (gold trajectories) and renders them as training rows
    with its own context map, so supervised fine-tuning (rtpo.core.methods.sft) trains on exactly the
    contexts a later RL run of the same environment sees."""

    num_demonstrations: int

    def demonstrations(self, ids: np.ndarray) -> Any:
        """rtpo.core.methods.sft.Demonstrations of demonstrations `ids` (indices into the set)."""
