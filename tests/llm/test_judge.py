"""The LLM-as-judge scorer (rtpo.llm.judge) behind QAScorer's interface.

- Verdicts are parsed from the judge's reply outside <think>.
- No answer and exact matches never reach the judge.
- The answers that need it go to the engine in one batch, with their questions.
- A malformed verdict falls back to the configured rule-based metric and is counted.
- The environment scores a step's finished episodes through score_batch.
- A run's config refuses a judge that cannot be built, in one line.

A scripted engine pins the verdicts. The real tiny model behind the real HF engine exercises the same
path end to end (its random replies are mostly malformed verdicts, which is the plumbing the tests
can check).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from rtpo.core.types import Generation, Ragged  # noqa: E402
from rtpo.llm.chat import Qwen3Chat, load_qwen3_tokenizer  # noqa: E402
from rtpo.llm.judge import JudgeScorer, parse_verdict  # noqa: E402
from rtpo.llm.rewards import BatchScorer, QAScorer  # noqa: E402


class ScriptedJudge:
    """An engine that answers each prompt with the next scripted reply and records what it was asked."""

    def __init__(self, chat: Qwen3Chat, replies: list[str]) -> None:
        self.chat, self.replies, self.calls = chat, list(replies), []

    def generate(self, contexts: Ragged, turn, n, rng) -> Generation:
        self.calls.append([self.chat.decode(contexts[i]) for i in range(len(contexts))])
        rows = [
            np.concatenate([self.chat.ids(self.replies.pop(0)), [self.chat.im_end_id]]) for _ in range(len(contexts))
        ]
        tokens = Ragged.from_rows(rows, dtype=np.int64)
        return Generation(tokens, Ragged(np.zeros(tokens.values.size), tokens.offsets))


@pytest.fixture(scope="module")
def chat():
    return Qwen3Chat(load_qwen3_tokenizer(), tools=None, enable_thinking=False)


@pytest.mark.parametrize(
    "reply, verdict",
    [
        ("yes", 1.0),
        ("Yes.", 1.0),
        ("  No, the years differ.", 0.0),
        ("<think>\nthe gold says 1912, yes or no?\n</think>\n\nno", 0.0),  # the thinking's "yes" is ignored
        ("correct", 1.0),
        ("incorrect", 0.0),
        ("maybe", None),
        ("", None),
        ("<think>\nunfinished", None),
        ("42", None),
    ],
)
def test_verdict_is_the_first_word_outside_thinking(reply, verdict):
    assert parse_verdict(reply) == verdict


def test_only_inexact_answers_reach_the_judge_in_one_batch(chat):
    engine = ScriptedJudge(chat, ["yes", "no", "the answer is fine"])
    judge = JudgeScorer(engine, chat, fallback="f1")
    answers = [None, "Paris", "the city of Paris", "Lyon", "Paris France"]
    golds = [("Paris",), ("Paris",), ("Paris",), ("Paris",), ("Paris",)]
    questions = [f"q{i}: where?" for i in range(5)]
    out = judge.score_batch(answers, golds, questions)

    assert len(engine.calls) == 1 and len(engine.calls[0]) == 3  # one batch: the three inexact answers
    for prompt, q, a in zip(engine.calls[0], questions[2:], answers[2:]):
        assert f"Question: {q}" in prompt and f"Predicted answer: {a}" in prompt and "Gold answers: Paris" in prompt
    assert [r.status for r in out] == ["no_answer", "correct", "correct", "incorrect", "incorrect"]
    assert [r.reward for r in out[:4]] == [0.0, 1.0, 1.0, 0.0]
    assert "judge_calls" not in out[0].metrics and "judge_calls" not in out[1].metrics  # never asked
    bad = out[4]  # the judge's reply was not a verdict: reward = F1 of "Paris France" vs "Paris"
    assert bad.metrics["judge_malformed"] == 1.0 and bad.reward == pytest.approx(2 / 3)
    assert bad.metrics["f1"] == pytest.approx(2 / 3) and bad.metrics["em"] == 0.0


@pytest.mark.parametrize("fallback, expected", [("f1", 2 / 3), ("em", 0.0), ("zero", 0.0)])
def test_fallback_on_a_malformed_verdict(chat, fallback, expected):
    judge = JudgeScorer(ScriptedJudge(chat, ["?"]), chat, fallback=fallback)
    assert judge.score("Paris France", "Paris", "where?").reward == pytest.approx(expected)


def test_bad_fallback_is_refused(chat):
    with pytest.raises(ValueError, match="judge.fallback must be one of f1, em, zero"):
        JudgeScorer(None, chat, fallback="judge")


def test_the_judge_sees_no_more_than_max_chars(chat):
    engine = ScriptedJudge(chat, ["no"])
    JudgeScorer(engine, chat, max_chars=20).score("x" * 5000, "gold", "q" * 5000)
    (prompt,) = engine.calls[0]
    assert "x" * 20 in prompt and "x" * 21 not in prompt and "q" * 21 not in prompt


def test_the_environment_scores_a_step_through_score_batch(tmp_path, chat):
    """Two episodes finish in one step: the judge is called once, with both raw questions; the episode
    rewards and answer/* metrics are the judge's."""
    pytest.importorskip("bm25s", reason="the search extra (bm25s) is not installed")
    from rtpo.llm.env import LLMEnv
    from rtpo.llm.retrieval import BM25Retriever
    from rtpo.llm.tasks.qa import corpus_from_contexts, load_qa, write_multihop
    from rtpo.llm.tools.search import SearchTool

    task = load_qa(write_multihop(tmp_path / "t.json", 4, seed=3), "hotpotqa")
    retriever = BM25Retriever(corpus_from_contexts([task], tmp_path / "c.jsonl"), cache_dir=tmp_path / "idx")
    engine = ScriptedJudge(chat, ["yes", "no"])
    judge = JudgeScorer(engine, chat)
    assert isinstance(judge, BatchScorer) and not isinstance(QAScorer(), BatchScorer)
    env = LLMEnv(task, load_qwen3_tokenizer(), num_turns=3, tools=[SearchTool(retriever)], verifier=judge)
    rng = np.random.default_rng(0)
    eps = env.reset(np.array([0, 1]), rng)
    rows = [np.concatenate([env.chat.ids(t), [env.chat.im_end_id]]) for t in ("\\boxed{wrong one}", "\\boxed{nope}")]
    tokens = Ragged.from_rows(rows, dtype=np.int64)
    _, out = env.step(eps, Generation(tokens, Ragged(np.zeros(tokens.values.size), tokens.offsets)), rng)

    assert len(engine.calls) == 1 and len(engine.calls[0]) == 2
    for prompt, item in zip(engine.calls[0], (task[0], task[1])):
        assert f"Question: {item.raw_question}\n" in prompt  # the question as asked, not the prompt template
    assert out.done.all() and list(out.reward) == [1.0, 0.0]
    m = env.pop_metrics()
    assert (m["answer/correct"], m["answer/incorrect"], m["answer/judge_calls"], m["answer/judge"]) == (1, 1, 2, 1)


def test_the_real_tiny_engine_runs_the_judge_path(tiny_model_dir):
    """The real HF engine on the tiny random model: each inexact answer costs one judge call, a reply that
    is no verdict falls back to F1 and is counted, and nothing raises."""
    from rtpo.llm.engines import HFEngine, SamplingConfig

    chat = Qwen3Chat(load_qwen3_tokenizer(str(tiny_model_dir)), tools=None, enable_thinking=False)
    engine = HFEngine(
        tiny_model_dir, SamplingConfig(temperature=0.0, max_tokens=8, stop_token_ids=tuple(chat.stop_ids))
    )
    judge = JudgeScorer(engine, chat, fallback="f1")
    out = judge.score_batch(["Lyon", "the Seine river", None], [("Paris",), ("Seine",), ("x",)], ["a?", "b?", "c?"])
    assert [r.metrics.get("judge_calls", 0.0) for r in out] == [1.0, 1.0, 0.0]
    for r in out[:2]:
        assert r.metrics["judge"] in (0.0, 1.0)
        if r.metrics.get("judge_malformed"):
            assert r.reward == r.metrics["f1"]
        else:
            assert r.reward == r.metrics["judge"]
    again = judge.score_batch(["Lyon", "the Seine river"], [("Paris",), ("Seine",)], ["a?", "b?"])
    assert [r.reward for r in again] == [r.reward for r in out[:2]]  # greedy: the same verdicts


def test_config_refuses_a_judge_it_cannot_build(tmp_path):
    from rtpo.llm.search import JudgeSection, build_judge, parse_qa_task
    from rtpo.scenario.schema import ConfigError

    with pytest.raises(ConfigError, match="reward judge needs task.judge"):
        parse_qa_task({"kind": "multihop", "reward": "judge"})
    with pytest.raises(ConfigError, match="not a local HF model folder"):
        build_judge(JudgeSection(model=str(tmp_path / "missing")), None)
    cfg = parse_qa_task({"kind": "multihop", "reward": "judge", "judge": {"model": "initial", "fallback": "em"}})
    assert cfg.judge is not None and cfg.judge.fallback == "em"
