"""What a method is: a way to build TurnBatches from rollouts plus an update schedule.

A method runs one iteration as a list of phases (RTPO: one per turn, K−1 down to 0; GRPO: one).  The
runner calls `begin` once per iteration and `phase` until nothing is pending, checkpointing between
phases, so the IterationState must be picklable and a resumed run continues at the next phase.

The bookkeeping lives here, once: `Method.phase` pops the next pending phase and counts it before the
method's `run_phase` sees it, and `Method.rollout` charges every rollout to the budget.  A method
implements `begin` and `run_phase` and rolls out only through `self.rollout`, so it can forget neither.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from rtpo.core.budget import Budget
from rtpo.core.kl_reward import KLRewardStats, kl_reward_metrics, penalise_rewards
from rtpo.core.loss import AdaptiveKL, Aggregation, LossConfig, RatioLevel
from rtpo.core.protocols import Environment, Learner, Sampler
from rtpo.core.registry import Registry
from rtpo.core.rollout import RolloutResult, rollout
from rtpo.core.train import ppo_update
from rtpo.core.types import TurnBatch

_KL_KEY = "adaptive_kl_coef"  # checkpoint_state's key for the adaptive β
KL_PLACEMENTS = ("loss", "reward")


@dataclass(frozen=True)
class UpdateConfig:
    """The PPO-update settings every method shares; a method's Config extends it.

    epochs:         PPO epochs E per phase (Algorithm 1 step 2.4).
    minibatch_size: sequences per optimiser step; None = the whole phase batch in one step.
    clip_eps:       ε of Eq. 6; clip_eps_high: optional asymmetric upper clip.
    kl_coef:        β of the KL penalty to the reference (initial) policy (E.3: 0.02); 0 = off.
    kl_placement:   where that penalty goes: "loss" (β · token-mean KL added to the loss, E.3) or "reward"
                    (β · Σ_t KL of a turn's tokens subtracted from the turn's reward before returns and
                    advantages, as verl's use_kl_in_reward: rtpo.core.kl_reward).
    log_ratio_clip: |log ρ| clamp before exp (E.3: 10).
    kl_estimator:   per-token KL estimate (rtpo.core.loss.kl_term): k1 | k2 | k3 (E.3) | low_var_kl.
    kl_target:      adaptive KL controller (rtpo.core.loss.AdaptiveKL, Ziegler et al. 2019 §2.2): β starts at
                    kl_coef and is scaled by 1 + clip(KL/kl_target − 1, ±0.2)·n/kl_horizon after every
                    update (placement loss: KL = the update's loss/kl_ref, n = its rows) or every
                    penalised rollout (placement reward, as verl: KL = the mean over turn rows of their
                    token-mean KL, n = those rows); None = a fixed β.
    kl_horizon:     the controller's horizon, in rows (samples).
    entropy_coef:   c of the entropy bonus −c·H in the loss (token mean at the response tokens); 0 = off.
    loss_aggregation: token aggregation of the policy loss for any method (rtpo.core.loss.aggregate):
                    token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
                    (Dr.GRPO); None = the method's own (RTPO: seq-mean-token-mean, Eq. 6; GRPO: token-mean).
    norm_length:    L of seq-mean-token-sum-norm (Dr.GRPO: the max response tokens).
    """

    epochs: int = 1
    minibatch_size: int | None = None
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    kl_coef: float = 0.0
    log_ratio_clip: float | None = 10.0
    kl_estimator: str = "k3"
    kl_placement: str = "loss"
    kl_target: float | None = None
    kl_horizon: int = 10000
    entropy_coef: float = 0.0
    loss_aggregation: str | None = None
    norm_length: float | None = None

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError("epochs must be >= 1")
        if self.minibatch_size is not None and self.minibatch_size < 1:
            raise ValueError("minibatch_size must be >= 1")
        if self.kl_target is not None and not (self.kl_target > 0 and self.kl_coef > 0):
            raise ValueError("kl_target needs kl_target > 0 and a starting kl_coef > 0")
        if self.kl_horizon < 1:
            raise ValueError("kl_horizon must be >= 1")
        if self.kl_placement not in KL_PLACEMENTS:
            raise ValueError(f"unknown kl_placement {self.kl_placement!r} (valid: {', '.join(KL_PLACEMENTS)})")
        self.loss_config()  # clip and ratio settings are checked where the loss defines them

    @property
    def loss_kl_coef(self) -> float:
        """β of the loss's KL term: kl_coef, or 0 when the penalty is in the reward."""
        return self.kl_coef if self.kl_placement == "loss" else 0.0

    def loss_config(self, ratio: RatioLevel = "token", aggregation: Aggregation = "seq-mean-token-mean") -> LossConfig:
        return LossConfig(
            clip_eps=self.clip_eps,
            clip_eps_high=self.clip_eps_high,
            ratio=ratio,
            aggregation=self.loss_aggregation or aggregation,
            log_ratio_clip=self.log_ratio_clip,
            kl_coef=self.loss_kl_coef,
            kl_estimator=self.kl_estimator,
            entropy_coef=self.entropy_coef,
            norm_length=self.norm_length,
        )


@dataclass
class RunContext:
    """The backend objects a method drives, plus the shared rng and budget counter."""

    env: Environment
    sampler: Sampler
    learner: Learner
    rng: np.random.Generator
    budget: Budget = field(default_factory=Budget)
    # True: methods read rollouts as columns (rtpo.core.types.Rollouts, vectorised returns and batches);
    # False: the per-episode path (one Trajectory object per episode).  Same results either way.
    columnar: bool = True

    def sync(self) -> None:
        """Push the learner's weights to the sampler (Algorithm 1 step 2.1).  A sampler that can read the
        learner itself (an IncrementalSync, e.g. the tabular one: only the turns that changed) does."""
        load_from = getattr(self.sampler, "load_from", None)  # the protocol's one method, as rollout asks
        if load_from is not None:
            load_from(self.learner)
        else:
            self.sampler.load_weights(self.learner.weights())


@dataclass
class IterationState:
    """pending: phases still to run, in order; data: the method's own picklable payload."""

    pending: list[Any]
    data: Any = None
    done_phases: int = 0


class Method(ABC):
    name: ClassVar[str]
    Config: ClassVar[type]

    def __init__(self, cfg: Any) -> None:
        if not isinstance(cfg, self.Config):
            raise TypeError(f"{type(self).__name__} needs a {self.Config.__name__}, got {type(cfg).__name__}")
        self.cfg = cfg

    @abstractmethod
    def begin(self, ctx: RunContext, query_ids: np.ndarray) -> IterationState:
        """Start an iteration on these queries (generate whatever the phases share)."""

    @abstractmethod
    def run_phase(self, ctx: RunContext, state: IterationState, key: Any) -> dict[str, float]:
        """Run phase `key` (already popped from state.pending and counted in state.done_phases, which
        therefore includes this phase) and return its metrics."""

    def phase(self, ctx: RunContext, state: IterationState) -> dict[str, float]:
        """Run the next pending phase: pop it, count it, then `run_phase` (the runner's one entry point).
        With kl_placement "reward" the metrics carry kl_reward/* over the rollouts since the last phase
        (this phase's and, for the first, `begin`'s: rtpo.core.kl_reward.kl_reward_metrics)."""
        key = state.pending.pop(0)
        state.done_phases += 1
        metrics = self.run_phase(ctx, state, key)
        stats: list[KLRewardStats] = getattr(self, "_kl_reward_stats", [])
        if stats:
            metrics.update(kl_reward_metrics(stats))
            self._kl_reward_stats = []
        return metrics

    def rollout(
        self,
        ctx: RunContext,
        query_ids: np.ndarray,
        snapshots: list | None = None,
        n: int = 1,
        record_boundaries: bool = False,
    ) -> RolloutResult:
        """rtpo.core.rollout from fresh episodes of these queries (snapshots None) or from these boundary
        snapshots, n responses per episode at the first step; the rollouts, turns and tokens it generates
        are charged to ctx.budget.  With kl_placement "reward" the turns' rewards come back KL-penalised
        (rtpo.core.kl_reward), so every method's returns and advantages read the penalised reward; β is
        the adaptive controller's current value when there is one, and the controller then moves by this
        rollout's measured KL (rtpo.core.kl_reward's module docstring; n = its turn rows with tokens)."""
        q = np.asarray(query_ids, dtype=np.int64)
        episodes = ctx.env.reset(q, ctx.rng) if snapshots is None else ctx.env.restore(snapshots)
        res = rollout(ctx.env, ctx.sampler, episodes, q, ctx.rng, n=n, record_boundaries=record_boundaries)
        if not ctx.columnar and res.columns is not None:
            res = res.per_episode()
        ctx.budget.charge(len(res.trajectories), res.turns, res.tokens)
        if getattr(self.cfg, "kl_placement", "loss") == "reward" and self.cfg.kl_coef > 0:
            ctl = self.kl_controller()
            beta = self.cfg.kl_coef if ctl is None else ctl.value
            res, stats = penalise_rewards(res, ctx.learner, beta, self.cfg.kl_estimator)
            if ctl is not None and stats.rows:
                ctl.update(stats.token_kl_mean, stats.rows)
            self._kl_reward_stats = [*getattr(self, "_kl_reward_stats", []), stats]
        return res

    def kl_controller(self) -> AdaptiveKL | None:
        """The adaptive KL coefficient (UpdateConfig.kl_target), created on first use; None: a fixed β."""
        ctl = getattr(self, "_kl_ctl", None)
        if ctl is None and getattr(self.cfg, "kl_target", None) is not None:
            ctl = self._kl_ctl = AdaptiveKL(self.cfg.kl_coef, self.cfg.kl_target, self.cfg.kl_horizon)
        return ctl

    def ppo(self, ctx: RunContext, batch: TurnBatch, loss: LossConfig) -> dict[str, float]:
        """ppo_update with this method's epochs and minibatch size, under the adaptive KL coefficient when
        there is one and the KL is in the loss (which then moves by the update's measured loss/kl_ref;
        metric loss/kl_coef).  With kl_placement "reward" the loss has no KL term: `rollout` applies β."""
        ctl = self.kl_controller() if getattr(self.cfg, "kl_placement", "loss") == "loss" else None
        if ctl is not None:
            loss = dataclasses.replace(loss, kl_coef=ctl.value)
        metrics = ppo_update(ctx.learner, batch, loss, self.cfg.epochs, self.cfg.minibatch_size, ctx.rng)
        if ctl is not None:
            metrics["loss/kl_coef"] = loss.kl_coef
            ctl.update(metrics.get("loss/kl_ref", 0.0), len(batch.seq_id))
        return metrics

    def checkpoint_state(self) -> Any:
        """state_dict plus the adaptive KL coefficient, when there is one (what the runner checkpoints)."""
        inner = self.state_dict()
        ctl = self.kl_controller()
        return inner if ctl is None else {_KL_KEY: ctl.value, "method": inner}

    def load_checkpoint_state(self, state: Any) -> None:
        """Restore what checkpoint_state returned."""
        ctl = self.kl_controller()
        if isinstance(state, dict) and _KL_KEY in state:
            if ctl is not None:
                ctl.value = float(state[_KL_KEY])
            state = state["method"]
        self.load_state_dict(state)

    def state_dict(self) -> Any:
        """What the method carries from one iteration to the next (picklable), checkpointed by the runner
        with everything else; None: nothing (every method but the adaptive ones: an iteration's data
        lives in its IterationState)."""
        return None

    def load_state_dict(self, state: Any) -> None:
        """Restore what `state_dict` returned (None: a fresh method)."""
        if state is not None:
            raise ValueError(f"{type(self).__name__} keeps no state across iterations, but the checkpoint has some")

    def rollouts_per_query(self, num_turns: int) -> float | None:
        """Rollouts this method plans per query and iteration, where known in advance (equal-budget runs)."""
        return None


METHODS: Registry[type[Method]] = Registry("method")


def register_method(name: str):
    def deco(cls: type[Method]) -> type[Method]:
        cls.name = name
        return METHODS.register(name)(cls)

    return deco
