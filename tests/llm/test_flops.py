"""The generator's model FLOPs (rtpo.llm.flops) against a hand count on the tiny Qwen3, and the sampler's
perf/generator_* metrics (achieved FLOP/s, MFU against a peak) summed like Ray's workers sum them.

Mutants: counting the prefill once per sample instead of once per context (n × the prompt), feeding the
last sampled token back (r_j decode positions instead of r_j − 1), or attending to p keys instead of
p + 1 turns test_generation_flops_by_hand red; dropping the q/k norms or the final norm from body_params
turns test_body_params_are_the_models red.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rtpo.core.metrics import generation_metrics, wall_clock
from rtpo.core.types import Generation, Ragged
from rtpo.llm.flops import ModelShape, generation_flops
from rtpo.llm.sampler import TrackedSampler


def _shape(model_dir) -> ModelShape:
    return ModelShape.from_config(json.loads((model_dir / "config.json").read_text()))


def test_body_params_are_the_models(tiny_model_dir):
    """N_body from the config alone equals the loaded model's parameters less the (tied) embedding."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, local_files_only=True)
    shape = _shape(tiny_model_dir)
    assert shape.tied and shape.qk_norm, "the tiny Qwen3 ties its lm_head and has q/k norms"
    n = sum(p.numel() for p in model.parameters())  # a tied weight is counted once
    assert shape.body_params == n - shape.hidden * shape.vocab, "N_body from the config is not the model's"
    # d = 128, q = 4·32, kv = 2·32, I = 256: q, k, v, o, q/k norms, gate/up/down, two RMSNorms; 2 layers + final norm
    per_layer = 128 * 128 + 2 * 128 * 64 + 128 * 128 + 2 * 32 + 3 * 128 * 256 + 2 * 128
    assert shape.body_params == 2 * per_layer + 128 == 295_680


def test_generation_flops_by_hand(tiny_model_dir):
    """c = 3, n = 2 samples of r = 2 and 1 tokens on the tiny Qwen3 (N_body = 295 680, d = 128, L·H·d_h = 256):

    prefill: positions 0, 1, 2 → 3·2N + 4·256·(1 + 2 + 3), one logit row 2·d·V
    decode:  sample 1 feeds its first token at position 3 → 2N + 2·d·V + 4·256·4; sample 2 feeds nothing
    total = 8N + 4·d·V + 1024·10 = 2 375 680 + 512·V."""
    shape = _shape(tiny_model_dir)
    v = shape.vocab
    prefill, decode = generation_flops(shape, np.array([3]), np.array([2, 1]), n=2)
    assert prefill == 6 * 295_680 + 2 * 128 * v + 1024 * 6, "prefill: 3 positions, one logit row"
    assert decode == 2 * 295_680 + 2 * 128 * v + 1024 * 4, "decode: the last sampled token is never fed back"
    assert prefill + decode == 2_375_680 + 512 * v


def test_generation_flops_equal_a_loop_over_positions(tiny_model_dir):
    """The closed form equals a loop over every position the engine runs, on ragged contexts and samples."""
    shape = _shape(tiny_model_dir)
    rng = np.random.default_rng(0)
    ctx = rng.integers(1, 40, size=5)
    n = 3
    rsp = rng.integers(0, 25, size=ctx.size * n)
    n2, dv, attn = (
        2 * shape.body_params,
        2 * shape.hidden * shape.vocab,
        4 * shape.layers * shape.heads * shape.head_dim,
    )
    want_pre = want_dec = 0
    for i, c in enumerate(ctx.tolist()):
        want_pre += sum(n2 + attn * (p + 1) for p in range(c)) + dv
        for j in range(n):
            r = int(rsp[i * n + j])
            want_dec += sum(n2 + dv + attn * (p + 1) for p in range(c, c + r - 1))
    assert generation_flops(shape, ctx, rsp, n) == (float(want_pre), float(want_dec))


class _Engine:
    """Answers every context with n responses of fixed lengths (what an engine's Generation looks like)."""

    def __init__(self, lengths):
        self.lengths = lengths

    def generate(self, contexts, turn, n, rng):
        toks = Ragged.from_rows([np.ones(k, dtype=np.int64) for k in self.lengths])
        return Generation(toks, Ragged(np.zeros(toks.values.size), toks.offsets))


def test_sampler_reports_generator_flops_and_mfu(tiny_model_dir):
    """TrackedSampler counts the FLOPs of each call; generation_metrics gives FLOP/s over engine time and
    MFU = Σ FLOPs / Σ peak·seconds, the same from two workers' summed counts as from one sampler."""
    shape = _shape(tiny_model_dir)
    ctx = Ragged.from_rows([np.ones(3, dtype=np.int64)])
    counts = []
    for _ in range(2):  # two rollout workers
        s = TrackedSampler(_Engine([2, 1]), shape=shape, peak_flops=1e9)
        s.generate(ctx, np.zeros(1, dtype=np.int64), 2, None)
        c = s.pop_generation_counts()
        c["time/generate_s"] = 0.5  # fixed engine time, for exact rates
        c["gen/peak_flop_budget_s"] = 1e9 * 0.5
        counts.append(c)
    one = sum(generation_flops(shape, np.array([3]), np.array([2, 1]), 2))
    assert counts[0]["gen/prefill_flops"] + counts[0]["gen/decode_flops"] == one
    summed = {k: counts[0][k] + counts[1][k] for k in counts[0]}
    m = generation_metrics(summed)
    assert m["perf/generator_flops"] == 2 * one
    assert m["perf/generator_flops_per_s"] == pytest.approx(2 * one / 1.0, rel=1e-12), "FLOPs per engine second"
    assert m["perf/generator_mfu"] == pytest.approx(2 * one / (1e9 * 1.0), rel=1e-12), "MFU against the summed peak"
    for key in ("perf/generator_flops", "perf/generator_flops_per_s", "perf/generator_mfu"):
        assert wall_clock(key), f"{key} is a machine measurement: resumed-run comparisons drop it"
    no_peak = TrackedSampler(_Engine([2, 1]), shape=shape)
    no_peak.generate(ctx, np.zeros(1, dtype=np.int64), 2, None)
    m2 = no_peak.pop_metrics()
    assert "perf/generator_mfu" not in m2 and m2["perf/generator_flops"] == one, "no peak: achieved FLOP/s only"
    bare = TrackedSampler(_Engine([2, 1]))
    bare.generate(ctx, np.zeros(1, dtype=np.int64), 2, None)
    assert not any(k.startswith("perf/") for k in bare.pop_metrics()), "no model shape: no FLOPs counted"
    assert not math.isnan(m2["perf/generator_flops_per_s"])
