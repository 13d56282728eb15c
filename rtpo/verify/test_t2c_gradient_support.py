"""T2c: the turn-k loss has gradient support only on the siblings' turn-k tokens (Thm 2(c), Eq. 80).

Two settings, both through the real core: rows built by rtpo.core.train.turn_rows and the loss
rtpo.core.loss.clipped_policy_loss.  (1) LLM-like: a tiny causal torch model over whole token
transcripts (prefix c_k, turn-k response, feedback, the next turn's response); torch autograd gives the
gradient of the loss with respect to every position's logits.  (2) Tabular: a real RTPO phase with the
tabular learner moves only turn-k parameters.
"""

from __future__ import annotations

import numpy as np

from rtpo.tabular import tool_chain
from rtpo.verify.claims import VOCAB, TinyCausalLM, check_t2c_llm_gradient_support, make_sibling  # noqa: F401 - shared with report.py
from rtpo.verify.harness import make_context, make_rtpo


def test_T2c_llm_gradient_only_on_turn_k_tokens_eq80():
    """T2c, Eq. 80: ∂(−J_k)/∂logits is exactly 0 at every prefix (c_k) and continuation position and
    non-zero at every turn-k response position of a sibling with A ≠ 0."""
    check_t2c_llm_gradient_support()


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
