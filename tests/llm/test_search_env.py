"""The search environment: forking siblings from a boundary snapshot re-issues none of the trunk's
searches (counted at the retriever), siblings' search histories stay apart, the summarising ψ keeps
only summaries of older turns (written once, when the turn ended), and a retrieval outage is feedback."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

pytest.importorskip("bm25s", reason="the search extra (bm25s) is not installed")

from rtpo.core.types import Generation, Ragged  # noqa: E402
from rtpo.llm.chat import load_qwen3_tokenizer  # noqa: E402
from rtpo.llm.env import LLMEnv  # noqa: E402
from rtpo.llm.retrieval import BM25Retriever, HTTPRetriever  # noqa: E402
from rtpo.llm.rewards import QAScorer  # noqa: E402
from rtpo.llm.tasks.qa import corpus_from_contexts, load_qa, write_multihop  # noqa: E402
from rtpo.llm.tools.search import SearchTool  # noqa: E402


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("search-env")
    task = load_qa(write_multihop(root / "t.json", 8, seed=1), "hotpotqa")
    retriever = BM25Retriever(corpus_from_contexts([task], root / "c.jsonl"), cache_dir=root / "idx")
    return task, retriever, load_qwen3_tokenizer()


def _env(world, **kw):
    task, retriever, tok = world
    tool = SearchTool(retriever)
    env = LLMEnv(task, tok, num_turns=4, tools=[tool], verifier=QAScorer(), enable_thinking=False, **kw)
    return env, tool


def _gen(env, texts):
    rows = [np.concatenate([env.chat.ids(t), [env.chat.im_end_id]]).astype(np.int64) for t in texts]
    tokens = Ragged.from_rows(rows, dtype=np.int64)
    return Generation(tokens, Ragged(np.zeros(tokens.values.size), tokens.offsets))


def _search(q: str) -> str:
    return f'Let me look.\n<tool_call>\n{{"name": "search", "arguments": {{"query": "{q}"}}}}\n</tool_call>'


def test_forking_from_a_snapshot_reissues_no_search(world):
    task, retriever, _ = world
    env, tool = _env(world)
    rng = np.random.default_rng(0)
    trunk = env.reset(np.array([0]), rng)
    trunk, _ = env.step(trunk, _gen(env, [_search(task[0].raw_question)]), rng)
    assert tool.calls_issued == 1
    boundary = pickle.loads(pickle.dumps(env.snapshot(trunk)))  # what a sibling is forked from (a Ray hop)
    q0, issued = retriever.queries + retriever.cache_hits, tool.calls_issued
    sibs = env.restore(boundary * 3)
    assert (tool.calls_issued, retriever.queries + retriever.cache_hits) == (issued, q0)  # restoring runs nothing
    city = task[0].titles[1]
    sibs, out = env.step(sibs, _gen(env, [_search(city), "\\boxed{x}", _search("river")]), rng)
    assert tool.calls_issued == issued + 2  # exactly the siblings' own searches
    states = [s.tool_state["search"] for s in sibs]
    assert states[0].queries == (task[0].raw_question, city) and states[2].queries == (task[0].raw_question, "river")
    assert boundary[0].tool_state["search"].queries == (task[0].raw_question,)  # the snapshot is untouched
    assert out.done.tolist() == [False, True, False]


def test_summarize_keeps_only_summaries_of_older_turns(world):
    task, _, _ = world
    env, _ = _env(world, context_map={"summarize": {"m": 1}}, full_context_map="identity")
    rng = np.random.default_rng(0)
    eps = env.reset(np.array([0]), rng)
    eps, _ = env.step(eps, _gen(env, [_search(task[0].raw_question)]), rng)
    eps, _ = env.step(eps, _gen(env, [_search("zzz nothing")]), rng)
    c2 = env.chat.decode(env.contexts(eps)[0])
    full = env.chat.decode(env.full_contexts(eps)[0])
    assert f'Earlier turn: searched "{task[0].raw_question}" and found: {task[0].titles[0]}' in c2
    assert "Doc 1 (Title:" not in c2.split("Earlier turn")[1].split("zzz nothing")[0]  # turn 0's passages are gone
    assert "No passage matched the query." in c2  # the last turn is kept in full
    assert full.count("<tool_response>") == 2 and len(env.contexts(eps)[0]) < len(env.full_contexts(eps)[0])
    # c_k is a pure function of S_k: the summary blocks were written when the turns ended
    again = env.contexts(pickle.loads(pickle.dumps(eps)))
    assert np.array_equal(again[0], env.contexts(eps)[0])


def test_retrieval_outage_is_feedback_and_the_episode_goes_on(world):
    task, _, tok = world
    tool = SearchTool(HTTPRetriever("http://127.0.0.1:9/retrieve", timeout_s=0.2, retries=0))
    env = LLMEnv(task, tok, num_turns=3, tools=[tool], verifier=QAScorer(), enable_thinking=False)
    rng = np.random.default_rng(0)
    eps = env.reset(np.array([0]), rng)
    eps, out = env.step(eps, _gen(env, [_search("x")]), rng)
    assert not out.done[0] and "Error: search is unavailable" in out.feedback[0]
    m = env.pop_metrics()
    assert m["tool/search/server_errors"] == 1 and m["tool/errors"] == 1


class CountingEngine:
    """The real HF engine, counting its generate calls and the prompts it was given."""

    def __init__(self, engine):
        self.engine, self.calls, self.prompts = engine, 0, 0

    def generate(self, contexts, turn, n, rng):
        self.calls += 1
        self.prompts += len(contexts)
        return self.engine.generate(contexts, turn, n, rng)


def test_engine_summaries_are_written_once_by_the_real_engine(world, tmp_path):
    """summarize ψ with the engine summarizer on the real HF engine (tiny random Qwen3 with the real
    vocab). One generate call per step writes a summary for every episode still going. The context holds
    that summary in place of the older turn, and forking or re-reading the context never calls the
    engine again."""
    pytest.importorskip("transformers")
    from rtpo.llm.engines import HFEngine, SamplingConfig
    from rtpo.llm.model_cache import tiny_random_model

    task, retriever, tok = world
    engine = CountingEngine(
        HFEngine(tiny_random_model(tmp_path / "models", 0), SamplingConfig(temperature=0.0, max_tokens=6))
    )
    env = LLMEnv(
        task,
        tok,
        num_turns=4,
        tools=[SearchTool(retriever)],
        verifier=QAScorer(),
        enable_thinking=False,
        context_map={"summarize": {"m": 1, "summarizer": "engine"}},
    )
    env.summarizer.engine = engine  # what the llm backend does once its engine exists
    rng = np.random.default_rng(0)
    eps = env.reset(np.array([0, 1]), rng)
    eps, out = env.step(eps, _gen(env, [_search(task[0].raw_question), "\\boxed{done}"]), rng)
    assert (engine.calls, engine.prompts) == (1, 1)  # the finished episode gets no summary
    (going,) = [e for e, d in zip(eps, out.done) if not d]
    eps, _ = env.step([going], _gen(env, [_search("second")]), rng)
    assert (engine.calls, engine.prompts) == (2, 2)
    summary = env.chat.decode(eps[0].state.turns[0].summary)
    assert "Earlier turn (summary):" in summary
    c2 = env.chat.decode(env.contexts(eps)[0])
    assert summary.split("<|im_start|>assistant\n")[-1].split("<|im_end|>")[0] in c2
    assert "Doc 1 (Title:" not in c2.split("Earlier turn (summary):")[1].split("second")[0]  # turn 0's passages gone
    sibs = env.restore(pickle.loads(pickle.dumps(env.snapshot(eps))) * 3)
    assert all(np.array_equal(c, env.contexts(eps)[0]) for c in env.contexts(sibs))
    assert engine.calls == 2  # restoring and reading contexts wrote no summary
