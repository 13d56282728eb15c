"""The learner's fast paths change cost only, never results: the ratio pass's forward reused by the next
train step (LearnerConfig.reuse_ratio_forward) and the versioned weight snapshot that lets the engine
skip reloading weights it already holds (LearnerConfig.cache_weights, VLLMEngine.load_weights)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from llm_test_constants import TEMPERATURE, vllm_missing
from test_learner import make_batch

from rtpo.core.loss import LossConfig
from rtpo.core.metrics import reproducible
from rtpo.core.train import rollout_train_ratio
from rtpo.llm.learner import FSDPLearner, LearnerConfig, WeightsSnapshot

CFG = LearnerConfig(lr=1e-2, eps=1e-2, weight_decay=0.01, grad_clip=1.0, temperature=TEMPERATURE)
LOSS = LossConfig(clip_eps=0.2)


def _counting(learner: FSDPLearner) -> list[int]:
    """Counts the learner's forward passes over the policy model."""
    calls = [0]
    inner = learner._token_logp

    def counted(model, batch, rows):
        if model is learner.model:
            calls[0] += 1
        return inner(model, batch, rows)

    learner._token_logp = counted
    return calls


def _phase(learner: FSDPLearner, batch, train_rows=None):
    """A method's phase tail: the §4.2 ratio pass, then one PPO step (on all rows or on train_rows)."""
    ratio = rollout_train_ratio(learner, batch)
    lp = learner.logprobs(batch).values  # a second ratio pass must see the same θ_old
    rows = np.arange(len(batch.seq_id)) if train_rows is None else np.asarray(train_rows)
    metrics = learner.train_step(batch.take(rows), LOSS)
    return ratio, lp, metrics, {k: v.clone() for k, v in learner.weights().items()}


@pytest.mark.parametrize("train_rows", [None, [0, 2]], ids=["same-rows", "other-rows"])
def test_reused_forward_gives_the_same_ratio_and_update(tiny_model_dir, train_rows):
    batch = make_batch(tiny_model_dir, seed=3)
    fast = FSDPLearner(tiny_model_dir, CFG)
    slow = FSDPLearner(tiny_model_dir, dataclasses.replace(CFG, reuse_ratio_forward=False))
    calls_fast, calls_slow = _counting(fast), _counting(slow)
    ratio_f, lp_f, m_f, w_f = _phase(fast, batch, train_rows)
    ratio_s, lp_s, m_s, w_s = _phase(slow, batch, train_rows)
    # the old path: two ratio passes + the train forward; the new one skips the train forward only
    # when the train step runs on the very rows of the last ratio pass
    assert calls_slow[0] == 3
    assert calls_fast[0] == (2 if train_rows is None else 3)
    for key in ratio_s:
        assert ratio_f[key] == pytest.approx(ratio_s[key], rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(lp_f, lp_s, rtol=0, atol=1e-6)
    for key in ("loss/policy", "loss/clipfrac", "train/grad_norm"):
        assert m_f[key] == pytest.approx(m_s[key], rel=1e-5, abs=1e-7)
    for k in w_s:
        torch.testing.assert_close(w_f[k], w_s[k], rtol=0, atol=1e-6)


def test_no_reuse_after_the_weights_moved(tiny_model_dir):
    """A ratio pass, a step, then a step on the same rows: the second step must run its own forward."""
    batch = make_batch(tiny_model_dir, seed=4)
    learner = FSDPLearner(tiny_model_dir, CFG)
    calls = _counting(learner)
    learner.logprobs(batch)
    learner.train_step(batch, LOSS)  # reuses the ratio pass
    learner.train_step(batch, LOSS)  # θ moved: a fresh forward
    assert calls[0] == 2


def test_weight_snapshot_versions(tiny_model_dir):
    batch = make_batch(tiny_model_dir, seed=5)
    learner = FSDPLearner(tiny_model_dir, CFG)
    w0 = learner.weights()
    assert isinstance(w0, WeightsSnapshot) and learner.weights() is w0  # unchanged: no second gather
    state = learner.state_dict()
    learner.train_step(batch, LOSS)
    w1 = learner.weights()
    assert w1.version != w0.version
    assert any(not torch.equal(w0[k], w1[k]) for k in w0)  # the old snapshot did not move with θ
    learner.load_state_dict(state)
    w2 = learner.weights()
    assert w2.version not in (w0.version, w1.version)
    for k in w0:
        torch.testing.assert_close(w2[k], w0[k], rtol=0, atol=0)
    plain = FSDPLearner(tiny_model_dir, dataclasses.replace(CFG, cache_weights=False))
    a, b = plain.weights(), plain.weights()
    assert a is not b and getattr(a, "version", None) is None


@pytest.mark.skipif(vllm_missing, reason="vllm is not installed")
def test_engine_skips_only_the_weights_it_holds(tiny_model_dir, vllm_session_engine):
    engine = vllm_session_engine
    learner = FSDPLearner(tiny_model_dir, CFG)
    original = {k: v.clone() for k, v in learner.weights().items()}  # the model folder's weights
    try:
        before = engine.reloads
        engine.load_weights(learner.weights())
        engine.load_weights(learner.weights())  # same version: skipped
        assert engine.reloads == before + 1
        learner.train_step(make_batch(tiny_model_dir, seed=6), LOSS)
        engine.load_weights(learner.weights())  # new version: reloaded
        assert engine.reloads == before + 2
        engine.load_weights(dict(learner.weights()))  # a plain dict carries no version: reloaded
        assert engine.reloads == before + 3
    finally:
        engine.load_weights(original)


def test_tied_weights_are_stored_once(tiny_model_dir):
    """The tied embedding and lm_head are one tensor in the weight snapshot and in the learner's state
    dict (one copy of the largest matrix, not two), and that copy does not move with training."""
    learner = FSDPLearner(tiny_model_dir, CFG)
    assert learner.model.config.tie_word_embeddings
    for sd in (learner.weights(), learner.state_dict()["model"]):
        emb, head = sd["model.embed_tokens.weight"], sd["lm_head.weight"]
        assert emb.data_ptr() == head.data_ptr()
        live = dict(learner.model.named_parameters())["model.embed_tokens.weight"]
        assert (
            emb.data_ptr() != live.data_ptr()
        )  # one rank: a plain module (LearnerConfig.fsdp_one_rank)  # a copy beside live state, shared by both names


def test_one_rank_without_fsdp_equals_fsdp_bit_for_bit(tiny_model_dir):
    """World size 1 skips FSDP2 (LearnerConfig.fsdp_one_rank=False): two steps with the KL term (its
    reference forward too) give the same metrics, entropy included, and the same weights, bit for bit,
    as the FSDP-wrapped learner; the row-wise entropy equals the whole-tensor formula."""
    from rtpo.llm.learner import _entropy

    cfg = dataclasses.replace(CFG, kl_reference=True, micro_batch_tokens=40)  # several micro-batches
    loss = LossConfig(clip_eps=0.2, kl_coef=0.1)
    plain, fsdp = (
        FSDPLearner(tiny_model_dir, cfg),
        FSDPLearner(tiny_model_dir, dataclasses.replace(cfg, fsdp_one_rank=True)),
    )
    assert not hasattr(plain.model, "set_requires_gradient_sync") and hasattr(fsdp.model, "set_requires_gradient_sync")
    for seed in (3, 4):
        batch = make_batch(tiny_model_dir, seed)
        # every metric but the machine's own measurements (perf/*, memory/*: FLOP/s, RSS)
        assert reproducible(plain.train_step(batch, loss)) == reproducible(fsdp.train_step(batch, loss))
    a, b = plain.weights(), fsdp.weights()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    log_p = torch.log_softmax(torch.randn(3, 5, 97, generator=torch.Generator().manual_seed(0)), -1)
    assert torch.equal(_entropy(log_p), -(log_p.exp() * log_p).sum(-1))
