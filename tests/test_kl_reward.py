"""KL in the reward (UpdateConfig.kl_placement = "reward", rtpo.core.kl_reward): the per-turn penalty by hand,
and a GRPO update on a tabular tool chain whose advantages are the hand-shaped returns' (Ziegler et al.
2019, Eq. 2; verl's use_kl_in_reward), with the loss's KL term off so β is not counted twice.

Mutants: the penalty added instead of subtracted (tried: every GRPO case and the paths test red), or
the estimator ignored (always k1), turns test_grpo_advantages_read_the_penalised_reward red; loss_config keeping kl_coef under the reward placement turns test_reward_placement_leaves_the_loss_kl_off
red.  The adaptive controller with the KL in the reward (test_adaptive_beta_in_the_reward_by_hand): the
controller updated with n = trajectories instead of turn rows, or not updated in `rollout`, or `ppo`
injecting its β into the loss under the reward placement, each turn it red.  The llm backend through `rtpo run` is tests/llm/test_kl_reward_llm.py (slow).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _method_helpers import make, stack

from rtpo.core.kl_reward import penalise_rewards, turn_kl_sums
from rtpo.core.types import Ragged
from rtpo.scenario.load import ConfigError, load_scenario


def test_turn_kl_penalty_by_hand():
    """Two turns: old log-probs (−1, −2) and (−0.5), reference (−1.5, −1) and (−0.5), β = 0.1."""
    old = Ragged(np.array([-1.0, -2.0, -0.5]), np.array([0, 2, 3]))
    ref = Ragged(np.array([-1.5, -1.0, -0.5]), np.array([0, 2, 3]))
    # k1 = log π_old − log π_ref: (0.5 − 1.0) and 0
    np.testing.assert_allclose(0.1 * turn_kl_sums(old, ref, "k1"), [0.1 * (0.5 - 1.0), 0.0], rtol=1e-15)
    # k3 = e^d − d − 1, d = log π_ref − log π_old = (−0.5, 1.0) and 0
    k3 = (math.exp(-0.5) + 0.5 - 1) + (math.exp(1.0) - 1.0 - 1)
    np.testing.assert_allclose(0.1 * turn_kl_sums(old, ref, "k3"), [0.1 * k3, 0.0], rtol=1e-15)
    # k2 = d²/2
    np.testing.assert_allclose(2.0 * turn_kl_sums(old, ref, "k2"), [2.0 * (0.125 + 0.5), 0.0], rtol=1e-15)
    empty = Ragged(np.array([-1.0]), np.array([0, 0, 1]))  # an empty turn has no penalty
    np.testing.assert_allclose(1.0 * turn_kl_sums(empty, empty, "k1"), [0.0, 0.0])


def _capture(ctx) -> list:
    seen = []
    step = ctx.learner.train_step

    def record(batch, loss):
        seen.append((batch, loss))
        return step(batch, loss)

    ctx.learner.train_step = record
    return seen


def _reference_away_from_theta(ctx, seed: int) -> torch.Tensor:
    """Move the learner's reference off the sampler's θ0, so the KL is not zero at the first rollout."""
    rng = np.random.default_rng(seed)
    ref = ctx.learner.ref_params + torch.as_tensor(rng.normal(size=tuple(ctx.learner.ref_params.shape)))
    ctx.learner.ref_params = ref
    return ref


@pytest.mark.parametrize("columnar", [True, False], ids=["columnar", "per_episode"])
@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_grpo_advantages_read_the_penalised_reward(columnar, estimator):
    """GRPO (G = 4, A = R − μ) on tool_chain K = 3: with the penalty in the reward every sequence's advantage
    moves by −β(S_i − mean_group S), S_i = Σ over its tokens of kl(log π_old, log π_ref) computed here from
    the batch's recorded log-probs and the reference table; the same run without a KL gives the unshaped
    advantages (same rollouts: the penalty draws no random numbers)."""
    beta, G, queries = 0.3, 4, 3
    batches = []
    for placement, coef in (("loss", 0.0), ("reward", beta)):
        _, _, ctx = stack(K=3, seed=5, columnar=columnar)
        ref = _reference_away_from_theta(ctx, 11)
        seen = _capture(ctx)
        method = make("grpo", G=G, normalize=False, kl_coef=coef, kl_placement=placement, kl_estimator=estimator)
        state = method.begin(ctx, np.arange(queries))
        while state.pending:
            method.phase(ctx, state)
        batches.append(seen[0])
    (plain, _), (shaped, loss) = batches
    assert loss.kl_coef == 0.0, "the reward placement must leave the loss's KL term off"
    np.testing.assert_array_equal(shaped.tokens.values, plain.tokens.values)
    np.testing.assert_array_equal(shaped.old_logp.values, plain.old_logp.values)
    pairs = np.asarray(shaped.contexts.values, dtype=np.int64).reshape(-1, 2)
    ref_lp = torch.log_softmax(ref, -1).numpy()[pairs[:, 0], pairs[:, 1], shaped.tokens.values]
    d = ref_lp - shaped.old_logp.values
    kl = -d if estimator == "k1" else np.exp(d) - d - 1
    seqs = np.unique(shaped.seq_id)
    s = np.array([kl[np.isin(np.repeat(shaped.seq_id, shaped.tokens.lengths), q)].sum() for q in seqs])
    first = shaped.tokens.offsets[:-1][np.unique(shaped.seq_id, return_index=True)[1]]
    a_plain, a_shaped = plain.advantages.values[first], shaped.advantages.values[first]
    group = np.arange(seqs.size) // G  # sequences are paths, G per query, query by query
    for g in range(queries):
        assert abs(a_plain[group == g].sum()) < 1e-12, "A = R − μ sums to 0 in each group (the grouping is right)"
    mean_s = np.array([s[group == g].mean() for g in group])
    np.testing.assert_allclose(
        a_shaped - a_plain, -beta * (s - mean_s), atol=1e-12, err_msg="advantages are not the penalised returns'"
    )
    assert np.abs(s).max() > 1e-3, "the reference was moved: some penalty must be non-zero"


def test_reward_placement_leaves_the_loss_kl_off():
    """kl_placement 'reward' keeps kl_coef (β of the reward penalty) but the loss gets β = 0; 'loss' keeps it."""
    on_reward = make("grpo", G=2, kl_coef=0.05, kl_placement="reward")
    on_loss = make("grpo", G=2, kl_coef=0.05)
    assert on_reward.cfg.loss_config().kl_coef == 0.0
    assert on_loss.cfg.loss_config().kl_coef == 0.05
    assert make("rtpo", G=2, kl_coef=0.05, kl_placement="reward").cfg.loss_config().kl_coef == 0.0
    assert make("refuel", kl_coef=0.05, kl_placement="reward").cfg.loss().kl_coef == 0.0


def test_penalise_rewards_paths_agree():
    """The columnar and per-episode rollouts get the same penalised rewards, and each is r − β Σ kl."""
    _, _, ctx = stack(K=3, seed=2)
    _reference_away_from_theta(ctx, 3)
    method = make("rtpo", G=2)
    res = method.rollout(ctx, np.arange(4))
    col, col_stats = penalise_rewards(res, ctx.learner, 0.2, "k3")
    per, per_stats = penalise_rewards(res.per_episode(), ctx.learner, 0.2, "k3")
    assert col_stats == per_stats, "both paths must measure the same KL"
    for a, b, raw in zip(col.trajectories, per.trajectories, res.trajectories):
        np.testing.assert_array_equal(a.rewards, b.rewards)
        assert np.all(a.rewards <= raw.rewards), "k3 is non-negative: a penalty never raises a reward"
    assert any(np.any(a.rewards < raw.rewards) for a, raw in zip(col.trajectories, res.trajectories))


def test_kl_placement_config_errors():
    with pytest.raises(ValueError, match="unknown kl_placement 'both'"):
        make("grpo", G=2, kl_coef=0.1, kl_placement="both")
    with pytest.raises(ValueError, match="kl_target needs kl_target > 0 and a starting kl_coef > 0"):
        make("grpo", G=2, kl_coef=0.0, kl_placement="reward", kl_target=0.01)
    make("grpo", G=2, kl_coef=0.1, kl_placement="reward", kl_target=0.01)  # the adaptive β in the reward is valid
    with pytest.raises(ConfigError, match="method.kl_placement: unknown kl_placement 'everywhere'"):
        load_scenario(None, ["method.kl_placement=everywhere"])


class _NoReference:
    def __getattr__(self, name):
        raise AttributeError(name)


def test_a_learner_without_a_reference_is_one_line():
    _, _, ctx = stack(K=2, seed=0)
    res = make("grpo", G=2).rollout(ctx, np.arange(1))
    with pytest.raises(TypeError, match="needs a learner with ref_logprobs"):
        penalise_rewards(res, _NoReference(), 0.1, "k1")


def test_adaptive_beta_in_the_reward_by_hand(monkeypatch):
    """GRPO (G = 3) on tool_chain K = 3, kl_placement reward, kl_coef β0 = 0.05, kl_target 0.01, horizon 40:
    the first iteration's rollout is penalised with β0, and the controller then holds
    β1 = β0·(1 + clip(KL/0.01 − 1, ±0.2)·n/40), KL = the mean over the rollout's turn rows of their
    token-mean k3 (one token per tabular row), n = the number of turn rows (9 paths × 3 turns), computed
    here from the raw rollout and the reference table.  The phase's metrics carry kl_reward/* with those
    figures; the second iteration penalises with β1; the loss gets β = 0 both times and no loss/kl_coef.
    Mutants: n = trajectories; no update in `rollout`; `ppo` injecting β into the loss (all red)."""
    import rtpo.core.methods.base as base_mod

    raw = []
    real_rollout = base_mod.rollout

    def recording(*args, **kwargs):
        raw.append(real_rollout(*args, **kwargs))
        return raw[-1]

    monkeypatch.setattr(base_mod, "rollout", recording)
    beta0, target, horizon = 0.05, 0.01, 40
    _, _, ctx = stack(K=3, seed=7)
    ref = _reference_away_from_theta(ctx, 13)
    seen = _capture(ctx)
    method = make("grpo", G=3, kl_coef=beta0, kl_placement="reward", kl_target=target, kl_horizon=horizon)
    metrics = []
    for _ in range(2):
        state = method.begin(ctx, np.arange(3))
        while state.pending:
            metrics.append(method.phase(ctx, state))
    cols = raw[0].columns
    pairs = np.asarray(cols.contexts.values, dtype=np.int64).reshape(-1, 2)
    ref_lp = torch.log_softmax(ref, -1).numpy()[pairs[:, 0], pairs[:, 1], cols.tokens.values]
    d = ref_lp - cols.logp.values
    kl_rows = np.exp(d) - d - 1  # k3, one token per row: the row's token mean
    n = len(cols.tokens)
    assert n == 9 * 3, f"9 paths of 3 turns expected, got {n} rows"
    kl = kl_rows.mean()
    beta1 = beta0 * (1 + min(max(kl / target - 1, -0.2), 0.2) * n / horizon)
    assert abs(kl / target - 1) > 1e-3, "the hand KL must move β (else the test checks nothing)"
    first = metrics[0]
    assert first["kl_reward/coef"] == beta0, "the first rollout is penalised with the starting β"
    assert first["kl_reward/rows"] == n
    assert first["kl_reward/token_kl_mean"] == pytest.approx(kl, rel=1e-12), "measured KL is not the row mean"
    assert first["kl_reward/penalty_mean"] == pytest.approx(beta0 * kl, rel=1e-12)
    assert metrics[1]["kl_reward/coef"] == pytest.approx(beta1, rel=1e-12), "iteration 2 must penalise with β1"
    assert all(loss.kl_coef == 0.0 for _, loss in seen), "the reward placement's loss must have no KL term"
    assert not any("loss/kl_coef" in m for m in metrics), "loss/kl_coef belongs to the loss placement"
