"""The tabular backend: the core's Environment, Sampler and Learner protocols on a TurnMDP.

Everything is vectorised over the batch: episodes are two int arrays (turn, global state index), a
context is the token pair (k, ψ_k(s)), a response is one token (the macro-action's index).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

try:  # Adam's functional kernel, the one Adam.step calls (TabularLearner._adam_step)
    from torch.optim.adam import adam as _adam_functional
except ImportError:  # pragma: no cover - a torch without it takes Adam.step
    _adam_functional = None

from rtpo.core.loss import FlatBatch, LossConfig, clipped_policy_loss_grad, closed_form_gradient, policy_loss
from rtpo.core.schedule import LRSchedule, make_lr_scheduler, restore_lr
from rtpo.core.types import Generation, Ragged, StepOutcome, TurnBatch
from rtpo.tabular.mdp import TurnMDP
from rtpo.tabular.policy import SoftmaxTable, TabularPolicy
from rtpo.tabular.solve import evaluate, solve, uniform_policy


@dataclass(frozen=True)
class TabularEpisodes:
    """B live episodes: turn (B,) and state (B,) in the MDP's flat state numbering."""

    turn: np.ndarray
    state: np.ndarray


class TabularEnv:
    """Environment protocol over a TurnMDP; snapshots are (k, state) int pairs, so forking is O(1)."""

    def __init__(self, mdp: TurnMDP) -> None:
        self.mdp = mdp
        self.num_turns = mdp.num_turns
        self.gamma = mdp.gamma
        off = mdp.state_offset
        K, A = mdp.num_turns, mdp.num_actions
        B = max(p.shape[-1] for p in mdp.prob)
        total = int(off[-1])
        self._psi = np.concatenate(mdp.psi)
        self._reward = np.concatenate(mdp.reward)
        self._tau = np.concatenate(mdp.tau)
        self._succ = np.zeros((total, A, B), dtype=np.int64)
        self._cum = np.ones((total, A, B))
        self._ends = np.zeros((total, A), dtype=bool)
        self._turn_of = np.repeat(np.arange(K), mdp.num_states)
        for k in range(K):
            lo, hi, b = off[k], off[k + 1], mdp.prob[k].shape[-1]
            nxt = off[k + 1] if k + 1 < K else 0
            self._succ[lo:hi, :, :b] = mdp.succ[k] + nxt
            self._cum[lo:hi, :, :b] = np.cumsum(mdp.prob[k], axis=-1)
            self._ends[lo:hi] = mdp.prob[k].sum(axis=-1) <= 0.0
            if b < B:
                self._succ[lo:hi, :, b:] = self._succ[lo:hi, :, b - 1 : b]

    def reset(self, query_ids: np.ndarray, rng: np.random.Generator) -> TabularEpisodes:
        n = len(query_ids)
        s0 = np.searchsorted(np.cumsum(self.mdp.init), rng.random(n), side="right")
        s0 = np.minimum(s0, self.mdp.num_states[0] - 1)
        return TabularEpisodes(np.zeros(n, dtype=np.int64), s0.astype(np.int64))

    def contexts(self, ep: TabularEpisodes) -> Ragged:
        return Ragged.from_dense(np.stack([ep.turn, self._psi[ep.state]], axis=1))

    def turn_index(self, ep: TabularEpisodes) -> np.ndarray:
        return ep.turn

    def step(
        self, ep: TabularEpisodes, gen: Generation, rng: np.random.Generator
    ) -> tuple[TabularEpisodes, StepOutcome]:
        n = ep.turn.size
        A = self.mdp.num_actions
        a = np.zeros(n, dtype=np.int64)
        lengths = gen.tokens.lengths
        first = gen.tokens.values[np.minimum(gen.tokens.offsets[:-1], max(gen.tokens.values.size - 1, 0))] if n else a
        malformed = (lengths != 1) | (first < 0) | (first >= A)
        any_malformed = bool(malformed.any())
        if any_malformed:
            a[~malformed] = first[~malformed]
        else:
            a = first.astype(np.int64)
        s = ep.state
        sa = s * A + a  # one flat (state, action) index for every table
        reward = self._reward.reshape(-1)[sa]
        if self.mdp.bernoulli_rewards:
            reward = (rng.random(n) < reward).astype(np.float64)
        u = rng.random(n)
        width = self._succ.shape[-1]
        cum = np.take(self._cum.reshape(-1, width), sa, axis=0)
        idx = np.minimum(_count_at_most(cum, u), width - 1)
        nxt = self._succ.reshape(-1)[sa * width + idx]
        done = self._ends.reshape(-1)[sa] | (ep.turn >= self.num_turns - 1)
        tau = self._tau.reshape(-1)[sa]
        if any_malformed:
            done |= malformed
            reward[malformed] = 0.0
            tau = np.where(malformed, np.maximum(lengths, 1), tau)
        duration = tau.astype(np.float64)
        nxt = np.where(done, s, nxt)
        out = StepOutcome(reward=reward, duration=duration, done=done, feedback=[None] * n, malformed=malformed)
        return TabularEpisodes(np.where(done, ep.turn, ep.turn + 1), nxt), out

    def snapshot(self, ep: TabularEpisodes) -> np.ndarray:
        return np.stack([ep.turn, ep.state], axis=1)

    def restore(self, snapshots: Sequence[np.ndarray]) -> TabularEpisodes:
        arr = np.asarray(snapshots, dtype=np.int64).reshape(-1, 2)
        if np.any(self._turn_of[arr[:, 1]] != arr[:, 0]):
            raise ValueError("snapshot names a state that does not belong to its turn")
        return TabularEpisodes(arr[:, 0].copy(), arr[:, 1].copy())

    def take(self, ep: TabularEpisodes, idx: np.ndarray) -> TabularEpisodes:
        return TabularEpisodes(ep.turn[idx], ep.state[idx])

    def local_state(self, ep: TabularEpisodes) -> np.ndarray:
        """The state index within its own turn's space."""
        return ep.state - self.mdp.state_offset[ep.turn]


# a row of 1, 2, 4 or 8 bools read as one unsigned integer: its popcount is the row's count of True
_ROW_AS_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _count_at_most(cum: np.ndarray, u: np.ndarray) -> np.ndarray:
    """(cum <= u[..., None]).sum(axis=-1) as int64: how many entries of each row of a cumulative
    distribution lie at or below its uniform draw (inverse-CDF sampling).  Rows of 1, 2, 4 or 8
    entries are counted as the popcount of their bytes: numpy's sum over a short last axis costs
    several times the comparison itself."""
    le = np.ascontiguousarray(cum <= u[..., None])
    as_uint = _ROW_AS_UINT.get(le.shape[-1])
    if as_uint is None or not hasattr(np, "bitwise_count"):  # numpy < 2 has no popcount
        return le.sum(axis=-1)
    return np.bitwise_count(le.view(as_uint)).reshape(le.shape[:-1]).astype(np.int64)


def _context_pairs(contexts: Ragged) -> tuple[np.ndarray, np.ndarray]:
    """(turn, context id) of each row of a batch of tabular contexts, as int64 arrays."""
    if contexts.values.size != 2 * len(contexts) or not contexts.is_uniform(2):
        raise ValueError("tabular contexts are (turn, context id) token pairs")
    pairs = np.asarray(contexts.values, dtype=np.int64).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def _decode_contexts(contexts: Ragged) -> tuple[torch.Tensor, torch.Tensor]:
    turn, ctx = _context_pairs(contexts)
    return torch.tensor(turn), torch.tensor(ctx)


# policies with at most this many (turn, context, action) cells are evaluated as a whole table
_TABLE_LIMIT = 1 << 20


class TabularSampler:
    """Sampler protocol: draws actions from the policy with the weights it was last given.

    Weights only change at a sync, so when the policy's (turn, context) table is small (at most
    `table_limit` entries) the sampler keeps log π_k(·|c) of every (k, c), computed with the same torch
    log-softmax the learner runs (row by row the same arithmetic, so the log-probs stay bit-identical to
    the learner's), together with its cumulative distribution; sampling is then a gather over the live
    rows instead of a policy evaluation.

    A sync changes only the turns whose weights changed (one per RTPO phase) and re-evaluates none of
    them at once: until a changed turn's table is rebuilt its rows are evaluated as they are asked for
    (the same arithmetic), and the turn's table is rebuilt once the rows asked for since the sync reach
    its number of contexts — so the work after a sync is at most twice the smaller of the two (a phase
    that samples 2,000 rows of a turn with 32,768 contexts evaluates 2,000 rows, not the table).
    """

    def __init__(self, policy: TabularPolicy, params: np.ndarray, table_limit: int | None = None) -> None:
        self.policy = policy
        self.table_limit = _TABLE_LIMIT if table_limit is None else table_limit
        self.load_weights(params)

    def load_weights(self, weights: np.ndarray) -> None:
        """Take a copy of `weights`; the turns they change are re-evaluated when next sampled (class doc).

        A turn-separable policy's turn k depends on weights[k] alone, so a sync after one RTPO phase
        (which trains one turn) changes that turn's rows only; the rows are the same arithmetic as a whole
        rebuild (`policy.log_prob_turn`), so the log-probs are bit-identical either way (tested)."""
        previous = self._params if getattr(self, "_table", None) is not None else None
        self._params = torch.as_tensor(np.array(weights, dtype=np.float64, copy=True))
        self._source = None  # weights from anywhere: the next load_from copies the learner's whole
        K, C, A = self.policy.num_turns, self.policy.num_contexts, self.policy.num_actions
        if K * C * A > self.table_limit:
            self._table = self._cdf = None
            self.synced_turns = K
            return
        if previous is not None and self.policy.turn_separable and previous.shape == self._params.shape:
            old, new = previous.numpy(), self._params.numpy()
            changed = [k for k in range(K) if not np.array_equal(old[k], new[k])]
            self._stale[changed] = True
            self._asked[changed] = 0
            self.synced_turns = len(changed)
            return
        with torch.no_grad():
            lp = self.policy.log_prob_table(self._params).numpy()
        # one row per (turn, context) cell, row k·C + c: np.take of rows is a block copy (a 2-D fancy
        # index costs several times as much)
        self._table = np.ascontiguousarray(lp.reshape(K * C, A))
        self._cdf = np.cumsum(np.exp(self._table), axis=-1)
        self._stale = np.zeros(K, bool)  # turns whose table rows predate their weights
        self._asked = np.zeros(K, np.int64)  # rows of each stale turn evaluated one by one since its sync
        self.synced_turns = K

    def load_from(self, learner: TabularLearner) -> None:
        """The sync of RunContext.sync from a TabularLearner, in proportion to what changed: copy only the
        turns the learner has changed (its turn_versions) since this sampler last took its weights — one
        turn after an RTPO phase, where load_weights(learner.weights()) copies the whole table twice and
        compares it — and mark them for re-evaluation (class doc).  Bit-identical to load_weights
        (tests/test_sampler_sync.py).  The first sync from a learner, one after load_weights, and a
        policy that is not turn-separable take load_weights(learner.weights())."""
        versions = getattr(learner, "turn_versions", None)
        token = getattr(learner, "sync_token", None)
        source = getattr(self, "_source", None)
        if versions is None or not self.policy.turn_separable or source is None or source[0] is not token:
            self.load_weights(learner.weights())
            if versions is not None and self.policy.turn_separable:
                self._source = (token, versions.copy())
            return
        seen = source[1]
        changed = np.flatnonzero(versions != seen)
        with torch.no_grad():
            for k in changed.tolist():
                self._params[k].copy_(learner.turn_weights(k))
        if self._table is not None:
            self._stale[changed] = True
            self._asked[changed] = 0
        seen[changed] = versions[changed]
        self.synced_turns = int(changed.size)

    def _rebuild_turn(self, k: int) -> None:
        C = self.policy.num_contexts
        rows = slice(k * C, (k + 1) * C)
        with torch.no_grad():
            self._table[rows] = self.policy.log_prob_turn(self._params, k).numpy()
        np.cumsum(np.exp(self._table[rows]), axis=-1, out=self._cdf[rows])
        self._stale[k] = False

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        """The (K·C, A) log-prob and cumulative tables with every turn up to date (None, None above
        table_limit)."""
        if self._table is not None:
            for k in np.flatnonzero(self._stale).tolist():
                self._rebuild_turn(k)
        return self._table, self._cdf

    def _table_rows(self, k: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(log π, its cumulative sum) of the rows (k[i], c[i]), (B, A) each, from the table; rows of a
        stale turn are evaluated directly, or the turn is rebuilt first once its rows asked for since the
        sync reach C."""
        C = self.policy.num_contexts
        cell = k * C + c
        direct = None
        if self._stale.any():
            hit = self._stale[k]
            if hit.any():
                turns, counts = np.unique(k[hit], return_counts=True)
                for t, n in zip(turns.tolist(), counts.tolist()):
                    self._asked[t] += n
                    if self._asked[t] >= C:
                        self._rebuild_turn(t)
                direct = np.flatnonzero(self._stale[k])
        lp, cum = np.take(self._table, cell, axis=0), np.take(self._cdf, cell, axis=0)
        if direct is not None and direct.size:
            with torch.no_grad():
                rows = self.policy.log_probs(
                    self._params, torch.from_numpy(k[direct]), torch.from_numpy(c[direct])
                ).numpy()
            lp[direct] = rows
            cum[direct] = np.cumsum(np.exp(rows), axis=-1)
        return lp, cum

    def current_weights(self) -> np.ndarray:
        """A copy of the weights the sampler holds (they may lag the learner's between syncs)."""
        return self._params.numpy().copy()

    def action_log_probs(self, contexts: Ragged) -> np.ndarray:
        if self._table is not None:
            k, c = _context_pairs(contexts)
            return self._table_rows(k, c)[0]
        turn, ctx = _decode_contexts(contexts)
        with torch.no_grad():
            return self.policy.log_probs(self._params, turn, ctx).numpy()

    def normalized_entropy(self, contexts: Ragged, turn: np.ndarray) -> np.ndarray:
        """(B,) H(π(·|c)) / log A: the entropy ARPO's branching rule reads after a tool call."""
        lp = self.action_log_probs(contexts)
        return -(np.exp(lp) * lp).sum(axis=1) / np.log(lp.shape[1])

    def generate(self, contexts: Ragged, turn: np.ndarray, n: int, rng: np.random.Generator) -> Generation:
        if self._table is not None:
            lp, cum = self._table_rows(*_context_pairs(contexts))  # (B, A) each
        else:
            lp = self.action_log_probs(contexts)  # (B, A)
            cum = np.cumsum(np.exp(lp), axis=1)
        u = rng.random((lp.shape[0], n)) * cum[:, -1:]
        A = lp.shape[1]
        a = np.minimum(_count_at_most(cum[:, None, :], u), A - 1)  # (B, n)
        chosen = np.take(lp.reshape(-1), a + (np.arange(lp.shape[0]) * A)[:, None])  # lp[i, a[i, j]]
        tokens = Ragged.from_dense(a.reshape(-1, 1))
        return Generation(tokens, Ragged._owned(chosen.reshape(-1), tokens.offsets))


class TabularLearner:
    """Learner protocol: torch parameters, the core's clipped loss, Adam or SGD.

    For a turn-separable policy (a softmax table) the parameters are one tensor per turn and only the
    turns present in a minibatch enter its graph.  Their gradient is then None, not zero, so Adam skips
    them: its momentum cannot keep moving turns that Algorithm 1 has frozen (an update on one shared
    (K, C, A) tensor would, since Adam steps every entry with a non-zero first moment).

    closed_form: a softmax table trained with the token-ratio clipped loss takes its gradient without
    autograd — the loss's closed-form ∂/∂log π (`clipped_policy_loss_grad`, beside the loss it
    differentiates) times ∂log π_k(a|c)/∂θ[k, c] = onehot(a) − π_k(·|c) — and hands it to the same
    torch optimiser; the same bits as autograd (tested), without building a graph per step.
    False (or any other policy or loss) takes autograd.
    """

    def __init__(
        self,
        policy: TabularPolicy,
        params: np.ndarray,
        lr: float = 0.1,
        optimizer: str = "adam",
        closed_form: bool = True,
        lr_schedule: LRSchedule | None = None,
    ) -> None:
        self.policy = policy
        # the closed form runs torch's own log_softmax backward kernel (bit-identical to autograd); a torch
        # without that op takes autograd
        self.closed_form = (
            bool(closed_form) and isinstance(policy, SoftmaxTable) and hasattr(torch, "_log_softmax_backward_data")
        )
        self._flat: tuple[TurnBatch, FlatBatch, tuple | None] | None = None
        p = torch.as_tensor(np.array(params, dtype=np.float64, copy=True))
        parts = list(p.unbind(0)) if policy.turn_separable else [p]
        self.parts = [torch.nn.Parameter(x.clone()) for x in parts]
        self.ref_params = p.clone()
        # turn_versions[k]: bumped whenever parts[k] may change (an optimiser step with its gradient set, a
        # load); with sync_token (this learner's identity) it lets TabularSampler.load_from copy and
        # re-evaluate only the turns that changed since its last sync from this learner
        self.turn_versions = np.zeros(len(self.parts), np.int64)
        self.sync_token = object()
        # foreach=False: the single-tensor loop torch picks for CPU tensors anyway, named so that no step
        # re-derives it by inspecting every parameter
        if optimizer == "adam":
            self.opt = torch.optim.Adam(self.parts, lr=lr, foreach=False)
        elif optimizer == "sgd":
            self.opt = torch.optim.SGD(self.parts, lr=lr, foreach=False)
        else:
            raise ValueError(f"unknown optimizer {optimizer!r}; valid: adam, sgd")
        self.steps = 0  # optimiser steps taken: the learning-rate schedule's position
        schedule = lr_schedule or LRSchedule()
        self.sched = make_lr_scheduler(self.opt, schedule)
        # a constant rate with no warm-up: factor(s) = 1.0 at every step, so the scheduler's step would
        # set each group's lr to base·1.0, the value it already holds
        self._constant_lr = schedule.kind == "constant" and schedule.warmup_steps == 0
        # Adam.step is a per-call wrapper (hooks, profiler scope, grad mode, graph-capture check) around
        # _init_group and the functional adam(); a step calls those two directly: the same kernel, in
        # the same order, on the same state (bench/bench_tabular.py: the per-phase fixed cost)
        self._adam = optimizer == "adam" and hasattr(self.opt, "_init_group") and _adam_functional is not None

    def _adam_step(self) -> None:
        """What torch.optim.Adam.step does for our one parameter group, without its per-call wrapper."""
        group = self.opt.param_groups[0]
        params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps = [], [], [], [], [], []
        has_complex = self.opt._init_group(group, params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps)
        beta1, beta2 = group["betas"]
        _adam_functional(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            max_sqs,
            steps,
            amsgrad=group["amsgrad"],
            has_complex=has_complex,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=group["maximize"],
            foreach=group["foreach"],
            capturable=group["capturable"],
            differentiable=group["differentiable"],
            fused=group["fused"],
            grad_scale=None,
            found_inf=None,
            decoupled_weight_decay=group["decoupled_weight_decay"],
        )

    def _step(self, metrics: dict[str, float]) -> dict[str, float]:
        """The optimiser step, then the schedule's (metrics get the learning rate the step ran at)."""
        metrics["train/lr"] = float(self.opt.param_groups[0]["lr"])
        for k, part in enumerate(self.parts):  # the optimisers skip a part whose gradient is None
            if part.grad is not None:
                self.turn_versions[k] += 1
        if self._adam:
            with torch.no_grad():
                self._adam_step()
            self.opt._opt_called = True  # what Adam.step's scheduler wrapper records
        else:
            self.opt.step()
        if self._constant_lr:
            self.sched.last_epoch += 1  # the scheduler's position, as its step would move it
        else:
            self.sched.step()
        self.steps += 1
        return metrics

    def _logits(self, turn: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        if not self.policy.turn_separable:
            return self.policy.logits(self.parts[0], turn, ctx)
        lo, hi = torch.aminmax(turn) if turn.numel() else (turn.new_zeros(()), turn.new_ones(()))
        if int(lo) == int(hi):  # one turn (an RTPO phase): its table alone, no split and merge
            return self.parts[int(lo)][ctx]
        # the tables of the turns present, stacked: one gather, and absent turns stay out of the graph
        present = torch.unique(turn)
        where = torch.full((len(self.parts),), -1, dtype=torch.int64)
        where[present] = torch.arange(present.numel())
        return torch.stack([self.parts[k] for k in present.tolist()])[where[turn], ctx]

    def _token_logp(self, batch: TurnBatch, params: torch.Tensor | None = None, entropy: bool = False):
        """log π of each row's action (and, with entropy=True, also each row's entropy −Σ_a π log π, both
        differentiable)."""
        if not batch.tokens.is_uniform(1):
            raise ValueError("tabular responses are exactly one token (the action)")
        turn, ctx = _decode_contexts(batch.contexts)
        if params is None:
            lp = torch.log_softmax(self._logits(turn, ctx), dim=-1)
        else:
            lp = self.policy.log_probs(params, turn, ctx)
        chosen = lp.gather(1, torch.tensor(batch.tokens.values, dtype=torch.int64)[:, None]).squeeze(1)
        return (chosen, -(lp.exp() * lp).sum(-1)) if entropy else chosen

    def logprobs(self, batch: TurnBatch) -> Ragged:
        with torch.no_grad():
            K, C, A = self.policy.num_turns, self.policy.num_contexts, self.policy.num_actions
            if K * C * A <= min(_TABLE_LIMIT, 4 * batch.tokens.values.size * A):
                # the whole (turn, context) table in one evaluation, then a gather: row by row the same
                # arithmetic as the batch's own rows (so still bit-identical to the sampler's log-probs)
                if not batch.tokens.is_uniform(1):
                    raise ValueError("tabular responses are exactly one token (the action)")
                k, c = _context_pairs(batch.contexts)
                params = torch.stack(self.parts) if self.policy.turn_separable else self.parts[0]
                table = self.policy.log_prob_table(params).numpy()
                lp = table[k, c, np.asarray(batch.tokens.values, np.int64)]
            else:
                lp = self._token_logp(batch).numpy()
        return Ragged(lp, batch.tokens.offsets)

    def ref_logprobs(self, batch: TurnBatch) -> Ragged:
        """log π_ref of each row's action under the reference (initial) parameters (ReferenceLogprobs)."""
        with torch.no_grad():
            return Ragged(self._token_logp(batch, self.ref_params).numpy(), batch.tokens.offsets)

    def train_step(self, batch: TurnBatch, loss: LossConfig) -> dict[str, float]:
        # epochs over one minibatch hand the same (immutable) batch again: its token view is reused
        if self._flat is None or self._flat[0] is not batch:
            self._flat = (batch, FlatBatch.from_batch(batch), None)
        flat = self._flat[1]
        if self.closed_form and closed_form_gradient(loss):
            return self._closed_form_step(batch, flat, loss)
        logp, entropy = (
            self._token_logp(batch, entropy=True) if loss.entropy_coef > 0 else (self._token_logp(batch), None)
        )
        ref = None
        if loss.kl_coef > 0:
            with torch.no_grad():
                ref = self._token_logp(batch, self.ref_params)
        value, metrics = policy_loss(logp, flat, loss, ref, entropy)
        self.opt.zero_grad(set_to_none=True)
        value.backward()
        grads = [p.grad for p in self.parts if p.grad is not None]
        metrics["train/grad_norm"] = float(torch.sqrt(sum((g**2).sum() for g in grads))) if grads else 0.0
        return self._step(metrics)

    def _table_rows(self, batch: TurnBatch) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """(present turns, each row's cell in their stacked (turns·C) table, each row's action as (N, 1)):
        the batch's indices for the closed-form step, built once per batch (kept across its epochs)."""
        if self._flat[2] is None:
            if not batch.tokens.is_uniform(1):
                raise ValueError("tabular responses are exactly one token (the action)")
            turn, ctx = _context_pairs(batch.contexts)
            if turn.size and turn.min() == turn.max():  # an RTPO phase: one turn, its table alone
                present, cell = [int(turn[0])], ctx
            else:
                turns = np.unique(turn)
                where = np.zeros(len(self.parts), np.int64)
                where[turns] = np.arange(turns.size)
                present, cell = turns.tolist(), where[turn] * self.policy.num_contexts + ctx
            act = torch.from_numpy(np.array(batch.tokens.values, np.int64))[:, None]
            self._flat = (*self._flat[:2], (present, torch.from_numpy(np.array(cell, np.int64)), act))
        return self._flat[2]

    def _closed_form_step(self, batch: TurnBatch, flat: FlatBatch, loss: LossConfig) -> dict[str, float]:
        """One optimiser step of the table policy with the gradient in closed form (see the class doc)."""
        present, cell, act = self._table_rows(batch)
        with torch.no_grad():
            # log π of the present turns' tables, then the batch's rows: row by row the same arithmetic
            # as _token_logp, so the same log-probs, loss value and metrics
            parts = self.parts[present[0]][None] if len(present) == 1 else torch.stack([self.parts[k] for k in present])
            # the batch's rows only: log_softmax is row by row, so these are the bits of the whole table's
            # rows (a phase's batch touches a few hundred of a table's cells; the table may hold 10⁵ or more)
            lp = torch.log_softmax(parts.reshape(-1, parts.shape[-1]).index_select(0, cell), dim=-1)  # (N, A)
            logp = lp.gather(1, act).squeeze(1)
            ref = None
            if loss.kl_coef > 0:
                ref = self._token_logp(batch, self.ref_params)
            _, g, metrics = clipped_policy_loss_grad(logp, flat, loss, ref)
            # ∂/∂θ[k, c] of log π_k(a|c) is onehot(a) − π_k(·|c): the kernel autograd runs for
            # log_softmax's backward on the gather's one-hot gradient, then the rows summed per cell in
            # row order as autograd's index backward does — so the same bits as autograd's gradient
            one_hot = torch.zeros_like(lp).scatter_(1, act, g[:, None])
            rows = torch._log_softmax_backward_data(one_hot, lp, 1, lp.dtype)
            grad = torch.zeros_like(parts).reshape(-1, parts.shape[-1]).index_add_(0, cell, rows)
            grad = grad.reshape(parts.shape)
            slot = dict(zip(present, grad.unbind(0)))
            for k, part in enumerate(self.parts):  # = zero_grad(set_to_none=True), then the present turns' grads
                part.grad = slot.get(k)
            metrics["train/grad_norm"] = float(torch.sqrt(sum((g_**2).sum() for g_ in slot.values())))
        return self._step(metrics)

    def turn_weights(self, k: int) -> torch.Tensor:
        """Turn k's parameters (a turn-separable policy's θ[k]) as the learner holds them: a view, not a copy."""
        return self.parts[k].detach()

    def weights(self) -> np.ndarray:
        with torch.no_grad():
            if self.policy.turn_separable:
                return torch.stack(self.parts).numpy()  # the stack is already a fresh array: no second copy
            return self.parts[0].numpy().copy()

    def state_dict(self) -> dict:
        return {
            "params": self.weights(),
            "ref": self.ref_params.numpy().copy(),
            "opt": self.opt.state_dict(),
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict) -> None:
        w = torch.tensor(state["params"])
        with torch.no_grad():
            for part, x in zip(self.parts, w.unbind(0) if self.policy.turn_separable else [w]):
                part.copy_(x)
        self.turn_versions += 1  # every part was overwritten
        self.ref_params = torch.as_tensor(state["ref"]).clone()
        self.opt.load_state_dict(state["opt"])
        self.steps = int(state.get("steps", 0))  # a checkpoint from before schedules: a constant rate anyway
        restore_lr(self.sched, self.steps)


class TabularEvaluator:
    """Exact value of the learner's current policy against V* (identity ψ) and the ψ-projected optimum."""

    def __init__(self, mdp: TurnMDP, policy: TabularPolicy) -> None:
        self.mdp = mdp
        self.policy = policy
        full = solve(mdp)
        self.v_star = full.value
        q0 = full.q[0]  # Q̃*_0(s, u): the optimal first actions of each start state
        self._first_ok = q0 >= q0.max(axis=1, keepdims=True) - 1e-9
        self.v_star_psi = solve(mdp, mdp.psi, prefix_policy=uniform_policy(mdp)).value
        self.v_uniform = evaluate(mdp, uniform_policy(mdp)).value

    def __call__(self, learner: TabularLearner) -> dict[str, float]:
        table = self.policy.table(learner.weights())
        value = evaluate(self.mdp, table).value
        greedy = table[0][self.mdp.psi[0]].argmax(axis=1)  # (S_0,) the policy's most likely first action
        wrong = ~self._first_ok[np.arange(greedy.size), greedy]
        return {
            # start-state mass whose most likely first action is not optimal (a seed "locked onto a wrong
            # first action" when this is above 1/2 at the end)
            "eval/first_action_wrong": float(self.mdp.init @ wrong),
            "eval/value": value,
            "eval/v_star": self.v_star,
            "eval/v_star_psi": self.v_star_psi,
            "eval/v_uniform": self.v_uniform,
            "eval/value_over_v_star": value / self.v_star if self.v_star != 0 else float("nan"),
        }
