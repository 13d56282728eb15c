"""An LLM-as-judge scorer for QA answers, behind the same interface as `QAScorer` (rtpo.llm.rewards).

The paper scores its knowledge-reasoning runs with F1 and also reports judged accuracy from a 72B judge
(Appendix F.1). `JudgeScorer` asks a local, frozen engine whether a predicted answer means the same as
one of the gold answers, given the question. In the tests the engine is the tiny random model, which
only exercises the plumbing; a real run points `task.judge.model` at a local HF folder of a capable
instruct model.

What it does, per finished episode:

- **No answer parsed** (nothing in \\boxed{} or <answer>): reward 0, status no_answer. The judge is not
  asked.
- **Exact match** with a gold answer after the official HotpotQA normalisation: reward 1, status
  correct. The judge is not asked, because an exact match cannot be wrong. This also saves most judge
  calls late in training.
- **Otherwise, one batched prompt per step.** The judge decodes greedily. Its verdict is the first
  word of the response outside any <think> block: "yes" gives reward 1, "no" gives reward 0.
- **Anything else is a malformed verdict.** It is counted as `answer/judge_malformed`, and the reward
  falls back to the rule-based metric named by `fallback` (f1, em or zero). A malformed judge never
  crashes a run; the counter makes it visible.

Metrics per episode (summed by the environment as `answer/<key>`): f1 and em (always, so judged and
rule-based runs can be compared on one axis), judge (the verdict used, 0/1), judge_calls,
judge_malformed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from rtpo.core.types import Ragged
from rtpo.llm.chat import split_thinking
from rtpo.llm.rewards import QAResult, exact_match, qa_answer_text, token_f1

PROMPT = (
    "You are grading an answer to a question. Reply with one word: yes if the predicted answer means the "
    "same as one of the gold answers, no otherwise.\n\n"
    "Question: {question}\nGold answers: {gold}\nPredicted answer: {answer}\n\nIs the predicted answer correct?"
)
_WORD = re.compile(r"[A-Za-z]+")
FALLBACKS = ("f1", "em", "zero")


def parse_verdict(text: str) -> float | None:
    """1.0 for yes, 0.0 for no: the first word of the judge's reply outside <think>; None if neither."""
    _, content = split_thinking(text)
    m = _WORD.search(content)
    if m is None:
        return None
    word = m.group(0).lower()
    return 1.0 if word in ("yes", "correct") else 0.0 if word in ("no", "incorrect") else None


class JudgeScorer:
    """Scores QA answers with a local judge engine; falls back to a rule-based metric on a bad verdict.

    engine:    a frozen Sampler (HFEngine or VLLMEngine) at greedy settings; its weights never change.
    chat:      a Qwen3Chat of the judge's tokenizer (no tools, thinking off by default).
    fallback:  the reward when the verdict cannot be parsed: f1 | em | zero.
    max_chars: question, gold list and predicted answer are each cut to this many characters.
    """

    def __init__(self, engine: Any, chat: Any, fallback: str = "f1", max_chars: int = 1000) -> None:
        if fallback not in FALLBACKS:
            raise ValueError(f"judge.fallback must be one of {', '.join(FALLBACKS)}, got {fallback!r}")
        self.engine, self.chat, self.fallback, self.max_chars = engine, chat, fallback, int(max_chars)

    def prompt(self, question: str, golds: Sequence[str], answer: str) -> str:
        cut = self.max_chars
        return PROMPT.format(question=question[:cut], gold=" | ".join(golds)[:cut], answer=answer[:cut])

    def score(self, answer: str | None, gold: str | Sequence[str], question: str = "") -> QAResult:
        return self.score_batch([answer], [gold], [question])[0]

    def score_batch(
        self, answers: Sequence[str | None], golds: Sequence[str | Sequence[str]], questions: Sequence[str]
    ) -> list[QAResult]:
        """One result per answer; the answers that need the judge go to the engine in one batch."""
        if not len(answers) == len(golds) == len(questions):
            raise ValueError(f"score_batch: {len(answers)} answers, {len(golds)} golds, {len(questions)} questions")
        out: list[QAResult | None] = [None] * len(answers)
        ask: list[int] = []
        rule: list[tuple[float, float]] = []
        for i, (a, g) in enumerate(zip(answers, golds)):
            gs = _golds(g)
            if a is None:
                out[i] = QAResult(0.0, "no_answer", "judge", {"f1": 0.0, "em": 0.0, "judge": 0.0})
                rule.append((0.0, 0.0))
                continue
            f1 = max(token_f1(qa_answer_text(a), x) for x in gs)
            em = max(exact_match(qa_answer_text(a), x) for x in gs)
            rule.append((f1, em))
            if em:
                out[i] = QAResult(1.0, "correct", "judge", {"f1": f1, "em": em, "judge": 1.0})
            else:
                ask.append(i)
        if ask:
            verdicts = self._ask(
                [self.prompt(questions[i], _golds(golds[i]), str(answers[i])) for i in ask],
            )
            for i, v in zip(ask, verdicts):
                f1, em = rule[i]
                m = {"f1": f1, "em": em, "judge_calls": 1.0}
                if v is None:
                    m["judge_malformed"] = 1.0
                    r = {"f1": f1, "em": em, "zero": 0.0}[self.fallback]
                    m["judge"] = 0.0
                    out[i] = QAResult(r, "incorrect", "judge", m)
                else:
                    m["judge"] = v
                    out[i] = QAResult(v, "correct" if v else "incorrect", "judge", m)
        return [r for r in out if r is not None]

    def _ask(self, prompts: Sequence[str]) -> list[float | None]:
        rows = [np.concatenate([self.chat.prompt_block(p), self.chat.generation_prompt]) for p in prompts]
        # greedy decoding: the rng is drawn from but does not change the tokens
        gen = self.engine.generate(
            Ragged.from_rows(rows, dtype=np.int64), np.zeros(len(rows), np.int64), 1, np.random.default_rng(0)
        )
        verdicts = []
        for i in range(len(rows)):
            ids = gen.tokens[i]
            if ids.size and int(ids[-1]) in self.chat.stop_ids:
                ids = ids[:-1]
            verdicts.append(parse_verdict(self.chat.decode(ids)))
        return verdicts


def _golds(g: str | Sequence[str]) -> tuple[str, ...]:
    return (g,) if isinstance(g, str) else tuple(g)


__all__ = ["FALLBACKS", "PROMPT", "JudgeScorer", "parse_verdict"]
