"""The LLM backend's FSDP2 learner as a 2-rank gloo trainer group on Ray equals the one-process learner."""

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the distributed extra (ray) is not installed")
pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")
learner_mod = pytest.importorskip("rtpo.llm.learner", reason="the LLM backend (rtpo.llm) is not on this branch")

from rtpo.core.loss import LossConfig  # noqa: E402
from rtpo.core.types import Ragged, TurnBatch  # noqa: E402
from rtpo.distributed import RayLearner  # noqa: E402
from rtpo.distributed.examples import FSDPTrainerFactory  # noqa: E402

CFG = learner_mod.LearnerConfig(lr=1e-3, temperature=1.0, micro_batch_tokens=24, grad_clip=1.0)


def _batch(vocab: int, seed: int) -> TurnBatch:
    rng = np.random.default_rng(seed)
    ctx_len, resp_len = (20, 4, 9, 33, 12), (6, 3, 8, 5, 7)
    tokens = Ragged.from_rows([rng.integers(0, vocab, n) for n in resp_len], dtype=np.int64)
    return TurnBatch(
        contexts=Ragged.from_rows([rng.integers(0, vocab, n) for n in ctx_len], dtype=np.int64),
        tokens=tokens,
        old_logp=Ragged(np.full(tokens.values.size, -6.0), tokens.offsets),
        advantages=Ragged(rng.normal(size=tokens.values.size), tokens.offsets),
        seq_id=np.array([0, 1, 1, 2, 3]),
        weight=np.ones(5),
        turn=np.zeros(5, np.int64),
    )


def test_two_rank_gloo_group_on_ray_equals_one_process(ray_cluster, tmp_path):
    from rtpo.llm.model import build_tiny_qwen3

    model_dir = str(build_tiny_qwen3(tmp_path / "tiny", seed=0, init_std=0.2))
    one = FSDPTrainerFactory(model_dir, CFG)().learner  # world size 1 in this process
    vocab = int(one.model.config.vocab_size) if hasattr(one, "model") else 2048
    group = RayLearner(FSDPTrainerFactory(model_dir, CFG), 2, backend="gloo", num_cpus=0.5)
    try:
        b0, b1 = _batch(vocab, 0), _batch(vocab, 1)
        np.testing.assert_allclose(group.logprobs(b0).values, one.logprobs(b0).values, atol=1e-5, rtol=0)
        m2, m1 = group.train_step(b1, LossConfig()), one.train_step(b1, LossConfig())
        assert set(m2) == set(m1)
        w2, w1 = group.weights(), one.weights()
        assert set(w2) == set(w1)
        for k in w1:
            np.testing.assert_allclose(w2[k].float().numpy(), w1[k].float().numpy(), atol=5e-6, rtol=0, err_msg=k)
        assert len(set(group.pids)) == 2
    finally:
        group.shutdown()
