"""LLMEnv: multi-turn tool-use math episodes behind the core's Environment protocol.

An episode is a frozen `ChatEpisode`: the task item, S_k as token blocks (`contexts.ChatState`), and the
message history (raw assistant texts with their <think> blocks, tool results).  Being immutable, an
episode is its own snapshot: `snapshot`, `restore` and `take` copy references, never re-run a turn,
and pickle cheaply (a boundary shares every block with its trunk).

A turn (`step`): decode the sampled ids, parse (chat.parse_response), then
- tool calls             -> run each in the sandbox (all calls of the batch in parallel threads), the
                            results come back as the template's tool message;
- a \\boxed{} answer      -> the episode ends, reward = math reward of the last boxed answer;
- neither, or a malformed call -> feedback text naming the problem, StepOutcome.malformed = True;
- turn K-1               -> the episode ends whatever was written (reward of a boxed answer, if any);
- a next context c_{k+1} longer than max_context_tokens -> the episode ends the same way (metric
                            context_overflow), so the engine never receives a context it cannot fit.
Rewards are sparse (only at the end, SPEC §1); τ_k = the number of response tokens (Eq. 19).
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rtpo.core.types import Generation, Ragged, StepOutcome
from rtpo.llm.chat import ParsedResponse, Qwen3Chat, parse_response
from rtpo.llm.contexts import ChatState, ContextMap, TurnBlocks, make_context_map
from rtpo.llm.rewards import ANSWER_PARSES, LENIENT_PARSERS, BatchScorer, MathVerifier, default_verifier
from rtpo.llm.sandbox import SandboxLimits, SandboxResult, run_python
from rtpo.llm.summaries import TurnRecord, make_summarizer
from rtpo.llm.tasks.math import MathItem, MathTask
from rtpo.llm.tools import Tool, ToolSet, make_tool
from rtpo.llm.tools.python import PythonTool

NO_ACTION_FEEDBACK = (
    "Error: no tool call and no final answer found. Call the python tool as "
    '<tool_call>\n{"name": "python", "arguments": {"code": "..."}}\n</tool_call> '
    "or give the final answer as \\boxed{...}."
)


def no_action_feedback(tools: ToolSet) -> str:
    """The feedback of a turn with neither a tool call nor a final answer (names the first tool)."""
    if tools.names == ("python",):
        return NO_ACTION_FEEDBACK
    name = tools.names[0] if len(tools) else "tool"
    props = list(tools.tools[name].parameters.get("properties", {})) if len(tools) else []
    arg = f'"{props[0]}": "..."' if props else ""
    listed = ", ".join(tools.names) or "none"
    return (
        f"Error: no tool call and no final answer found. Call a tool (available: {listed}) as "
        f'<tool_call>\n{{"name": "{name}", "arguments": {{{arg}}}}}\n</tool_call> '
        "or give the final answer as \\boxed{...}."
    )


@dataclass(frozen=True)
class ChatEpisode:
    """One episode at a boundary.  history: ((role, text), ...) with role 'assistant' (raw, with
    thinking) or 'tool'.  done: ended at the previous step (kept for completeness; the driver drops
    finished episodes)."""

    query_id: int
    item: MathItem
    state: ChatState
    history: tuple[tuple[str, str], ...] = ()
    done: bool = False
    tool_state: Any = None  # the tool set's per-episode state (ToolSet.initial_state), picklable

    @property
    def k(self) -> int:
        return self.state.k


class LLMEnv:
    """Environment protocol for tool-use math over a Qwen3 chat.

    task:          the problems; query ids index into it.
    tokenizer:     a Qwen3 tokenizer with its chat template (`chat.load_qwen3_tokenizer()`).
    context_map:   ψ, a registered name ("identity", "think_strip", "last_turns", "summarize"), a
                   {name: params} mapping, or a ContextMap.
    num_turns:     K, the turn horizon.
    gamma:         per-token discount (the paper uses 1).
    system:        optional system prompt; enable_thinking: the Qwen3 thinking switch.
    sandbox:       limits of one tool call; max_calls_per_turn: further calls in a turn get an error.
    max_feedback_chars: tool output shown to the model is cut to this (with a note).
    verifier:      math answer checker (default: the process-wide one).
    tool_threads:  tool calls of a batch run in parallel on this many threads.
    run_tool:      the code runner of the python tool (default: the sandbox); injectable for tests.
    tools:         the tools offered (rtpo.llm.tools): a ToolSet, or a list of registered names /
                   {name: params} / Tool objects; default [python].  "python" by name gets this env's
                   sandbox, run_tool and max_feedback_chars.
    answer_parse:  "boxed" (default): the answer is the last \\boxed{}; "last_integer": lenient, for tiny
                   random models only: without a \\boxed{}, the last integer of the content is the answer
                   (rtpo.llm.rewards.last_integer); "last_digit": likewise the last digit character.
    full_context_map: None (default), or a map name such as "identity": then the env also exposes
                   `full_contexts(episodes)` = that map's context of each episode, which the rollout
                   driver records into Trajectory.full_contexts, so a flat baseline (grpo with
                   train_context full_history/auto) trains on the full history behind ψ's rollouts.
    summarizer:    writes each finished turn's summary block when ψ (or full_context_map) is a summarising
                   map (`summarize`); default: the map's own `summarizer` by name (rtpo.llm.summaries).
    max_context_tokens: None (no limit), or the longest c_k a turn may be sampled from (E.3: max prompt
                   8192; at most the engine's max_model_len − 1): an episode whose next context would be
                   longer ends after the current turn, scored like a turn-K−1 end; a problem whose first
                   context is already longer is a one-line error at reset (check_prompts finds them all).
    """

    def __init__(
        self,
        task: MathTask,
        tokenizer: Any,
        context_map: str | ContextMap = "think_strip",
        num_turns: int = 4,
        gamma: float = 1.0,
        system: str | None = None,
        enable_thinking: bool = True,
        sandbox: SandboxLimits | None = None,
        max_calls_per_turn: int = 2,
        max_feedback_chars: int = 2000,
        verifier: MathVerifier | None = None,
        tool_threads: int = 4,
        run_tool: Callable[[str, SandboxLimits], SandboxResult] | None = None,
        answer_parse: str = "boxed",
        full_context_map: str | ContextMap | None = None,
        max_context_tokens: int | None = None,
        tools: ToolSet | Sequence[Any] | None = None,
        summarizer: Any = None,
    ) -> None:
        if num_turns < 1:
            raise ValueError(f"LLMEnv: num_turns must be >= 1, got {num_turns}")
        if answer_parse not in ANSWER_PARSES:
            raise ValueError(f"LLMEnv: answer_parse must be one of {', '.join(ANSWER_PARSES)}, got {answer_parse!r}")
        self.answer_parse = answer_parse
        if max_context_tokens is not None and max_context_tokens < 1:
            raise ValueError(f"LLMEnv: max_context_tokens must be >= 1, got {max_context_tokens}")
        self.max_context_tokens = max_context_tokens
        if full_context_map is not None:
            # an instance attribute, not a method: the driver records full contexts only when the
            # environment has this attribute (getattr), so unconfigured runs pay nothing
            full_psi = _context_map(full_context_map)
            self.full_contexts = functools.partial(self.contexts_with, psi=full_psi)  # picklable
        self.task = task
        self.sandbox = sandbox or SandboxLimits()
        self.max_feedback_chars = max_feedback_chars
        self.run_tool = run_tool or run_python
        self.tools = tools if isinstance(tools, ToolSet) else ToolSet(self._tool(t) for t in (tools or ["python"]))
        self.chat = Qwen3Chat(
            tokenizer, tools=self.tools.schemas or None, system=system, enable_thinking=enable_thinking
        )
        self.no_action_feedback = no_action_feedback(self.tools)
        self.psi: ContextMap = _context_map(context_map)
        # a summarising ψ (here or behind full_contexts) needs each finished turn's summary block
        maps = [self.psi] + ([full_psi] if full_context_map is not None else [])
        wants = [p for p in maps if getattr(p, "uses_summary", False)]
        if summarizer is None and wants:
            summarizer = make_summarizer(getattr(wants[0], "summarizer", "extractive"))
        self.summarizer = summarizer if wants else None
        if self.summarizer is not None and getattr(self.summarizer, "chat", False) is None:
            self.summarizer.chat = self.chat  # an engine-written summary speaks this chat format
        self.num_turns = num_turns
        self.gamma = gamma
        self.max_calls_per_turn = max_calls_per_turn
        self._verifier = verifier
        self._capture = 0  # finished episodes still to keep for sample_log (logging.generations_per_iteration)
        self._captured: list[dict] = []
        self.tool_threads = tool_threads
        self._prompts: dict[int, np.ndarray] = {}
        self.metrics: collections.Counter = collections.Counter()

    # ------------------------------------------------------------------ protocol

    def reset(self, query_ids: np.ndarray, rng: np.random.Generator) -> list[ChatEpisode]:
        eps = []
        for q in np.asarray(query_ids, dtype=np.int64):
            q = int(q)
            if not 0 <= q < len(self.task):
                raise IndexError(f"query id {q} outside task {self.task.name!r} of {len(self.task)} items")
            state = self._first_state(q)
            if self.max_context_tokens is not None and (n := len(self.psi(state))) > self.max_context_tokens:
                raise ValueError(
                    f"query {q} of task {self.task.name!r}: its prompt has {n} tokens, "
                    f"more than max_context_tokens={self.max_context_tokens}"
                )
            item = self.task[q]
            eps.append(ChatEpisode(q, item, state, tool_state=self.tools.initial_state(item)))
        return eps

    def check_prompts(self) -> list[tuple[int, int]]:
        """(query id, prompt tokens) of every problem whose first context exceeds max_context_tokens."""
        if self.max_context_tokens is None:
            return []
        out = []
        for q in range(len(self.task)):
            n = len(self.psi(self._first_state(q)))
            if n > self.max_context_tokens:
                out.append((q, n))
        return out

    def _first_state(self, q: int) -> ChatState:
        """S_0 of problem q; its prompt block is tokenised once and shared (read-only) by every episode."""
        if q not in self._prompts:
            block = self.chat.prompt_block(self.task[q].question)
            block.flags.writeable = False
            self._prompts[q] = block
        return ChatState(self._prompts[q], (), self.chat.generation_prompt)

    def contexts(self, episodes: Sequence[ChatEpisode]) -> Ragged:
        """c_k = ψ(S_k), the exact ids the sampler sees and the learner trains on."""
        return Ragged.from_rows([self.psi(e.state) for e in episodes], dtype=np.int64)

    def contexts_with(self, episodes: Sequence[ChatEpisode], psi: str | ContextMap) -> Ragged:
        """ψ'(S_k) for another context map ψ' (e.g. the full history behind a think-stripped rollout):
        every S_k keeps all its blocks, so any map applies to any episode or boundary snapshot."""
        other = _context_map(psi)
        return Ragged.from_rows([other(e.state) for e in episodes], dtype=np.int64)

    def turn_index(self, episodes: Sequence[ChatEpisode]) -> np.ndarray:
        return np.fromiter((e.k for e in episodes), dtype=np.int64, count=len(episodes))

    def snapshot(self, episodes: Sequence[ChatEpisode]) -> list[ChatEpisode]:
        return list(episodes)  # immutable: the episode is its own snapshot

    def restore(self, snapshots: Sequence[Any]) -> list[ChatEpisode]:
        for s in snapshots:
            if not isinstance(s, ChatEpisode):
                raise TypeError(f"LLMEnv.restore: expected ChatEpisode snapshots, got {type(s).__name__}")
            if s.done:
                raise ValueError("LLMEnv.restore: cannot fork from a finished episode")
        return list(snapshots)

    def take(self, episodes: Sequence[ChatEpisode], idx: np.ndarray) -> list[ChatEpisode]:
        return [episodes[int(i)] for i in np.asarray(idx, dtype=np.int64)]

    def step(
        self, episodes: Sequence[ChatEpisode], gen: Generation, rng: np.random.Generator
    ) -> tuple[list[ChatEpisode], StepOutcome]:
        n = len(episodes)
        if len(gen) != n:
            raise ValueError(f"LLMEnv.step: {len(gen)} responses for {n} episodes")
        parsed: list[ParsedResponse] = []
        texts: list[str] = []
        for i in range(n):
            ids = gen.tokens[i]
            finished = ids.size > 0 and int(ids[-1]) in self.chat.stop_ids
            text = self.chat.decode(ids[:-1] if finished else ids)
            texts.append(text)
            parsed.append(parse_response(text, finished=finished))

        reward = np.zeros(n)
        done = np.zeros(n, dtype=bool)
        malformed = np.zeros(n, dtype=bool)
        feedback: list[str | None] = [None] * n
        calls: list[list[tuple[str, Any]]] = [[] for _ in range(n)]
        slots: list[list[int]] = [[] for _ in range(n)]  # where each call's result goes in results[i]
        results: list[list[str]] = [[] for _ in range(n)]
        m = self.metrics
        to_score: list[tuple[int, str | None, ChatEpisode]] = []  # finished episodes, scored in one batch
        m["turns"] += n
        m["truncated_turns"] += sum(not p.finished for p in parsed)
        for i, (e, p) in enumerate(zip(episodes, parsed)):
            last = e.k >= self.num_turns - 1
            wants_tools = bool(p.tool_calls or p.errors)
            answer = self._answer(p)
            m["turns/valid"] += int(self._valid_turn(p, answer))
            if last or (answer is not None and not wants_tools):
                done[i] = True
                to_score.append((i, answer, e))
                if last and answer is None and wants_tools:
                    m["tool/cut_by_horizon"] += 1
                continue
            if not wants_tools:
                malformed[i] = True
                m["malformed/no_action"] += 1
                results[i].append(self.no_action_feedback)
                continue
            for err in p.errors:
                malformed[i] = True
                m["malformed/tool_call"] += 1
                results[i].append(f"Error: {err}.")
            for c, call in enumerate(p.tool_calls):
                problem = (
                    f"at most {self.max_calls_per_turn} tool calls per turn; this one was not run"
                    if c >= self.max_calls_per_turn
                    else self.tools.check(call.name, call.arguments)
                )
                if problem:
                    malformed[i] = True
                    m["malformed/tool_call"] += 1
                    if call.name not in self.tools:
                        m["tool/unknown"] += 1
                    results[i].append(f"Error: {problem}.")
                else:
                    slots[i].append(len(results[i]))
                    results[i].append("")
                    calls[i].append((call.name, call.arguments))
        t0 = time.perf_counter()
        ran = self.tools.run_batch(calls, [e.tool_state for e in episodes], m, threads=self.tool_threads)
        m["time/tools_s"] += time.perf_counter() - t0
        tool_states = []
        found: list[list[tuple[str, ...]]] = [[] for _ in range(n)]
        for i, (res, st) in enumerate(ran):
            for slot, r in zip(slots[i], res):
                results[i][slot] = r.text
                found[i].append(tuple(r.found))
            tool_states.append(st)

        summaries: dict[int, str] = {}
        if self.summarizer is not None:
            going = [i for i in range(n) if not done[i]]
            records = [
                TurnRecord(parsed[i].content, tuple(calls[i]), tuple(results[i][s] for s in slots[i]), tuple(found[i]))
                for i in going
            ]
            t0 = time.perf_counter()
            summaries = dict(zip(going, self.summarizer.summarize(records, rng)))
            m["time/summarize_s"] += time.perf_counter() - t0

        out: list[ChatEpisode] = []
        for i, e in enumerate(episodes):
            history = e.history + (("assistant", texts[i]),)
            if done[i]:
                self.tools.end_metrics(e.tool_state, e.item, m)
                out.append(replace(e, history=history, done=True))
                continue
            feedback[i] = "\n\n".join(results[i])
            blocks = TurnBlocks(
                raw=self.chat.raw_assistant_block(gen.tokens[i]),
                stripped=self.chat.assistant_block(parsed[i].content, self._sampled(gen.tokens[i])),
                feedback=self.chat.tool_block(results[i]),
                summary=self.chat.summary_block(summaries[i]) if i in summaries else np.zeros(0, np.int64),
            )
            nxt = ChatEpisode(
                e.query_id,
                e.item,
                e.state.append(blocks),
                history + tuple(("tool", r) for r in results[i]),
                tool_state=tool_states[i],
            )
            if self.max_context_tokens is not None and len(self.psi(nxt.state)) > self.max_context_tokens:
                # no room for another turn: end here, scored as at the horizon (a lenient or boxed
                # answer written beside tool calls still counts)
                done[i] = True
                feedback[i] = None
                to_score.append((i, self._answer(parsed[i]), e))
                self.tools.end_metrics(nxt.tool_state, e.item, m)
                m["context_overflow"] += 1
                out.append(replace(nxt, done=True))
                continue
            out.append(nxt)
        t0 = time.perf_counter()
        for (i, answer, e), r in zip(to_score, self._score_many([(a, e) for _, a, e in to_score])):
            reward[i] = r
            if self._capture > len(self._captured):
                self._captured.append(_episode_record(e, texts[i], answer, r))
        if to_score:
            m["time/score_s"] += time.perf_counter() - t0
        m["malformed"] += int(malformed.sum())
        m["episodes_done"] += int(done.sum())
        outcome = StepOutcome(
            reward=reward,
            duration=gen.tokens.lengths.astype(np.float64),
            done=done,
            feedback=feedback,
            malformed=malformed,
        )
        return out, outcome

    # ------------------------------------------------------------------ helpers

    def sample_log(self, n: int) -> list[dict]:
        """The finished episodes kept since the last call (at most the n of that call), and keep the
        first `n` that finish from now on (0: none).  Each is a plain dict: query_id, question, gold,
        turns (role, text; the assistant's raw text with its thinking), answer, reward."""
        out, self._captured, self._capture = self._captured, [], int(n)
        return out

    def pop_metrics(self) -> dict[str, float]:
        """Counters since the last call (tool calls, their outcomes, malformed turns, answer statuses)."""
        out = dict(self.metrics)
        self.metrics = collections.Counter()
        return out

    def _sampled(self, ids: np.ndarray) -> np.ndarray:
        """A response's ids without its stop token (what was decoded and parsed)."""
        return ids[:-1] if ids.size and int(ids[-1]) in self.chat.stop_ids else ids

    def _valid_turn(self, p: ParsedResponse, answer: str | None) -> bool:
        """A turn that parses as a valid action (eval/valid_turn_rate): tool calls that all parse, name
        an offered tool with valid arguments and fit max_calls_per_turn, or, without any call, an answer
        (the task's answer parse).  Judged on the text alone, also at the last turn where calls are not run."""
        if p.errors:
            return False
        if p.tool_calls:
            return len(p.tool_calls) <= self.max_calls_per_turn and not any(
                self.tools.check(c.name, c.arguments) for c in p.tool_calls
            )
        return answer is not None

    def _answer(self, p: ParsedResponse) -> str | None:
        """The final answer of a turn: the last \\boxed{}, or the lenient parse if configured."""
        if p.answer is None and self.answer_parse != "boxed":
            return LENIENT_PARSERS[self.answer_parse](p.content)
        return p.answer

    def _score_many(self, done: Sequence[tuple[str | None, ChatEpisode]]) -> list[float]:
        """Rewards of finished episodes: one batch for a scorer that batches (an LLM judge), else one
        score per answer.  Each result's status and metrics are counted (answer/<status>, answer/<key>)."""
        if not done:
            return []
        scorer = self._verifier_or_default()
        if isinstance(scorer, BatchScorer):
            results = scorer.score_batch(
                [a for a, _ in done], [e.item.answer for _, e in done], [_question(e.item) for _, e in done]
            )
        else:
            results = [scorer.score(a, e.item.answer) for a, e in done]
        for r in results:
            self.metrics[f"answer/{r.status}"] += 1
            for k, v in (getattr(r, "metrics", None) or {}).items():  # e.g. QA's f1 / em (rtpo.llm.tasks.qa)
                self.metrics[f"answer/{k}"] += v
        return [r.reward for r in results]

    def _verifier_or_default(self) -> MathVerifier:
        if self._verifier is None:
            self._verifier = default_verifier()
        return self._verifier

    def _tool(self, t: Any) -> Tool:
        if t == "python":
            return PythonTool(self.sandbox, self.max_feedback_chars, run=self.run_tool)
        if isinstance(t, str):
            return make_tool(t)
        if isinstance(t, dict) and len(t) == 1:
            ((name, params),) = t.items()
            return make_tool(name, **dict(params or {}))
        return t


def _episode_record(e: ChatEpisode, last: str, answer: str | None, reward: float) -> dict:
    turns = [{"role": role, "text": text} for role, text in e.history] + [{"role": "assistant", "text": last}]
    return {
        "query_id": int(e.query_id),
        "question": _question(e.item),
        "gold": _gold(getattr(e.item, "answer", "")),
        "turns": turns,
        "answer": answer,
        "reward": float(reward),
    }


def _gold(answer: Any) -> str | list[str]:
    """A gold answer as JSON: the string (math), or the list of accepted answers (QA's tuple)."""
    return answer if isinstance(answer, str) else [str(a) for a in answer]


def _question(item: Any) -> str:
    """The question as asked, without the prompt template (QA items keep it as raw_question)."""
    return getattr(item, "raw_question", "") or item.question


def _context_map(spec: str | dict | ContextMap) -> ContextMap:
    """ψ from a registered name, a {name: params} mapping (e.g. {summarize: {m: 1}}), or a ContextMap."""
    if isinstance(spec, str):
        return make_context_map(spec)
    if isinstance(spec, dict):
        if len(spec) != 1:
            raise ValueError(f"a context map must be a name or {{name: {{params}}}}, got {sorted(spec)}")
        ((name, params),) = spec.items()
        return make_context_map(name, **dict(params or {}))
    return spec
