"""The rollout/train mismatch (issue #5), small: think-stripped rollouts with scripted thinking in the
trunk, learner log-probs on the recorded c_k (RTPO: ratio 1) and on the full history (flat: not 1);
and the lenient answer parses of tiny-cpu-learn.  The full measurement is bench/llm_mismatch.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")

from conftest import TEMPERATURE  # noqa: E402
from rtpo.core.types import Generation, Ragged  # noqa: E402
from rtpo.llm.env import LLMEnv  # noqa: E402
from rtpo.llm.rewards import last_digit, last_integer  # noqa: E402
from rtpo.llm.sandbox import SandboxResult  # noqa: E402
from rtpo.llm.tasks import MathItem, MathTask  # noqa: E402
from rtpo.llm.tasks.math import arithmetic_task  # noqa: E402


def _bench():
    path = Path(__file__).resolve().parents[2] / "bench" / "llm_mismatch.py"
    spec = importlib.util.spec_from_file_location("llm_mismatch", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _no_tool(code, limits):  # the env's own logic only; the sandbox has its own suite
    return SandboxResult(
        stdout="4\n",
        stderr="",
        exit_code=0,
        signal=None,
        timed_out=False,
        truncated=False,
        limits_hit=(),
        wall_time_s=0.0,
        isolation="rlimits",
    )


@pytest.mark.parametrize(
    "text, integer, digit",
    [
        ("abc 12 x 7", "7", "7"),
        ("3.5 and 4", "4", "4"),
        ("x-3", "-3", "3"),
        ("12a34", "34", "4"),
        ("no digits", None, None),
        ("", None, None),
        ("v1.25", None, "5"),
    ],
)
def test_lenient_parsers(text, integer, digit):
    assert last_integer(text) == integer
    assert last_digit(text) == digit


def test_answer_parse_option_is_opt_in(tiny_model_dir):
    from rtpo.llm.chat import load_qwen3_tokenizer

    tok = load_qwen3_tokenizer(str(tiny_model_dir))
    task = MathTask("t", (MathItem("a", "Compute 1 + 3.", "4", "t"),))
    texts = ["so 12 then 4", "so 34", "so 12 then 5"]
    got = {}
    for parse in ("boxed", "last_integer", "last_digit"):
        env = LLMEnv(task, tok, "think_strip", num_turns=2, run_tool=_no_tool, answer_parse=parse)
        rng = np.random.default_rng(0)
        eps = env.reset(np.zeros(len(texts), dtype=np.int64), rng)
        rows = [np.concatenate([env.chat.ids(t), [env.chat.im_end_id]]) for t in texts]
        gen = Generation(
            Ragged.from_rows(rows, dtype=np.int64), Ragged.from_rows([np.zeros(r.size) for r in rows], dtype=np.float64)
        )
        _, out = env.step(eps, gen, rng)
        got[parse] = (out.reward.tolist(), out.done.tolist(), out.malformed.tolist())
    # the default stays strict: no \boxed{} is no answer, feedback and another turn
    assert got["boxed"] == ([0.0, 0.0, 0.0], [False] * 3, [True] * 3)
    assert got["last_integer"] == ([1.0, 0.0, 0.0], [True] * 3, [False] * 3)
    assert got["last_digit"] == ([1.0, 1.0, 0.0], [True] * 3, [False] * 3)
    with pytest.raises(ValueError, match="answer_parse"):
        LLMEnv(task, tok, answer_parse="first_word")


def test_rtpo_ratio_is_one_and_flat_history_is_not(tiny_model_dir, hf_reference):
    """Turn 0 scripted with a <think> block (through env.step), turn 1 sampled under think_strip: the
    learner on the recorded c_1 reproduces the rollout log-probs; on the full history it does not."""
    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.learner import FSDPLearner, LearnerConfig

    bench = _bench()
    tok = load_qwen3_tokenizer(str(tiny_model_dir))
    env = LLMEnv(
        arithmetic_task(4, 0, max_operand=9, num_operands=2),
        tok,
        "think_strip",
        num_turns=2,
        run_tool=_no_tool,
        max_calls_per_turn=1,
    )
    learner = FSDPLearner(tiny_model_dir, LearnerConfig(temperature=TEMPERATURE))
    res = bench.measure(env, hf_reference, learner, np.arange(4), turns=2, n=2, scripted=True, seed=0)
    t0, t1 = res["per_turn"]
    assert t0["contexts_identical"] and not t1["contexts_identical"]
    assert t1["context_tokens_mean_full"] > t1["context_tokens_mean_rtpo"] + 20  # the thinking is there
    for t in (t0, t1):
        assert abs(t["rtpo"]["mean_log_ratio"]) < 1e-4 and t["rtpo"]["max_abs_log_ratio"] < 1e-3
    assert t0["flat"]["max_abs_log_ratio"] < 1e-3  # same context at turn 0: the control
    assert t1["flat"]["abs_log_ratio"] > 1e-2  # different context, different distribution


def test_full_contexts_only_when_configured(tiny_model_dir):
    """The rollout driver records Trajectory.full_contexts iff the env has `full_contexts`: opt-in."""
    from rtpo.llm.chat import load_qwen3_tokenizer

    tok = load_qwen3_tokenizer(str(tiny_model_dir))
    task = arithmetic_task(2, 0, max_operand=9, num_operands=2)
    assert not hasattr(LLMEnv(task, tok, "think_strip", run_tool=_no_tool), "full_contexts")
    env = LLMEnv(task, tok, "think_strip", num_turns=3, run_tool=_no_tool, full_context_map="identity")
    rng = np.random.default_rng(0)
    eps = env.reset(np.arange(2), rng)
    rows = [np.concatenate([env.chat.ids("<think>\nplan\n</think>\n\nno idea"), [env.chat.im_end_id]])] * 2
    gen = Generation(
        Ragged.from_rows(rows, dtype=np.int64), Ragged.from_rows([np.zeros(r.size) for r in rows], dtype=np.float64)
    )
    eps, _ = env.step(eps, gen, rng)
    full, ck = env.full_contexts(eps), env.contexts(eps)
    ident = env.contexts_with(eps, "identity")
    for i in range(2):
        assert np.array_equal(full[i], ident[i]) and full[i].size > ck[i].size
        assert "plan" in env.chat.decode(full[i]) and "plan" not in env.chat.decode(ck[i])
