"""The FSDP2 learner in one process: teacher-forced log-probs, the core loss, weight sync, checkpoints.

The two-rank equivalence lives in test_learner_dist.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from llm_test_constants import TEMPERATURE

from rtpo.core.loss import FlatBatch, LossConfig, policy_loss
from rtpo.core.train import rollout_train_ratio
from rtpo.core.types import Ragged, TurnBatch
from rtpo.llm.engines import SamplingConfig
from rtpo.llm.learner import FSDPLearner, LearnerConfig, plan_micro_batches
from rtpo.llm.model import load_hf_model

# Adam's first step is lr·g/(|g|+eps): a larger eps keeps it proportional to g, so implementations
# that differ only by float summation order give updates that differ by ~lr·1e-7, not by up to lr.
CFG = LearnerConfig(lr=1e-2, eps=1e-2, weight_decay=0.01, grad_clip=1.0, temperature=TEMPERATURE)


def make_batch(
    model_dir,
    seed: int,
    context_lengths=(20, 4, 9, 33),
    response_lengths=(6, 3, 8, 5),
    seq_id=None,
    noise: float = 0.05,
) -> TurnBatch:
    """Random ids; old log-probs = the model's own (teacher-forced at T) plus noise, so ratios are
    near 1 (some clipped) as in a real phase."""

    rng = np.random.default_rng(seed)
    ctx = Ragged.from_rows([rng.integers(9, 500, m) for m in context_lengths], dtype=np.int64)
    rsp = Ragged.from_rows([rng.integers(0, 500, m) for m in response_lengths], dtype=np.int64)
    ref = _ref_engine(model_dir)
    old = ref.teacher_forced_logprobs(ctx, rsp, TEMPERATURE).values + noise * rng.normal(size=rsp.values.size)
    b = len(ctx)
    adv_row = rng.normal(size=b)
    return TurnBatch(
        contexts=ctx,
        tokens=rsp,
        old_logp=Ragged(old, rsp.offsets),
        advantages=Ragged(np.repeat(adv_row, rsp.lengths), rsp.offsets),
        seq_id=np.arange(b) if seq_id is None else np.asarray(seq_id),
        weight=np.ones(b),
        turn=np.zeros(b),
    )


_REF: dict = {}


def _ref_engine(model_dir):
    from rtpo.llm.engines.hf import HFEngine

    key = str(model_dir)
    if key not in _REF:
        _REF[key] = HFEngine(model_dir, SamplingConfig(temperature=TEMPERATURE))
    return _REF[key]


def reference_step(model_dir, batch: TurnBatch, loss: LossConfig, cfg: LearnerConfig) -> dict[str, torch.Tensor]:
    """One plain-torch AdamW step on an unsharded HF model: per-row teacher forcing over context +
    response, log-probs of response tokens only (context tokens are not in the objective, Eq. 80),
    the core loss, global-norm clipping."""
    model = load_hf_model(model_dir).train()
    ref_model = load_hf_model(model_dir) if loss.kl_coef > 0 else None
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)

    entropies = []

    def token_logp(m):
        out = []
        for c, r in zip(batch.contexts, batch.tokens):
            ids = torch.as_tensor(np.concatenate([c, r]), dtype=torch.long)[None]
            logits = m(input_ids=ids).logits[0, c.size - 1 : c.size + r.size - 1].float() / cfg.temperature
            lp = torch.log_softmax(logits, -1)
            entropies.append(-(lp.exp() * lp).sum(-1))
            out.append(lp.gather(1, torch.as_tensor(np.array(r))[:, None]).squeeze(1))
        return torch.cat(out)

    ref = None
    if ref_model is not None:
        with torch.no_grad():
            ref = token_logp(ref_model)
    entropies.clear()
    logp = token_logp(model)
    entropy = torch.cat(entropies) if loss.entropy_coef > 0 else None
    value, _ = policy_loss(logp, FlatBatch.from_batch(batch), loss, ref, entropy)
    opt.zero_grad()
    value.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def assert_weights_close(a: dict, b: dict, atol: float = 2e-6) -> None:
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k].float(), b[k].float(), atol=atol, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


def test_logprobs_match_teacher_forcing_for_any_micro_batch(tiny_model_dir):
    batch = make_batch(tiny_model_dir, 0)
    expected = _ref_engine(tiny_model_dir).teacher_forced_logprobs(batch.contexts, batch.tokens, TEMPERATURE)
    for micro in (1, 40, 10_000):  # one row per pass, a few rows, everything at once (left padding)
        learner = FSDPLearner(tiny_model_dir, LearnerConfig(temperature=TEMPERATURE, micro_batch_tokens=micro))
        got = learner.logprobs(batch)
        np.testing.assert_array_equal(got.offsets, batch.tokens.offsets)
        np.testing.assert_allclose(got.values, expected.values, atol=1e-5, rtol=0)


def test_rollout_train_ratio_is_one_for_each_engine(engine, tiny_model_dir, contexts):
    """The paper's §4.2 consistency metric at θ = θ_old: rollout log-probs (processed, T = 0.9) against
    the learner's teacher-forced ones on the exact recorded ids."""
    engine.sampling = SamplingConfig(temperature=TEMPERATURE, max_tokens=12)
    n = 3
    gen = engine.generate(contexts, np.zeros(3, np.int64), n, np.random.default_rng(0))
    b = len(gen)
    adv = Ragged(np.zeros(gen.tokens.values.size), gen.tokens.offsets)
    batch = TurnBatch(
        contexts.take(np.repeat(np.arange(3), n)), gen.tokens, gen.logp, adv, np.arange(b), np.ones(b), np.zeros(b)
    )
    learner = FSDPLearner(tiny_model_dir, LearnerConfig(temperature=TEMPERATURE))
    m = rollout_train_ratio(learner, batch)
    assert abs(m["consistency/rollout_train_ratio"] - 1.0) < 1e-5
    assert m["consistency/abs_log_ratio"] < 1e-4
    wrong_t = FSDPLearner(tiny_model_dir, LearnerConfig(temperature=1.0))  # a temperature mismatch shows
    assert rollout_train_ratio(wrong_t, batch)["consistency/abs_log_ratio"] > 1e-2


@pytest.mark.parametrize(
    "loss",
    [
        LossConfig(),  # Eq. 6: token ratio, mean over sequences of token means
        LossConfig(aggregation="token-mean", kl_coef=0.1),  # GRPO-style aggregation with the k3 KL term
        LossConfig(ratio="sequence", clip_eps_high=0.28),  # GSPO sequence ratio, clip-higher
        LossConfig(objective="pair_regression", eta=0.5, kl_coef=0.1),  # REFUEL: two rows (y, y') per pair
        # Dr.GRPO's constant normaliser with the k1 KL (whose gradient is not zero at θ = θ_ref) and an
        # entropy bonus: every regulariser's token share across micro-batches
        LossConfig(
            aggregation="seq-mean-token-sum-norm", norm_length=8.0, kl_coef=0.1, kl_estimator="k1", entropy_coef=0.05
        ),
        LossConfig(aggregation="seq-mean-token-sum", entropy_coef=0.1),
    ],
    ids=["eq6", "token-mean-kl", "sequence", "refuel", "drgrpo-k1-entropy", "token-sum-entropy"],
)
def test_train_step_equals_unsharded_reference(tiny_model_dir, loss):
    pairs = loss.objective == "pair_regression"
    # a two-row sequence (GSPO) or pair (REFUEL) must stay whole in a micro-batch
    seq_id = (
        [0, 1, 1, 2]
        if loss.ratio == "sequence" or loss.aggregation.startswith("seq-mean-token-sum")
        else [0, 0, 1, 1]
        if pairs
        else None
    )
    batch = make_batch(tiny_model_dir, 1, seq_id=seq_id)
    if pairs:  # +1 on y, -1 on y'
        batch = dataclasses.replace(batch, weight=np.array([1.0, -1.0, 1.0, -1.0]))
    cfg = LearnerConfig(**{**CFG.__dict__, "kl_reference": loss.kl_coef > 0, "micro_batch_tokens": 30})
    learner = FSDPLearner(tiny_model_dir, cfg)
    metrics = learner.train_step(batch, loss)
    assert np.isfinite(metrics["loss/policy"]) and metrics["train/grad_norm"] > 0
    assert pairs or metrics["loss/clipfrac"] >= 0
    if loss.kl_coef > 0:
        assert metrics["loss/kl_ref"] == pytest.approx(0.0, abs=1e-9)  # θ = θ_ref at the first step
    assert_weights_close(learner.weights(), reference_step(tiny_model_dir, batch, loss, cfg))


def test_micro_batch_plan_keeps_sequences_whole_and_aligns_ranks(tiny_model_dir):
    batch = make_batch(
        tiny_model_dir, 2, context_lengths=(5, 6, 7, 8, 9), response_lengths=(2, 2, 2, 2, 2), seq_id=[3, 3, 1, 2, 2]
    )
    plan = plan_micro_batches(batch, world_size=3, micro_batch_tokens=12)
    assert len({len(p) for p in plan}) == 1  # every rank runs the same number of passes
    rows = np.concatenate([m for p in plan for m in p])
    np.testing.assert_array_equal(np.sort(rows), np.arange(5))
    for p in plan:
        for m in p:
            for s in np.unique(batch.seq_id[m]):
                assert set(np.flatnonzero(batch.seq_id == s)) <= set(m.tolist())


def test_weight_sync_learner_to_engine(engine, tiny_model_dir, contexts):
    """After a step, the engine serves the learner's new weights: its greedy path and log-probs are
    the learner's (the tied lm_head included)."""
    learner = FSDPLearner(tiny_model_dir, CFG)
    learner.train_step(make_batch(tiny_model_dir, 3), LossConfig())
    engine.sampling = SamplingConfig(temperature=0.0, max_tokens=8)
    before = engine.generate(contexts, np.zeros(3, np.int64), 1, np.random.default_rng(0))
    try:
        engine.load_weights(learner.weights())
        gen = engine.generate(contexts, np.zeros(3, np.int64), 1, np.random.default_rng(0))
        new_model = load_hf_model(tiny_model_dir)
        new_model.load_state_dict(learner.weights())
        from test_engines import teacher_forced

        ref = teacher_forced(new_model, contexts, gen.tokens, SamplingConfig(temperature=1.0))
        np.testing.assert_allclose(gen.logp.values, ref.values, atol=1e-4, rtol=0)
        assert np.abs(gen.logp.values - before.logp.values).max() > 1e-3 or not np.array_equal(
            gen.tokens.values, before.tokens.values
        )
    finally:
        engine.load_weights(_original_weights(tiny_model_dir))


def _original_weights(model_dir) -> dict:
    return load_hf_model(model_dir).state_dict()


@pytest.mark.slow  # starts vLLM (getfixturevalue)
def test_save_pretrained_loads_in_transformers_and_vllm(tiny_model_dir, tmp_path, request, contexts):
    learner = FSDPLearner(tiny_model_dir, CFG)
    learner.train_step(make_batch(tiny_model_dir, 4), LossConfig())
    out = learner.save_pretrained(tmp_path / "ckpt")
    weights = learner.weights()
    loaded = load_hf_model(out).state_dict()
    assert_weights_close({k: loaded[k] for k in weights}, weights, atol=0)
    from rtpo.llm.model import load_tokenizer

    assert len(load_tokenizer(out)) == len(load_tokenizer(tiny_model_dir))
    from llm_test_constants import vllm_missing

    if vllm_missing:
        pytest.skip("vllm is not installed: checked the transformers side only")
    eng = request.getfixturevalue("vllm_session_engine")
    saved = eng.sampling
    eng.sampling = SamplingConfig(temperature=0.0, max_tokens=6)
    try:
        eng.load_checkpoint(out)
        gen = eng.generate(contexts, np.zeros(3, np.int64), 1, np.random.default_rng(0))
        b = len(gen)
        batch = TurnBatch(
            contexts,
            gen.tokens,
            gen.logp,
            Ragged(np.zeros(gen.tokens.values.size), gen.tokens.offsets),
            np.arange(b),
            np.ones(b),
            np.zeros(b),
        )
        ref = FSDPLearner(out, LearnerConfig(temperature=1.0))
        np.testing.assert_allclose(ref.logprobs(batch).values, gen.logp.values, atol=1e-4, rtol=0)
    finally:
        eng.load_checkpoint(tiny_model_dir)
        eng.sampling = saved


@pytest.mark.parametrize("kl", [0.0, 0.1])
def test_state_dict_round_trip_resumes_exactly(tiny_model_dir, kl):
    """With a KL reference the checkpoint leaves the (frozen) reference out; the resumed run still matches."""
    cfg = LearnerConfig(**{**CFG.__dict__, "kl_reference": kl > 0})
    b1, b2 = make_batch(tiny_model_dir, 5), make_batch(tiny_model_dir, 6)
    learner = FSDPLearner(tiny_model_dir, cfg)
    learner.train_step(b1, LossConfig(kl_coef=kl))
    state = learner.state_dict()
    assert state["ref"] is None
    m2 = learner.train_step(b2, LossConfig(kl_coef=kl))
    expected = learner.weights()
    resumed = FSDPLearner(tiny_model_dir, cfg)
    resumed.load_state_dict(state)
    assert resumed.steps == 1
    r2 = resumed.train_step(b2, LossConfig(kl_coef=kl))
    if kl:
        assert m2["loss/kl_ref"] > 0 and r2["loss/kl_ref"] == m2["loss/kl_ref"]
    assert_weights_close(resumed.weights(), expected, atol=0)


def test_bad_input_is_a_clear_error(tiny_model_dir):
    learner = FSDPLearner(tiny_model_dir, LearnerConfig(temperature=TEMPERATURE))
    batch = make_batch(tiny_model_dir, 7)
    with pytest.raises(ValueError, match="reference model"):
        learner.train_step(batch, LossConfig(kl_coef=0.02))
    bad = TurnBatch(
        batch.contexts,
        Ragged(batch.tokens.values + 10_000, batch.tokens.offsets),
        batch.old_logp,
        batch.advantages,
        batch.seq_id,
        batch.weight,
        batch.turn,
    )
    with pytest.raises(ValueError, match="token ids outside"):
        learner.logprobs(bad)
    with pytest.raises(ValueError, match="lr"):
        LearnerConfig(lr=0.0)
    with pytest.raises(ValueError, match="param_dtype"):
        LearnerConfig(param_dtype="float8")
