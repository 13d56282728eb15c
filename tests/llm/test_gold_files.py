"""The shipped gold trajectories (scenarios/llm/data/*-gold.jsonl) against their SFT scenarios' own
environments: every demonstration replays, and every tool result, retrieval and user reply recorded
in it is what the environment returns now (rtpo.llm.sft refuses a stale file; a test here edits one
result to show it).  Writing the gold trajectories exercises what RL is later measured on: search
calls, F1, tool errors from the imperfect share, normal terminations and τ² rewards.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")

from rtpo.llm.build import build_env  # noqa: E402
from rtpo.llm.sft import DemonstrationError, attach, load_demonstrations  # noqa: E402
from rtpo.scenario.load import load_scenario  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCEN = ROOT / "scenarios" / "llm"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


def _env(name: str, cache: Path):
    cfg = load_scenario(SCEN / f"tiny-cpu-{name}-sft.yaml", [f"backend.model_cache={cache}"])
    return cfg, build_env(cfg)


def _shares(path: Path) -> tuple[int, int]:
    items = load_demonstrations(path)
    return len(items), sum(d.quality == "imperfect" for d in items)


@pytest.mark.parametrize(("name", "count"), [("search", 32), ("airline", 30)])
def test_shipped_gold_files_replay_exactly(name, count, cache):
    cfg, env = _env(name, cache)
    replay = attach(env, ROOT / cfg.method.config.data)
    n, bad = _shares(ROOT / cfg.method.config.data)
    assert n == count == len(env.task), f"{name}: one demonstration per training problem"
    assert 0.1 <= bad / n <= 0.25, f"{name}: the documented imperfect share is ~15%, got {bad}/{n}"
    demos = env.demonstrations(np.arange(n))  # raises on any stale tool output or user reply
    assert np.array_equal(np.unique(demos.seq_id), np.arange(n))
    assert replay.qualities()["imperfect"] == bad


@pytest.mark.slow  # 16 real sandbox runs
def test_shipped_math_gold_replays_exactly(cache):
    cfg, env = _env("math", cache)
    attach(env, ROOT / cfg.method.config.data)
    n, bad = _shares(ROOT / cfg.method.config.data)
    assert n == 256 and 0.1 <= bad / n <= 0.25
    demos = env.demonstrations(np.arange(16))
    assert len(np.unique(demos.seq_id)) == 16


def test_a_stale_retrieval_is_refused(cache, tmp_path):
    cfg, env = _env("search", cache)
    lines = (ROOT / cfg.method.config.data).read_text().splitlines()
    rec = json.loads(lines[0])
    rec["messages"][1]["content"] = rec["messages"][1]["content"].replace("born in", "born near")
    path = tmp_path / "stale.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    attach(env, path)
    with pytest.raises(DemonstrationError, match=r"stale\.jsonl:1: messages\[1\]\.content differs"):
        env.demonstrations(np.array([0]))


def test_gold_search_trajectories_exercise_the_tool_metrics(cache):
    from rtpo.llm.gold_qa import qa_demonstrations

    _, env = _env("search", cache)
    env.pop_metrics()
    recs = qa_demonstrations(env, imperfect=0.5, seed=1)
    m = env.pop_metrics()
    searches = sum(v for k, v in m.items() if k.startswith("tool/search/calls") or k == "tool/search/ok")
    assert searches > 0, f"no search call counted: {sorted(m)}"
    assert m.get("malformed/tool_call", 0) > 0, "the imperfect bad_call share makes tool errors"
    assert m.get("answer/f1", 0) > 0 and m.get("episodes_done", 0) == len(recs)


def test_gold_airline_trajectories_end_normally_and_score(cache):
    from rtpo.llm.gold_airline import airline_demonstrations

    _, env = _env("airline", cache)
    env.pop_metrics()
    recs = airline_demonstrations(env, imperfect=0.5, seed=1)
    m = env.pop_metrics()
    assert m["end/normal"] == len(recs) == 30, "every replay ends by the user's stop or a transfer"
    assert m["tool/calls"] > 0 and m["tool/unknown"] > 0, "gold calls run; the bad_call share is an error"
    gold = [r for r in recs if r["quality"] == "gold"]
    assert all(r["reward"] == 1.0 for r in gold), "every gold replay scores 1 under τ²'s reward"
