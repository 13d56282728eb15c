"""What LLM users look for in a run's metrics: the policy entropy of a train step (checked against an
independent computation from transformers' logits), its learning rate, and the time/token counters
that split a phase (generation, log-probs, training) with the response length and tokens per second."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from llm_test_constants import TEMPERATURE
from test_learner import make_batch

from rtpo.core.loss import LossConfig
from rtpo.core.protocols import ReportsMetrics
from rtpo.llm.learner import FSDPLearner, LearnerConfig
from rtpo.llm.model import load_hf_model
from rtpo.llm.sampler import TrackedSampler


def _entropy_by_hand(model_dir, batch) -> float:
    """Token-mean of H = -sum_v p_v log p_v of softmax(logits / T) at each response token, one row at a time."""
    model = load_hf_model(model_dir).eval()
    ents = []
    with torch.no_grad():
        for c, r in zip(batch.contexts, batch.tokens):
            ids = torch.as_tensor(np.concatenate([c, r]), dtype=torch.long)[None]
            logits = model(input_ids=ids).logits[0, c.size - 1 : c.size + r.size - 1].double() / TEMPERATURE
            p = torch.softmax(logits, -1)
            ents.append(-(p * torch.log(p)).sum(-1))
    return float(torch.cat(ents).mean())


@pytest.mark.parametrize("micro", [1, 10_000])  # one row per pass, everything in one (the reused forward)
def test_train_step_reports_entropy_and_learning_rate(tiny_model_dir, micro):
    batch = make_batch(tiny_model_dir, 3)
    cfg = LearnerConfig(temperature=TEMPERATURE, micro_batch_tokens=micro, lr=3e-4)
    learner = FSDPLearner(tiny_model_dir, cfg)
    learner.logprobs(batch)  # the ratio pass a phase makes first (its forward is reused at micro 10_000)
    m = learner.train_step(batch, LossConfig(clip_eps=0.2))
    assert m["train/entropy"] == pytest.approx(_entropy_by_hand(tiny_model_dir, batch), rel=1e-5)
    assert 0 < m["train/entropy"] < np.log(learner.vocab_size)
    assert m["train/lr"] == 3e-4
    assert isinstance(learner, ReportsMetrics)
    times = learner.pop_metrics()
    assert set(times) == {"time/logprobs_s", "time/train_s"} and all(v > 0 for v in times.values())
    assert learner.pop_metrics() == {}  # handed over once


def test_sampler_counts_generated_tokens_and_time(hf_session_engine, contexts):
    sampler = TrackedSampler(hf_session_engine)
    rng = np.random.default_rng(0)
    gens = [sampler.generate(contexts, np.zeros(len(contexts)), 2, rng) for _ in range(2)]
    m = sampler.pop_metrics()
    tokens = sum(int(g.tokens.lengths.sum()) for g in gens)
    responses = sum(len(g) for g in gens)
    assert m["gen/tokens"] == tokens and m["gen/responses"] == responses
    assert m["gen/response_len_mean"] == pytest.approx(tokens / responses)
    assert m["gen/tokens_per_s"] == pytest.approx(tokens / m["time/generate_s"])
    assert sampler.pop_metrics() == {}
