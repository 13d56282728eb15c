"""T2c: the turn-k loss has gradient support only on the siblings' turn-k tokens (Thm 2(c), Eq. 80).

Two settings, both through the real core: rows built by rtpo.core.train.turn_rows and the loss
rtpo.core.loss.clipped_policy_loss.  (1) LLM-like: a tiny causal torch model over whole token
transcripts (prefix c_k, turn-k response, feedback, the next turn's response); torch autograd gives the
gradient of the loss with respect to every position's logits.  (2) Tabular: a real RTPO phase with the
tabular learner moves only turn-k parameters.
"""

from __future__ import annotations

import numpy as np
import torch

from rtpo.core import estimators
from rtpo.core.loss import FlatBatch, LossConfig, clipped_policy_loss
from rtpo.core.train import turn_rows
from rtpo.core.types import Ragged, Trajectory
from rtpo.tabular import tool_chain
from rtpo.verify.harness import make_context, make_rtpo

VOCAB = 12


class TinyCausalLM(torch.nn.Module):
    """logits_t = W · mean(embed(x_<t)) + b: position t sees only earlier tokens (a causal LM in miniature)."""

    def __init__(self, seed: int = 0, dim: int = 6) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.nn.Parameter(torch.randn(VOCAB, dim, generator=g, dtype=torch.float64))
        self.out = torch.nn.Parameter(torch.randn(dim, VOCAB, generator=g, dtype=torch.float64))
        self.bias = torch.nn.Parameter(torch.randn(VOCAB, generator=g, dtype=torch.float64))

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        e = self.embed[seq]  # (L, D)
        prev = torch.cat([torch.zeros_like(e[:1]), torch.cumsum(e, 0)[:-1]])  # sum of tokens before t
        count = torch.arange(seq.numel(), dtype=e.dtype).clamp(min=1)[:, None]
        return (prev / count) @ self.out + self.bias  # (L, V): row t scores token t


def _sibling(prefix, response, feedback, next_response, model) -> Trajectory:
    """A sibling forked at boundary k: turn k (context c_k = prefix) and turn k+1 (context c_k∘l_k∘f_k)."""
    c_k = np.array(prefix)
    c_kp1 = np.concatenate([c_k, response, feedback])
    seq = torch.as_tensor(np.concatenate([c_kp1, next_response]))
    with torch.no_grad():
        lp_all = torch.log_softmax(model(seq), -1).gather(1, seq[:, None]).squeeze(1).numpy()
    lp_k = lp_all[len(c_k) : len(c_k) + len(response)]
    lp_kp1 = lp_all[len(c_kp1) :]
    return Trajectory(
        contexts=Ragged.from_rows([c_k, c_kp1], dtype=np.int64),
        tokens=Ragged.from_rows([np.array(response), np.array(next_response)], dtype=np.int64),
        logp=Ragged.from_rows([lp_k, lp_kp1]),
        rewards=np.array([0.0, 1.0 if sum(response) % 2 else 0.0]),
        durations=np.ones(2),
        malformed=np.zeros(2, bool),
        query_id=0,
        start_turn=1,
    )


def test_T2c_llm_gradient_only_on_turn_k_tokens_eq80():
    """T2c, Eq. 80: ∂(−J_k)/∂logits is exactly 0 at every prefix (c_k) and continuation position and
    non-zero at every turn-k response position of a sibling with A ≠ 0."""
    model = TinyCausalLM()
    prefix = [1, 4, 2, 7, 3]
    sibs = [
        _sibling(prefix, [5, 6, 8], [9, 2], [4, 10], model),
        _sibling(prefix, [5, 6], [9, 2], [11, 3, 3], model),
        _sibling(prefix, [8, 8, 1, 6], [9, 0], [4], model),
    ]
    rewards = np.array([1.0, 0.0, 0.25])
    sibs = [
        Trajectory(s.contexts, s.tokens, s.logp, np.array([0.0, r]), s.durations, s.malformed, 0, 1)
        for s, r in zip(sibs, rewards)
    ]
    adv = estimators.get("sibling_mean")(np.array([s.ret for s in sibs]))
    assert np.all(adv != 0)
    batch = turn_rows(sibs, np.zeros(len(sibs), np.int64), adv)

    transcripts, logits, logps = [], [], []
    for i, s in enumerate(sibs):
        full = np.concatenate([s.contexts[1], s.tokens[1]])  # the sibling's whole transcript
        seq = torch.as_tensor(full)
        lg = model(seq)
        lg.retain_grad()
        ctx, tok = batch.contexts[i], batch.tokens[i]
        assert np.array_equal(full[: len(ctx)], ctx)  # the row's context is a prefix of the transcript
        pos = torch.as_tensor(len(ctx) + np.arange(len(tok)))
        logps.append(torch.log_softmax(lg[pos], -1).gather(1, torch.as_tensor(np.array(tok))[:, None]).squeeze(1))
        transcripts.append(full)
        logits.append(lg)
    loss, _ = clipped_policy_loss(torch.cat(logps), FlatBatch.from_batch(batch), LossConfig(clip_eps=0.2))
    loss.backward()

    for s, lg in zip(sibs, logits):
        g = lg.grad.abs().sum(-1).numpy()
        lo, hi = len(s.contexts[0]), len(s.contexts[0]) + len(s.tokens[0])
        assert np.all(g[:lo] == 0.0), "gradient reached the prefix c_k"
        assert np.all(g[hi:] == 0.0), "gradient reached the continuation"
        assert np.all(g[lo:hi] > 0.0), "a turn-k token got no gradient"


def test_T2c_tabular_phase_moves_only_turn_k_parameters_eq80():
    """T2c, Eq. 80 in the real method: a phase-k update of the tabular learner (SGD) changes θ only in
    turn k's table — prefix turns (< k) and the frozen downstream turns (> k) are untouched."""
    mdp = tool_chain(num_turns=3, num_actions=3, seed=2)
    ctx = make_context(mdp, lr=0.5, optimizer="sgd", seed=3)
    method = make_rtpo(G=4, epochs=2)
    state = method.begin(ctx, np.arange(12))
    moved = []
    while state.pending:
        k = state.pending[0]
        before = ctx.learner.weights()
        method.phase(ctx, state)
        delta = np.abs(ctx.learner.weights() - before).reshape(mdp.num_turns, -1).sum(axis=1)
        assert np.all(np.delete(delta, k) == 0.0), (k, delta)
        moved.append(delta[k] > 0)
    assert any(moved)
