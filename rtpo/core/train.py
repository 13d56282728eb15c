"""Turning sibling groups into TurnBatches, and the PPO epoch/minibatch loop over a Learner."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rtpo.core.loss import LossConfig
from rtpo.core.protocols import Learner
from rtpo.core.types import Ragged, Rollouts, Trajectory, TurnBatch


def turn_rows(
    trajectories: Sequence[Trajectory],
    turn_offset: Sequence[int] | np.ndarray,
    advantages: np.ndarray,
    seq_id: np.ndarray | None = None,
    weight: np.ndarray | None = None,
) -> TurnBatch:
    """One row per trajectory: its response at local turn index turn_offset[i], trained on the context
    recorded at rollout (Eq. 5, 18: RTPO trains on the same c_k it sampled from).

    advantages: (B,) one advantage per row, repeated over the row's tokens.
    trajectories may be a Rollouts (columns, e.g. a `select` with one episode per row): the batch is
    then gathered from its row arrays, identical to the per-trajectory build.
    """
    b = len(trajectories)
    turn_offset = np.asarray(turn_offset, dtype=np.int64)
    advantages = np.asarray(advantages, dtype=np.float64).reshape(b)
    if isinstance(trajectories, Rollouts):  # columns: the same batch as gathers, no loop over rows
        if turn_offset.shape != (b,) or np.any(turn_offset < 0) or np.any(turn_offset >= trajectories.num_rows):
            raise IndexError("turn_rows: a turn offset outside its trajectory")
        rows = trajectories.row_start + turn_offset
        tok = _as(trajectories.tokens.take(rows), np.int64)
        width = tok._uniform_width()
        return TurnBatch(
            contexts=_as(trajectories.contexts.take(rows), np.int64),
            tokens=tok,
            old_logp=_as(trajectories.logp.take(rows), np.float64),
            # a fresh array over the tokens' (read-only) offsets: nothing to check or copy
            advantages=Ragged._owned(np.repeat(advantages, width if width else tok.lengths), tok.offsets),
            seq_id=np.arange(b, dtype=np.int64) if seq_id is None else seq_id,
            weight=np.ones(b) if weight is None else weight,
            turn=trajectories.turn[rows],
        )
    contexts = [t.contexts[int(j)] for t, j in zip(trajectories, turn_offset)]
    tokens = [t.tokens[int(j)] for t, j in zip(trajectories, turn_offset)]
    logp = [t.logp[int(j)] for t, j in zip(trajectories, turn_offset)]
    tok = Ragged.from_rows(tokens, dtype=np.int64)
    return TurnBatch(
        contexts=Ragged.from_rows(contexts, dtype=np.int64),
        tokens=tok,
        old_logp=Ragged.from_rows(logp, dtype=np.float64),
        advantages=Ragged(np.repeat(advantages, tok.lengths), tok.offsets),
        seq_id=np.arange(b, dtype=np.int64) if seq_id is None else seq_id,
        weight=np.ones(b) if weight is None else weight,
        turn=np.array([t.start_turn + int(j) for t, j in zip(trajectories, turn_offset)], dtype=np.int64),
    )


def _as(r: Ragged, dtype) -> Ragged:
    return r if r.values.dtype == dtype else Ragged(r.values.astype(dtype), r.offsets)


def rollout_train_ratio(learner: Learner, batch: TurnBatch) -> dict[str, float]:
    """The paper's rollout/train consistency metric (§4.2): the geometric-mean ratio
    exp(mean_t [log π_train(a_t|c) − log π_rollout(a_t|c)]) over the batch's tokens, at θ = θ_old,
    plus the mean absolute log-ratio and a k3 estimate of KL(π_rollout || π_train)."""
    train = learner.logprobs(batch).values
    d = train - batch.old_logp.values
    return {
        "consistency/rollout_train_ratio": float(np.exp(d.mean())) if d.size else 1.0,
        "consistency/abs_log_ratio": float(np.abs(d).mean()) if d.size else 0.0,
        "consistency/kl_rollout_train": float(np.mean(np.exp(d) - 1.0 - d)) if d.size else 0.0,
    }


def ppo_update(
    learner: Learner,
    batch: TurnBatch,
    loss: LossConfig,
    epochs: int,
    minibatch_size: int | None,
    rng: np.random.Generator,
) -> dict[str, float]:
    """E epochs over shuffled minibatches (Algorithm 1 step 2.4).  Minibatches split by sequence, so a
    multi-row sequence is never cut.  Returns the metrics averaged over all steps, plus
    `samples/turn_<k>`: the batch's rows (training samples) of each turn k present."""
    if epochs < 1:
        raise ValueError("epochs must be >= 1")
    seq_id = np.asarray(batch.seq_id)
    # strictly increasing ids (every RTPO batch: one row per sequence) are already their own np.unique
    seqs = seq_id if seq_id.size < 2 or bool(np.all(seq_id[1:] > seq_id[:-1])) else np.unique(seq_id)
    size = len(seqs) if not minibatch_size else int(minibatch_size)
    sums: dict[str, float] = {}
    steps = 0
    for _ in range(epochs):
        perm = rng.permutation(seqs)
        for lo in range(0, len(perm), size):
            if size >= len(perm):  # one minibatch: every row, in batch order (what the take would give)
                minibatch = batch
            else:
                chosen = perm[lo : lo + size]
                minibatch = batch.take(np.flatnonzero(np.isin(batch.seq_id, chosen)))
            metrics = learner.train_step(minibatch, loss)
            for key, v in metrics.items():
                sums[key] = sums.get(key, 0.0) + float(v)
            steps += 1
    out = {k: v / steps for k, v in sums.items()}
    out["train/steps"] = float(steps)
    # training samples of this update by turn (each counted once, however many epochs reuse it)
    turn = np.asarray(batch.turn, np.int64)
    if turn.size and turn.min() == turn.max():  # one turn (an RTPO phase)
        turns, counts = turn[:1], [turn.size]
    else:
        turns, counts = np.unique(turn, return_counts=True)
    out.update({f"samples/turn_{int(k)}": float(c) for k, c in zip(turns, counts)})
    return out
