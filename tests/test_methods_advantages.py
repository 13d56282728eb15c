"""Each baseline's advantage computation, pinned on hand-made returns and trees (SPEC §3)."""

import numpy as np
import pytest

from rtpo.core import estimators
from rtpo.core.methods.arpo import first_branch
from rtpo.core.methods.rtpo_multitrunk import select_trunks
from rtpo.core.methods.tree_grpo import _Node, expansion_candidates


def test_tree_advantage_is_prompt_norm_plus_tree_norm():
    # two trees of two leaves: prompt mean 0.75, n − 1 std √(0.75/3) = 0.5 (Tree-GRPO's torch.std);
    # tree 0 is (1, 0): ±0.5 / (n − 1 std √0.5) = ±1/√2; tree 1 ties
    r = np.array([[1.0, 0.0], [1.0, 1.0]])
    s, t = 0.5, np.sqrt(0.5)
    expected = np.array([[0.25 / s + 0.5 / t, -0.75 / s - 0.5 / t], [0.25 / s, 0.25 / s]])
    np.testing.assert_allclose(estimators.tree_advantage(r, eps=1e-12), expected, rtol=1e-9)
    # the population form: std √3/4 over the prompt, 0.5 in tree 0 (±1)
    sp = np.sqrt(3) / 4
    pop = np.array([[0.25 / sp + 1, -0.75 / sp - 1], [0.25 / sp, 0.25 / sp]])
    np.testing.assert_allclose(estimators.tree_advantage(r, eps=1e-12, std="population"), pop, rtol=1e-9)
    # batched over prompts: each prompt independent
    both = estimators.tree_advantage(np.stack([r, 1 - r]), eps=1e-12)
    np.testing.assert_allclose(both[0], expected, rtol=1e-9)
    assert estimators.get("tree") is estimators.tree_advantage


def test_tree_advantage_with_one_tree_is_twice_grpo():
    r = np.array([[0.0, 1.0, 1.0, 3.0]])
    np.testing.assert_allclose(estimators.tree_advantage(r), 2 * estimators.group_advantage(r, normalize=True))


def test_tree_advantage_rejects_a_flat_group():
    with pytest.raises(ValueError, match="M trees"):
        estimators.tree_advantage(np.array([1.0, 0.0]))


def test_seeupo_advantage_normalises_over_the_batch_then_clips():
    returns = np.array([1.0, 0.0, 1.0, 1.0])
    task_mean = np.array([0.5, 0.5, 1.0, 1.0])  # two queries of two
    a0 = returns - task_mean  # [0.5, -0.5, 0, 0]: mean 0, std sqrt(1/8)
    np.testing.assert_allclose(estimators.seeupo_advantage(returns, task_mean, eps=0.0), a0 / np.sqrt(1 / 8))
    big = np.zeros(20)
    big[0] = 1.0
    a = estimators.seeupo_advantage(big, np.zeros(20), clip=3.0)
    assert a.max() == 3.0  # the outlier is sqrt(19) ≈ 4.36 standard deviations out: clipped at 3
    np.testing.assert_allclose(a[1:], -1 / np.sqrt(19), rtol=1e-5)


def test_seeupo_reweight_clips_step_and_product():
    m = np.array([1.0, 1.0, 1.15, 0.85])
    lr = np.log(np.array([1.1, 1.5, 1.1, 0.5]))
    # 1.1; 1.5 -> step clip 1.2; 1.15·1.1 = 1.265 -> 1.2; 0.85·0.8 = 0.68 -> 0.8
    np.testing.assert_allclose(estimators.seeupo_reweight(m, lr, 0.2), [1.1, 1.2, 1.2, 0.8])


def test_off_policy_turn_value_eq109():
    q = estimators.off_policy_turn_value([0.0, 1.0], [1.0, 0.5], [2.0, 4.0], [0.5, 2.0])
    np.testing.assert_allclose(q, [0.0 + 1.0 * 0.5 * 2.0, 1.0 + 0.5 * 2.0 * 4.0])


def test_arpo_branch_probability_and_first_trigger():
    p = estimators.arpo_branch_probability(np.array([1.0, 0.5, 0.0, 10.0]), 0.5, alpha=0.5, beta=0.2)
    np.testing.assert_allclose(p, [0.6, 0.5, 0.4, 1.0])
    assert first_branch(p, np.array([0.7, 0.6, 0.1, 0.0]), tau=0.5) == 2  # stochastic: first u < P
    assert first_branch(p, None, tau=0.5) == 0  # paper text: first P > τ
    assert first_branch(np.array([0.5, 0.5]), None, tau=0.5) == -1


def test_select_trunks_keeps_the_best_and_breaks_ties_at_random():
    returns = np.array([[0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 2.0]])
    seen = set()
    for seed in range(20):
        keep = select_trunks(returns, 1, "max_return", np.random.default_rng(seed))
        assert keep[1, 0] == 3
        assert keep[0, 0] in (1, 3)
        seen.add(int(keep[0, 0]))
    assert seen == {1, 3}  # both tied maxima get chosen
    assert select_trunks(returns, 2, "max_return", np.random.default_rng(0))[1, 0] == 3
    assert sorted(select_trunks(returns, 4, "random", np.random.default_rng(0))[0]) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="valid: max_return, random"):
        select_trunks(returns, 1, "best", np.random.default_rng(0))


class _T:
    def __init__(self, start, end):
        self.start_turn, self.end_turn = start, end


def test_tree_expansion_candidates_are_root_and_non_leaf_turn_nodes():
    # root path over turns 0..2; an expansion forked at boundary 2 (turns 2..2); another at 1 (turns 1..2)
    nodes = [_Node([], [], _T(0, 2)), _Node([], [], _T(2, 2)), _Node([], [], _T(1, 2))]
    # root (boundary 0); turn nodes 0, 1 of the root path (boundaries 1, 2); the leaf-only node adds
    # nothing; the third node's turn 1 (boundary 2)
    assert expansion_candidates(nodes) == [(0, 0), (0, 1), (0, 2), (2, 2)]
