"""Exact worlds as chat tasks (rtpo.llm.worlds, rtpo.worlds): canonical actions parse back, contexts
are the chat template's ids token for token, bad responses are feedback plus a metric, and a scenario's
tabular task section means the same MDP on the llm backend."""

from __future__ import annotations

import numpy as np
import pytest

from rtpo.core.types import Generation, Ragged
from rtpo.llm.chat import parse_response
from rtpo.llm.worlds import World, WorldEnv, action_name, canonical_text
from rtpo.tabular.generators import random_mdp, tool_chain
from rtpo.tabular.solve import solve


def _world(mdp, kind="tool_chain") -> World:
    return World.of(mdp, solve(mdp).value, kind)


@pytest.fixture(scope="module")
def qwen3_tok():
    from rtpo.llm.chat import load_qwen3_tokenizer

    return load_qwen3_tokenizer()


@pytest.fixture(scope="module")
def chat_tok():
    from rtpo.llm.model import train_tiny_tokenizer

    return train_tiny_tokenizer(512, "chat")


def _gen(rows) -> Generation:
    rows = [np.asarray(r, dtype=np.int64) for r in rows]
    tokens = Ragged.from_rows(rows, dtype=np.int64)
    return Generation(tokens=tokens, logp=Ragged(np.zeros(tokens.values.size), tokens.offsets))


@pytest.mark.parametrize("tok", ["qwen3_tok", "chat_tok"])
def test_every_canonical_action_parses_back_to_itself(tok, request):
    tokenizer = request.getfixturevalue(tok)
    env = WorldEnv(_world(tool_chain(num_turns=3, num_actions=5, seed=1)), tokenizer)
    for a, ids in enumerate(env.words.canonical):
        assert env.words.action_of(ids) == a, f"action {a}'s canonical ids map to {env.words.action_of(ids)}"
        assert int(ids[-1]) == env.chat.im_end_id, "a canonical response must end with the stop token"
        p = parse_response(env.chat.decode(ids))
        assert p.finished and not p.errors, p
        assert [(c.name, c.arguments) for c in p.tool_calls] == [(action_name(a), {})], p.tool_calls
        assert env.words.tools.check(p.tool_calls[0].name, p.tool_calls[0].arguments) is None
        assert env.chat.ids(env.chat.decode(ids[:-1])).tolist() == ids[:-1].tolist(), "decode/encode not token-exact"
    assert len({tuple(x.tolist()) for x in env.words.canonical}) == 5


def test_contexts_are_the_chat_templates_ids_token_for_token(qwen3_tok):
    """c_k recorded by the env (what the engine samples from) equals apply_chat_template of the same
    conversation (assistant tool calls, tool results) with the tools listed, for every turn."""
    mdp = tool_chain(num_turns=4, num_actions=4, seed=0)
    env = WorldEnv(_world(mdp), qwen3_tok, context_map="think_strip")
    rng = np.random.default_rng(0)
    eps = env.reset(np.zeros(3, np.int64), rng)
    msgs = [[{"role": "user", "content": env.words.prompt_text(e.s)}] for e in eps]
    actions = [[0, 1, 2], [3, 3, 1], [2, 0, 0]]
    for k in range(3):
        ctx = env.contexts(eps)
        for i in range(len(eps)):
            text = qwen3_tok.apply_chat_template(
                msgs[i],
                tools=list(env.words.tools.schemas),
                add_generation_prompt=True,
                enable_thinking=False,
                tokenize=False,
            )
            want = qwen3_tok.encode(text, add_special_tokens=False)
            assert ctx[i].tolist() == want, f"turn {k}, episode {i}: context differs from the template"
        eps, out = env.step(eps, _gen([env.words.canonical[a[k]] for a in actions]), rng)
        assert not out.malformed.any()
        for i, a in enumerate(actions):
            call = {"type": "function", "function": {"name": action_name(a[k]), "arguments": {}}}
            msgs[i] += [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": out.feedback[i]},
            ]


def test_bad_responses_are_feedback_and_a_metric_never_an_exception(chat_tok):
    env = WorldEnv(_world(tool_chain(num_turns=3, num_actions=4, seed=0)), chat_tok, malformed_reward=-0.5)
    ids = env.chat.ids
    end = [env.chat.im_end_id]
    bad = {
        "unknown_tool": np.concatenate([ids(canonical_text(7)), end]),  # tool_7: outside the 4 actions
        "tool_call": np.concatenate([ids('<tool_call>\n{"name": tool_1, "arguments"\n</tool_call>'), end]),
        "empty": np.zeros(0, np.int64),
        "empty ": np.asarray(end),
        "no_call": np.concatenate([ids("I pick the second tool."), end]),
        "several_calls": np.concatenate([ids(canonical_text(1) + canonical_text(2)), end]),
        "arguments": np.concatenate([ids('<tool_call>\n{"name": "tool_1", "arguments": {"x": 1}}\n</tool_call>'), end]),
        "not_canonical": np.concatenate([ids("ok " + canonical_text(1)), end]),
        "cut_off": env.words.canonical[2][:-3],
    }
    rng = np.random.default_rng(0)
    eps = env.reset(np.zeros(len(bad), np.int64), rng)
    out_eps, out = env.step(eps, _gen(list(bad.values())), rng)
    assert out.malformed.all() and out.done.all(), "every bad response ends its episode as malformed"
    assert np.all(out.reward == -0.5), "a malformed turn pays task.malformed_reward"
    m = env.pop_metrics()
    assert m["malformed"] == len(bad)
    for reason in {k.strip() for k in bad}:
        assert m.get(f"malformed/{reason}", 0) >= 1, f"no malformed/{reason} in {m}"
    for fb in out.feedback:
        assert isinstance(fb, str) and fb.startswith("Error:"), fb
    assert all(e.done and e.history[-1][0] == "feedback" for e in out_eps)


def test_well_formed_turns_follow_the_mdp():
    """Rewards, τ, ends and successors are the MDP's: a long random run's mean return under uniformly
    random canonical actions matches the tabular value of the uniform policy."""
    from rtpo.llm.model import train_tiny_tokenizer
    from rtpo.tabular.solve import evaluate, uniform_policy

    mdp = random_mdp(3, num_turns=3, num_states=3, num_actions=2, end_prob=0.3, max_tau=3, gamma=0.9)
    env = WorldEnv(_world(mdp, "random"), train_tiny_tokenizer(512, "chat"))
    rng = np.random.default_rng(1)
    n = 4000
    eps = env.reset(np.zeros(n, np.int64), rng)
    ret = np.zeros(n)
    disc = np.ones(n)
    live = np.arange(n)
    while live.size:
        acts = rng.integers(2, size=live.size)
        eps, out = env.step(eps, _gen([env.words.canonical[a] for a in acts]), rng)
        ret[live] += disc[live] * out.reward
        disc[live] *= 0.9**out.duration
        keep = ~out.done
        live, eps = live[keep], [e for e, k in zip(eps, keep) if k]
    want = evaluate(mdp, uniform_policy(mdp)).value
    sem = ret.std() / np.sqrt(n)
    assert abs(ret.mean() - want) < 4 * sem, f"mean return {ret.mean():.4f} vs uniform-policy value {want:.4f}"


def test_scenario_task_section_is_the_same_mdp_on_both_backends():
    from rtpo.llm.worlds import WorldTaskConfig, build_world
    from rtpo.scenario.load import parse_scenario as load_config
    from rtpo.tabular.build import build_mdp

    base = {
        "name": "x",
        "task": {"kind": "region_chain", "num_turns": 3, "seed": 2, "psi": "identity", "policy": "softmax"},
        "method": {"name": "rtpo", "G": 4},
    }
    tab = load_config({**base, "backend": {"kind": "tabular"}})
    llm = load_config(
        {
            **base,
            "backend": {"kind": "llm", "model": "tiny-random"},
            "task": {**base["task"], "context_map": "identity"},
        }
    )
    assert isinstance(llm.task, WorldTaskConfig)
    mdp, world = build_mdp(tab.task), build_world(llm.task)
    for k in range(mdp.num_turns):
        assert np.array_equal(mdp.prob[k], world.prob[k]) and np.array_equal(mdp.reward[k], world.reward[k])
    assert world.v_star == pytest.approx(solve(mdp).value)
    assert llm.task.to_dict()["seed"] == 2 and llm.task.to_dict()["context_map"] == "identity"


@pytest.mark.parametrize(
    ("task", "key"),
    [
        ({"kind": "tool_chain", "psi": "last_feedback"}, "task.psi"),
        ({"kind": "tool_chain", "num_turns": 0}, "task.num_turns"),
        ({"kind": "tool_chain", "nonsense": 1}, "task"),
        ({"kind": "tool_chain", "context_map": "nope"}, "task.context_map"),
        ({"kind": "tool_chain", "exact_max_contexts": 0}, "task.exact_max_contexts"),
    ],
)
def test_bad_world_sections_are_one_line_errors_naming_the_key(task, key):
    from rtpo.scenario.load import parse_scenario as load_config
    from rtpo.scenario.schema import ConfigError

    with pytest.raises(ConfigError) as e:
        load_config(
            {"name": "x", "backend": {"kind": "llm", "model": "tiny-random"}, "task": task, "method": {"name": "rtpo"}}
        )
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(key), msg


def test_worlds_are_registered_even_when_the_llm_backend_was_imported_first():
    """A process that imported rtpo.llm.build itself (a test, a library caller) before asking for the llm
    backend still gets the exact worlds: the registry imports and registers its extension every time, not
    only when it imports the backend (the full suite once failed here, test order dependent)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = (
        "import rtpo.llm.build\n"
        "from rtpo.scenario.load import load_scenario\n"
        "print(load_scenario('scenarios/llm/tiny-cpu-mdp.yaml').task.kind)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(root)},
    )
    assert out.returncode == 0 and out.stdout.strip() == "tool_chain", out.stderr[-500:]
