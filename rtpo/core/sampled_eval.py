"""Sampled evaluation of a policy, written once for every backend: Pass@k, reward, tokens, turns, tool
calls, truncation and malformed rates (the metrics library; the `rtpo eval` command is rtpo.commands.eval).

A backend lends the evaluator its environments, its policy at the evaluation sampling settings and those
settings (`SampledEval`, the optional `BuiltBackend.sampled_eval`); `sample_and_score` draws N samples per
problem with the core's rollout driver (n forks at the first step) and `EvalSamples.summary` turns them
into metrics.  The LLM backend's in-run evaluation calls the same two functions (`in_run_metrics`), so
the metric formulas exist once.  Nothing here imports a backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rtpo.core.protocols import Environment, ReportsMetrics, Sampler
from rtpo.core.rollout import rollout

# the in-run evaluation of the LLM backend has always drawn with seed + this (kept: same numbers)
IN_RUN_SEED_OFFSET = 7919


# -- the estimator ----------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k of one problem from n samples of which c succeeded: 1 − C(n−c, k) / C(n, k).

    Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (arXiv:2107.03374),
    §2.1, Eq. 1 and the numerically stable form given there.  The ratio of binomials is evaluated as a
    product instead of with factorials, which overflow (or lose all digits in float) for n in the
    hundreds:
        C(n−c, k) / C(n, k) = Π_{i=0}^{c−1} (n−k−i)/(n−i) = Π_{j=n−c+1}^{n} (1 − k/j),
    and it is 0 when n − c < k (every k-subset then holds a success).
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"pass_at_k: {name} must be an integer, got {v!r}")
    n, c, k = int(n), int(c), int(k)
    if k < 1:
        raise ValueError(f"pass_at_k: k must be >= 1, got k={k}")
    if n < k:
        raise ValueError(f"pass_at_k: k={k} needs at least k samples per problem, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: successes c must be in [0, n={n}], got c={c}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_pass_at_k(successes: Sequence[int] | np.ndarray, n: int, k: int) -> float:
    """Pass@k averaged over problems: successes[i] of the n samples of problem i succeeded."""
    counts = np.asarray(successes).reshape(-1)
    if counts.size == 0:
        raise ValueError("mean_pass_at_k: no problems")
    return float(np.mean([pass_at_k(n, int(c), k) for c in counts]))


# -- what a backend provides ------------------------------------------------------------------------
@dataclass(frozen=True)
class EvalSplit:
    """env: the environment episodes of this split run in; num_problems: the size of its problem set
    (query ids 0..num_problems-1), or None when ids name no fixed problems (tabular: each episode draws
    its start state, so a "problem" is one draw, and its N samples fork from it)."""

    env: Environment
    num_problems: int | None


@dataclass(frozen=True)
class SampledEval:
    """What a backend lends the sampled evaluator (BuiltBackend.sampled_eval).

    splits:            split name ("eval", "train") -> EvalSplit.
    policy:            () -> a context manager giving a Sampler that draws from the learner's *current*
                       policy at the evaluation sampling settings, and that puts back whatever it changed
                       (the training sampler's weights and settings) on exit.
    settings:          the evaluation sampling settings, recorded in every report (temperature, top-p, ...).
    default_problems:  problems evaluated when the split has no fixed set (num_problems None).
    success_threshold: a sample succeeds when its return is > this.
    exact:             optional () -> exact metrics of the current policy (tabular: the exact value, V*),
                       which a sampled estimate can be checked against.
    """

    splits: Mapping[str, EvalSplit]
    policy: Callable[[], AbstractContextManager[Sampler]]
    settings: Mapping[str, Any]
    default_problems: int = 64
    success_threshold: float = 0.0
    exact: Callable[[], dict[str, float]] | None = None


# -- sampling and scoring ---------------------------------------------------------------------------
@dataclass(frozen=True)
class EvalSamples:
    """N samples of each of Q problems.  Arrays are (Q, N); row i belongs to query_ids[i].

    counters: the environment's own counters over these episodes (pop_metrics: tool/calls, tool/ok,
    truncated_turns, turns, ...), or None when the environment keeps none (then the rates that need them
    are None)."""

    query_ids: np.ndarray
    returns: np.ndarray
    tokens: np.ndarray
    turns: np.ndarray
    malformed_turns: np.ndarray
    threshold: float
    counters: dict[str, float] | None = field(default=None)

    @property
    def num_problems(self) -> int:
        return int(self.returns.shape[0])

    @property
    def samples(self) -> int:
        return int(self.returns.shape[1])

    @property
    def success(self) -> np.ndarray:
        return self.returns > self.threshold

    @property
    def successes(self) -> np.ndarray:
        """(Q,) successful samples per problem."""
        return self.success.sum(axis=1).astype(np.int64)

    def summary(self, ks: Sequence[int] = (1,)) -> dict[str, Any]:
        """Every metric of the report, defined here and nowhere else (None = not measurable here)."""
        episodes = self.returns.size
        turns = int(self.turns.sum())
        c = self.counters
        calls = None if c is None else float(c.get("tool/calls", 0))
        out: dict[str, Any] = {f"pass@{k}": mean_pass_at_k(self.successes, self.samples, k) for k in sorted({1, *ks})}
        out.update(
            {
                "success_rate": float(self.success.mean()),
                "reward_mean": float(self.returns.mean()),
                "tokens_mean": float(self.tokens.mean()),
                "turns_mean": float(self.turns.mean()),
                "tool_calls_mean": None if calls is None else calls / episodes,
                # Table 9's tool-execution success: 1 - errors / attempted (a call refused before it ran,
                # for an unknown tool or bad arguments, is attempted and an error)
                "tool_ok_rate": (
                    (1.0 - float(c.get("tool/errors", 0)) / float(c["tool/attempted"]))
                    if c is not None and c.get("tool/attempted")
                    else None
                    if not calls
                    else float(c.get("tool/ok", 0)) / calls
                ),
                # a turn is truncated when it hit the token limit before a stop token (LLM env counter)
                "truncation_rate": (
                    None if c is None or "truncated_turns" not in c else float(c["truncated_turns"]) / max(turns, 1)
                ),
                "malformed_rate": float(self.malformed_turns.sum()) / max(turns, 1),
                # the share of turns that parse as a valid tool call or a valid answer (the environment's
                # own test of its action format: rtpo.llm.env, rtpo.llm.airline.env)
                "valid_turn_rate": (
                    None
                    if c is None or "turns/valid" not in c or not c.get("turns")
                    else float(c["turns/valid"]) / float(c["turns"])
                ),
                # episodes ended because their next context would pass the context limit (LLM env counter)
                "context_overflow_rate": (
                    None if c is None or "turns" not in c else float(c.get("context_overflow", 0)) / episodes
                ),
                # τ³-airline's Tables 8, 9, 14 (Appendix G); None where the environment keeps no such counter
                "tokens_per_turn": float(self.tokens.sum()) / max(turns, 1),
                "tokens_per_success": (
                    float(self.tokens[self.success].sum()) / int(self.success.sum()) if self.success.any() else None
                ),
                "tool_calls_attempted": None if c is None else float(c.get("tool/attempted", calls or 0)),
                "tool_error_calls": None if c is None or "tool/errors" not in c else float(c["tool/errors"]),
                "normal_termination_rate": (
                    None if c is None or "end/normal" not in c else float(c["end/normal"]) / episodes
                ),
                # multi-hop QA (Table 1, F.1): answer F1/EM per episode, searches per episode, and the
                # share of the gold supporting titles the searches retrieved (rtpo.llm.tools.search)
                "f1_mean": None if c is None or "answer/f1" not in c else float(c["answer/f1"]) / episodes,
                "em_mean": None if c is None or "answer/em" not in c else float(c["answer/em"]) / episodes,
                # LLM-judged accuracy (rtpo.llm.judge), and how often the judge gave no verdict
                "judge_mean": None if c is None or "answer/judge" not in c else float(c["answer/judge"]) / episodes,
                "judge_malformed_rate": (
                    None
                    if c is None or "answer/judge" not in c
                    else float(c.get("answer/judge_malformed", 0)) / max(float(c.get("answer/judge_calls", 0)), 1.0)
                ),
                "search_calls_mean": (
                    None
                    if c is None or "tool/search/episodes" not in c
                    else float(c.get("tool/search/calls", 0)) / episodes
                ),
                "retrieval_recall": (
                    None
                    if c is None or not c.get("tool/search/recall_episodes")
                    else float(c["tool/search/recall"]) / float(c["tool/search/recall_episodes"])
                ),
                "num_problems": self.num_problems,
                "samples_per_problem": self.samples,
                "num_episodes": int(episodes),
            }
        )
        return out


def sample_and_score(
    spec: SampledEval,
    query_ids: Sequence[int] | np.ndarray,
    samples: int,
    seed: int,
    split: str = "eval",
    threshold: float | None = None,
    chunk_problems: int | None = None,
) -> EvalSamples:
    """Roll out `samples` episodes per query id with the policy at evaluation settings and score them.

    One rollout call per chunk of problems, n = samples (the driver forks n responses at the first step,
    so an LLM engine shares the prompt's prefix cache).  Draws come from np.random.default_rng(seed)
    alone: the same seed, target and chunking give the same samples.
    """
    if split not in spec.splits:
        raise ValueError(f"split {split!r} is not available (valid: {', '.join(spec.splits)})")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    env = spec.splits[split].env
    ids = np.asarray(query_ids, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        raise ValueError("no problems to evaluate")
    if isinstance(env, ReportsMetrics):
        env.pop_metrics()  # counters of earlier use of this environment belong to someone else
    rng = np.random.default_rng(seed)
    step = ids.size if not chunk_problems else int(chunk_problems)
    trajs = []
    with spec.policy() as sampler:
        for lo in range(0, ids.size, step):
            part = ids[lo : lo + step]
            trajs += rollout(env, sampler, env.reset(part, rng), part, rng, n=samples).trajectories
    # the environment's counts (deterministic for a seed); its wall-clock sums (time/...) are left out, so
    # two evaluations of the same target give the same report
    counters = (
        {k: float(v) for k, v in env.pop_metrics().items() if not k.startswith("time/")}
        if isinstance(env, ReportsMetrics)
        else None
    )

    def grid(values) -> np.ndarray:  # episodes are row-major: problem i's samples are rows i*n..i*n+n-1
        return np.asarray(values).reshape(ids.size, samples)

    return EvalSamples(
        query_ids=ids,
        returns=grid([t.ret for t in trajs]).astype(np.float64),
        tokens=grid([t.num_tokens for t in trajs]).astype(np.int64),
        turns=grid([t.num_turns for t in trajs]).astype(np.int64),
        malformed_turns=grid([int(np.sum(t.malformed)) for t in trajs]).astype(np.int64),
        threshold=spec.success_threshold if threshold is None else float(threshold),
        counters=counters,
    )


# the in-run metric names (metrics.jsonl) of summary keys; eval/value is the runner's value_key
_IN_RUN_KEYS = {
    "reward_mean": "eval/value",
    "pass@1": "eval/pass@1",
    "tokens_mean": "eval/tokens_mean",
    "turns_mean": "eval/turns_mean",
    "tool_calls_mean": "eval/tool_calls_mean",
    "tool_ok_rate": "eval/tool_ok_rate",
    "truncation_rate": "eval/truncation_rate",
    "malformed_rate": "eval/malformed_rate",
    "valid_turn_rate": "eval/valid_turn_rate",
    "context_overflow_rate": "eval/context_overflow_rate",
    "tokens_per_turn": "eval/tokens_per_turn",
    "tokens_per_success": "eval/tokens_per_success",
    "tool_error_calls": "eval/tool_error_calls",
    "normal_termination_rate": "eval/normal_termination_rate",
    "f1_mean": "eval/f1",
    "em_mean": "eval/em",
    "judge_mean": "eval/judge",
    "judge_malformed_rate": "eval/judge_malformed_rate",
    "search_calls_mean": "eval/search_calls_mean",
    "retrieval_recall": "eval/retrieval_recall",
}


def in_run_metrics(spec: SampledEval, query_ids: np.ndarray, seed: int) -> dict[str, float]:
    """The evaluation a run logs after a phase: one sample per problem of the eval split, as
    `eval/*` metrics (a metric that is not measurable, such as the tool success rate of a policy that
    made no call, is left out rather than logged as a made-up number)."""
    s = sample_and_score(spec, query_ids, samples=1, seed=seed, split="eval").summary((1,))
    return {name: float(s[key]) for key, name in _IN_RUN_KEYS.items() if s[key] is not None}
