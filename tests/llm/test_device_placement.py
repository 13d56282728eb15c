"""Device placement on a CPU-only machine: the llm path with the model on a device other than the
batch's (tests/llm/device_guard.py: a second device whose tensors refuse to meet host tensors, as CUDA's
do), so that CI catches the class of bug an H200 found (issue 32: the learner's flat batch stayed on the
CPU while the model was on cuda, "Expected all tensors to be on the same device" in the clipped loss).

The guarded device computes on the host values, so every result must equal the plain CPU run's.
Mutant: `FSDPLearner._flat` building the batch on the CPU (the original bug) turns
test_guard_catches_a_cpu_resident_batch's expectation true and test_learner_on_a_second_device red.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from device_guard import CrossDevice, Guarded, guarded_device
from llm_test_constants import TEMPERATURE

from rtpo.core.loss import FlatBatch, LossConfig
from rtpo.core.types import Ragged, TurnBatch

pytest.importorskip("transformers")


def _batch(seed: int = 0) -> TurnBatch:
    """Rows of unequal lengths (left padding, several sequences), log-probs near a uniform policy's."""
    rng = np.random.default_rng(seed)
    ctx = Ragged.from_rows([rng.integers(9, 500, m) for m in (7, 3, 11, 5)], dtype=np.int64)
    rsp = Ragged.from_rows([rng.integers(0, 500, m) for m in (4, 6, 2, 5)], dtype=np.int64)
    old = -np.log(512.0) + 0.05 * rng.normal(size=rsp.values.size)
    adv = np.repeat(rng.normal(size=4), rsp.lengths)
    return TurnBatch(
        contexts=ctx,
        tokens=rsp,
        old_logp=Ragged(old, rsp.offsets),
        advantages=Ragged(adv, rsp.offsets),
        seq_id=np.arange(4),
        weight=np.ones(4),
        turn=np.zeros(4),
    )


def _learner(model_dir, device=None):
    from rtpo.llm.learner import FSDPLearner, LearnerConfig

    cfg = LearnerConfig(lr=1e-3, temperature=TEMPERATURE, kl_reference=True)
    return FSDPLearner(model_dir, cfg, backend="gloo", device=device)


def test_the_guard_refuses_what_cuda_refuses_and_allows_what_it_allows():
    """The guard itself: a host tensor of one or more dimensions meeting a guarded one raises; scalars,
    copies, moves and host index tensors pass; results equal the host computation."""
    x = torch.arange(6.0)
    with guarded_device() as dev:
        g = x.to(dev)
        assert isinstance(g, Guarded) and g.device == dev
        with pytest.raises(CrossDevice, match="same device"):
            g + x  # the class of the H200 crash
        assert torch.equal((g * torch.tensor(2.0)).cpu(), x * 2)  # a 0-dim host tensor is a scalar
        assert torch.equal(g[torch.tensor([1, 3])].cpu(), x[[1, 3]])  # host indices
        buf = torch.zeros(6, device=dev)
        buf.copy_(x)  # copies across devices
        assert torch.equal(buf.cpu(), x)
        with pytest.raises((TypeError, RuntimeError)):
            g.numpy()  # as on cuda: bring it back first


def test_learner_on_a_second_device_matches_the_host(tiny_model_dir):
    """logprobs, a train step (with the KL reference), the weights and the full state dict with the
    learner's model on the guarded device: no cross-device op, the CPU learner's numbers, and what
    leaves the learner (log-probs, metrics, weights, state) is on the host."""
    batch, loss = _batch(), LossConfig(clip_eps=0.2, kl_coef=0.02)
    host = _learner(tiny_model_dir)
    lp_host = host.logprobs(batch)
    m_host = host.train_step(batch, loss)
    w_host = host.weights()
    with guarded_device() as dev:
        learner = _learner(tiny_model_dir, device=dev)
        assert next(learner.model.parameters()).device == dev
        lp = learner.logprobs(batch)
        metrics = learner.train_step(batch, loss)
        weights = learner.weights()
        state = learner.state_dict()
    np.testing.assert_allclose(lp.values, lp_host.values, rtol=0, atol=1e-5, err_msg="log-probs moved with the device")
    for key in ("loss/policy", "loss/kl_ref", "train/grad_norm", "train/entropy"):
        assert metrics[key] == pytest.approx(m_host[key], rel=1e-4, abs=1e-6), key
    for name, value in weights.items():
        assert type(value) is torch.Tensor and value.device.type == "cpu", f"{name} left the learner on {value.device}"
        # AdamW's step is ~lr per weight whatever the gradient's size: a weight whose gradient is ~0 may
        # step differently under other rounding (the guarded device takes the optimiser's per-tensor path)
        torch.testing.assert_close(value, w_host[name], rtol=0, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    leaves = [t for t in state["model"].values()] + [
        t for s in state["optim"]["state"].values() for t in s.values() if isinstance(t, torch.Tensor)
    ]
    assert all(type(t) is torch.Tensor and t.device.type == "cpu" for t in leaves), "state dict holds device tensors"


def test_guard_catches_a_cpu_resident_batch(tiny_model_dir, monkeypatch):
    """The mutant of the H200 crash: the flat batch built on the host while the model is elsewhere.
    The guard must fail the train step the way CUDA did (in the clipped loss)."""
    from rtpo.llm.learner import FSDPLearner

    monkeypatch.setattr(FSDPLearner, "_flat", lambda self, batch: FlatBatch.from_batch(batch))
    with guarded_device() as dev:
        learner = _learner(tiny_model_dir, device=dev)
        with pytest.raises(CrossDevice, match="same device"):
            learner.train_step(_batch(), LossConfig(clip_eps=0.2))


def test_hf_engine_on_a_second_device_matches_the_host(tiny_model_dir):
    """The HF engine with its model on the guarded device: the same samples and log-probs as on the host
    (its CPU generator: the guard has no generators), the entropy probe, teacher forcing, and weights
    loaded from the learner's host state dict."""
    from rtpo.llm.engines import SamplingConfig
    from rtpo.llm.engines.hf import HFEngine

    sampling = SamplingConfig(temperature=TEMPERATURE, max_tokens=6)
    ctx = Ragged.from_rows([np.array([11, 12, 13]), np.array([40, 41])], dtype=np.int64)
    turn = np.zeros(2, dtype=np.int64)
    host = HFEngine(tiny_model_dir, sampling)
    g_host = host.generate(ctx, turn, 3, np.random.default_rng(5))
    tf_host = host.teacher_forced_logprobs(ctx.take(np.repeat([0, 1], 3)), g_host.tokens, TEMPERATURE)
    weights = {k: v.clone() + 0.01 for k, v in host.model.state_dict().items()}
    with guarded_device() as dev:
        engine = HFEngine(tiny_model_dir, sampling, device=dev)
        gen = engine.generate(ctx, turn, 3, np.random.default_rng(5))
        tf = engine.teacher_forced_logprobs(ctx.take(np.repeat([0, 1], 3)), gen.tokens, TEMPERATURE)
        probe = engine.normalized_entropy(ctx, turn)
        engine.load_weights(weights)
        after = engine.generate(ctx, turn, 1, np.random.default_rng(6))
    assert np.array_equal(gen.tokens.values, g_host.tokens.values) and np.array_equal(
        gen.tokens.offsets, g_host.tokens.offsets
    )
    np.testing.assert_allclose(gen.logp.values, g_host.logp.values, atol=1e-5)
    np.testing.assert_allclose(tf.values, tf_host.values, atol=1e-5)
    assert probe.shape == (2,) and np.all(np.isfinite(probe))
    host.load_weights(weights)
    again = host.generate(ctx, turn, 1, np.random.default_rng(6))
    assert np.array_equal(after.tokens.values, again.tokens.values), (
        "weights loaded onto the device differ from the host's"
    )


@pytest.mark.slow
def test_an_rtpo_iteration_on_a_second_device(tiny_model_dir, monkeypatch, tmp_path):
    """One RTPO iteration of tiny-cpu (hf engine, KL reference) built by rtpo.llm.build with
    backend.device resolved to the guarded device for the learner and the engine alike: it runs without
    a cross-device op, and its rollout/train log-prob ratio is 1 (engine and learner agree there too)."""
    import rtpo.llm.build as build_mod
    from rtpo.scenario.load import load_scenario

    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    cfg = load_scenario(
        root / "scenarios" / "llm" / "tiny-cpu.yaml",
        [
            f"backend.model={tiny_model_dir}",
            "backend.engine=hf",
            "backend.max_tokens=4",
            "budget.iterations=1",
            "budget.queries_per_iteration=2",
            "task.num_turns=2",
            "method.G=2",
        ],
    )
    with guarded_device() as dev:
        monkeypatch.setattr(build_mod, "_device", lambda b: dev.type)
        ctx = build_mod.build(cfg).ctx
        assert next(ctx.learner.model.parameters()).device == dev
        method = cfg.method.build()
        state = method.begin(ctx, np.arange(2, dtype=np.int64))
        ratios = []
        while state.pending:
            metrics = method.phase(ctx, state)
            ratios.append(metrics.get("consistency/rollout_train_ratio"))
    ratios = [r for r in ratios if r is not None]
    assert ratios and all(abs(r - 1.0) < 1e-4 for r in ratios), ratios
